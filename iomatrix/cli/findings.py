"""``iomatrix findings``: the study's conclusions (its suite's [[finding]] tables) checked on a run."""

from __future__ import annotations

from rich.table import Table

from iomatrix.cli.common import (DEFAULT_DB, EMULATED, Db, RunRef, WithStalled, load_run, out,
                                 p_column)


def findings(run_ref: RunRef, db: Db = DEFAULT_DB, with_stalled: WithStalled = False) -> None:
    """Each claim of the study the suite transcribes, checked on this run: the published figure,
    what was measured (95 % CI, Holm-adjusted p) and a verdict."""
    from iomatrix.analysis.findings import NOT_MEASURABLE, check_text, effect_text, evaluate

    stored = load_run(db, run_ref, with_stalled=with_stalled)
    result = evaluate(stored)
    out.print(f"run {stored.id} · suite {stored.suite.name} · findings (from {result.source})",
              markup=False)
    if stored.emulated:
        out.print(EMULATED)
    for line in result.stalls:      # a configuration that stalls is a finding in itself
        out.print(f"stalled: {line}" + (" (in the figures: --with-stalled)" if with_stalled
                                         else " (out of the figures)"),
                  markup=False, soft_wrap=True)
    if not result.results:
        out.print("this run's suite states no findings ([[finding]] tables): nothing to check",
                  markup=False)
        return
    for r in result.results:
        f = r.finding
        out.print("", markup=False)
        out.print(f"{f.id} · {f.study}", markup=False)
        out.print(f"  claim: {f.claim}", markup=False)
        out.print(f"  published: {f.published}", markup=False)
        for check in r.checks:
            out.print(f"  {check_text(f, check)}", markup=False)
        for v in r.version_changes:
            out.print(f"  warning: the study and this run straddle a version change that "
                      f"moves baselines: {v.text('study', 'run')}", markup=False)
        where = f" (in {r.mode} mode)" if r.mode else ""
        out.print(f"  verdict: {r.verdict}{where}", markup=False)
    out.print("", markup=False)
    table = Table("finding", "verdict", "mode", "measured", "adj. p", box=None)
    for r in result.results:
        check = r.decisive
        measured = effect_text(r.finding, check) if r.verdict != NOT_MEASURABLE else "—"
        table.add_row(r.finding.id, r.verdict, r.mode or "—", measured,
                      p_column(check.adjusted_p) if r.mode else "—")
    out.print(table)
    out.print(f"rules: {result.rules}", markup=False)
