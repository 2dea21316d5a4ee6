"""The independent evaluator (`scalerl.hfeval`, `scalerl evaluate`) against exact computations.

Where the pass rate can be computed without sampling it is: the demo's base model's probability
of writing the right completion (teacher forcing), the argmax completion in the limit T -> 0, and
a model whose next-token distribution does not depend on the context, for which every rule of
scalerl/generator/length.py (cutoff window, interruption phrase, answer budget, EOS while thinking,
truncation) gives pass and truncation probabilities by enumeration. Sampled rates must agree with
them within 4 standard errors (computed from the exact per-prompt probabilities).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.cli import main
from scalerl.demo.tokenizer import EOS, THINK_END, build_tokenizer
from scalerl.errors import InputError
from scalerl.hfeval import HeldOut, evaluate_checkpoint, iter_checkpoints, load_model, load_spec
from scalerl.spec import API_VERSION, ScaleRLRun, parse_run

ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = ROOT / "examples" / "local.yaml"
CHAT_SPEC = ROOT / "examples" / "chat-arith.yaml"


def variant(run: ScaleRLRun, **changes: Any) -> ScaleRLRun:
    """`run` with fields changed, named by dotted camelCase paths under spec
    (`variant(run, **{"recipe.length.answerBudget": 1})`)."""
    data = run.model_dump(by_alias=True, mode="json")
    for dotted, value in changes.items():
        *parents, name = dotted.split(".")
        node = data["spec"]
        for parent in parents:
            node = node[parent]
        node[name] = value
    return ScaleRLRun.model_validate(data)


def within(rate: float, expected: list[float], k: int, above: float = 0.0) -> bool:
    """`rate`, a mean over k samples of each prompt, is within 4 standard errors of the mean of
    the prompts' exact probabilities `expected` (up to `above` more: mass the exact value leaves
    out)."""
    sd = math.sqrt(sum(p * (1 - p) for p in expected) / k) / len(expected)
    return -4 * sd <= rate - statistics.fmean(expected) <= 4 * sd + above


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Any:
    """Sampling these tiny models is many small matmuls: a second torch thread gains little and,
    on cores shared with other jobs, can cost ten times the time waiting for a busy core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def demo() -> tuple[ScaleRLRun, HeldOut, Any]:
    """The demo run (`builtin:` paths built and cached), its held-out set and base model."""
    from transformers import AutoTokenizer

    run = load_spec(DEMO_SPEC)
    path = run.spec.model.path
    tokenizer = AutoTokenizer.from_pretrained(path)
    return run, HeldOut.for_run(run, tokenizer, path), load_model(path)


@torch.inference_mode()
def completion_probability(
    model: Any, prompts: list[list[int]], ends: list[list[int]]
) -> list[float]:
    """P(completion | prompt) for each pair, by one teacher-forced forward pass each."""
    out = []
    for prompt, end in zip(prompts, ends, strict=True):
        ids = torch.tensor([prompt + end])
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
        out.append(math.exp(sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(end))))
    return out


# --- the demo's base model -----------------------------------------------------------------


def test_demo_pass_rate_matches_the_exact_probability_of_the_right_completion(demo) -> None:
    # The demo model writes `</think>`, the reversed word and EOS in all but ~0.2 % of samples
    # (the rest: stray thinking or punctuation, none of it seen passing in 4096 samples), so
    # P(pass) is P(that completion) (exact) plus at most that sliver.
    run, held, model = demo
    tokenizer = held.tokens.tokenizer
    think, eos = held.tokens.think_end_id, tokenizer.eos_token_id
    right = [
        [think, *tokenizer(e.answer, add_special_tokens=False).input_ids, eos]
        for e in held.examples
    ]
    exact = completion_probability(model, [list(p) for p in held.prompt_ids], right)
    k = 32
    result = held.evaluate(model, k, seed=1)
    assert 0.15 < statistics.fmean(exact) < 0.25  # the bench's "exact 0.187" (on 256 prompts)
    assert within(result.pass_rate, exact, k, above=0.002), result.pass_rate
    # Per prompt too: records attributed to the wrong prompt would blow this up (chi-square with
    # 128 degrees of freedom: mean 128, sd 16).
    chi2 = sum(
        (r.correct - k * p) ** 2 / (k * p * (1 - p))
        for r, p in zip(result.per_prompt, exact, strict=True)
    )
    assert chi2 < 128 + 5 * 16, chi2


