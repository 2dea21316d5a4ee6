"""Models and data by Hugging Face Hub id: `hf://org/name[@revision][/path]` for a model,
`hf://datasets/org/name[@revision][/path]` (or Kubeflow's looser `hf://org/name`) for data.

Resolved once, at the edge (`scalerl run`, `scalerl evaluate`, `scalerl validate --deep`): the
revision becomes a commit, the files of that commit are downloaded into Hugging Face's own cache
(HF_HOME / HF_HUB_CACHE), and every process gets the local snapshot folder of that commit, never
an id. A run records what it resolved (`Resolved.record`) and a resumed run asks for the recorded
commit again (`pinned`), so a branch that moved since does not change what it trains on.

The environment is read when a source is resolved, not when huggingface_hub is imported:
HF_TOKEN (the library reads it itself), HF_ENDPOINT (a mirror), HF_HUB_OFFLINE=1 (the cache
only). Every failure is one InputError line naming the id and what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from scalerl.errors import InputError
from scalerl.spec import HUB_PREFIX

if TYPE_CHECKING:
    from scalerl.spec import RunSpec

PREFIX = HUB_PREFIX
DEFAULT_REVISION = "main"
Kind = Literal["model", "dataset"]

# What scalerl.datafile reads (JSONL by default, Parquet by suffix).
DATA_SUFFIXES = (".jsonl", ".parquet", ".pq")
# Weights of other frameworks a model repo may carry beside its PyTorch ones: never loaded here.
MODEL_IGNORE = ["*.msgpack", "*.h5", "*.ot", "*.onnx", "*.onnx_data", "*.tflite", "*.gguf"]
# The split a data field reads when its source names none: training reads `train`, held-out
# data the first of `validation`, `test` that has files.
TRAIN_SPLITS = ("train",)
VALIDATION_SPLITS = ("validation", "test")


def is_hub(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


@dataclass(frozen=True)
class HubRef:
    """A parsed hf:// value: which repo, which revision (None: the default branch), where in it."""

    kind: Kind
    repo_id: str
    revision: str | None
    path_in_repo: str


def parse(uri: str, kind: Kind) -> HubRef:
    """`uri` read by huggingface_hub's own parser; a dataset field takes `hf://org/name` as a
    dataset (Kubeflow's form). A malformed id, or a model where data is wanted (or the other way
    round), is an InputError naming the value."""
    from huggingface_hub import parse_hf_uri
    from huggingface_hub.errors import HfUriError

    if not is_hub(uri):
        raise InputError(f"{uri!r}: a Hub id starts with {PREFIX}")
    try:
        parsed = parse_hf_uri(uri)
    except HfUriError as err:
        raise InputError(f"{uri}: not a Hub id ({_first_line(err)}); {_GRAMMAR}") from None
    if parsed.type == "model" and kind == "dataset" and not uri.startswith(PREFIX + "models/"):
        return HubRef("dataset", parsed.id, parsed.revision, parsed.path_in_repo)
    if parsed.type != kind:
        raise InputError(f"{uri}: a {parsed.type} id where a {kind} is wanted; {_GRAMMAR}")
    return HubRef(kind, parsed.id, parsed.revision, parsed.path_in_repo)


_GRAMMAR = (
    "use hf://org/name[@revision] for a model, hf://datasets/org/name[@revision][/path] for data"
)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


@dataclass(frozen=True)
class Resolved:
    """One hf:// source as a run uses it: the commit its revision named and the local snapshot
    of that commit (`path`: the model folder; `files`: a data source's files, in order)."""

    uri: str
    kind: Kind
    repo: str
    revision: str
    commit: str
    path: str
    files: tuple[str, ...] = ()
    split: str | None = None
    data_files: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """The entry of sources.json and fit.json's `sources`."""
        entry = asdict(self)
        entry["files"], entry["dataFiles"] = list(self.files), list(entry.pop("data_files"))
        return entry

    def line(self) -> str:
        """The line `scalerl run` prints for the source when it starts."""
        where = self.path if not self.files else f"{len(self.files)} file(s) in {self.path}"
        return (
            f"{self.uri}: {self.kind} {self.repo}@{self.revision} = commit {self.commit} ({where})"
        )


