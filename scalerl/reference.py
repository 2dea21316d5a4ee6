"""The docs site's reference pages, generated from the code that owns each fact: the spec from
`scalerl.spec`'s models, the CLI from `scalerl.cli.build_parser`, the metrics from
`scalerl.metrics`. `docs/hooks.py` adds them to every `mkdocs build`, so they never drift from
the code; `python -m scalerl.reference DIR` writes them out to read without MkDocs.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from scalerl import metrics
from scalerl.cli import build_parser
from scalerl.spec import RunSpec, SweepSpec

# Each page: its path under docs/ -> its text.
Pages = dict[str, str]


def pages() -> Pages:
    return {
        "reference/spec.md": spec_page(),
        "reference/cli.md": cli_page(),
        "reference/metrics.md": metrics_page(),
    }


# --- the spec --------------------------------------------------------------------------------


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type holds (itself, in a list, a union or an Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in nested_models(arg)]


def description(field: FieldInfo) -> str:
    """The field's own description, else its one nested model's docstring (as the CRD has it)."""
    if field.description:
        return field.description
    models = nested_models(field.annotation)
    doc = models[0].__doc__ if len(models) == 1 else None
    return " ".join(doc.split()) if doc else ""


def models_in_order() -> list[tuple[type[BaseModel], list[str]]]:
    """Every model below ScaleRLRun's and ScaleRLSweep's spec, depth first (a block, then the
    blocks inside it), with each path (YAML, camelCase) it is found at; a sweep's paths start
    with "sweep "."""
    paths: dict[type[BaseModel], list[str]] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        if model in paths:
            paths[model].append(path)
            return
        paths[model] = [path]
        for name, field in model.model_fields.items():
            for sub in nested_models(field.annotation):
                visit(sub, f"{path}.{field.alias or name}")

    visit(RunSpec, "spec")
    visit(SweepSpec, "sweep spec")
    return list(paths.items())


def heading(model: type[BaseModel], path: str) -> str:
    """`spec.recipe.loss` (type cispo), `spec` of a ScaleRLRun, `spec.variants` of a sweep."""
    sweep = path.startswith("sweep ")
    path = path.removeprefix("sweep ")
    text = f"`{path}`"
    tag = model.model_fields.get("type")
    if tag is not None and typing.get_origin(tag.annotation) is Literal:
        text += f" (type {typing.get_args(tag.annotation)[0]})"
    if sweep:
        return text + " of a ScaleRLSweep"
    return text + (" of a ScaleRLRun" if path == "spec" else "")


def type_text(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation)})"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_text(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return "object"
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_text(field: FieldInfo) -> str:
    """The numeric and length bounds pydantic enforces, e.g. `>= 1, <= 1000`."""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    signs |= {"min_length": "length >=", "max_length": "length <="}
    found = []
    for item in field.metadata:
        if isinstance(item, annotated_types.BaseMetadata):
            for key, sign in signs.items():
                value = getattr(item, key, None)
                if value is not None:
                    found.append(f"{sign} {value}")
    return ", ".join(found)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        model = type(value)
        shown = "the defaults of" if value == model() else "set fields of"
        return f"{shown} [{model.__name__}](#{anchor(model)})"
    return f"`{json.dumps(value)}`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def model_section(model: type[BaseModel], paths: list[str]) -> Iterator[str]:
    yield f"## {heading(model, paths[0])} {{#{anchor(model)}}}"
    yield ""
    yield f"Model `{model.__name__}`" + (
        "; also at " + ", ".join(f"`{p}`" for p in paths[1:]) + "." if paths[1:] else "."
    )
    if model.__doc__ and model.__doc__ != BaseModel.__doc__:
        yield ""
        yield " ".join(model.__doc__.split())
    yield ""
    yield "| field | type | default | description |"
    yield "|---|---|---|---|"
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation)
        bounds = bounds_text(field)
        kind += f" ({bounds})" if bounds else ""
        yield (
            f"| `{field.alias or name}` | {kind} | {cell(default_text(field))} "
            f"| {cell(description(field))} |"
        )
    yield ""


def spec_page() -> str:
    lines = [
        "# The spec",
        "",
        "Every field of a `ScaleRLRun`'s and a `ScaleRLSweep`'s `spec`, generated from",
        "`scalerl/spec.py` (the one place that holds the defaults: the paper's ScaleRL values).",
        "YAML names are camelCase. A nested block links to its own table. `scalerl validate`",
        "and the CRD check the same types and bounds; a field not listed here is refused.",
        "",
    ]
    for model, paths in models_in_order():
        lines += model_section(model, paths)
    return "\n".join(lines)


# --- the CLI ---------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order `--help` lists them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def argument_rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    # argparse's own formatter writes each flag as `--help` shows it (`--run NAME`) and expands
    # its help's %(default)s and %%.
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = formatter._format_action_invocation(action)
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) else f"`{default}`"
        help_ = formatter._expand_help(action) if action.help else ""
        yield f"| `{name}` | {shown} | {cell(help_)} |"


def command_section(
    prefix: str, name: str, help_: str, parser: argparse.ArgumentParser
) -> list[str]:
    lines = [f"## `{prefix} {name}`", "", cell(help_) + ("." if help_ else ""), ""]
    if parser.description:
        lines += [parser.description, ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = list(argument_rows(parser))
    if rows:
        lines += ["| argument | default | help |", "|---|---|---|", *rows, ""]
    for sub_name, sub_help, sub in subcommands(parser):
        lines += command_section(f"{prefix} {name}", sub_name, sub_help, sub)
    return lines


def cli_page() -> str:
    parser = build_parser()
    lines = [
        "# The CLI",
        "",
        "Every `scalerl` command and flag, generated from `scalerl.cli.build_parser` (what",
        "`scalerl COMMAND --help` prints). Bad input exits 2 with one line; see",
        "[Getting started locally](../local.md#cli) for examples.",
        "",
    ]
    for name, help_, sub in subcommands(parser):
        lines += command_section("scalerl", name, help_, sub)
    return "\n".join(lines)


# --- the metrics -----------------------------------------------------------------------------


def metric_rows(
    table: dict[str, str], kind: str, labels: tuple[str, ...] = metrics.LABELS
) -> Iterator[str]:
    suffix = "_total" if kind == "counter" else ""
    for name, help_ in table.items():
        series = f"{metrics.PREFIX}{name}{suffix}"
        yield f"| `{series}` | {kind} | {', '.join(labels)} | {cell(help_)} |"


def metrics_page() -> str:
    generators = [
        (metrics.GENERATOR_COUNTERS, "counter"),
        (metrics.GENERATOR_GAUGES, "gauge"),
        (metrics.GENERATOR_HISTOGRAMS, "histogram"),
    ]
    trainer = [(metrics.TRAINER_COUNTERS, "counter"), (metrics.TRAINER_GAUGES, "gauge")]
    groups = [
        ("Generators", generators),
        ("Trainer", trainer),
        ("Trainer and generators", [(metrics.HISTOGRAMS, "histogram")]),
        ("The run as a whole (the local runner, or the operator)", [(metrics.RUN_GAUGES, "gauge")]),
    ]
    lines = [
        "# Metrics",
        "",
        "Every Prometheus series the processes export, generated from `scalerl/metrics.py`.",
        "Counters end in `_total`; a histogram is served as `_bucket`, `_sum` and `_count`.",
        "Every series is labelled `namespace` and `run` (a local run's namespace is `local`),",
        "except the track record's. See [Operations](../operations.md#metrics) for how to",
        "scrape them, locally and on a cluster.",
        "",
    ]
    header = ["| series | type | labels | help |", "|---|---|---|---|"]
    for title, tables in groups:
        lines += [f"## {title}", "", *header]
        for table, kind in tables:
            lines += metric_rows(table, kind)
        if title == "Trainer":
            lines += metric_rows(metrics.TRAINER_DOMAIN_GAUGES, "gauge", metrics.DOMAIN_LABELS)
            lines += metric_rows(metrics.TRAINER_LAG_GAUGES, "gauge", metrics.LAG_LABELS)
        lines.append("")
    lines += ["## Track record (the operator, over the finished runs it manages)", "", *header]
    lines += metric_rows(metrics.TRACK_RECORD_GAUGES, "gauge", metrics.TRACK_RECORD_LABELS)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the generated reference pages to DIR.")
    parser.add_argument("out", metavar="DIR", type=Path)
    out: Path = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for path, text in pages().items():
        (out / Path(path).name).write_text(text)
        print(out / Path(path).name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
