"""Draw the chart's Grafana dashboard from a real local run, for the docs (docs/dashboard.png,
shown in docs/operations.md).

Grafana cannot be installed on our machines, so this stands in for it: a real Prometheus scrapes
`scalerl run examples/local.yaml` (the demo), then every panel's own PromQL, read from the
dashboard JSON the chart ships, is run as a range query and drawn where the panel sits.

    .venv/bin/python docs/render_dashboard.py [--steps 60] [--out docs/dashboard.png]

Needs Debian's `prometheus` (apt-get install prometheus). Takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "chart"))  # the Prometheus launcher the live test uses
import prometheus as prom  # noqa: E402

from scalerl.fit.law import sigmoid  # noqa: E402
from scalerl.spec import parse_run  # noqa: E402

DASHBOARD = ROOT / "helm" / "scalerl" / "dashboards" / "scalerl-runs.json"
STEP_S = 2.0
TARGET = 0.9


def run_demo(workdir: Path, steps: int, out: Path) -> None:
    """The demo with Prometheus scraping it, then every panel drawn from what it stored."""
    run = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    run["spec"]["budget"]["maxSteps"] = steps
    # A target, so the panel of the pass rate predicted at the end draws its line.
    run["spec"]["budget"].setdefault("targetPassRate", TARGET)
    spec = workdir / "run.yaml"
    spec.write_text(yaml.safe_dump(run))
    run_dir = workdir / "run"
    with prom.Prometheus(workdir, run_dir / "prometheus-targets.json") as server:
        start = time.time()
        command = [sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(run_dir)]
        subprocess.run(command, check=True)
        end = time.time()
        parsed = parse_run(run)
        panels = Panels(server, parsed.namespace, parsed.name, start, end)
        panels.draw(out, parsed.spec.compute_unit)


class Panels:
    """The dashboard's panels over one run's time span, with `$namespace` and `$run` bound to
    it."""

    def __init__(
        self, server: prom.Prometheus, namespace: str, run: str, start: float, end: float
    ) -> None:
        self.server, self.namespace, self.run = server, namespace, run
        self.start, self.end = start, end

    def bind(self, text: str) -> str:
        """A query or legend with the dashboard's variables and labels set to this run."""
        for name, value in (("namespace", self.namespace), ("run", self.run)):
            text = text.replace(f"${name}", value).replace("{{" + name + "}}", value)
        return text

    def series(self, expr: str) -> list[tuple[list[float], list[float]]]:
        """(seconds since the start, values) of each series the query returns."""
        result = self.server.query_range(self.bind(expr), self.start, self.end, STEP_S)
        return [
            ([float(t) - self.start for t, _ in r["values"]], [float(v) for _, v in r["values"]])
            for r in result
        ]

    def last(self, expr: str) -> float | None:
        found = self.series(expr)
        return found[0][1][-1] if found and found[0][1] else None

    def draw(self, out: Path, unit: str) -> None:
        """Every panel where it sits; `unit` is the run's compute unit (RunSpec.compute_unit)."""
        # The file holds the chart's default alert values, the windows and thresholds the
        # chart renders by default.
        dashboard = json.loads(DASHBOARD.read_text())
        rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
        rows += 1  # room for the title
        fig = plt.figure(figsize=(16, rows * 0.42))
        fig.suptitle(
            f"{dashboard['title']}: run {self.run} (the local demo with targetPassRate {TARGET}, "
            "from Prometheus)",
            y=0.995,
        )
        for panel in dashboard["panels"]:
            g = panel["gridPos"]  # a 24-column grid, rows of equal height
            ax = fig.add_axes(
                (
                    g["x"] / 24 + 0.035,
                    1 - (g["y"] + 1 + g["h"]) / rows + 0.035,
                    g["w"] / 24 - 0.055,
                    g["h"] / rows - 0.07,
                )
            )
            ax.set_title(panel["title"], fontsize=10, loc="left")
            if panel["type"] == "xychart":
                self.pass_rate_vs_compute(ax, panel, unit)
            elif panel["type"] == "stat":
                self.stat(ax, panel)
            else:
                self.timeseries(ax, panel)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=80)

    def timeseries(self, ax: Any, panel: dict[str, Any]) -> None:
        defaults = panel["fieldConfig"]["defaults"]
        factor, label = scale(defaults.get("unit", "none"))
        # A query whose override gives it a unit of its own goes on a right-hand axis.
        own = {
            o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
            for o in panel["fieldConfig"].get("overrides", [])
            if o["matcher"]["id"] == "byFrameRefID"
        }
        right = None
        for target in panel["targets"]:
            legend = self.bind(target.get("legendFormat", ""))
            where, by = ax, factor
            if "unit" in own.get(target["refId"], {}):
                right = right or ax.twinx()
                where, (by, right_label) = right, scale(own[target["refId"]]["unit"])
                right.set_ylabel(
                    own[target["refId"]].get("custom.axisLabel", right_label), fontsize=8
                )
                right.tick_params(labelsize=7)
            for times, values in self.series(target["expr"]):
                style = "--" if where is right else "-"
                where.plot(times, [v * by for v in values], style, label=legend or None)
        for step in defaults.get("thresholds", {}).get("steps", []):
            if step.get("value") is not None:  # drawn as a line, as thresholdsStyle asks
                ax.axhline(step["value"] * factor, color="red", linestyle="--", linewidth=1)
        ax.set_xlabel("seconds since the run started", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        handles, labels = ax.get_legend_handles_labels()
        if right is not None:
            more = right.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="best")

    def stat(self, ax: Any, panel: dict[str, Any]) -> None:
        ax.axis("off")
        lines = []
        for target in panel["targets"]:
            value = self.last(target["expr"])
            name = self.bind(target.get("legendFormat", ""))
            lines.append(f"{name}: {'-' if value is None else f'{value:.3g}'}")
        ax.text(0.5, 0.5, "\n".join(lines), ha="center", va="center", fontsize=11)

    def pass_rate_vs_compute(self, ax: Any, panel: dict[str, Any], unit: str) -> None:
        """Held-out pass rate against the compute it was measured at (the panel's queries A and
        B, joined on time), the curve fitted last (its parameters from the run's gauges) and its
        asymptote."""
        factor, label = scale(panel["fieldConfig"]["defaults"].get("unit", "none"))
        by_ref = {t["refId"]: t["expr"] for t in panel["targets"]}
        compute = dict(zip(*self.series(by_ref["A"])[0], strict=True))
        held_out = dict(zip(*self.series(by_ref["B"])[0], strict=True))
        # The gauge holds each evaluation until the next: one point where a new value arrives.
        points, previous = [], None
        for t in sorted(held_out):
            if held_out[t] != previous and t in compute:
                points.append((compute[t], held_out[t]))
            previous = held_out[t]
        ax.plot([c for c, _ in points], [p * factor for _, p in points], "o", label="held-out")
        fit = {
            k: self.last(self.bind(f'scalerl_predicted_{k}{{namespace="$namespace",run="$run"}}'))
            for k in ("asymptote", "slope", "cmid", "r0")
        }
        if points and all(v is not None for v in fit.values()):
            grid = [points[-1][0] * i / 100 for i in range(1, 101)]
            curve = sigmoid(grid, fit["asymptote"], fit["slope"], fit["cmid"], fit["r0"])
            ax.plot(grid, [v * factor for v in curve], label="fitted curve")
            ax.axhline(fit["asymptote"] * factor, linestyle="--", color="gray", label="A")
        ax.set_xlabel(f"compute at evaluation ({unit} for this run)", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="lower right")


def scale(unit: str) -> tuple[float, str]:
    """A Grafana unit as (factor, axis label)."""
    if unit == "percentunit":
        return 100.0, "%"
    if unit.startswith(("suffix:", "si:")):
        return 1.0, unit.split(":", 1)[1]
    return 1.0, {"s": "seconds", "none": "", "short": ""}.get(unit, unit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps of the demo run")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    if prom.binary() is None:
        print("prometheus is not installed: apt-get install prometheus", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as workdir:
        run_demo(Path(workdir), args.steps, args.out.resolve())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