def resolve_model(uri: str, pinned: str | None = None) -> Resolved:
    """A model's snapshot (its sub-folder when the id names one): downloaded once into the
    cache, the commit `pinned` when a run recorded one."""
    ref = parse(uri, "model")
    sub = ref.path_in_repo.strip("/")
    allow = [f"{sub}/*"] if sub else None
    commit, folder = _snapshot(uri, ref, pinned, allow=allow, ignore=MODEL_IGNORE)
    path = folder / sub if sub else folder
    if not (path / "config.json").is_file():
        raise InputError(f"{uri}: no config.json at commit {commit}; not a Hugging Face model")
    return Resolved(uri, "model", ref.repo_id, ref.revision or DEFAULT_REVISION, commit, str(path))


def resolve_dataset(
    uri: str,
    split: str | None = None,
    data_files: Sequence[str] = (),
    pinned: str | None = None,
    default_splits: Sequence[str] = TRAIN_SPLITS,
) -> Resolved:
    """A data source's files (JSONL or Parquet) at one commit: `data_files` (globs in the repo),
    else the path the id names, else `split`'s files (`train-*.parquet`, `data/train.jsonl`,
    `train/…`), else the first of `default_splits` that has files."""
    ref = parse(uri, "dataset")
    sub = ref.path_in_repo.strip("/")
    splits = [split] if split else list(default_splits)
    if data_files:
        patterns = [_under(sub, p) for p in data_files]
    elif sub.endswith(DATA_SUFFIXES):
        patterns = [sub]
    else:
        patterns = [_under(sub, p) for s in splits for p in split_patterns(s)]
    commit, folder = _snapshot(uri, ref, pinned, allow=patterns, ignore=None)
    if data_files or sub.endswith(DATA_SUFFIXES):
        files = _data_files(folder, patterns)
    else:
        files = _first_split(folder, sub, splits)
    if not files:
        wanted = f"dataFiles {list(data_files)}" if data_files else f"split {' or '.join(splits)}"
        raise InputError(
            f"{uri}: no JSONL or Parquet file of {wanted} at commit {commit}; name the files "
            "with dataFiles (globs in the repo) or the split with split"
        )
    return Resolved(
        uri, "dataset", ref.repo_id, ref.revision or DEFAULT_REVISION, commit, str(folder),
        tuple(str(folder / f) for f in files), split, tuple(data_files),
    )  # fmt: skip


def split_patterns(split: str) -> list[str]:
    """Globs of a split's data files, as the Hub lays them out: `train.jsonl`,
    `train-00000-of-00002.parquet`, `data/train-….parquet`, `default/train/0000.parquet`."""
    stems = [split, f"{split}[-_./]*"]
    return [
        f"{top}{stem}{suffix}" for top in ("", "*/") for stem in stems for suffix in DATA_SUFFIXES
    ]


def _under(sub: str, pattern: str) -> str:
    return f"{sub}/{pattern}" if sub else pattern


def _data_files(folder: Path, patterns: Sequence[str]) -> list[str]:
    """The files of the snapshot (paths in the repo, sorted) that match a pattern and that the
    loaders read. The snapshot may hold other files of the same commit, fetched for another
    field."""
    found = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(
        f for f in found if f.endswith(DATA_SUFFIXES) and any(fnmatch(f, p) for p in patterns)
    )


def _first_split(folder: Path, sub: str, splits: Sequence[str]) -> list[str]:
    for split in splits:
        files = _data_files(folder, [_under(sub, p) for p in split_patterns(split)])
        if files:
            return files
    return []


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def endpoint() -> str:
    """The Hub the ids are read from: HF_ENDPOINT (a mirror), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def cache_dir() -> str | None:
    """HF_HUB_CACHE, else HF_HOME/hub, else the library's default (read now, not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None


# Seconds a request may wait for the Hub's answer: a server that accepts and never answers
# fails as fast as one that refuses.
TIMEOUT_S = 10.0


