"""``iomatrix suites``: the built-in suites, or one of them as TOML with its scales."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from iomatrix.cli.common import out
from iomatrix.core.errors import SuiteError
from iomatrix.suite.fields import DEFAULT_SCALE
from iomatrix.suite.model import Suite
from iomatrix.vocab.words import Accelerator


def plan_summary(suite: Suite) -> str:
    """One line: the trials, sessions and time a suite (at one scale) plans, a pilot's rounds and
    guests under TCG included."""
    from iomatrix.suite import expand
    from iomatrix.suite.plan import duration_text, estimate

    method = suite.method
    expansion = expand(suite)
    est = estimate(expansion, method)
    bound = "up to" if method.steady_state else "about"
    text = (f"{est.trials} trials in {est.sessions} sessions, {bound} {duration_text(est.seconds)}"
            f" (fio measuring {duration_text(est.measured_seconds)})")
    if est.max_trials is not None and est.max_seconds is not None:
        text += (f"; up to {est.max_trials} trials, {duration_text(est.max_seconds)}, if a "
                 f"pilot finds that ±{(method.target_ci or 0.02):.1%} on every gain needs "
                 f"{method.max_samples} rounds")
    emulated = expansion.for_accel(Accelerator.TCG)
    if emulated.trials_per_sample < expansion.trials_per_sample:
        tcg = estimate(emulated, method)
        text += f"; guests under TCG: {tcg.trials} trials, {bound} {duration_text(tcg.seconds)}"
    return text


def scale_summaries(ref: str, suite: Suite) -> list[tuple[str, str, str]]:
    """(scale, plan summary, description) for the suite's own tables (``default``) and each of
    its [scale.NAME] tables; ``ref`` is what ``load_suite`` loaded ``suite`` from."""
    from iomatrix.translate.fromvm import resolve_vm
    from iomatrix.suite import load_suite

    rows = [(DEFAULT_SCALE, plan_summary(suite), "the suite's own tables (no --scale)")]
    for info in suite.scales:     # each with its VM's disk, as a run at that scale has it
        rows.append((info.name, plan_summary(resolve_vm(load_suite(ref, scale=info.name))),
                     info.description))
    return rows


def scale_lines(ref: str, suite: Suite, name: str) -> list[str]:
    """The scales of ``suite`` in words: a line per scale with its plan, then its description."""
    rows = scale_summaries(ref, suite)
    width = max(len(row[0]) for row in rows)
    lines = [f"scales (iomatrix run {name} --scale NAME; without --scale: default):"]
    for scale, summary, description in rows:
        lines.append(f"  {scale:<{width}}  {summary}")
        lines.append(f"  {'':<{width}}  {description}")
    return lines


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


def suites(name: Annotated[Optional[str], typer.Argument(help="Print this built-in suite's TOML, then its scales and what each plans.")] = None) -> None:
    """List the built-in suites, or print one with its scales."""
    from iomatrix.suite import builtin_suites, load_suite_text

    texts = builtin_suites()
    if name is not None:
        if name not in texts:
            raise SuiteError(f"{name}: no built-in suite of that name",
                             hint="built-in suites: " + ", ".join(texts))
        # Never wrapped, so that what is printed stays a suite file one can save and edit.
        out.print(texts[name], markup=False, highlight=False, soft_wrap=True)
        suite = load_suite_text(texts[name], source=f"builtin:{name}")
        if suite.scales:
            out.print("\n".join("# " + line for line in scale_lines(name, suite, name)),
                      markup=False, highlight=False, soft_wrap=True)
        return
    table = Table("suite", "mode", "description", box=None)
    for column in table.columns:
        column.no_wrap = True
    table.columns[2].overflow = "ellipsis"
    for key, text in texts.items():
        s = load_suite_text(text, source=f"builtin:{key}")
        table.add_row(key, s.method.mode + (" + host baseline" if s.method.baseline else ""),
                      _first_sentence(s.suite.description)
                      + (f" Scales: {', '.join(i.name for i in s.scales)}." if s.scales else ""))
    out.print(table)
