"""``iomatrix effect`` and ``iomatrix scores``: what one axis changes, and a composite score."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from iomatrix.analysis.metrics import KEY_CHOICES, METRICS, OPTION_CHOICES, OPTION_HELP, metric_named
from iomatrix.cli.common import (DEFAULT_DB, EMULATED, Db, RunRef, WithStalled, load_run, out,
                                 p_column)
from iomatrix.core.errors import AnalysisError

if TYPE_CHECKING:
    from iomatrix.analysis.effects import Gain
    from iomatrix.store.records import StoredRun

_BY = {"iodepth": ("iodepth",), "workload": ("workload",), "none": ()}


def _header(run: StoredRun, what: str) -> None:
    out.print(f"run {run.id} · suite {run.suite.name} · {what}", markup=False)
    if run.emulated:
        out.print(EMULATED)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.1f}%".replace("-", "\u2212")


def _short(g: Gain) -> str:
    """The verdict column: the gist of ``g.verdict``."""
    if g.p_value is None:
        return "not enough samples" if g.method != "none" else "no usable pair"
    if not g.significant:
        return "no significant difference"
    return "better" if g.better else "worse"


def method_text(g: Gain) -> str:
    """The method column: how a gain was estimated (``Gain.method``)."""
    if g.method == "rounds":
        boot = ", bootstrap" if g.interval == "bootstrap" else ""
        return f"paired: {g.rounds} rounds{boot}"
    return {"pairs": "unpaired: across pairs", "samples": "unpaired: Welch",
            "none": "—"}[g.method]


def _list_axes(stored: StoredRun) -> None:
    """``effect`` without --axis: the run's axes, their levels and each one's reference."""
    from iomatrix.analysis.effects import axes_of, default_reference

    _header(stored, "axes (host baseline excluded)")
    axes = axes_of(stored)
    if not axes:
        out.print("no axis takes two or more levels in this run: nothing to compare")
        return
    table = Table("axis", "levels", "reference", box=None)
    for name, levels in axes.items():
        table.add_row(name, ", ".join(levels), default_reference(name, levels))
    out.print(table)
    out.print("compare one with: iomatrix effect RUN --axis AXIS", markup=False)


def effect(
    run_ref: RunRef,
    axis: Annotated[Optional[str], typer.Option("--axis", help="The axis whose levels are compared, e.g. iothread, aio, cache. Without it, list the run's axes.")] = None,
    metric: Annotated[str, typer.Option("--metric", help=OPTION_HELP)] = "iops",
    reference: Annotated[Optional[str], typer.Option("--reference", help="The level the others are compared with (default: native for aio, off for iothread, else the first level).")] = None,
    by: Annotated[str, typer.Option("--by", help="iodepth (one gain per queue depth, averaged over block sizes, as seed 000), workload (one per workload) or none (one over everything).")] = "iodepth",
    hold: Annotated[Optional[list[str]], typer.Option("--hold", help="Keep this other axis's levels apart (repeat, or comma-separate): --axis iothread --hold aio gives the iothread gain per aio mode.")] = None,
    db: Db = DEFAULT_DB,
    with_stalled: WithStalled = False,
) -> None:
    """Gain of each level of one axis over a reference level, all else held fixed (seed 000)."""
    from iomatrix.analysis.effects import axes_of, default_reference, gains

    stored = load_run(db, run_ref, with_stalled=with_stalled)
    if axis is None:
        _list_axes(stored)
        return
    chosen = metric_named(metric)
    if chosen is None:
        raise AnalysisError(f"--metric {metric!r}: not a metric", hint=f"use {OPTION_CHOICES}")
    if by not in _BY:
        raise AnalysisError(f"--by {by!r}: not a grouping", hint="use iodepth, workload or none")
    held = tuple(h.strip() for item in hold or () for h in item.split(",") if h.strip())
    found = gains(stored, axis, metric=chosen.key, reference=reference, by=_BY[by], hold=held)
    levels = axes_of(stored)[axis]
    ref = reference or default_reference(axis, levels)
    grouping = {"iodepth": "per queue depth, averaged over the other workload settings",
                "workload": "per workload", "none": "over every matched pair"}[by]
    _header(stored, f"{axis}: each level against {axis}={ref} · {chosen.name} · {grouping}")
    if not found:
        out.print(f"no matched pairs: no two configurations differ only in {axis} on a "
                  "workload measured on both", markup=False)
        return
    columns = ["level", *held]
    if by == "iodepth":
        columns.append("QD")
    elif by == "workload":
        columns.append("workload")
    columns += ["pairs", "gain", "95% CI", "p", "adj. p", "MDE", "method", "verdict"]
    table = Table(*columns, box=None)
    for col in table.columns[len(columns) - 7:len(columns) - 2]:
        col.justify = "right"
    labels = {w.key: w.label for w in stored.workloads}
    for g in found:
        row = [g.level, *(g.held[h] for h in held)]
        if by == "iodepth":
            row.append(str(g.iodepth))
        elif by == "workload":
            row.append(labels[g.workload] if g.workload else "—")
        ci = "—" if g.low is None or g.high is None else f"{_pct(g.low)} … {_pct(g.high)}"
        mde = "—" if g.mde is None else f"±{g.mde * 100:.1f}%"
        row += [str(g.pairs), _pct(g.relative), ci, p_column(g.p_value), p_column(g.adjusted_p),
                mde, method_text(g), _short(g)]
        table.add_row(*row)
    out.print(table)
    family = next((g.family for g in found if g.family), 0)
    sign = ("negative: lower latency, better" if chosen.lower_is_better
            else "positive: higher, better")
    out.print(f"gain = {axis}=level / {axis}={ref} − 1 ({sign}). Paired (where both sides were "
              "measured in the same rounds): per round the mean over pairs of log(level/reference), "
              "a t-interval (bootstrap when skewed) and t-test across rounds, so drift common to a "
              "round cancels. Otherwise unpaired: one pair, Welch's t-test and a Fieller CI on its "
              "samples; several pairs, geometric mean of the per-pair ratios with a t-interval and "
              "t-test across pairs of their logs. MDE: the smallest gain detectable (80 % power) "
              "at the rounds or pairs reached."
              + (f" p adjusted (Holm) across the {family} gains shown; verdicts use the "
                 "adjusted p." if family > 1 else ""), markup=False)
    from iomatrix.analysis.paired import aa_report

    aa = aa_report(stored, chosen.key)
    if aa is not None:
        out.print(aa.text() + ": a gain within the noise floor is indistinguishable from "
                  "measuring one configuration twice", markup=False)


def scores(
    run_ref: RunRef,
    metrics: Annotated[str, typer.Option("--metrics", help="Comma-separated: iops, bw_bytes, qd1_lat, qd128_lat (seed 002's four, the default), qd1_p99, qd128_p99, or FIGURE@WORKLOAD (figure " + KEY_CHOICES + "; workload key or label).")] = "iops,bw_bytes,qd1_lat,qd128_lat",
    host: Annotated[bool, typer.Option("--host", help="Score the host baseline (bare metal) too.")] = False,
    db: Db = DEFAULT_DB,
    with_stalled: WithStalled = False,
) -> None:
    """Min-max normalized score per configuration, lower is better (seed 002)."""
    from iomatrix.analysis.scores import scores as score_run

    stored = load_run(db, run_ref, with_stalled=with_stalled)
    table_data = score_run(stored, [m.strip() for m in metrics.split(",") if m.strip()],
                           include_host=host)
    _header(stored, "normalized scores (0 best, 1 worst per metric; lower score is better)")
    for c in table_data.components:
        out.print(f"{c.name}: {c.label} ({'lower' if c.lower_is_better else 'higher'} is better)",
                  markup=False)
    comps = table_data.components
    table = Table("rank", "configuration",
                  *(f"{c.name} {METRICS[c.figure].unit}" for c in comps),
                  *(f"{c.name} norm." for c in comps), "score", box=None)
    for col in table.columns[2:]:
        col.justify = "right"
    for r in table_data.rows:
        table.add_row("—" if r.rank is None else str(r.rank), r.label,
                      *(METRICS[c.figure].text(r.values[c.name]) for c in comps),
                      *("—" if r.normalized[c.name] is None else f"{r.normalized[c.name]:.3f}"
                        for c in comps),
                      "—" if r.score is None else f"{r.score:.3f}")
    out.print(table)
    out.print(f"method: {table_data.method}", markup=False)
    out.print(f"caveat: {table_data.caveat}", markup=False)
    for note in table_data.notes:
        out.print(f"note: {note}", markup=False)