def _snapshot(
    uri: str, ref: HubRef, pinned: str | None, *, allow: list[str] | None, ignore: list[str] | None
) -> tuple[str, Path]:
    """(commit, snapshot folder) of `ref`'s revision, or of `pinned`; downloaded into the cache
    unless already there (or HF_HUB_OFFLINE=1: the cache only)."""
    from huggingface_hub import snapshot_download

    offline = _offline()
    revision = pinned or ref.revision or DEFAULT_REVISION
    try:
        if not offline and not pinned:
            revision = _commit_of(ref, revision)
        folder = snapshot_download(
            ref.repo_id,
            repo_type=ref.kind,
            revision=revision,
            cache_dir=cache_dir(),
            endpoint=endpoint(),
            local_files_only=offline,
            allow_patterns=allow,
            ignore_patterns=ignore,
            etag_timeout=TIMEOUT_S,
        )
    except Exception as err:  # noqa: BLE001 — every library error becomes the line a user reads
        from huggingface_hub.errors import RevisionNotFoundError

        if pinned and isinstance(err, RevisionNotFoundError):
            raise InputError(
                f"{uri}: commit {pinned}, recorded in the run's {SOURCES_FILE}, is not on "
                f"{endpoint()} any more; remove {SOURCES_FILE} to resolve the revision again"
            ) from None
        raise InputError(explain(uri, err, offline)) from None
    path = Path(folder)
    return path.name, path  # the cache's snapshot folders are named by commit


def _commit_of(ref: HubRef, revision: str) -> str:
    """The commit `revision` names now (one API call, no retries, bounded wait)."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint()).repo_info(
        ref.repo_id, repo_type=ref.kind, revision=revision, timeout=TIMEOUT_S
    )
    if not info.sha:
        raise InputError(f"{endpoint()} gave no commit for {ref.repo_id}@{revision}")
    _remember(ref, revision, str(info.sha))
    return str(info.sha)


def _remember(ref: HubRef, revision: str, commit: str) -> None:
    """The cache's `refs/REVISION` file, as snapshot_download writes it, so that HF_HUB_OFFLINE=1
    finds the commit by the revision's name later (snapshot_download writes none when it is
    given the commit itself, as here)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

    if REGEX_COMMIT_HASH.fullmatch(revision):
        return
    storage = Path(cache_dir() or constants.HF_HUB_CACHE).expanduser()
    path = storage / repo_folder_name(repo_id=ref.repo_id, repo_type=ref.kind) / "refs" / revision
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(commit)
    partial.replace(path)


def explain(uri: str, err: Exception, offline: bool) -> str:
    """The one line for a failed resolution: what happened to `uri` and what to do."""
    import httpx2
    from huggingface_hub import errors

    if isinstance(err, InputError):
        return str(err)
    hub = endpoint()
    status = getattr(getattr(err, "response", None), "status_code", None)
    if offline or isinstance(err, errors.OfflineModeIsEnabled):
        where = cache_dir() or "the default Hugging Face cache"
        return (
            f"{uri}: not in the cache ({where}) and HF_HUB_OFFLINE=1; resolve it once online "
            "(scalerl validate --deep), or point HF_HOME at a filled cache"
        )
    if isinstance(err, errors.RevisionNotFoundError):
        return f"{uri}: no such revision on {hub}; name a branch, tag or commit that exists"
    if isinstance(err, errors.GatedRepoError):
        return (
            f"{uri}: gated on {hub}; accept its conditions on the Hub and set HF_TOKEN to a "
            "token of that account"
        )
    if isinstance(err, errors.RepositoryNotFoundError):
        token = "HF_TOKEN is set but cannot read it" if _has_token() else "set HF_TOKEN if private"
        return f"{uri}: no such repository on {hub}, or it is private or gated ({token})"
    if status == 401:  # the Hub's answer to a token it does not know, whatever the repo
        return (
            f"{uri}: {hub} refused HF_TOKEN (401: invalid or expired); set a valid one or unset it"
        )
    if status == 403:
        return f"{uri}: {hub} refused access (403); set HF_TOKEN to a token that can read it"
    if status == 429:
        return (
            f"{uri}: rate limited by {hub} (429); wait and retry, set HF_TOKEN (higher limits), "
            "or fill the cache once and run with HF_HUB_OFFLINE=1"
        )
    if isinstance(err, httpx2.TransportError) or isinstance(
        err.__cause__ or err.__context__, httpx2.TransportError
    ):
        return (
            f"{uri}: cannot reach {hub} ({type(err).__name__}); check the network or "
            "HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the cache"
        )
    if isinstance(err, errors.LocalEntryNotFoundError | errors.HfHubHTTPError):
        what = f"HTTP {status}" if status else _first_line(err)
        return f"{uri}: cannot download from {hub} ({what}); check the network or HF_ENDPOINT"
    return f"{uri}: cannot resolve ({type(err).__name__}: {_first_line(err)})"


