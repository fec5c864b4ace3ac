"""``iomatrix compare RUN_A RUN_B [--match workload|A=B]``: the same points across two runs;
configurations paired by name, by ``--match``, or, one in each run, with each other.
``iomatrix compare RUN_A RUN_B RUN_C ...``: a fleet, every run against the first, one line per
node (``analysis.fleet``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from iomatrix.analysis.metrics import (OPTION_CHOICES, OPTION_HELP, Metric, metric_named,
                                       run_latency)
from iomatrix.cli.common import (DEFAULT_DB, Db, WithStalled, err, load_run, out, p_column,
                                 shown_db)

if TYPE_CHECKING:   # the analysis imports scipy: load it only when the command runs
    from iomatrix.analysis.crossrun import RunComparison, Side
    from iomatrix.store.records import StoredRun

def _header(name: str, run: StoredRun, db: str) -> str:
    host = run.host
    return (f"{name}: run {run.id} ({shown_db(db)}) · suite {run.suite.name} · {run.status} · "
            f"{run.created_at} · {host.get('hostname', '?')} · "
            f"target {host.get('target', '?')} ({host.get('target_fs', '?')})")


def _figure(side: Side, metric: Metric) -> str:
    if side.ci is None:
        return "— (no sample)"
    text = metric.text(side.ci.mean)
    if side.ci.relative is not None:
        return f"{text} ±{side.ci.relative:.1%}"
    if side.ci.half_width == 0:
        return f"{text} ±0"
    return f"{text} (n={side.n})"


def _pct(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x if round(x, 3) else 0.0:+.1%}"   # no "-0.0%" for a change that rounds to nothing


def _line(text: str) -> None:
    # One unwrapped line: the summary and notes stay greppable whatever the width.
    out.print(text, markup=False, soft_wrap=True)


def _warn(text: str) -> None:
    err.print(f"warning: {text}", markup=False)


_HOW = {"only configuration": "each run has only this configuration",
        "workload": "--match workload: the configuration each run measured the workloads in",
        "mapping": "--match"}


def _print(result: RunComparison, metric: Metric, headings: tuple[str, str]) -> None:
    renamed = any(p.a_key != p.b_key for p in result.pairings)
    for p in result.pairings:
        if p.how != "same key":
            _line(f"compared: A {p.a_label} with B {p.b_label} ({_HOW[p.how]})")
    table = Table("configuration", "workload", f"A {headings[0]}", f"B {headings[1]}",
                  "change", "95% CI of change", "adj. p", "verdict", box=None)
    for col in table.columns[2:7]:
        col.justify = "right"
    for p in result.points:
        c = p.comparison
        tags = [f"emulated in {s}" for s, side in (("A", p.a), ("B", p.b)) if side.emulated]
        tags += [f"stalled in {s}" for s, side in (("A", p.a), ("B", p.b)) if side.stalled]
        name = p.config_label
        if renamed and p.config_label_b != p.config_label:
            name += f" ↔ {p.config_label_b}"
        ci = ("—" if c.p_value is None else "unbounded" if c.low is None or c.high is None
              else f"{_pct(c.low)} … {_pct(c.high)}")
        table.add_row(name + "".join(f" [{t}]" for t in tags),
                      p.workload_label, _figure(p.a, metric),
                      _figure(p.b, metric), _pct(p.change), ci,
                      p_column(c.adjusted_p if c.adjusted_p is not None else c.p_value), p.verdict)
    if result.points:
        out.print(table)
    else:
        _line("no point was measured in both runs"
              + ("" if result.pairings else ": no configuration of A has the name of one of B; "
                 "pair them with --match CONFIG_A=CONFIG_B (or --match workload)"))
    if any(p.direction for p in result.points):
        _line(f"mixed workloads: {metric.name} compared per direction (read, write); "
              "percentiles of reads and writes are never averaged")
    s = result.summary
    better = "higher" if result.higher_is_better else "lower"
    counts = [f"{s.better} significantly better in B", f"{s.worse} significantly worse",
              f"{s.no_difference} no significant difference"]
    if s.not_judged:
        counts.append(f"{s.not_judged} not judged (fewer than 2 samples a side)")
    method = {"holm": "Holm", "bh": "Benjamini–Hochberg"}[result.adjustment]
    _line(f"{len(result.points)} points: {', '.join(counts)} ({better} {metric.name} is better; "
          f"p {method}-adjusted across {s.family} comparisons)")
    _line("p-values treat each run's samples as independent draws of one quantity; what a whole "
          "run shares (file layout, cache state, background load) is not in them: repeat a run "
          "to see how far two runs of the same setup differ")
    for name, run, labels in (("A", result.run_a, result.only_a), ("B", result.run_b, result.only_b)):
        if labels:
            _line(f"only in {name} (run {run}), not compared: {', '.join(labels)}")
    for u in result.unpaired:
        name = "A" if u.measured_in == "a" else "B"
        _line(f"measured in {name} only, not compared: {u.config_label} · {u.workload_label}")


def compare(
    run_a: Annotated[str, typer.Argument(metavar="RUN_A", help="The reference run: a number (see `iomatrix runs`) or 'last'.")],
    run_b: Annotated[Optional[list[str]], typer.Argument(metavar="[RUN_B [RUN...]]", help="The run compared against it: a number or 'last' (in --db-b when given). Several: a fleet (runs of other nodes or storages), each against RUN_A, one line per node. None: RUN_A is a cluster run (run --nodes), its nodes compared as a fleet, each against the first.")] = None,
    metric: Annotated[str, typer.Option(help=OPTION_HELP)] = "iops",
    db: Db = DEFAULT_DB,
    db_b: Annotated[Optional[str], typer.Option("--db-b", help="Read RUN_B from this database (a file or a PostgreSQL URL, e.g. copied from another host) instead of --db.")] = None,
    match: Annotated[Optional[list[str]], typer.Option("--match", metavar="workload|A=B", help="Pair configurations other than by name: 'workload' pairs the configuration each run measured a workload in; CONFIG_A=CONFIG_B (repeatable) pairs run A's configuration with run B's, by label, key or imported folder name. Runs of one configuration each are paired without it.")] = None,
    with_stalled: WithStalled = False,
) -> None:
    """Compare the same points across two runs (another host, storage, or an upgrade): change of B
    against A, its 95 % CI and a multiple-comparison adjusted Welch test per point. With more
    runs (a fleet: several nodes or storages), each against RUN_A: which node is slower, by how
    much, the method and the noise floor. With RUN_A alone, a cluster run: its nodes as a fleet."""
    from iomatrix.analysis.crossrun import compare_runs

    chosen = metric_named(metric)
    if chosen is None:
        raise typer.BadParameter(f"{metric!r}: choose {OPTION_CHOICES}", param_hint="--metric")
    if not run_b:
        from iomatrix.analysis.fleet import by_node

        if db_b is not None or match:
            raise typer.BadParameter("a cluster run's nodes are compared within --db, by "
                                     "configuration", param_hint="--db-b/--match")
        _fleet(by_node(load_run(db, run_a, with_stalled=with_stalled)), chosen, db)
        return
    if len(run_b) > 1:
        if db_b is not None or match:
            raise typer.BadParameter("a fleet (3 runs or more) reads every run from --db and "
                                     "pairs configurations by name", param_hint="--db-b/--match")
        _fleet([load_run(db, r, with_stalled=with_stalled) for r in (run_a, *run_b)], chosen, db)
        return
    a = load_run(db, run_a, with_stalled=with_stalled)
    b = load_run(db_b or db, run_b[0], with_stalled=with_stalled)
    result = compare_runs(a, b, metric=chosen.key, match=match or ())
    _line(_header("A", a, db))
    _line(_header("B", b, db_b or db))
    for side, emulated in (("A", result.emulated_a), ("B", result.emulated_b)):
        if emulated:
            out.print(Text(f"EMULATED (TCG): run {side}'s guest figures measure QEMU's CPU "
                           "emulator, not the hardware", style="bold red"))
    if result.mixed_emulation:
        _warn("this comparison mixes emulated (TCG) and native figures: points marked "
              "'emulated in' one run only compare the emulator with the hardware")
    for d in result.host_differences:
        _warn(f"host {d.key} differs: A {d.a or '(not recorded)'} · B {d.b or '(not recorded)'}")
    for d in result.method_differences:
        _warn(f"method {d.key} differs: A {d.a} · B {d.b}")
    for v in result.version_changes:
        _warn(f"the runs straddle a version change that moves baselines: {v.text()}")
    if result.latency_difference is not None:
        d = result.latency_difference
        _warn(f"{d.key} is not the same latency: A {d.a} · B {d.b}")
    _print(result, chosen, (chosen.heading_for(run_latency(a)), chosen.heading_for(run_latency(b))))
    _stalls(a, b, result)


def _stalls(a: StoredRun, b: StoredRun, result: RunComparison) -> None:
    """The configurations that stalled in either run, beside the other run's count: a
    configuration that stalls in one run and not the other is a finding of the comparison."""
    from iomatrix.analysis.stalls import RULE, contrast

    found = contrast(a, b, [(p.a_key, p.b_key) for p in result.pairings])
    if not found:
        return
    kept = " (here they are in: --with-stalled)" if a.with_stalled else ""
    _line(RULE + kept)
    for one in found:
        _line(f"stalls: {one.text}")


def _fleet(runs: list[StoredRun], metric: Metric, db: Path) -> None:
    from iomatrix.analysis.fleet import by_storage, compare_fleet, slowest_first, stalls_by_node

    fleet = compare_fleet(runs, metric=metric.key)
    _line(_header("reference", runs[0], db))
    if any(r.emulated for r in runs):
        _warn("some runs' guests were emulated (TCG): their figures measure the emulator")
    table = Table("node", "storage", "run", "points", f"{metric.name} vs reference", "95% CI",
                  "worse", "better", "n.s.", "noise floor", "standing", box=None)
    for col in table.columns[2:10]:
        col.justify = "right"
    for n in slowest_first(fleet):
        ci = ("—" if n.low is None or n.high is None else f"{_pct(n.low)} … {_pct(n.high)}")
        floor = "—" if n.noise_floor is None else f"±{n.noise_floor:.1%}"
        counts = (["—"] * 4 if n.standing == "reference"
                  else [str(x) for x in (n.points, n.worse, n.better, n.no_difference)])
        table.add_row(n.node, n.storage, str(n.run), counts[0], _pct(n.change),
                      ci, *counts[1:], floor, n.standing)
    out.print(table)
    for n in fleet.nodes[1:]:
        _line(f"{n.node} (run {n.run}): {n.verdict}")
        for d in n.differences:
            _line(f"  {n.node}: host {d.key} differs: reference {d.a or '(not recorded)'} · "
                  f"{d.b or '(not recorded)'}")
        for v in n.version_changes:
            _warn(f"{n.node} (run {n.run}) and the reference straddle a version change that "
                  f"moves baselines: {v.text('reference', n.node)}")
    storages = by_storage(fleet)
    if len(storages) > 1:
        _line("by storage (median change of its nodes): " + ", ".join(
            f"{k} {_pct(v)}" for k, v in storages.items()))
    _line(f"per point: {fleet.point_method}; per node: {fleet.node_method}")
    for line in stalls_by_node(runs):
        _line(line)
