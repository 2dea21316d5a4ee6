"""A run's files and their one typed record: the history of evaluations.

`history.jsonl` holds one `HistoryRow` per evaluation and is the input of `scalerl fit`. Its names
are fixed here and nowhere else: `pass_rate` is the held-out mean@k of that evaluation, correct
samples / (prompts x k) over the validation prompts, `pass_rate_se` its standard error, and
everything measured on a training batch is `train_*`. A row is built field by field (never by
merging dicts, where a later key silently wins), so one name has one meaning and one writer.

Every sample an evaluation asks for is in the denominator. One that could not be scored (the code
sandbox itself failed, the environment failed its rollout, the reward function or rubric raised)
counts as not passed and is reported: `eval_unscored` and `eval_unscored_reasons` in the row. An
evaluation with more than `MAX_UNSCORED_FRACTION` of its samples unscored measures the sandbox or
the environment as much as the model: the row says so (`fit_excluded`, the reason) and the fit
leaves it out (`scalerl.fit.report`), never silently.

`evaluations/step-<N>.jsonl` beside it holds what each evaluation scored, one line per held-out
prompt (`PromptScore`): the history's `pass_rate` is their correct / samples, which anyone can
recompute. `progress.json` is the live progress (`Progress`). After a resume the history is
rewritten from the checkpoint, so evaluations made after the checkpoint (and redone) never appear
twice.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from scalerl.errors import DataError

HISTORY_FILE = "history.jsonl"
CONSUMED_FILE = "consumed.jsonl"  # spec.data.logConsumed: the prompts each training step took
PROGRESS_FILE = "progress.json"
EVALUATIONS_DIR = "evaluations"
# More than this fraction of an evaluation's samples (prompts x k) unscored, and the evaluation is
# left out of the fit with the reason (`HistoryRow.fit_excluded`): at 10 % unscored samples the
# pass rate could be off by up to 0.1 from the model's (were they all passes), several standard
# errors of a typical evaluation, so the point would say more about the sandbox than the model.
MAX_UNSCORED_FRACTION = 0.1

# Why a sample could not be scored (PromptScore.unscored_reasons' keys).
SANDBOX = "sandbox"  # the code sandbox itself failed (no bubblewrap, the host out of memory)
REWARD_ERROR = "reward_error"  # the reward function or the environment's rubric raised
ROLLOUT_FAILED = "rollout_failed"  # the environment failed the rollout (raised, timed out, ...)


@dataclass(frozen=True)
class PromptScore:
    """What one held-out prompt scored in one evaluation: `samples` is every sample asked for
    (evaluation.generationsPerPrompt), scored or not, so `correct / samples` is its mean@k."""

    prompt_id: str
    samples: int
    correct: int  # samples that passed: reward > 0 and not truncated
    truncated: int
    domain: str = ""  # the row's domain (scalerl.generator.prompts.Example)
    # Samples that could not be scored: among `samples`, never among `correct`.
    unscored: int = 0
    unscored_reasons: dict[str, int] = field(default_factory=dict)  # why: reason -> count

    def __post_init__(self) -> None:
        counts = (self.samples, self.correct, self.truncated, self.unscored)
        if min(counts) < 0:
            raise DataError(f"prompt {self.prompt_id!r}: a negative count in {counts}")
        if self.correct + self.unscored > self.samples or self.truncated > self.samples:
            raise DataError(
                f"prompt {self.prompt_id!r}: {self.correct} correct and {self.unscored} "
                f"unscored ({self.truncated} truncated) of {self.samples} samples"
            )
        reasons = self.unscored_reasons
        if sum(reasons.values()) != self.unscored or min(reasons.values(), default=1) < 1:
            raise DataError(
                f"prompt {self.prompt_id!r}: unscored reasons {reasons} do not add up to "
                f"{self.unscored}"
            )

    @property
    def mean(self) -> float:
        return self.correct / self.samples


def add_reasons(*parts: dict[str, int]) -> dict[str, int]:
    """Counts by reason, summed over `parts` (sorted by reason, so equal totals compare equal)."""
    total: dict[str, int] = {}
    for part in parts:
        for reason, count in part.items():
            total[reason] = total.get(reason, 0) + count
    return dict(sorted(total.items()))


def reasons_text(reasons: dict[str, int]) -> str:
    """ "sandbox 3, reward_error 1": for a log line or a reason."""
    return ", ".join(f"{reason} {count}" for reason, count in reasons.items())


@dataclass(frozen=True)
class HeldOut:
    """One evaluation's held-out result, from its per-prompt scores."""

    prompts: int
    samples: int  # every sample asked for: prompts x k
    correct: int
    truncated: int
    pass_rate: float  # mean@k: correct / samples, an unscored sample counted as not passed
    stderr: float  # of pass_rate: std of the per-prompt means (ddof 1) / sqrt(prompts)
    # The same, of each domain's prompts alone, when the prompts span two or more domains.
    by_domain: dict[str, HeldOut] = field(default_factory=dict)
    unscored: int = 0  # samples that could not be scored (among `samples`)
    unscored_reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, scores: list[PromptScore]) -> HeldOut:
        if not scores:
            raise DataError("an evaluation scored no prompts")
        empty = [s.prompt_id for s in scores if s.samples == 0]
        if empty:  # every prompt is asked for k samples: none means it was never evaluated
            raise DataError(f"an evaluation has prompts with no samples: {empty[:5]}")
        domains = sorted({s.domain for s in scores})
        by_domain = (
            {d: cls.of([s for s in scores if s.domain == d]) for d in domains}
            if len(domains) > 1
            else {}
        )
        samples = sum(s.samples for s in scores)
        correct = sum(s.correct for s in scores)
        return cls(
            prompts=len(scores),
            samples=samples,
            correct=correct,
            truncated=sum(s.truncated for s in scores),
            pass_rate=correct / samples,
            stderr=standard_error([s.mean for s in scores]),
            by_domain=by_domain,
            unscored=sum(s.unscored for s in scores),
            unscored_reasons=add_reasons(*(s.unscored_reasons for s in scores)),
        )

    def fit_excluded(self) -> str | None:
        """Why this evaluation is left out of the fit (too many unscored samples); None: it is
        fitted."""
        if self.unscored <= MAX_UNSCORED_FRACTION * self.samples:
            return None
        return (
            f"{self.unscored} of {self.samples} samples could not be scored "
            f"({reasons_text(self.unscored_reasons)}), more than "
            f"{MAX_UNSCORED_FRACTION:.0%}: they count as not passed, so the pass rate "
            f"understates the model"
        )

    def domain_rates(self) -> dict[str, dict[str, Any]]:
        """history.jsonl's `pass_rate_by_domain`: each domain's mean@k, its standard error and
        counts ({} for an evaluation of one domain: `pass_rate` is that domain's)."""
        return {
            domain: {
                "pass_rate": part.pass_rate,
                "pass_rate_se": part.stderr,
                "prompts": part.prompts,
                "samples": part.samples,
                "correct": part.correct,
                "unscored": part.unscored,
            }
            for domain, part in self.by_domain.items()
        }


