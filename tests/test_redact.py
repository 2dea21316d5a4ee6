"""scalerl.redact: the credential shapes it masks in URLs, arguments and text, and what it leaves
alone (the shipped example specs come out unchanged)."""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from scalerl.redact import (
    MASK,
    redact,
    redact_text,
    redact_url,
    redacted_logs,
    secret_key,
    secrets_of,
)
from scalerl.spec import parse_run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://user:pa55w0rd@pypi.corp.example/simple", "https://***@pypi.corp.example/simple"),
        ("https://ghp_tokentokentokentoken1234@github.com/o/r", "https://***@github.com/o/r"),
        ("https://idx.example/simple?token=abc123&x=1", "https://idx.example/simple?token=***&x=1"),
        ("http://h.example/?api_key=k1k2k3k4&sig=zz9", "http://h.example/?api_key=***&sig=zz9"),
        ("postgresql://bob:s3cret@db:5432/x", "postgresql://***@db:5432/x"),
        ("https://pypi.corp.example/simple", "https://pypi.corp.example/simple"),
        ("hf://gpt2@main", "hf://gpt2@main"),  # a revision, not a user
        ("https://x.example/?key_var=OPENAI_API_KEY", "https://x.example/?key_var=OPENAI_API_KEY"),
    ],
)
def test_a_urls_credentials_are_masked_and_nothing_else(url: str, masked: str) -> None:
    assert redact_url(url) == masked


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Using provided args: api_key=sk-abc, rows=4", "Using provided args: api_key=***, rows=4"),
        ("{'api_key': 'x y z', 'rows': 4}", "{'api_key': '***', 'rows': 4}"),
        ('{"hfToken": "abcdefgh"}', '{"hfToken": "***"}'),
        ("X-Api-Key: abcdefgh", "X-Api-Key: ***"),
        ("client_secret=abcdefgh&a=1", "client_secret=***&a=1"),
        ("Authorization: Bearer abcdefghijklmnop", "Authorization: Bearer ***"),
        ("token: HF_TOKEN", "token: HF_TOKEN"),  # a variable's name: where the secret is
        ("max_tokens=512 secretRef: keys", "max_tokens=512 secretRef: keys"),
        ("keys=3 monkey=4", "keys=3 monkey=4"),
    ],
)
def test_a_secret_keys_value_is_masked_in_text(text: str, masked: str) -> None:
    assert redact_text(text) == masked


@pytest.mark.parametrize(
    "token",
    [
        "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567",
        "sk-proj-AbCdEf0123456789",
        "sk-SECRET-123",
        "ghp_" + "a" * 36,
        "github_pat_" + "A1" * 20,
        "glpat-" + "x" * 20,
        "xoxb-1234567890-abcdef",
        "AKIA" + "ABCDEFGHIJKLMNOP",
        "pypi-" + "AgEIcHlwaS5vcmc" * 2,
        "npm_" + "a1" * 18,
        "AIza" + "B" * 35,
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlX2hlcmU",
    ],
)
def test_a_known_services_token_is_masked_anywhere(token: str) -> None:
    for text in (token, f"the value {token} here", f"x:{token}", f'"{token}"'):
        assert token not in redact_text(text)
        assert MASK in redact_text(text)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("apiKey", True),
        ("OPENAI_API_KEY", True),
        ("X-Api-Key", True),
        ("hf_token", True),
        ("db_password", True),
        ("Authorization", True),
        ("tokenSecret", True),
        ("key", True),
        ("max_tokens", False),
        ("secretRef", False),
        ("keys", False),
        ("tokenizer", False),
        ("monkey", False),
        ("key_var", False),
    ],
)
def test_which_names_hold_secrets(name: str, secret: bool) -> None:
    assert secret_key(name) is secret


SECRET_NAMES = st.builds(
    lambda prefix, word, style: style(prefix + word),
    st.sampled_from(["", "judge_", "my-", "openai_", "db."]),
    st.sampled_from(["api_key", "token", "secret", "password", "passwd", "auth", "key", "cookie"]),
    st.sampled_from([str, str.upper, lambda s: s.replace("_", "-")]),
)
SECRET_VALUES = st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=6)
PLAIN = st.one_of(st.integers(), st.booleans(), st.none(), st.text(alphabet="abc ", max_size=8))


@given(
    st.dictionaries(SECRET_NAMES, SECRET_VALUES, min_size=1, max_size=4),
    st.dictionaries(st.sampled_from(["rows", "model", "lr"]), PLAIN, max_size=3),
)
def test_secrets_under_secret_names_never_come_out(
    secret: dict[str, str], plain: dict[str, Any]
) -> None:
    assume(all(not v.isupper() for v in secret.values()))  # a variable's name is kept
    nested = {"spec": {"environment": {"args": {**plain, **secret}}, "list": [dict(secret)]}}
    out = redact(nested)
    dumped = json.dumps(out)
    for value in secret.values():
        assert value not in dumped.replace(MASK, "")
    assert out["spec"]["environment"]["args"] == {**plain, **{k: MASK for k in secret}}
    assert nested["spec"]["environment"]["args"] == {**plain, **secret}  # the input is kept
    # The same arguments quoted in log text, as verifiers writes them (dict repr, k=v).
    known = secrets_of(nested)
    assert sorted(known) == sorted([*secret.values(), *secret.values()])
    for text in (repr(secret), ", ".join(f"{k}={v}" for k, v in secret.items())):
        masked = redact_text(text, known)
        assert all(value not in masked for value in secret.values())
        unknown = redact_text(text)  # without the values known: the key=value rule alone
        assert all(value not in unknown.replace(MASK, "") for value in secret.values())


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_the_example_specs_hold_nothing_that_is_masked(example: str) -> None:
    """No false alarm on the specs users start from: their tracker parameters are unchanged."""
    document = yaml.safe_load((EXAMPLES / example).read_text())
    if document.get("kind") != "ScaleRLRun":
        pytest.skip("not a run")
    spec = parse_run(document).spec.model_dump(by_alias=True, mode="json")
    assert redact(spec) == spec


def test_redacted_logs_masks_every_record_while_inside_and_none_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    log = logging.getLogger("some.library")
    with pytest.raises(RuntimeError), redacted_logs(["opaque-value-77"]):
        log.info("args %s", {"api_key": "abcdefgh", "x": "opaque-value-77"})
        try:
            raise ValueError("https://u:p4ss@h.example/")
        except ValueError:
            log.exception("failed")
        raise RuntimeError("leave")
    first, second = caplog.records[-2:]
    assert first.getMessage() == "args {'api_key': '***', 'x': '***'}"
    assert "p4ss" not in caplog.text and "https://***@h.example/" in caplog.text
    assert second.exc_text is not None and "p4ss" not in second.exc_text
    log.info("api_key=%s", "abcdefgh")  # outside: as it was
    assert caplog.records[-1].getMessage() == "api_key=abcdefgh"