@torch.inference_mode()
def greedy_completion(model: Any, prompt: list[int], most: int, eos: int) -> list[int]:
    """Argmax decoding, one unpadded sequence, a full forward pass per token."""
    ids = list(prompt)
    while len(ids) - len(prompt) < most:
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        if ids[-1] == eos:
            break
    return ids[len(prompt) :]


def test_code_is_scored_with_the_runs_own_limits(demo) -> None:
    run, _, _ = demo
    limited = variant(run, **{"data.reward": "code", "data.code": {"testTimeoutSeconds": 0.3}})
    held = HeldOut.for_run(limited, load_tokenizer(run), run.spec.model.path, prompts=1)
    looping = "def f(x):\n    while True:\n        pass\n"
    reference = json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [1]})
    started = time.monotonic()
    assert held.rewards["code"](looping, reference) == -1.0
    assert time.monotonic() - started < 3.0  # its 0.3 s, not the default 6 s a test may take


def test_temperature_near_zero_samples_the_argmax_completion(demo) -> None:
    # The demo's argmax completion is `</think>`, the right word, EOS: 5 to 7 tokens. With an
    # answer budget of 5 tokens (EOS included), 3- and 4-letter words pass, 5-letter ones are
    # truncated one token short.
    run, _, model = demo
    cold = variant(run, **{"recipe.sampling.temperature": 1e-4, "recipe.length.answerBudget": 5})
    prompts = 32
    result = evaluate_checkpoint(run.spec.model.path, cold, k=3, prompts=prompts, seed=0)
    held = HeldOut.for_run(cold, load_tokenizer(run), run.spec.model.path, prompts)
    tokenizer = held.tokens.tokenizer
    passed, truncated = [], []
    for example, prompt in zip(held.examples, held.prompt_ids, strict=True):
        ids = greedy_completion(model, list(prompt), 1 + 16, tokenizer.eos_token_id)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert text.startswith(THINK_END) and ids[-1] == tokenizer.eos_token_id, text
        fits = len(ids) - 1 <= 5
        passed.append(3 * (fits and text.removeprefix(THINK_END) == example.answer))
        truncated.append(3 * (not fits))
    assert [r.correct for r in result.per_prompt] == passed
    assert [r.truncated for r in result.per_prompt] == truncated
    assert 0 < sum(passed) < 3 * prompts and sum(truncated) > 0  # the test tells them apart


def test_top_k_one_samples_the_argmax_completion_as_temperature_near_zero(demo: Any) -> None:
    # The filters reach HF's sampler: top-k 1 at temperature 1 is the argmax, as temperature ~0.
    run, _, _ = demo
    budget = {"recipe.length.answerBudget": 5}
    cold = variant(run, **{"recipe.sampling.temperature": 1e-4}, **budget)
    top1 = variant(run, **{"recipe.sampling.topK": 1}, **budget)
    plain = variant(run, **budget)
    results = [
        evaluate_checkpoint(run.spec.model.path, v, k=3, prompts=32, seed=0)
        for v in (cold, top1, plain)
    ]
    counts = [[(r.correct, r.truncated) for r in result.per_prompt] for result in results]
    assert counts[1] == counts[0] != counts[2]
    # The result says what it sampled with (scalerl evaluate --json prints it).
    assert results[1].to_dict()["filters"] == {"top_p": 1.0, "top_k": 1, "min_p": 0.0}
    assert results[2].filters.on is False


def load_tokenizer(run: ScaleRLRun) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.spec.model.path)