def standard_error(means: list[float]) -> float:
    """Standard error of the mean of `means` (0.0 for fewer than two)."""
    n = len(means)
    if n < 2:
        return 0.0
    centre = sum(means) / n
    variance = sum((m - centre) ** 2 for m in means) / (n - 1)
    return math.sqrt(variance / n)


@dataclass(frozen=True)
class TrainSummary:
    """The last training step: its batch (every group received for it) and its update."""

    pass_rate: float | None = None  # received samples with reward > 0 and not truncated
    truncation_rate: float | None = None  # received samples that hit a length limit
    # Current version - mean version of the trained (kept) tokens; None: nothing was kept.
    policy_lag: float | None = None
    entropy: float | None = None  # mean token entropy of the trained batch; None: no update
    loss: float | None = None
    grad_norm: float | None = None
    ratio_max: float | None = None
    clip_fraction: float | None = None
    # Train-inference mismatch of the update's tokens by policy lag (scalerl.recipe.mismatch):
    # {"0": {kl, abs_mean, abs_max, outside, tokens}, "1": ...}; lag 0 is mismatch alone.
    mismatch_by_lag: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HistoryRow:
    """One line of history.jsonl: one evaluation, and where the run stood when it was made."""

    step: int
    version: int
    compute: float  # training compute so far: GPU-hours (process-hours locally), 0 at step 0
    time: float  # unix time of the evaluation's end
    # Held-out: mean@k over the validation prompts (HeldOut).
    pass_rate: float
    pass_rate_se: float
    eval_prompts: int
    eval_samples: int
    eval_correct: int
    eval_truncation_rate: float
    # Samples that could not be scored, counted in eval_samples as not passed, and why
    # (reason -> count: SANDBOX, REWARD_ERROR, ROLLOUT_FAILED).
    eval_unscored: int = 0
    eval_unscored_reasons: dict[str, int] = field(default_factory=dict)
    # Why the fit leaves this evaluation out (HeldOut.fit_excluded); None: it is fitted.
    fit_excluded: str | None = None
    # Each domain's held-out mean@k when the prompts span several (HeldOut.domain_rates):
    # {domain: {pass_rate, pass_rate_se, prompts, samples, correct, unscored}}; {} for one.
    pass_rate_by_domain: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The last training step before the evaluation (None at step 0): TrainSummary.
    train_pass_rate: float | None = None
    train_truncation_rate: float | None = None
    train_policy_lag: float | None = None
    train_entropy: float | None = None
    train_loss: float | None = None
    train_grad_norm: float | None = None
    train_ratio_max: float | None = None
    train_clip_fraction: float | None = None
    train_mismatch_by_lag: dict[str, dict[str, float]] = field(default_factory=dict)
    # Run totals: trainer counters (zero_variance_groups, ...), trainer wall seconds per phase
    # (scalerl.trainer.profile) and the generators' totals; all summed over gang attempts.
    counters: dict[str, int] = field(default_factory=dict)
    trainer_seconds: dict[str, float] = field(default_factory=dict)
    generation: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        step: int,
        version: int,
        compute: float,
        time: float,
        held_out: HeldOut,
        train: TrainSummary | None,
        counters: dict[str, int],
        trainer_seconds: dict[str, float],
        generation: dict[str, float],
    ) -> HistoryRow:
        t = train or TrainSummary()  # step 0: no training yet
        return cls(
            step=step,
            version=version,
            compute=compute,
            time=time,
            pass_rate=held_out.pass_rate,
            pass_rate_se=held_out.stderr,
            eval_prompts=held_out.prompts,
            eval_samples=held_out.samples,
            eval_correct=held_out.correct,
            eval_truncation_rate=held_out.truncated / held_out.samples,
            eval_unscored=held_out.unscored,
            eval_unscored_reasons=dict(held_out.unscored_reasons),
            fit_excluded=held_out.fit_excluded(),
            pass_rate_by_domain=held_out.domain_rates(),
            train_pass_rate=t.pass_rate,
            train_truncation_rate=t.truncation_rate,
            train_policy_lag=t.policy_lag,
            train_entropy=t.entropy,
            train_loss=t.loss,
            train_grad_norm=t.grad_norm,
            train_ratio_max=t.ratio_max,
            train_clip_fraction=t.clip_fraction,
            train_mismatch_by_lag={lag: dict(f) for lag, f in t.mismatch_by_lag.items()},
            counters=dict(counters),
            trainer_seconds=dict(trainer_seconds),
            generation=dict(generation),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HistoryRow:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DataError(
                f"history row has unknown fields {unknown}: not a row this scalerl writes"
            )
        try:
            return cls(**data)
        except TypeError as err:
            raise DataError(f"history row: {err}") from None


@dataclass(frozen=True)
class Progress:
    """The run's live progress after each step (progress.json, status.progress)."""

    step: int
    version: int
    compute: float
    max_steps: int
    time: float
    train: TrainSummary | None
    eval_pass_rate: float | None  # held-out mean@k of the last evaluation
    no_signal: str | None  # why the last step learnt nothing (None: it learnt)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RunFiles:
    """The run directory's history, progress and evaluation records."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.history = run_dir / HISTORY_FILE
        self.progress = run_dir / PROGRESS_FILE
        self.consumed = run_dir / CONSUMED_FILE

    def rewrite_history(self, rows: list[dict[str, Any]]) -> None:
        atomic_write(self.history, "".join(json.dumps(r) + "\n" for r in rows))

    def append_history(self, row: dict[str, Any]) -> None:
        with self.history.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def append_consumed(self, row: dict[str, Any]) -> None:
        """One training step's prompts (`{"batch": n, "step": s, "prompts": [...]}`)."""
        with self.consumed.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def keep_consumed(self, batches: int) -> None:
        """A resumed run: the record of the first `batches` batches only, those its checkpoint
        counts (the lost attempt's later ones are taken again)."""
        if self.consumed.exists():
            rows = [r for r in read_jsonl(self.consumed) if r["batch"] < batches]
            atomic_write(self.consumed, "".join(json.dumps(r) + "\n" for r in rows))

    def write_progress(self, progress: dict[str, Any]) -> None:
        atomic_write(self.progress, json.dumps(progress))

    def write_scores(self, step: int, scores: list[PromptScore]) -> Path:
        """The evaluation at `step`, one line per prompt; replaced whole if it is redone."""
        return self._write_lines(scores_path(self.run_dir, step), [asdict(s) for s in scores])

    def write_completions(self, step: int, completions: list[dict[str, Any]]) -> Path:
        """A few completions of the evaluation at `step`, for a person to read."""
        return self._write_lines(scores_path(self.run_dir, step, ".completions"), completions)

    def _write_lines(self, path: Path, rows: list[dict[str, Any]]) -> Path:
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, "".join(json.dumps(row) + "\n" for row in rows))
        return path


def scores_path(run_dir: Path, step: int, kind: str = "") -> Path:
    """`evaluations/step-<N>{kind}.jsonl` of `run_dir` (kind "" for the per-prompt scores)."""
    return run_dir / EVALUATIONS_DIR / f"step-{step:08d}{kind}.jsonl"


def read_scores(run_dir: Path, step: int) -> list[PromptScore]:
    return [PromptScore(**row) for row in read_jsonl(scores_path(run_dir, step))]


def read_history(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file ([] when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
