"""The chart's queries against a live local run: the names they read are the names the processes
serve, and a real Prometheus scraping the run answers the truncation-rate query with the value
the run's own counters give.

One short run (one trainer, one vLLM generator on CPU) serves both tests. To compare exact
numbers, the test freezes the generator's counters twice: it stops the trainer (SIGSTOP), the
generator runs out of its rollout quota and stands still, the test reads its counters itself,
and waits for Prometheus to scrape the same values. Between the two frozen moments the run
trains; the truncation rate over exactly that interval is then (T2 - T1) / (G2 - G1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prometheus as prom
import pytest
import yaml
from helmchart import of_kind, one, render
from prometheus_client.parser import text_string_to_metric_families
from promql import queries

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN = "live"
WAIT_S = 300.0
# Short completion budgets without interruption: the demo model often runs out of tokens, so
# the truncation counter moves (a rate of 0/N would prove little).
SPEC = {
    "recipe": {
        "batch": {"prompts": 4, "generationsPerPrompt": 4},
        "length": {
            "thinkingBudget": 6,
            "answerBudget": 4,
            "interruption": {"enabled": False},
        },
    },
    "data": {"validation": {"prompts": 8}},
    "evaluation": {"everySteps": 2, "generationsPerPrompt": 2},
    "fit": {"everyEvaluations": 2},
    # Targets, so the runner serves target_pass_rate and stop_asymptote_below too; far below
    # anything the run predicts.
    "budget": {
        "maxSteps": 200,
        "targetPassRate": 0.001,
        "stopWhen": {"predictedABelow": 0.001, "minPoints": 8},
    },
    "generators": {"replicas": 1},
    "checkpoint": {"everySteps": 1000},
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def served_names(text: str) -> set[str]:
    """Series names a /metrics page declares (from its families, whether or not they have
    samples yet: a gauge set only after the first fit is still served)."""
    names = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def counter(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("run") == RUN:
                return float(sample.value)
    raise AssertionError(f"{name} not served")


@dataclass
class LiveRun:
    out: Path
    proc: subprocess.Popen[str]
    prometheus: prom.Prometheus | None

    def processes(self) -> dict[str, dict[str, Any]]:
        return json.loads((self.out / "processes.json").read_text())  # type: ignore[no-any-return]

    def step(self) -> int:
        try:
            return int(json.loads((self.out / "progress.json").read_text())["step"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return -1

    def wait_for_step(self, step: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.step() < step:
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            assert time.monotonic() < deadline, f"the run did not reach step {step}"
            time.sleep(0.5)

    def counters(self) -> tuple[float, float]:
        """(truncated, generated) as the generator serves them right now."""
        text = scrape(self.processes()["generator-0"]["metrics"])
        return (
            counter(text, "scalerl_truncated_sequences_total"),
            counter(text, "scalerl_generated_sequences_total"),
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    root = tmp_path_factory.mktemp("live")
    run = yaml.safe_load((EXAMPLES / "local.yaml").read_text())
    run["metadata"]["name"] = RUN
    run["spec"] = merge(run["spec"], SPEC)
    spec = root / "run.yaml"
    spec.write_text(yaml.safe_dump(run))
    out = root / "run"
    server = None
    if prom.binary() is not None:
        rules = root / "rules.yaml"
        rules.write_text(yaml.safe_dump(one(render(), "PrometheusRule")["spec"]))
        server = prom.Prometheus(root, out / "prometheus-targets.json", (rules,)).__enter__()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SCALERL_PEER_TIMEOUT": "120"},
    )
    live = LiveRun(out, proc, server)
    try:
        live.wait_for_step(2)
        yield live
    finally:
        trainer = live.processes().get("trainer-0") if (out / "processes.json").exists() else None
        if trainer is not None:
            os.kill(int(trainer["pid"]), signal.SIGCONT)
        proc.terminate()  # SIGTERM: the runner stops its gang like Ctrl-C
        proc.communicate(timeout=120)
        if server is not None:
            server.__exit__()


@pytest.mark.slow
def test_every_metric_the_chart_reads_is_served_by_the_run(live: LiveRun) -> None:
    served: set[str] = set()
    for process in live.processes().values():
        served |= served_names(scrape(process["metrics"]))
    objs = render()
    rules = [r["expr"] for r in one(objs, "PrometheusRule")["spec"]["groups"][0]["rules"]]
    read: dict[str, set[str]] = {}
    for expr in [*rules, *queries(objs)]:
        for name in re.findall(r"\bscalerl_[a-z0-9_]+\b", expr):
            read.setdefault(name, set()).add(expr.split("\n")[0][:60])
    assert read, "no query names a metric"
    missing = {name: where for name, where in read.items() if name not in served}
    assert not missing, f"queried but not served by any process of the run: {missing}"
    assert len(of_kind(objs, "ConfigMap")) >= 2  # dashboards and the Grafana rule were read


def freeze(live: LiveRun) -> tuple[float, float, float]:
    """Stop the trainer until the generator's counters stand still and Prometheus has scraped
    them; (truncated, generated, timestamp of that scrape). The trainer stays stopped."""
    assert live.prometheus is not None
    processes = live.processes()
    os.kill(int(processes["trainer-0"]["pid"]), signal.SIGSTOP)
    deadline = time.monotonic() + 120
    previous, still_since = live.counters(), time.time()
    while time.time() - still_since < 3 * prom.SCRAPE_INTERVAL_S:  # unchanged for 3 scrapes
        assert time.monotonic() < deadline, "the generator kept generating with the trainer stopped"
        time.sleep(0.5)
        now = live.counters()
        if now != previous:
            previous, still_since = now, time.time()
    truncated, generated = previous
    selector = f'scalerl_generated_sequences_total{{run="{RUN}"}}'
    while True:  # a scrape taken after the counters stood still
        assert time.monotonic() < deadline, "prometheus did not scrape the frozen counters"
        result = live.prometheus.query(selector)
        if result:
            stamp, value = result[0]["value"]
            if float(stamp) > still_since and float(value) == generated:
                # An instant query stamps its result with the query time: the scrape's own time
                # is what timestamp() returns.
                sample_time = live.prometheus.query(f"timestamp({selector})")[0]["value"][1]
                return truncated, generated, float(sample_time)
        time.sleep(0.5)


@pytest.mark.slow
def test_prometheus_answers_the_truncation_rate_of_the_runs_own_counters(live: LiveRun) -> None:
    if live.prometheus is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed: .ci/run installs Debian's prometheus")
        pytest.skip("prometheus not installed: apt-get install prometheus")
    truncated_1, generated_1, t1 = freeze(live)
    os.kill(int(live.processes()["trainer-0"]["pid"]), signal.SIGCONT)
    live.wait_for_step(live.step() + 2)
    truncated_2, generated_2, t2 = freeze(live)
    assert generated_2 > generated_1

    # The alert's own ratio, its window set to exactly (t1, t2]: both ends fall on samples, so
    # Prometheus extrapolates nothing and the rate ratio is the counters' increase ratio.
    alert = next(
        rule
        for rule in one(render(), "PrometheusRule")["spec"]["groups"][0]["rules"]
        if rule["alert"] == "ScaleRLTruncationRateHigh"
    )
    ratio, threshold = alert["expr"].rsplit(">", 1)
    assert float(threshold) == 0.10
    window_ms = round((t2 - t1) * 1000)
    exact = re.sub(r"\[\w+\]", f"[{window_ms}ms]", ratio)
    answer = live.prometheus.query(exact, at=t2)
    assert [r["metric"]["run"] for r in answer] == [RUN]
    expected = (truncated_2 - truncated_1) / (generated_2 - generated_1)
    assert float(answer[0]["value"][1]) == pytest.approx(expected, rel=1e-12)
    print(
        f"\ntruncation rate over {window_ms / 1000:.1f} s: Prometheus "
        f"{float(answer[0]['value'][1]):.4f}, counters {truncated_2 - truncated_1:.0f}/"
        f"{generated_2 - generated_1:.0f} = {expected:.4f}"
    )
    # Prometheus loaded the chart's rules and evaluates them against the live run.
    groups = live.prometheus.rules()
    assert [g["name"] for g in groups] == ["scalerl.runs"]
    assert all(rule["health"] == "ok" for rule in groups[0]["rules"]), groups
