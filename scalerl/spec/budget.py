"""Where a run ends (its budgets, a prediction-driven stop) and when it restarts or fails."""

from __future__ import annotations

from pydantic import Field

from scalerl.spec.base import MAX_STEPS, Float, Int, _Model
from scalerl.spec.evaluation import PREDICTION_MIN_POINTS


class StopWhenSpec(_Model):
    """Stop a hopeless run: the point of predicting a run is not paying for the rest of it."""

    predicted_a_below: Float = Field(
        alias="predictedABelow",
        gt=0,
        le=1,
        description="Stop when the whole interval of the forecast at the budget "
        "(predictedAtBudgetInterval, the one the status shows) of a checked fit (confidence OK: "
        "its half-run check ran and held) lies below this pass rate: the run cannot reach it "
        "within what it may spend. Never on an interval as wide as [0, 1].",
    )
    min_points: Int = Field(
        PREDICTION_MIN_POINTS,
        ge=PREDICTION_MIN_POINTS,
        le=10_000,
        description="Only after the fit used at least this many trained evaluations past "
        f"fit.minCompute (at least {PREDICTION_MIN_POINTS}: a fit of fewer is TooEarly, and "
        "its A interval can be far too narrow to stop a run on).",
    )


class BudgetSpec(_Model):
    """Where the run ends (the first budget it reaches) and what it aims at."""

    max_steps: Int = Field(10000, ge=1, le=MAX_STEPS, description="Optimizer steps at most.")
    max_compute_hours: Float = Field(
        16000, gt=0, le=1e9, description="GPU-hours; process-hours for a CPU run."
    )
    stop_when: StopWhenSpec | None = Field(
        None,
        description="Prediction-driven early stop, on a cluster and by `scalerl run`: the run "
        "ends (Stopped, reason PredictedBelowTarget) without a restart.",
    )
    target_pass_rate: Float | None = Field(
        None,
        gt=0,
        le=1,
        description="A held-out pass rate to reach: the prediction says at what compute "
        "(computeToTarget) and how soon (etaSeconds.target) the fitted curve reaches it.",
    )

    def end(self, step: int, compute: float) -> tuple[float, str]:
        """Where a run that is at `step` having spent `compute` will stop: the compute of the
        first budget it hits (maxSteps at its compute per step so far, or maxComputeHours), and
        that budget's field name."""
        if step <= 0 or compute <= 0:
            return self.max_compute_hours, "maxComputeHours"
        at_max_steps = compute / step * self.max_steps
        if at_max_steps < self.max_compute_hours:
            return at_max_steps, "maxSteps"
        return self.max_compute_hours, "maxComputeHours"


class FailurePolicySpec(_Model):
    """When a gang restarts from its checkpoint, and when the run fails."""

    max_restarts: Int = Field(
        3, ge=0, le=1000, description="Gang restarts from the last checkpoint before Failed."
    )
    peer_timeout_seconds: Int = Field(
        300,
        ge=1,
        le=24 * 3600,
        description="How long a process waits for a silent peer (no rollouts, no command) "
        "before it fails and the gang restarts; the first meeting of a gang's processes waits "
        "up to startupTimeoutSeconds instead.",
    )
    startup_timeout_seconds: Int = Field(
        1800,
        ge=1,
        le=7 * 24 * 3600,
        description="On a cluster: how long a run's gangs may take until every pod runs "
        "(scheduling, autoscaling, image pulls), counted from the first gang since it last ran "
        "(a queued run: since Kueue admitted it); past it the run fails. Gangs that fail while "
        "starting use up no maxRestarts.",
    )
    no_signal_steps: Int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="Fail after this many consecutive steps whose every group was filtered out "
        "(all right or all wrong): such a run learns nothing.",
    )
