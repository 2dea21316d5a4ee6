"""A real Prometheus server (Debian's `prometheus`) on loopback, scraping a local run.

The run writes its endpoints to `prometheus-targets.json` (file-based discovery), so the server
finds every process of every gang attempt as a cluster's PodMonitor would.

    with Prometheus(tmp_path, run_dir / "prometheus-targets.json") as prom:
        prom.query('sum by (run) (scalerl_generated_sequences_total)')
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from scalerl.ports import free_port

SCRAPE_INTERVAL_S = 1


def binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    def __init__(self, workdir: Path, targets: Path, rule_files: tuple[Path, ...] = ()) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": "scalerl",
                    "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                }
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        command = [
            str(binary()),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout_s=30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None and self.process.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {timeout_s} s:\n{self.log.read_text()}")

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (at `at`, seconds since the epoch, or now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        """A range query's result matrix: one entry per series, `values` as [time, "value"]."""
        params = {"query": expr, "start": start, "end": end, "step": step_s}
        url = f"{self.url}/api/v1/query_range?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    def rules(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/rules", timeout=10) as response:
            return json.loads(response.read())["data"]["groups"]  # type: ignore[no-any-return]
