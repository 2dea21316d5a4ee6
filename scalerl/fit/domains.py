"""One curve per domain: a run that mixes domains (math and code, `spec.data.train` as sources)
records each evaluation's pass rate per domain beside the combined one (history.jsonl's
`pass_rate_by_domain`, status.evaluations[].byDomain), and each domain's series is fitted alone,
by the same `fit_report` as the combined one, as the paper fits its math+code run (Table 1).

A domain's series is the run's evaluations with that domain's pass rate and standard error in
place of the combined ones; compute, steps and times are the run's (every domain trains on the
same compute). A domain whose fit cannot be made (too few points yet) says why instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scalerl.errors import ScaleRLError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from scalerl.fit.outlook import FitReport
    from scalerl.fit.points import Columns


def domains_of(rows: Sequence[Mapping[str, Any]], by_domain: str) -> list[str]:
    """The domains the rows report a pass rate for (sorted), [] for a run of one domain."""
    names: set[str] = set()
    for row in rows:
        names |= set(row.get(by_domain) or {})
    return sorted(names)


def domain_rows(
    rows: Sequence[Mapping[str, Any]], domain: str, columns: Columns
) -> list[dict[str, Any]]:
    """The rows as `domain`'s series: its pass rate (and standard error, when the row has one) in
    the combined one's place; rows without that domain's pass rate are left out."""
    out = []
    for row in rows:
        part = (row.get(columns.by_domain) or {}).get(domain)
        if not isinstance(part, Mapping) or part.get(columns.pass_rate) is None:
            continue
        series = {k: v for k, v in row.items() if k not in (columns.by_domain, columns.se)}
        series[columns.pass_rate] = part[columns.pass_rate]
        if part.get(columns.se) is not None:
            series[columns.se] = part[columns.se]
        out.append(series)
    return out


def fit_domains(
    rows: Sequence[Mapping[str, Any]],
    fit: Callable[..., FitReport],
    columns: Columns,
    **options: Any,
) -> dict[str, FitReport | str]:
    """Each domain's fit (`fit`: `fit_report`, given `options` and `columns`), or why it could
    not be made; {} for a run of one domain."""
    out: dict[str, FitReport | str] = {}
    for domain in domains_of(rows, columns.by_domain):
        try:
            out[domain] = fit(domain_rows(rows, domain, columns), columns=columns, **options)
        except ScaleRLError as err:
            out[domain] = str(err)
    return out


def as_dicts(fits: Mapping[str, FitReport | str]) -> dict[str, dict[str, Any]]:
    """fit.json's `domains`: each domain's fit as the combined one is written, or {error}."""
    return {
        domain: {"error": fitted} if isinstance(fitted, str) else fitted.to_dict()
        for domain, fitted in fits.items()
    }


def a_by_domain(domains: Mapping[str, Mapping[str, Any]]) -> str:
    """Each domain's A in one line, "code=0.615 math=0.595": "code>=0.64" where the points
    bound it from below only (A_atLeast: the curve has not bent yet), "code=-" where no fit was
    made."""
    return " ".join(_a_text(domain, fit) for domain, fit in sorted(domains.items()))


def _a_text(domain: str, fit: Mapping[str, Any]) -> str:
    if fit.get("A_atLeast") is not None:
        return f"{domain}>={fit['A_atLeast']:.3g}"
    return f"{domain}={fit['A']:.3g}" if fit.get("A") is not None else f"{domain}=-"


def draw_domains(
    fig: Figure,
    fits: Mapping[str, FitReport | str],
    rows: Sequence[Mapping[str, Any]],
    columns: Columns,
) -> None:
    """Add each domain's points and fitted law to the combined fit's figure (its first axes),
    one colour per domain, solid over its points and dashed to the figure's right edge."""
    ax = fig.axes[0]
    left, right = ax.get_xlim()
    for n, (domain, fitted) in enumerate(sorted(fits.items())):
        colour = f"C{n + 3}"  # C0-C2: the combined points, law and asymptote
        series = [r for r in domain_rows(rows, domain, columns) if float(r[columns.compute]) > 0]
        compute = np.array([float(r[columns.compute]) for r in series])
        rate = np.array([float(r[columns.pass_rate]) for r in series])
        ax.plot(compute, rate, "s", color=colour, markersize=4, label=f"{domain} evaluations")
        if isinstance(fitted, str) or not len(compute):
            continue
        law = fitted.result
        seen = np.geomspace(max(left, compute.min()), compute.max(), 100)
        ahead = np.geomspace(compute.max(), right, 100)
        bound = law.A_at_least  # the curve has not bent: A is bounded from below only
        a = f"A={law.A:.3f}" if bound is None else f"A>={bound:.3f}"
        ax.plot(seen, law.predict(seen), "-", color=colour, label=f"{domain}: {a}")
        ax.plot(ahead, law.predict(ahead), "--", color=colour)
    ax.set_xlim(left, right)
    ax.legend(loc="best", fontsize="small")