def test_records_add_up_to_the_totals(demo) -> None:
    run, held, model = demo
    result = held.evaluate(model, 8, seed=3)
    records = result.per_prompt
    assert [r.prompt_id for r in records] == [e.id for e in held.examples]
    assert result.prompts == len(records) == run.spec.data.validation.prompts == 128
    assert all(r.samples == 8 for r in records)
    assert sum(r.samples for r in records) == result.samples == 1024
    assert sum(r.correct for r in records) == result.correct
    assert sum(r.truncated for r in records) == result.truncated
    assert result.pass_rate * result.samples == pytest.approx(round(result.pass_rate * 1024))
    assert round(result.pass_rate * result.samples) == result.correct
    means = [r.correct / r.samples for r in records]
    assert result.stderr == pytest.approx(statistics.stdev(means) / math.sqrt(128))
    assert result.summary() == (
        f"pass rate {result.pass_rate:.3f} ± {result.stderr:.3f} "
        "(mean@8 over 128 prompts, 1024 samples)"
    )
    one = HeldOut.for_run(run, held.tokens.tokenizer, run.spec.model.path, prompts=1)
    assert one.evaluate(model, 8, seed=3).stderr == 0.0  # as history.jsonl has it


def test_same_seed_same_samples_and_the_callers_rng_is_untouched(demo) -> None:
    _, held, model = demo
    before = torch.get_rng_state()
    first, again = held.evaluate(model, 4, seed=7), held.evaluate(model, 4, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert first.per_prompt == again.per_prompt
    other = held.evaluate(model, 4, seed=8)
    assert other.per_prompt != first.per_prompt


def test_an_answer_budget_of_one_token_truncates_every_answer(demo) -> None:
    # `</think>` then one answer token: a letter (no room left for EOS) is truncated; only EOS
    # at once ends in time, with an empty answer. So nothing passes, and the truncated share is
    # at least P(`</think>`, then not EOS) (exact), less sampling noise.
    run, _, model = demo
    tight = variant(run, **{"recipe.length.answerBudget": 1})
    result = evaluate_checkpoint(run.spec.model.path, tight, k=8, seed=0)
    held = HeldOut.for_run(tight, load_tokenizer(run), run.spec.model.path)
    think, eos = held.tokens.think_end_id, held.tokens.tokenizer.eos_token_id
    prompts = [list(p) for p in held.prompt_ids]
    closing = completion_probability(model, prompts, [[think]] * len(prompts))
    closing_then_eos = completion_probability(model, prompts, [[think, eos]] * len(prompts))
    least = [c - e for c, e in zip(closing, closing_then_eos, strict=True)]
    assert result.correct == 0 and result.pass_rate == 0.0
    assert result.truncated / result.samples >= statistics.fmean(least) - 0.01
    assert sum(r.truncated for r in result.per_prompt) == result.truncated


# --- a model whose next token does not depend on the context --------------------------------

PROBABILITIES = {THINK_END: 0.2, EOS: 0.3, "a": 0.45, "b": 0.05}
ANSWERS = ("a", "aa")
SAMPLES = 1024  # per prompt, 16 prompts


def build_context_free(root: Path, probabilities: dict[str, float]) -> Path:
    """A Llama whose every next-token distribution is `probabilities`, and a task for it.

    Constant embeddings and zeroed residual writes make the final hidden state the same vector
    of ones at every position; the head's row of token t is log p(t) / hidden (others -1e4, which
    softmax makes exactly 0).
    """
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(root / "model"))
    hidden = 8
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    logits = torch.full((len(tokenizer),), -1e4)
    for token, p in probabilities.items():
        logits[tokenizer.convert_tokens_to_ids(token)] = math.log(p)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(logits[:, None].expand(-1, hidden) / hidden)
    model.save_pretrained(str(root / "model"))
    for name, count in (("train", 4), ("val", 16)):
        rows = [
            {"id": f"{name}-{i}", "prompt": f"x{i}", "answer": ANSWERS[i % len(ANSWERS)]}
            for i in range(count)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def context_free(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_context_free(tmp_path_factory.mktemp("context-free"), PROBABILITIES)


def context_free_run(root: Path, *, think_end: str | None, length: dict[str, Any]) -> ScaleRLRun:
    return parse_run(
        {
            "apiVersion": API_VERSION,
            "kind": "ScaleRLRun",
            "metadata": {"name": "context-free"},
            "spec": {
                "model": {"path": str(root / "model"), "dtype": "float32", "thinkEnd": think_end},
                "data": {
                    "train": str(root / "train.jsonl"),
                    "validation": {"path": str(root / "val.jsonl"), "prompts": 16},
                    "reward": "exact",
                },
                "recipe": {"length": {"maxPromptTokens": 8, **length}},
                "evaluation": {"generationsPerPrompt": SAMPLES},
            },
        }
    )


def exact_rates(
    reference: str, *, thinks: bool, window: tuple[int, int], interrupt: bool, answer_budget: int
) -> tuple[float, float]:
    """(P(pass), P(truncated)) of one sample, enumerated from the rules of length.py: think up to
    the cutoff (uniform in `window`); `</think>` in time opens the answer, EOS ends the sample
    with no answer; at the cutoff the phrase (ending in `</think>`) opens the answer, or without
    interruption the sample is truncated; the answer is what follows the last `</think>` and
    ends with EOS within `answer_budget` tokens, else it is truncated."""

    def answer(left: int, text: str) -> tuple[float, float]:
        if left == 0:
            return 0.0, 1.0
        passed = truncated = 0.0
        for token, p in PROBABILITIES.items():
            if token == EOS:
                passed += p * (text == reference)
                continue
            after = "" if thinks and token == THINK_END else text + token
            a, t = answer(left - 1, after)
            passed, truncated = passed + p * a, truncated + p * t
        return passed, truncated

    def thinking(made: int, cutoff: int) -> tuple[float, float]:
        if made == cutoff:
            return answer(answer_budget, "") if interrupt else (0.0, 1.0)
        passed = truncated = 0.0
        for token, p in PROBABILITIES.items():
            if token == EOS:
                continue  # complete, no answer: neither passed nor truncated
            a, t = answer(answer_budget, "") if token == THINK_END else thinking(made + 1, cutoff)
            passed, truncated = passed + p * a, truncated + p * t
        return passed, truncated

    if not thinks:
        return answer(answer_budget, "")
    cutoffs = range(window[0], window[1] + 1)
    rates = [thinking(0, c) for c in cutoffs]
    return statistics.fmean(r[0] for r in rates), statistics.fmean(r[1] for r in rates)


CASES = {
    "interrupted": (
        THINK_END,
        {
            "thinkingBudget": 3,
            "answerBudget": 3,
            "interruption": {"enabled": True, "window": [1, 3]},
        },
    ),
    "thinking-budget": (
        THINK_END,
        {"thinkingBudget": 2, "answerBudget": 2, "interruption": {"enabled": False}},
    ),
    "no-thinking": (None, {"answerBudget": 3, "interruption": {"enabled": False}}),
}


@pytest.mark.parametrize("case", CASES)
def test_context_free_model_matches_the_enumerated_rates(context_free: Path, case: str) -> None:
    think_end, length = CASES[case]
    run = context_free_run(context_free, think_end=think_end, length=length)
    budget = length.get("thinkingBudget", 0)
    interruption = length["interruption"]
    rules = {
        "thinks": think_end is not None,
        "window": tuple(interruption.get("window", (budget, budget))),
        "interrupt": interruption["enabled"],
        "answer_budget": length["answerBudget"],
    }
    k = run.spec.evaluation.generations_per_prompt
    result = evaluate_checkpoint(run.spec.model.path, run, seed=0)
    exact = [exact_rates(ANSWERS[i % len(ANSWERS)], **rules) for i in range(result.prompts)]  # type: ignore[arg-type]
    passed, truncated = [e[0] for e in exact], [e[1] for e in exact]
    assert result.samples == 16 * k
    assert within(result.pass_rate, passed, k), (result.pass_rate, statistics.fmean(passed))
    assert within(result.truncated / result.samples, truncated, k)
    assert statistics.fmean(passed) > 0.01 and statistics.fmean(truncated) > 0.1


@pytest.mark.parametrize("interrupt", [True, False])
def test_thinking_is_cut_at_a_cutoff_uniform_in_the_window(tmp_path: Path, interrupt: bool) -> None:
    # A model that only ever writes "a" never closes its thinking: each sample is "a" up to its
    # cutoff, then (interruption on) the phrase and "a" up to the answer budget, truncated.
    root = build_context_free(tmp_path, {"a": 1.0})
    window = {"enabled": True, "window": [2, 6]} if interrupt else {"enabled": False}
    length = {"thinkingBudget": 6, "answerBudget": 3, "interruption": window}
    run = context_free_run(root, think_end=THINK_END, length=length)
    held = HeldOut.for_run(run, load_tokenizer(run), run.spec.model.path, prompts=4)
    a = held.tokens.tokenizer.convert_tokens_to_ids("a")
    phrase = list(held.budgets.phrase_ids)
    completions = held.sample(load_model(run.spec.model.path), 200, seed=0)
    assert len(completions) == 800 and all(c.truncated for c in completions)
    if not interrupt:
        assert all(c.ids == [a] * 6 for c in completions)
        return
    assert phrase[-1] == held.tokens.think_end_id
    cutoffs = []
    for c in completions:
        thinking = len(c.ids) - len(phrase) - 3
        assert c.ids == [a] * thinking + phrase + [a] * 3
        cutoffs.append(thinking)
    counts = [cutoffs.count(n) for n in range(2, 7)]
    assert sum(counts) == 800  # every cutoff in [2, 6], each about 1/5 of them (sd 11)
    assert all(abs(n - 160) < 5 * 11.4 for n in counts), counts


def test_the_enumeration_tells_the_rules_apart() -> None:
    # The cases above could not pass with a rule dropped: each changes an exact rate by more
    # than 8 standard errors of the sampled one, so a sampler without it would land outside 4.
    rules = {"thinks": True, "window": (1, 3), "interrupt": True, "answer_budget": 3}
    # (The window is checked directly, above: its effect on the rates here is too small.)
    for change in ({"interrupt": False}, {"answer_budget": 2}):
        base = [exact_rates(a, **rules) for a in ANSWERS]  # type: ignore[arg-type]
        other = [exact_rates(a, **{**rules, **change}) for a in ANSWERS]  # type: ignore[arg-type]
        apart = []
        for which in (0, 1):  # pass, truncation
            expected = [r[which] for r in base]
            sd = math.sqrt(sum(p * (1 - p) for p in expected) / SAMPLES) / len(expected)
            gap = abs(statistics.fmean(expected) - statistics.fmean(r[which] for r in other))
            apart.append(gap / sd)
        assert max(apart) > 8, (change, apart)


# --- chat-arith: another tokenizer, two EOS ids, a chat template, no thinking ---------------


def test_chat_arith_matches_the_exact_probability_of_the_right_answer() -> None:
    run = load_spec(CHAT_SPEC)
    path = run.spec.model.path
    tokenizer = load_tokenizer(run)
    held = HeldOut.for_run(run, tokenizer, path, prompts=64)
    model = load_model(path)
    ends = sorted(held.budgets.eos_ids)
    assert len(ends) == 2 and tokenizer.eos_token_id in ends  # <|end|> and <|endoftext|>
    assert held.tokens.think_end_id is None
    exact = [0.0] * len(held.examples)
    for end in ends:
        right = [
            tokenizer(e.answer, add_special_tokens=False).input_ids + [end] for e in held.examples
        ]
        for i, p in enumerate(
            completion_probability(model, [list(p) for p in held.prompt_ids], right)
        ):
            exact[i] += p
    k = 64
    result = held.evaluate(model, k, seed=0)
    assert within(result.pass_rate, exact, k, above=0.002), result.pass_rate
    assert 0.05 < statistics.fmean(exact) < 0.5


# --- the command line ------------------------------------------------------------------------


def test_cli_prints_the_pass_rate_line_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["evaluate", "builtin:demo", "--spec", str(DEMO_SPEC), "--prompts", "16", "-k", "4"]
    assert main(args) == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(
        r"pass rate \d\.\d{3} ± \d\.\d{3} \(mean@4 over 16 prompts, 64 samples\)", line
    )
    assert main([*args, "--json", "--seed", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    direct = evaluate_checkpoint("builtin:demo", load_spec(DEMO_SPEC), k=4, prompts=16, seed=5)
    assert data["pass_rate"] == direct.pass_rate and data["correct"] == direct.correct
    assert [p["prompt_id"] for p in data["per_prompt"]] == [p.prompt_id for p in direct.per_prompt]
    assert data["samples"] == 64 and data["k"] == 4 and data["seed"] == 5


def test_cli_names_a_folder_that_is_no_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate", str(tmp_path), "--spec", str(DEMO_SPEC)]) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["-k", "--prompts"])
def test_no_samples_or_no_prompts_are_refused_before_anything_loads(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    # B18: `-k 0` was refused only after the spec's assets were built and the model loaded.
    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("loaded something before checking the arguments")

    monkeypatch.setattr("scalerl.hfeval.load_spec", never)
    monkeypatch.setattr("scalerl.hfeval.load_model", never)
    assert main(["evaluate", "builtin:demo", "--spec", str(DEMO_SPEC), option, "0"]) == 2
    assert f"argument {option}: '0' must be >= 1" in capsys.readouterr().err
    name = option.lstrip("-")
    with pytest.raises(InputError, match=f"^{name} must be >= 1; got 0$"):
        evaluate_checkpoint(tmp_path, parse_run(yaml.safe_load(DEMO_SPEC.read_text())), **{name: 0})


def test_checkpoints_are_listed_by_step(tmp_path: Path) -> None:
    for name in ("step-000020", "step-000005", ".tmp-step-000030-x", "step-000040"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    for name in ("step-000020", "step-000005", ".tmp-step-000030-x"):
        (tmp_path / "checkpoints" / name / "config.json").write_text("{}")
    found = list(iter_checkpoints(tmp_path))
    assert [step for step, _ in found] == [5, 20]  # incomplete and temporary ones left out
    assert all(a < b for (a, _), (b, _) in pairwise(found))
    assert list(iter_checkpoints(tmp_path / "nothing")) == []


def test_a_lora_checkpoint_is_evaluated_as_its_merged_model(demo, tmp_path: Path) -> None:
    from scalerl.spec import LoraSpec
    from scalerl.trainer import load_policy

    run = demo[0]
    policy = load_policy(run.spec.model.path, fp32_lm_head=True, lora=LoraSpec(rank=4))
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(0))
    checkpoint = tmp_path / "checkpoints" / "step-000010"
    policy.save_pretrained(checkpoint)  # what a LoRA run checkpoints: the adapter alone
    (checkpoint / "state.json").write_text("{}")
    assert list(iter_checkpoints(tmp_path)) == [(10, checkpoint)]
    assert main(["export", str(checkpoint), str(tmp_path / "merged"), "--merge"]) == 0
    adapter = evaluate_checkpoint(checkpoint, run, k=4, prompts=32, seed=3)
    merged = evaluate_checkpoint(tmp_path / "merged", run, k=4, prompts=32, seed=3)
    base = evaluate_checkpoint(run.spec.model.path, run, k=4, prompts=32, seed=3)
    assert adapter.correct == merged.correct and adapter.per_prompt == merged.per_prompt
    assert adapter.per_prompt != base.per_prompt  # the adapter changed what the model does
    with pytest.raises(InputError, match="LoRA adapter"):
        load_model(checkpoint)
