"""Fixtures shared by every test folder.

`user_model` builds what a new user brings, unlike the demo's model on purpose: EOS `<eos>`, no
BOS, a pad token, an EOS list in generation_config.json, a short context, optionally a
single-token `</think>` and a chat template.
"""

from __future__ import annotations

import os
import re
import string
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from history_rows import history_row, impossible_rows
from hypothesis import settings

from scalerl.ports import RANGE_VARIABLE, split_range
from scalerl.status.history import HistoryRow

USER_EOS, USER_PAD, USER_UNK = "<eos>", "<pad>", "<unk>"
USER_END_OF_TURN = "<|end|>"  # a second EOS, listed only in generation_config.json
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# A property test checks what holds for every input, not how fast one example runs (speed lives in
# bench/): without a deadline, a machine loaded by other work cannot fail one by its clock
# (hypothesis's default 200 ms per example did, on 2 cores shared by four agents).
settings.register_profile("scalerl", deadline=None)
settings.load_profile("scalerl")

UserModel = Callable[..., Path]
CLUSTER_TESTS = Path(__file__).parent / "cluster"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`), each worker and the processes its tests start draw ports
    from a range of their own: two workers never hand out the same port (scalerl/ports.py)."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        index = int(str(worker["workerid"]).removeprefix("gw"))
        os.environ[RANGE_VARIABLE] = split_range(index, int(worker["workercount"]))
        # And a temporary directory of their own: what one worker's sandboxes and runs leave
        # there (the sandbox's folders, checked by tests/sandbox) is never the other's.
        own = Path(tempfile.gettempdir()) / f"scalerl-tests-{worker['workerid']}"
        own.mkdir(mode=0o755, exist_ok=True)
        own.chmod(0o755)  # the sandbox's user (nobody) goes through it to its folder
        os.environ["TMPDIR"] = str(own)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


# Tests that run on one worker, one after the other, under `--dist loadgroup` (`make test`): every
# test of the real control plane (one per worker would start a second one, and an operator of
# every namespace must see only its own test's runs; they mostly wait on it, so they get a worker
# of their own), and each module's whole runs (its module-scoped run is made once, not once per
# worker its tests land on). Whole runs of different modules spread over the other workers with
# the rest: one after another they alone would outlast the suite (84 minutes of worker time).
GROUP_CLUSTER = "cluster"


# A module whose every test is slow says so once, at its top.
SLOW_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Where the run leaves out `cluster` or `slow` tests (`make test-fast`), what holds nothing
    else is not imported at all: tests/cluster/, and a module marked slow at its top. Each
    worker would import it (vLLM, the control plane's helpers) only to deselect every test."""
    leaves_out = str(config.getoption("markexpr") or "")
    if "not cluster" in leaves_out and collection_path == CLUSTER_TESTS:
        return True
    module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if "not slow" in leaves_out and module and SLOW_MODULE.search(collection_path.read_text()):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/cluster/ needs the real control plane: marked `cluster`."""
    for item in items:
        if item.path.is_relative_to(CLUSTER_TESTS):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.xdist_group(GROUP_CLUSTER))
        elif item.get_closest_marker("slow") or item.get_closest_marker("gpu"):
            runs = item.path.relative_to(CLUSTER_TESTS.parent).as_posix()
            item.add_marker(pytest.mark.xdist_group(f"runs-{runs}"))


@pytest.hookimpl(trylast=True)  # after xdist's own hook put the groups in the node ids
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` the groups must have taken: xdist puts a test's group in its node
    id, and a pytest that reads node ids elsewhere (9.2 does; hence the pin to 9.1) silently ran
    two control planes at once."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rsplit("]", 1)[-1]
    ]
    if lost:
        raise pytest.UsageError(f"pytest-xdist's groups did not take ({len(lost)}): {lost[:3]}")


def build_user_model(
    path: Path,
    *,
    think_end: str | None = None,
    max_positions: int = 64,
    chat_template: str | None = None,
) -> Path:
    """A random tiny Llama with a character-level tokenizer of its own."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    specials = [USER_PAD, USER_EOS, USER_UNK, USER_END_OF_TURN]
    characters = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(specials + characters)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=USER_UNK))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=USER_EOS, pad_token=USER_PAD, unk_token=USER_UNK
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [USER_END_OF_TURN]})
    for role in ("system", "user", "assistant"):
        tokenizer.add_tokens([f"<|{role}|>"], special_tokens=True)
    if think_end is not None:
        tokenizer.add_tokens([think_end])
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(path))
    eos, end_of_turn = tokenizer.convert_tokens_to_ids([USER_EOS, USER_END_OF_TURN])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(path), safe_serialization=True)
    GenerationConfig(
        eos_token_id=[eos, end_of_turn], pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(str(path))
    return path


@pytest.fixture
def user_model(tmp_path: Path) -> UserModel:
    """`user_model(name, **options)` builds a model folder under tmp_path (see build_user_model)."""

    def make(name: str = "model", **options: object) -> Path:
        return build_user_model(tmp_path / name, **options)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def build_model() -> Callable[..., Path]:
    """`build_user_model` itself, for fixtures that build a model once for many tests."""
    return build_user_model


@pytest.fixture(scope="session")
def chat_template() -> str:
    """The Jinja chat template `user_model(chat_template=...)` tests use."""
    return CHAT_TEMPLATE


@pytest.fixture(name="history_row")
def history_row_fixture() -> Callable[..., HistoryRow]:
    """`history_row(step, compute, pass_rate=0.3)`: one evaluation as the trainer records it."""
    return history_row


@pytest.fixture(scope="session", autouse=True)
def every_history_counts_whole_samples(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """After the session: every run any test made has held-out pass rates that count samples."""
    yield
    base = tmp_path_factory.getbasetemp()
    bad = [line for path in sorted(base.rglob("history.jsonl")) for line in impossible_rows(path)]
    assert not bad, "\n".join(bad)
