"""Runs a whole ScaleRLRun on this machine: `trainers.replicas` trainer ranks and
`generators.replicas` generator processes with the same entry points and environment contract as
the pods, a live progress display,
refits of the scaling curve as evaluations arrive, and gang restarts from the last checkpoint when a
process dies (bounded, like the operator's).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from scalerl import preflight
from scalerl.agents.openenv_server import URL_VARIABLE, LocalServer
from scalerl.environment import ProcessEnv
from scalerl.errors import PeerError, ScaleRLError
from scalerl.hub import RunSources
from scalerl.metrics import RunMetrics
from scalerl.ports import free_port
from scalerl.progress import ProgressDisplay
from scalerl.rollout.keys import StreamKeys
from scalerl.runpaths import resolve_paths
from scalerl.spec import RunSpec, ScaleRLRun
from scalerl.status.files import GAVE_UP_FILE, STATUS_FILE, FileStatus, read_status
from scalerl.status.history import HISTORY_FILE, PROGRESS_FILE, read_history
from scalerl.tracking import open_trackers

log = logging.getLogger("scalerl.local")
PROCESSES_FILE = "processes.json"  # role -> pid and /metrics URL of the current attempt
# The same endpoints as Prometheus file-based discovery reads them (`file_sd_configs`): point a
# Prometheus at it to watch a local run as a cluster's PodMonitor would.
TARGETS_FILE = "prometheus-targets.json"
KEYS_DIR = "stream-keys"  # the rollout stream's CURVE keys, readable by the run's user only
STOP_GRACE_S = 15.0


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the runner dies, even by SIGKILL (Linux)."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass  # not Linux: Ctrl-C and stop() still clean up


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Gang:
    """One attempt: the trainer and generator processes of the run."""

    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)  # variables for every process
    started: dict[str, tuple[str, ProcessEnv]] = field(default_factory=dict)  # role: command, env

    def start(self, role: str, command: str, env: ProcessEnv, log_path: Path) -> None:
        """Start `scalerl <command>` as `role` (its processes.json and Prometheus name)."""
        self.started[role] = (command, env)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            # Own process group: Ctrl-C reaches only the runner, which stops the gang in order,
            # and stop() can take a generator's vLLM engine process down with it.
            self.processes[role] = subprocess.Popen(
                [sys.executable, "-m", "scalerl.cli", command],
                env={**os.environ, **self.environ, **env.to_environ()},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.logs[role] = log_path

    def restart(self, role: str) -> None:
        """Start `role` again, as it was started, once whatever is left of its process group (a
        killed generator's vLLM engine process) is gone."""
        _signal_group(self.processes[role], signal.SIGKILL)
        command, env = self.started[role]
        self.start(role, command, env, self.logs[role])

    def failed(self) -> list[str]:
        """The roles of the processes that exited non-zero, likeliest cause first: one killed by
        a signal (OOM, a kill) before one that exited on an error, which is often a peer's
        death seen through a collective."""
        codes = {role: proc.poll() for role, proc in self.processes.items()}
        failed = [role for role, code in codes.items() if code not in (None, 0)]
        return sorted(failed, key=lambda role: (codes[role] or 0) > 0)

    def describe(self, roles: list[str]) -> str:
        return "\n".join(
            f"{role} exited with code {self.processes[role].returncode}:\n{self.tail(role)}"
            for role in roles
        )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every process group, SIGKILL what is left after the grace period."""
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.processes.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # also any engine process left in the group
            proc.wait()

    def tail(self, role: str, lines: int = 15) -> str:
        text = self.logs[role].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def write_targets(path: Path, processes: dict[str, dict[str, Any]]) -> None:
    """One file_sd target group per process, labelled with its role; replaced atomically, since
    Prometheus rereads the file whenever it changes."""
    groups = []
    for role, process in processes.items():
        url = urllib.parse.urlsplit(process["metrics"])
        groups.append({"targets": [url.netloc], "labels": {"role": role.split("-")[0]}})
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(groups, indent=2))
    partial.replace(path)


LEADER = "trainer-0"  # trainer rank 0: the run ends when it does


def roles(spec: RunSpec) -> list[str]:
    """The processes of a run, by role: `trainer-<rank>` and `generator-<index>`; colocated,
    the one process (trainer and engine) is trainer-0."""
    trainers = [f"trainer-{r}" for r in range(spec.trainers.replicas)]
    if spec.colocated:
        return trainers
    return trainers + [f"generator-{g}" for g in range(spec.generators.replicas)]


class LocalRun:
    def __init__(
        self,
        run: ScaleRLRun,
        out: Path,
        *,
        display: bool = True,
        sources: list[dict[str, Any]] | None = None,
    ) -> None:
        self.run, self.out = run, out
        self.sources = sources or []  # the hf:// sources resolved (sources.json), for fit.json
        self.spec_path = out / "run.yaml"
        self.display = ProgressDisplay(
            run.spec.budget.max_steps, unit=run.spec.compute_unit, enabled=display
        )
        self.metrics = RunMetrics()
        budget = run.spec.budget
        stop_below = budget.stop_when.predicted_a_below if budget.stop_when else None
        self.metrics.set_targets(run.namespace, run.name, budget.target_pass_rate, stop_below)
        self.metrics.set_restarts(run.namespace, run.name, 0)
        port = free_port()
        self.metrics.serve(port, addr="127.0.0.1")
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"  # the prediction, for Prometheus
        self.fitted_at = 0
        self.restarts = 0
        self.replacements = 0  # generators replaced alone
        self.replaced_at: dict[str, int] = {}  # role: the trained step it was last replaced at
        self.gave_up_seen = 0  # bytes of GAVE_UP_FILE acted on
        self.fit_skipped: str | None = None  # why the last fit could not be made
        # history.jsonl's size and mtime when refresh last read it: it is read again only when
        # it changed (every evaluation), not every half-second tick.
        self.history_seen: tuple[int, int] | None = None
        # The fits to spec.tracking's trackers (the trainer logs its steps itself).
        self.tracker = open_trackers(run, out, "fit", resume_step=None)
        # spec.environment.openenv.app's server, for the whole run (across gang restarts).
        self.env_server: LocalServer | None = None
        self.environ: dict[str, str] = {}

    def start_env_server(self) -> None:
        """Start spec.environment.openenv.app on 127.0.0.1 and tell the processes its URL."""
        environment = self.run.spec.environment
        if environment is None or environment.openenv is None or environment.openenv.app is None:
            return
        log_path = self.out / "logs" / "openenv.log"
        app = environment.openenv.app
        self.env_server = LocalServer.start(app, log_path, preexec_fn=_die_with_parent)
        self.environ[URL_VARIABLE] = self.env_server.url

    def launch(self) -> Gang:
        spec = self.run.spec
        count = spec.generators.replicas
        keys = self.out / KEYS_DIR
        if not keys.exists():  # one set per run, kept across gang restarts
            StreamKeys.generate().write(keys)
        trainers = spec.trainers.replicas
        # Every process's environment but its own /metrics port and index.
        base = ProcessEnv(
            spec=self.spec_path.resolve(),
            stream_keys=keys.resolve(),
            run_dir=self.out.resolve(),
            trainer_host="127.0.0.1",
            channel_port=free_port(),
            sync_port=free_port(),
            compute_units=spec.cluster_compute_units,  # GPUs; processes for a CPU run
            metrics_port=0,
            trainer_ranks=trainers,
            ranks_port=free_port(),
            peer_timeout_s=float(spec.failure_policy.peer_timeout_seconds),
            startup_timeout_s=float(spec.failure_policy.startup_timeout_seconds),
        )
        gang = Gang(environ=self.environ)
        logs = self.out / "logs"
        ports = {role: free_port() for role in roles(spec)}
        for r in range(trainers):  # colocated: one, which holds the engine too
            env = replace(base, metrics_port=ports[f"trainer-{r}"], trainer_rank=r)
            command = "colocated" if spec.colocated else "trainer"
            gang.start(f"trainer-{r}", command, env, logs / f"trainer-{r}.log")
        for g in range(0 if spec.colocated else count):
            env = replace(base, metrics_port=ports[f"generator-{g}"], generator_index=g)
            gang.start(f"generator-{g}", "generator", env, logs / f"generator-{g}.log")
        self.write_processes(gang)
        return gang

    def write_processes(self, gang: Gang) -> None:
        """processes.json and the Prometheus targets: each process's pid and /metrics."""
        processes = {
            role: {"pid": proc.pid, "metrics": f"http://127.0.0.1:{port}/metrics"}
            for role, proc in gang.processes.items()
            if (port := gang.started[role][1].metrics_port)
        }
        processes["runner"] = {"pid": os.getpid(), "metrics": self.metrics_url}
        (self.out / PROCESSES_FILE).write_text(json.dumps(processes, indent=2))
        write_targets(self.out / TARGETS_FILE, processes)

    def supervise(self, gang: Gang) -> None:
        """Until the trainer finishes: show progress, refit; a generator that died is replaced
        alone (the trainer trains on with the others: scalerl.trainer.pool); raise PeerError
        when another process dies (naming every process that has, since one death takes the
        trainer ranks with it)."""
        while gang.processes[LEADER].poll() != 0:
            self.end_given_up(gang)
            failed = gang.failed()
            if LEADER in failed and (stopped := stopped_reason(self.out)) is not None:
                raise ScaleRLError(f"run stopped: {stopped}")  # on purpose: no restart
            if any(not role.startswith("generator-") for role in failed):
                raise PeerError(gang.describe(failed))
            for role in failed:
                self.replace(gang, role)
            time.sleep(0.5)
            self.refresh()

    def end_given_up(self, gang: Gang) -> None:
        """Generators the trainer gave up while they looked alive (they sent nothing for the
        peer timeout while the others did: scalerl.trainer.pool): each still running as the
        process the trainer gave up is killed, and so replaced as a dead one is."""
        path = self.out / GAVE_UP_FILE
        if not path.exists() or path.stat().st_size == self.gave_up_seen:
            return  # nothing appended since the last tick
        with path.open("rb") as appended:
            appended.seek(self.gave_up_seen)
            lines = appended.read().split(b"\n")[:-1]  # whole lines only
        self.gave_up_seen += sum(len(line) + 1 for line in lines)
        for line in lines:
            given_up = json.loads(line)
            role, proc = given_up["role"], gang.processes.get(given_up["role"])
            if proc is not None and proc.pid == given_up["pid"] and proc.poll() is None:
                self.display.note(f"{role} stopped answering ({given_up['reason']}); ending it")
                _signal_group(proc, signal.SIGKILL)
                proc.wait()

    def replace(self, gang: Gang, role: str) -> None:
        """Start a dead generator again; one that dies again before the trainer took a step
        since its last replacement fails the gang instead (it would only fail again)."""
        step = self.trained_steps()
        if self.replaced_at.get(role) == step:
            raise PeerError(f"{gang.describe([role])}\n(it died again before another step)")
        self.replaced_at[role] = step
        self.replacements += 1
        self.display.note(
            f"{role} exited with code {gang.processes[role].returncode}; starting a replacement "
            "(training goes on with the other generators)"
        )
        gang.restart(role)
        self.write_processes(gang)

    def refresh(self) -> None:
        progress_file = self.out / PROGRESS_FILE
        if progress_file.exists():
            try:
                self.display.update(json.loads(progress_file.read_text()))
            except (json.JSONDecodeError, OSError):
                pass  # being replaced right now; next tick
        path = self.out / HISTORY_FILE
        stat = path.stat() if path.exists() else None
        seen = None if stat is None else (stat.st_size, stat.st_mtime_ns)
        if seen == self.history_seen:
            return  # no new evaluation since the last tick: nothing to refit
        self.history_seen = seen
        history = read_history(path)
        if len(history) - self.fitted_at >= self.run.spec.fit.every_evaluations:
            self.judge(self.refit(history))

    def judge(self, report: dict[str, Any] | None) -> None:
        """Raise PredictedStop when budget.stopWhen condemns the run on this fit: the cluster's
        rule (`scalerl.fit.decision.stop_reason`: a fit whose forecast passed its half-run check,
        whose whole interval at the budget lies below the threshold)."""
        from scalerl.fit.decision import stop_reason

        reason = stop_reason(self.run.spec.budget, report)
        if reason is not None:
            raise PredictedStop(reason)

    def refit(
        self, history: list[dict[str, Any]], ended: bool = False, stopped: str | None = None
    ) -> dict[str, Any] | None:
        """Fit the history so far (fit.json, its track); once the run has `ended`, the last fit
        also scores every prediction the run kept (fit.json's trackRecord); a run `stopped` by
        its prediction keeps them as censored."""
        from scalerl.fit.report import FIT_FILE, write_fit

        self.fitted_at = len(history)
        self.fit_skipped = None
        try:
            result = write_fit(
                history,
                self.out,
                min_compute=self.run.spec.fit.min_compute,
                budget=self.run.spec.budget,
                units=self.run.spec.cluster_compute_units,  # as the trainer counts compute
                ended=ended,
                stopped=stopped,
            )
        except ScaleRLError as err:  # too few points yet, or a flat curve: try again later
            self.fit_skipped = str(err)
            self.display.note(f"fit skipped: {err}")
            return None
        except Exception as err:  # noqa: BLE001 — a failed fit must never take the run down
            log.exception("fit of %d evaluations failed", len(history))
            self.display.note(f"fit failed ({type(err).__name__}: {err}); the run goes on")
            return None
        if self.sources:  # which commits of the Hub ids this prediction is about
            result["sources"] = self.sources
            partial = self.out / (FIT_FILE + ".partial")
            partial.write_text(json.dumps(result, indent=2) + "\n")
            partial.replace(self.out / FIT_FILE)
        self.metrics.set_prediction(self.run.namespace, self.run.name, result)
        if self.tracker is not None:
            from scalerl.fit.report import PLOT_FILE
            from scalerl.tracking import names

            metrics, text = names.fit_metrics(result), names.fit_text(result)
            step = int(result.get("lastStep") or 0)
            self.tracker.fit(step, metrics, text, str((self.out / PLOT_FILE).resolve()))
        self.display.note(
            f"fit: A={result['A']:.3f} C_mid={result['C_mid']:.3g} {self.run.spec.compute_unit} "
            f"B={result['B']:.2f} ({result['points']} points, {result['confidence']})"
            + (f"; A by domain: {result['A_byDomain']}" if result.get("A_byDomain") else "")
        )
        return result

    def execute(self) -> dict[str, Any] | None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.spec_path.write_text(yaml.safe_dump(self.run.model_dump(by_alias=True, mode="json")))
        signal.signal(signal.SIGTERM, _raise_interrupt)
        # Ctrl-C must stop the run whatever a library imported before (a tracker's client, an
        # engine) made of SIGINT: in the full test suite one had left it not raising.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.start_env_server()
            with self.display:
                while not self.attempt():
                    pass
        except PredictedStop as stop:
            # As the operator ends a run it condemns: Stopped, reason PredictedBelowTarget, no
            # restart. Written once the gang has stopped (attempt's finally), so that no
            # trainer rewrites status.json after it.
            FileStatus(self.out).condition("Stopped", True, PREDICTED_BELOW_TARGET, stop.reason)
            # Its predictions are kept as censored (scalerl.fit.track): a wrong stop shows.
            self.refit(read_history(self.out / HISTORY_FILE), stopped=stop.reason)
            raise
        except KeyboardInterrupt as interrupt:
            signum = getattr(interrupt, "signum", signal.SIGINT)
            raise Interrupted(self.trained_steps(), signum) from None
        finally:
            if self.env_server is not None:
                self.env_server.stop()
            if self.tracker is not None and sys.exc_info()[0] is not None:
                self.tracker.close()  # the fits so far, sent for a bounded time
        report = self.refit(read_history(self.out / HISTORY_FILE), ended=True)
        if self.tracker is not None:
            self.tracker.close(finished=True)
        return report

    def attempt(self) -> bool:
        """Run one gang to the end (True) or to a failure worth a restart (False)."""
        started_at = self.trained_steps()
        gang = self.launch()
        try:
            self.supervise(gang)
            return True
        except PeerError as err:
            # Restart only an attempt that made progress: a failure before any step (a bad
            # model, a port in use) would fail the same way again.
            limit = self.run.spec.failure_policy.max_restarts
            if self.trained_steps() <= started_at or self.restarts >= limit:
                raise PeerError(f"run failed after {self.restarts} restarts: {err}") from None
            self.restarts += 1
            self.metrics.set_restarts(self.run.namespace, self.run.name, self.restarts)
            self.display.note(
                f"restarting from the last checkpoint ({self.restarts}/{limit}): {err}"
            )
            return False
        finally:
            gang.stop()

    def trained_steps(self) -> int:
        try:
            return int(json.loads((self.out / PROGRESS_FILE).read_text())["step"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return 0


def stopped_reason(out: Path) -> str | None:
    """The message of a true `Stopped` condition in the run's status.json, if any."""
    for condition in read_status(out / STATUS_FILE).get("conditions", []):
        if condition.get("type") == "Stopped" and condition.get("status") == "True":
            return str(condition.get("message") or condition.get("reason"))
    return None


PREDICTED_BELOW_TARGET = "PredictedBelowTarget"  # the Stopped reason, as the operator's


class PredictedStop(ScaleRLError):
    """budget.stopWhen condemned the run on its prediction: it ends, without a restart."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"run stopped: {reason}")
        self.reason = reason


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, `signum`) stopped the run at a step; the same command resumes it."""

    def __init__(self, step: int, signum: int = signal.SIGINT) -> None:
        super().__init__(f"stopped at step {step}; run the same command again to resume")
        self.step, self.signum = step, int(signum)


class _Terminated(KeyboardInterrupt):
    signum = signal.SIGTERM


def _raise_interrupt(signum: int, frame: object) -> None:
    raise _Terminated  # SIGTERM stops the gang like Ctrl-C does


@dataclass(frozen=True)
class RunEnd:
    """A finished run's last fit (fit.json's data), or why none could be made."""

    report: dict[str, Any] | None
    no_fit: str | None = None


def run_local(run: ScaleRLRun, out: Path | None, *, display: bool = True) -> RunEnd:
    """Run `run` (as `load_run` reads it) to its end (or resume it) in `out` (default
    runs/<name>). Raises PredictedStop when budget.stopWhen ends it, Interrupted on Ctrl-C or
    SIGTERM."""
    out = out or Path("runs") / run.name
    hub = RunSources.of_run(out)  # a resumed run: the commits it recorded
    run = resolve_paths(run, hub)
    for _, resolved in hub.resolved:
        print(resolved.line(), flush=True)
    preflight.check(run)
    hub.write(out)
    local = LocalRun(run, out, display=display, sources=hub.records())
    report = local.execute()
    return RunEnd(report, None if report is not None else local.fit_skipped)
