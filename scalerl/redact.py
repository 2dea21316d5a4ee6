"""Secrets out of what others read: tracker parameters, log lines, error messages.

A spec can hold a secret where a user puts one (an environment's `api_key` argument, a URL with
a password in it); a run shows its spec to every tracker and its errors in logs. What is masked
(as `***`), wherever the text comes from:

- a URL's credentials: all of `user:password@` (of http(s), the user alone too: a token is often
  put there), and the value of a query parameter named like a secret (`?token=...`);
- the value of a key named like a secret: its last word is token, secret, password, passwd,
  pwd, passphrase, key, apikey, credential(s), auth, authorization, cookie or signature
  (`api_key`, `hfToken`, `X-Api-Key`, `client_secret`; not `max_tokens`, `secretRef` or
  `keys`), in a mapping or written `name=value` / `"name": "value"` in text. A value that is an
  environment variable's name (`HF_TOKEN`, `OPENAI_API_KEY`: capitals, digits and `_`) names where
  the secret is, and is kept;
- values shaped like the tokens of known services, anywhere: Hugging Face `hf_...`, OpenAI and
  Anthropic `sk-...`, GitHub `ghp_...` / `github_pat_...`, GitLab `glpat-...`, Slack `xox?-...`,
  AWS access key ids `AKIA...`, PyPI `pypi-...`, npm `npm_...`, Google `AIza...`, JSON Web
  Tokens, and `Bearer ...` / `Basic ...` credentials.

What no rule knows is not masked (a bare random string under an innocent name): a secret's place
is a Kubernetes Secret (spec.tracking.secretRef, spec.hub.tokenSecret,
spec.environment.indexSecret) or the environment, never the spec.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MASK = "***"

_SECRET_WORDS = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "key",
        "apikey",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "cookie",
        "signature",
    }
)
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{16,}"
    r"|sk-[A-Za-z0-9_\-]{6,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{8,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}"
    r"|github_pat_[A-Za-z0-9_]{16,}"
    r"|glpat-[A-Za-z0-9_\-]{16,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|pypi-[A-Za-z0-9_\-]{16,}"
    r"|npm_[A-Za-z0-9]{20,}"
    r"|AIza[A-Za-z0-9_\-]{30,}"
    r"|eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}"
    r")"
)
# An HTTP Authorization header's credentials (Basic as headers write it: "Basic" is a word too).
_SCHEME_AUTH = re.compile(r"\b([Bb]earer|BEARER|Basic)(\s+)[A-Za-z0-9._~+/\-]{12,}=*")
# scheme://userinfo@ : userinfo up to the first / or whitespace
_URL_USER = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*)://([^/\s@?#]+)@")
_QUERY = re.compile(r"([?&;])([^=&#\s?;]+)=([^&#\s;]*)")
# `name=value`, `name: value`, `"name": "value"`: the name and its separator; then the value,
# quoted or bare, after an Authorization scheme where there is one.
_KEY = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<q>[\"']?)(?P<sep>\s*[:=]\s*)")
_VALUE = re.compile(
    r"(?P<scheme>(?:[Bb]earer|BEARER|Basic|[Tt]oken)\s+)?"
    r"(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^\s\"',;&}\])]+))"
)


def secret_key(name: str) -> bool:
    """Whether a field, argument or parameter called `name` holds a secret (module doc)."""
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    words = [w for w in words if w]
    return bool(words) and words[-1] in _SECRET_WORDS


def names_a_variable(value: str) -> bool:
    """Whether `value` is an environment variable's name (where a secret is, not the secret)."""
    return bool(_ENV_NAME.match(value))


def redact_url(url: str) -> str:
    """`url` with its credentials masked: userinfo and secret query parameters."""
    return _redact_urls(url)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """`text` with every secret the module doc names masked, and each of the `known` secret
    values (those of a mapping `secrets_of` found) wherever it appears."""
    for value in sorted({k for k in known if len(k) >= 4}, key=len, reverse=True):
        text = text.replace(value, MASK)
    text = _redact_urls(text)
    text = _key_values(text)
    text = _SCHEME_AUTH.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    return _TOKENS.sub(MASK, text)


def redact(value: Any, key: str | None = None) -> Any:
    """`value` (a spec, arguments: mappings, lists, scalars) with its secrets masked: a scalar
    under a secret key (but None, booleans and a variable's name), and in every string what
    `redact_text` masks. A new object; `value` is left as it was."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if key is not None and secret_key(key) and _secret_scalar(value):
        return MASK
    if isinstance(value, str):
        return redact_text(value)
    return value


def secrets_of(value: Any, key: str | None = None) -> list[str]:
    """The strings `redact` would mask whole in `value` (its secret keys' values), for finding
    them again in text that quotes them (`redact_text`'s `known`)."""
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in secrets_of(v, str(k))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in secrets_of(v)]
    if key is not None and secret_key(key) and _secret_scalar(value):
        return [str(value)]
    return []


@contextlib.contextmanager
def redacted_logs(known: Iterable[str] = ()) -> Iterator[None]:
    """While inside: every log record made in this process (by any library) carries its message
    and its exception's text through `redact_text` (with `known`). For code that logs what it is
    given, such as verifiers' `load_environment`, which logs its arguments."""
    secrets = list(known)
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        redact_record(record, secrets)
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


def redact_record(record: logging.LogRecord, known: Iterable[str] = ()) -> None:
    """`record`'s message (formatted) and exception text, redacted in place."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 — a bad format string is logging's own error to report
        return
    cleaned = redact_text(message, known)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[1] is not None:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = redact_text(text, known)


def _secret_scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, str):
        return value != "" and not names_a_variable(value)
    return isinstance(value, int | float)


def _redact_urls(text: str) -> str:
    def user(match: re.Match[str]) -> str:
        scheme, info = match.group(1), match.group(2)
        if scheme.lower() in ("http", "https") or ":" in info:
            return f"{scheme}://{MASK}@"
        return match.group(0)  # hf://model@revision: a revision, not a user

    def query(match: re.Match[str]) -> str:
        lead, name, value = match.groups()
        if value and secret_key(name) and not names_a_variable(value):
            return f"{lead}{name}={MASK}"
        return match.group(0)

    return _QUERY.sub(query, _URL_USER.sub(user, text))


def _key_values(text: str) -> str:
    """`text` with the value after each secret name masked (a name that is not a secret's
    takes nothing, so `args: api_key=...` still finds api_key)."""
    out: list[str] = []
    pos = 0
    for key in _KEY.finditer(text):
        if key.start() < pos or not secret_key(key["key"]):
            continue
        value = _VALUE.match(text, key.end())
        if value is None:
            continue
        said = next(v for v in (value["dq"], value["sq"], value["bare"]) if v is not None)
        if not _secret_scalar(said) or said == MASK:
            continue
        quote = '"' if value["dq"] is not None else "'" if value["sq"] is not None else ""
        out += [text[pos : key.end()], value["scheme"] or "", quote, MASK, quote]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)
