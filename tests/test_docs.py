"""The docs site: every spec field and CLI flag carries its own words, the generated reference
names each of them, and the site builds with no broken link or anchor.

What the reference must hold is read independently of `scalerl.reference`: the spec's fields from
pydantic's JSON schema of the models, the CLI's flags from the parser's actions and the usage line
argparse prints, the metrics from `scalerl.metrics.all_metric_names`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from scalerl.cli import build_parser
from scalerl.metrics import all_metric_names
from scalerl.reference import model_section, pages
from scalerl.spec import RunSpec, SweepSpec

ROOT = Path(__file__).resolve().parents[1]
PAGES = pages()


def schema_defs() -> dict[str, dict[str, Any]]:
    """Every model's JSON schema (by class name), the roots included."""
    defs: dict[str, dict[str, Any]] = {}
    for root in (RunSpec, SweepSpec):
        schema = root.model_json_schema(by_alias=True, mode="validation")
        defs |= schema.pop("$defs", {})
        defs[root.__name__] = schema
    return defs


def refs(prop: dict[str, Any]) -> set[str]:
    """The models a property's schema points at ($ref, inside anyOf/oneOf/items)."""
    found = {prop["$ref"].rsplit("/", 1)[-1]} if "$ref" in prop else set()
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in prop.get(key, []):
            found |= refs(sub)
    if isinstance(prop.get("items"), dict):
        found |= refs(prop["items"])
    return found


def undescribed(defs: dict[str, dict[str, Any]]) -> list[str]:
    """Fields with no description of their own nor of the one model they hold (the CRD's rule)."""
    missing = []
    for name, schema in defs.items():
        for prop, sub in schema.get("properties", {}).items():
            held = refs(sub)
            if sub.get("description"):
                continue
            if len(held) == 1 and defs[held.pop()].get("description"):
                continue
            missing.append(f"{name}.{prop}")
    return missing


def test_every_spec_field_has_a_description() -> None:
    assert undescribed(schema_defs()) == []


def test_a_field_without_a_description_is_caught() -> None:
    defs = {"M": {"properties": {"x": {"type": "integer"}, "y": {"$ref": "#/$defs/N"}}}, "N": {}}
    assert undescribed(defs) == ["M.x", "M.y"]


def section(page: str, anchor: str) -> str:
    """The text of the section whose heading carries {#anchor}, up to the next heading."""
    match = re.search(rf"^## .*\{{#{re.escape(anchor)}\}}\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    assert match, f"no section #{anchor} in the generated spec page"
    return match.group(1)


def test_the_spec_reference_names_every_field_of_every_model() -> None:
    page = PAGES["reference/spec.md"]
    for name, schema in schema_defs().items():
        text = section(page, name.lower())
        for prop in schema.get("properties", {}):
            assert f"| `{prop}` |" in text, f"{name}.{prop} is not in reference/spec.md"


def test_the_spec_reference_gives_defaults_and_descriptions() -> None:
    text = section(PAGES["reference/spec.md"], "optimizerspec")
    assert re.search(r"^\| `lr` \| number \(> 0, <= 1\) \| `5e-07` \| AdamW lr", text, re.M)
    assert "| `maxGradNorm` |" in text


def commands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, Any, Any]]:
    """(full command, its help, its parser) for every subcommand, nested ones included."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{prefix} {name}", helps.get(name), sub))
                found += commands(sub, f"{prefix} {name}")
    return found


def test_every_cli_command_and_flag_has_help() -> None:
    missing = []
    for command, help_, parser in commands(build_parser(), "scalerl"):
        if not help_:
            missing.append(command)
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{command} {action.option_strings or action.dest}")
    assert missing == []


def test_the_cli_reference_names_every_command_and_flag() -> None:
    page = PAGES["reference/cli.md"]
    found = commands(build_parser(), "scalerl")
    assert len(found) >= 10
    for command, _, parser in found:
        at = page.find(f"## `{command}`\n")
        assert at >= 0, f"{command} is not in reference/cli.md"
        end = page.find("\n## ", at + 1)
        text = page[at : end if end >= 0 else len(page)]
        # argparse's own usage line names each flag the command takes.
        flags = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", parser.format_usage())) - {"-h"}
        for flag in flags:
            assert f"`{flag}" in text, f"{command} {flag} is not in reference/cli.md"


def test_the_metrics_reference_names_every_series() -> None:
    page = PAGES["reference/metrics.md"]
    for name in all_metric_names():
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"`{name}`" in page or f"`{base}`" in page, f"{name} is not in reference/metrics.md"


def test_readme_links_into_the_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", readme)
    assert {"docs/index.md", "docs/local.md", "docs/cluster.md"} <= set(links)
    for link in links:
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.fail("mkdocs is not installed: `make setup` installs the `docs` extra")
    site = tmp_path / "site"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert 'id="optimizerspec"' in spec
    assert (site / "dashboard.png").is_file()


class Inner(BaseModel):
    """A nested block."""

    x: int = 1


FIELD_TYPES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, st.integers(-5, 5)),
    (float, st.floats(-1, 1, allow_nan=False)),
    (str, st.text("abc|", max_size=4)),
    (bool, st.booleans()),
    (Literal["a", "b"], st.sampled_from(["a", "b"])),
    (list[int], st.lists(st.integers(0, 3), max_size=2)),
    (int | None, st.none()),
]


@st.composite
def models(draw: st.DrawFn) -> type[BaseModel]:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=1,
                          max_size=6, unique=True))  # fmt: skip
    fields: dict[str, Any] = {}
    for name in names:
        kind, values = draw(st.sampled_from([*FIELD_TYPES, (Inner, st.just(Inner()))]))
        default = draw(st.one_of(st.just(...), values))
        words = draw(st.one_of(st.none(), st.text("xyz |", min_size=1, max_size=8)))
        fields[name] = (kind, Field(default, description=words))
    return create_model("Drawn", **fields)


@settings(max_examples=40)
@given(models())
def test_a_models_section_has_one_row_per_field_with_its_default(model: type[BaseModel]) -> None:
    text = "\n".join(model_section(model, ["spec.drawn"]))
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(model.model_fields)
    for row, (name, field) in zip(rows, model.model_fields.items(), strict=True):
        cells = re.split(r"(?<!\\)\|", row)[1:-1]
        assert len(cells) == 4, row  # a | in a description or default is escaped
        assert cells[0].strip() == f"`{name}`"
        if field.is_required():
            assert cells[2].strip() == "required"
        elif isinstance(field.default, Inner):
            assert "(#inner)" in cells[2]
        else:
            assert cells[2].strip() == f"`{json.dumps(field.default)}`".replace("|", "\\|")