def _has_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


SOURCES_FILE = "sources.json"  # in the run directory: what each hf:// source resolved to


class RunSources:
    """The hf:// sources of one run, resolved at its start: a source the run directory's
    sources.json already records (same id, split and files) loads its recorded commit."""

    def __init__(self, recorded: list[dict[str, Any]] | None = None) -> None:
        self.recorded = recorded or []
        self.resolved: list[tuple[str, Resolved]] = []  # (the spec field, what it resolved to)

    @classmethod
    def of_run(cls, out: Path | None) -> RunSources:
        path = None if out is None else out / SOURCES_FILE
        if path is None or not path.is_file():
            return cls()
        try:
            recorded = json.loads(path.read_text())["sources"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise InputError(f"{path}: unreadable ({err}); remove it to resolve again") from None
        return cls(list(recorded))

    def pinned(
        self, uri: str, split: str | None = None, data_files: Sequence[str] = ()
    ) -> str | None:
        for entry in self.recorded:
            same = (entry.get("uri"), entry.get("split"), list(entry.get("dataFiles") or []))
            if same == (uri, split, list(data_files)):
                return str(entry["commit"])
        return None

    def model(self, field: str, uri: str) -> str:
        """The local folder of the model `uri` names."""
        resolved = resolve_model(uri, self.pinned(uri))
        self.resolved.append((field, resolved))
        return resolved.path

    def dataset(
        self,
        field: str,
        uri: str,
        split: str | None = None,
        data_files: Sequence[str] = (),
        default_splits: Sequence[str] = TRAIN_SPLITS,
    ) -> list[str]:
        """The local files of the data source `uri` names, in order."""
        pinned = self.pinned(uri, split, data_files)
        resolved = resolve_dataset(uri, split, data_files, pinned, default_splits)
        self.resolved.append((field, resolved))
        return list(resolved.files)

    def records(self) -> list[dict[str, Any]]:
        return [{"field": field, **r.record()} for field, r in self.resolved]

    def write(self, out: Path) -> None:
        """sources.json in the run directory (replaced whole); none when the run has no hf://
        source (any left from an earlier start whose spec had some is removed)."""
        if not self.resolved:
            (out / SOURCES_FILE).unlink(missing_ok=True)
            return
        out.mkdir(parents=True, exist_ok=True)
        partial = out / (SOURCES_FILE + ".partial")
        partial.write_text(json.dumps({"sources": self.records()}, indent=2) + "\n")
        partial.replace(out / SOURCES_FILE)


def id_problems(spec: RunSpec) -> list[str]:
    """One line per hf:// value of `spec` that is not a well-formed id of the kind its field
    takes (checked without the network: `scalerl validate`)."""
    fields: list[tuple[str, str, Kind]] = [("spec.model.path", spec.model.path, "model")]
    for name, sources in (
        ("spec.data.train", spec.data.train_sources()),
        ("spec.data.validation.path", spec.data.held_out()),
    ):
        fields += [(name, s.path, "dataset") for s in sources]
    problems = []
    for name, value, kind in fields:
        if not is_hub(value):
            continue
        try:
            parse(value, kind)
        except InputError as err:
            problems.append(f"{name}: {err}")
    return problems
