"""The tracker sink: what the trainer and the fit call, and the threads that deliver to trackers.

A tracker that is slow or down never slows or stops training. `TrackerSink.log` appends the
record to the journal (a local file) and puts it on each tracker's bounded queue without
waiting; one thread per tracker delivers, retrying with backoff. When a queue is full the records
stay on disk only (a warning and `scalerl_tracker_dropped_records_total`, records dropped from
memory): the tracker's thread reads them back from the journal, in order, once it has emptied its
queue. A record a tracker refuses after every try is given up
(`scalerl_tracker_failed_records_total`). `close` waits a bounded time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from scalerl.redact import redact, redact_text
from scalerl.tracking.records import Delivered, Journal, Kind, Record, TrackedRun

log = logging.getLogger("scalerl.tracking")

CAPACITY = 10_000  # records a tracker's queue holds (a step's is a few hundred bytes)
ATTEMPTS = 5  # tries of one record before it is given up
BACKOFF_S = (0.5, 30.0)  # first and longest wait between tries (doubling)
CLOSE_TIMEOUT_S = 10.0  # what an interrupted attempt waits for the trackers at most
# A finished run waits longer: no later start will send what its journal still holds. At 10 s,
# on 2 cores at load 16, W&B had not written a resumed run's offline file when the trainer
# exited, and that attempt's steps were lost.
CLOSE_FINISHED_TIMEOUT_S = 120.0


class Tracker(Protocol):
    """One tracker backend (scalerl.tracking.to_*): opened lazily by its delivery thread."""

    name: str
    # True: on a resume the tracker writes again every step after the checkpoint's, and its
    # reader drops the copies written before (TensorBoard's purge_step).
    rewrites: bool

    def open(self, purge_step: int | None) -> None:
        """Connect; find or create the run's tracker run (`purge_step`: where a rewriting
        tracker starts again). Raises when the tracker is down."""

    def confirm(self, kind: Kind, step: int, key: str) -> bool | None:
        """Whether the tracker has metric `key` of a `kind` record at `step` (a record a kill
        left in doubt); None: it cannot tell."""

    def kept_through(self) -> int | None:
        """Once open: the last step the tracker holds for certain, where what it took may not
        all be kept (W&B buffers); None: what it took, it keeps."""

    def log(self, record: Record) -> None:
        """Deliver one record; raises on failure (delivering it again must be harmless)."""

    def close(self, finished: bool) -> None:
        """Flush and let go (`finished`: the run ended, not a restart)."""


Counter = Callable[[], None]


class Delivery:
    """One tracker's queue and the thread that empties it into the tracker."""

    def __init__(
        self,
        tracker: Tracker,
        run: TrackedRun,
        backlog: list[Record],
        on_failed: Counter,
        resume_step: int | None,
        journal: Journal,
        lock: threading.Lock,
        attempts: int = ATTEMPTS,
        backoff_s: tuple[float, float] = BACKOFF_S,
        capacity: int = CAPACITY,
        ask_first: bool = False,
    ) -> None:
        self.tracker, self.on_failed = tracker, on_failed
        # A process with no journal kept from its earlier runs (the fit Job: a new pod each
        # time) asks the tracker whether it holds a record before sending it.
        self.ask_first = ask_first
        self.attempts, self.backoff_s = attempts, backoff_s
        self.delivered = Delivered(run, tracker.name)
        self.purge_step: int | None = None
        if tracker.rewrites and resume_step is not None:
            self.purge_step = self.delivered.rewind(resume_step) + 1
        self.backlog, self.journal, self.lock = backlog, journal, lock
        self.queue: queue.Queue[Record | None] = queue.Queue(capacity)
        self.behind = False  # the queue overflowed: later records are read from the journal
        self.given_up: set[tuple[str, int]] = set()
        self.stopping = threading.Event()  # close gave up waiting: stop retrying
        self.opened = self.failing = False
        self.finished = False
        self.thread = threading.Thread(
            target=self._run, name=f"tracker-{tracker.name}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        for old in self.backlog:
            self._deliver(old)
        while (record := self.queue.get()) is not None:
            self._deliver(record)
            if self.behind and self.queue.empty():
                self._catch_up()
        if self.behind:  # closing: what the journal holds beyond the queue, first
            self._catch_up()
        if self.opened:
            try:
                self.tracker.close(self.finished)
            except Exception as err:  # noqa: BLE001 — a tracker's failure is never the run's
                log.warning(
                    "tracker %s: closing failed: %s", self.tracker.name, redact_text(str(err))
                )

    def _catch_up(self) -> None:
        """Deliver from the journal what the full queue did not take, until nothing is left;
        then the queue takes the records again."""
        while not self.stopping.is_set():
            with self.lock:
                left = [
                    r
                    for r in self.journal.read()
                    if not self.delivered.has(r) and (r.kind, r.step) not in self.given_up
                ]
                if not left:
                    self.behind = False
                    return
            for record in left:
                self._deliver(record)

    def _deliver(self, record: Record) -> None:
        if self.opened and self.delivered.has(record):
            return  # an earlier attempt of the run delivered it (known once the tracker is open)
        wait = self.backoff_s[0]
        for attempt in range(1, self.attempts + 1):
            if self.stopping.is_set():
                return
            try:
                if not self.opened:
                    self._open()
                if self.delivered.has(record) or self._held(record):
                    return
                self.delivered.begin(record)
                self.tracker.log(record)
            except Exception as err:  # noqa: BLE001 — any tracker error is retried, never raised
                self._failed(record, attempt, err)
                self.stopping.wait(wait)
                wait = min(wait * 2, self.backoff_s[1])
                continue
            self.delivered.mark(record)
            if self.failing:
                log.warning("tracker %s: delivering again", self.tracker.name)
                self.failing = False
            return
        self.on_failed()
        self.given_up.add((record.kind, record.step))  # not again in this process
        log.warning(
            "tracker %s: %s record of step %d given up after %d tries",
            self.tracker.name,
            record.kind,
            record.step,
            self.attempts,
        )

    def _held(self, record: Record) -> bool:
        """With ask_first: the tracker says it already has `record` (noted as delivered)."""
        if not self.ask_first:
            return False
        key = next(iter(record.metrics), "")
        if self.tracker.confirm(record.kind, record.step, key) is not True:
            return False
        self.delivered.mark(record)
        return True

    def _open(self) -> None:
        self.tracker.open(self.purge_step)
        doubt = self.delivered.pending
        kept = self.tracker.kept_through()
        if kept is not None:
            self.delivered.clamp(kept)  # what the tracker lost with a killed process goes again
        elif doubt is not None:
            known = self.tracker.confirm(doubt["kind"], int(doubt["step"]), str(doubt["key"]))
            # Unknown: taken as delivered; a step the kill cut is rarer than one sent twice.
            self.delivered.settle(known is not False)
        self.opened = True

    def _failed(self, record: Record, attempt: int, err: Exception) -> None:
        if not self.failing:
            log.warning(
                "tracker %s: %s (%s record, step %d, try %d of %d); training goes on, the "
                "tracker is retried in the background",
                self.tracker.name,
                redact_text(f"{type(err).__name__}: {err}")[:300],  # a URL's password
                record.kind,
                record.step,
                attempt,
                self.attempts,
            )
        self.failing = True


class TrackerSink:
    """Where a process's records go: the journal, then every tracker's delivery thread."""

    def __init__(
        self,
        trackers: list[Tracker],
        run: TrackedRun,
        *,
        resume_step: int | None,
        on_dropped: Counter = lambda: None,
        on_failed: Counter = lambda: None,
        **delivery: Any,
    ) -> None:
        self.run, self.on_dropped = run, on_dropped
        self.journal = Journal(run)
        self.lock = threading.Lock()  # the journal's end, between log and a catching-up thread
        backlog = self.journal.resume(resume_step)
        self.deliveries = [
            Delivery(t, run, backlog, on_failed, resume_step, self.journal, self.lock, **delivery)
            for t in trackers
        ]
        self.dropped = 0
        self.closed = False

    def params(self, spec: dict[str, Any]) -> None:
        """The run's spec as the trackers' parameters (config), once per run, its secrets masked
        (`scalerl.redact`: every tracker, and the journal, get the masked copy)."""
        self.log(Record("params", 0, params=redact(spec)))

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.log(Record("step", step, metrics))

    def evaluation(self, step: int, metrics: dict[str, float]) -> None:
        self.log(Record("eval", step, metrics))

    def fit(
        self, step: int, metrics: dict[str, float], text: dict[str, str], image: str | None
    ) -> None:
        self.log(Record("fit", step, metrics, text, image=image))

    def log(self, record: Record) -> None:
        """Journal the record, queue it for every tracker; never waits, never raises."""
        if self.closed:
            return
        with self.lock:
            try:
                self.journal.append(record)
            except OSError as err:
                log.warning("tracking journal %s: %s", self.journal.path, err)
            for delivery in self.deliveries:
                if not delivery.behind:
                    try:
                        delivery.queue.put_nowait(record)
                        continue
                    except queue.Full:
                        delivery.behind = True
                self._dropped(delivery.tracker.name, record.kind)

    def _dropped(self, tracker: str, kind: Kind) -> None:
        self.dropped += 1
        self.on_dropped()
        if self.dropped == 1 or self.dropped % 100 == 0:
            log.warning(
                "tracker %s is behind: %s record dropped from memory (%d so far); it is sent "
                "from the journal once the tracker catches up",
                tracker,
                kind,
                self.dropped,
            )

    def close(self, *, finished: bool = False, timeout_s: float | None = None) -> None:
        """Let the trackers catch up for at most `timeout_s` (by default CLOSE_TIMEOUT_S, or
        CLOSE_FINISHED_TIMEOUT_S for a `finished` run), then close them; what is left is in
        the journal."""
        if self.closed:
            return
        self.closed = True
        if timeout_s is None:
            timeout_s = CLOSE_FINISHED_TIMEOUT_S if finished else CLOSE_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        for delivery in self.deliveries:
            delivery.finished = finished
            try:
                delivery.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass
        for delivery in self.deliveries:
            delivery.thread.join(max(0.0, deadline - time.monotonic()))
            if delivery.thread.is_alive():
                delivery.stopping.set()
                log.warning(
                    "tracker %s: not caught up after %.0f s; the rest is in %s for the next start",
                    delivery.tracker.name,
                    timeout_s,
                    self.journal.path,
                )
