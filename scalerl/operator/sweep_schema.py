"""The ScaleRLSweep status schema of its CRD (structural OpenAPI v3, written by hand: the operator
writes it, scalerl/operator/sweeps.py)."""

from __future__ import annotations

from typing import Any

from scalerl import spec as _spec
from scalerl.operator.status_schema import conditions, interval, number


def sweep_status_schema() -> dict[str, Any]:
    """status of a ScaleRLSweep, written by the operator (scalerl/operator/sweeps.py)."""
    text = {"type": "string", "nullable": True}
    row = {
        "type": "object",
        "description": "One variant, as a row of `scalerl sweep`'s leaderboard.json: the fit "
        "of its run's evaluations (weighted by their SEs) it was ranked by.",
        "properties": {
            "name": {"type": "string", "description": "The variant."},
            "run": {"type": "string"},
            "phase": {"type": "string", "enum": list(_spec.VARIANT_PHASES)},
            "A": number("The ranked fit's A.", nullable=True),
            "A_interval": interval("Its A interval."),
            "A_atLeast": number(
                "A lower bound on A where the data bound it only from below.", nullable=True
            ),
            "B": number("Its B.", nullable=True),
            "C_mid": number("Its C_mid.", nullable=True),
            "points": {"type": "integer", "nullable": True},
            "confidence": {**text, "description": "Its run's own prediction's confidence."},
            "compute": number("Compute its run spent (its last evaluation's), in computeUnit."),
            "computeUnit": {"type": "string", "description": "GPU-hours or process-hours."},
            "stopReason": {**text, "description": "Why the sweep stopped it."},
            "stopEvidence": {**text, "description": "What decided the stop: measured or fit."},
            "failure": {**text, "description": "Why its run failed."},
            "computeSaved": number(
                "Compute its early stop saved: its budget's end beyond its last evaluation.",
                nullable=True,
            ),
            "tiedWith": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Variants it is tied with: each one's A is bounded only from "
                "below, and their fitted curves read within 0.02 of each other at the compute "
                "all of them reached.",
            },
        },
    }
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": ["Running", "Succeeded", "Failed"]},
            "message": {"type": "string"},
            "leader": {
                "type": "string",
                "nullable": True,
                "description": "The leaderboard's first variant, once it has a fit (where it is "
                "tied with others, its row's tiedWith names them).",
            },
            "leaderA": number("The leader's A.", nullable=True),
            "running": {"type": "integer"},
            "stopped": {"type": "integer"},
            "computeSaved": number("Compute the early stops saved, all variants."),
            "leaderboard": {"type": "array", "items": row, "description": "Best first."},
            "conditions": conditions(),
        },
    }
