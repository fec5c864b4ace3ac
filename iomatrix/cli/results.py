"""``iomatrix runs``, ``show``, ``report`` and ``export``: the stored runs as a list, a table, an
HTML page or a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from iomatrix.analysis.metrics import OPTION_CHOICES, OPTION_HELP, metric_named
from iomatrix.cli.common import (DEFAULT_DB, EMULATED, Db, RunRef, WithStalled, environment, err,
                                 load_run, open_store, out, write_report)
from iomatrix.core.files import write_file_atomically
from iomatrix.core.text import printable
from iomatrix.vocab.words import Accelerator, TrialStatus


def _date(value: str | None, option: str) -> str | None:
    """An ISO date (2026-11-25) or date and time (2026-11-25T08:00), as ``--since`` and
    ``--until`` take them."""
    import re

    if value is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}(T\d{2}(:\d{2}(:\d{2})?)?)?", value):
        raise typer.BadParameter(f"{value!r}: give a date (2026-11-25) or a date and time "
                                 "(2026-11-25T08:00), UTC", param_hint=option)
    return value


def runs(
    db: Db = DEFAULT_DB,
    host: Annotated[Optional[str], typer.Option("--host", help="Only the runs measured on this host (its hostname); a cluster run's too when it is the controller or one of its nodes (by node name or hostname).")] = None,
    suite: Annotated[Optional[str], typer.Option("--suite", help="Only the runs of this suite (its name).")] = None,
    target: Annotated[Optional[str], typer.Option("--target", help="Only the runs over this storage: the target's directory or device, or one of its [[targets]] names.")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Only the runs started on or after this date (2026-11-25) or time (2026-11-25T08:00), UTC.")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Only the runs started on or before this date (the whole day) or before this time, UTC.")] = None,
) -> None:
    """List the stored runs (of one host, suite, storage or time span)."""
    with open_store(db) as store:
        rows = store.list_runs(host=host, suite=suite, target=target,
                               since=_date(since, "--since"), until=_date(until, "--until"))
        # A run marked running whose process is gone was killed: say so, and how to go on.
        gone = {run_id for run_id, owner in store.running_runs()
                if owner is None or not store.alive(owner)[0]}
    table = Table("run", "suite", "started (UTC)", "status", "accel", "ok", "failed", "host",
                  box=None)
    for r in rows:
        status = "stopped (process gone; --resume)" if r.id in gone else r.status
        table.add_row(str(r.id), r.suite_name, r.created_at, status,
                      r.accelerator + (" (emulated)" if r.accelerator == Accelerator.TCG else ""),
                      str(r.trials_ok), str(r.trials_failed),
                      f"{len(r.nodes)} nodes: {', '.join(r.nodes)}" if r.nodes else r.hostname)
    filtered = any(v is not None for v in (host, suite, target, since, until))
    out.print(table if rows else "no runs match" if filtered else "no runs stored")


def show(
    run_ref: RunRef,
    db: Db = DEFAULT_DB,
    command: Annotated[bool, typer.Option("--command", help="Also print, per configuration, the command lines that realized it and what QEMU applied.")] = False,
    with_stalled: WithStalled = False,
) -> None:
    """Print a run's points: IOPS, bandwidth and latency per configuration × workload."""
    from iomatrix.analysis.efficiency import efficiency
    from iomatrix.analysis.ioping import is_ioping
    from iomatrix.analysis.metrics import METRICS, figure_text, run_latency
    from iomatrix.analysis.pagecache import mark
    from iomatrix.analysis.points import points
    from iomatrix.analysis.impossible import MARK as BARE
    from iomatrix.analysis.impossible import RULE as BARE_RULE
    from iomatrix.analysis.impossible import of_run
    from iomatrix.analysis.stalls import MARK as STALL

    stored = load_run(db, run_ref, with_stalled=with_stalled)
    labels = {c.key: c.label for c in stored.configs}
    workloads = {w.key: w.label for w in stored.workloads}
    _heading(stored)
    short = _short_depths(stored, labels, workloads)
    found = [p for p in points(stored) if not is_ioping(p.workload_key)]   # paced: own table
    bare = efficiency(found, stored.configs)
    faster = of_run(stored)
    latency = run_latency(stored)
    iops, bw, mean, p99 = (METRICS[k] for k in ("iops", "bw_bytes", "lat_mean_ns", "lat_p99_ns"))
    p50_heading = p99.heading_for(latency).replace("p99", "p50")
    us = lambda ns: figure_text(None if ns is None else ns / 1000)  # noqa: E731
    columns = ["configuration", "workload", "n", iops.heading, "±95% CI", bw.heading,
               mean.heading_for(latency), p50_heading, p99.heading_for(latency),
               "CPU µs/IO", "steady"]
    if bare:
        columns += ["% bare IOPS", "+lat µs"]
    table = Table(*columns, box=None)
    emulated = {t.config_key for t in stored.trials if t.accelerator == Accelerator.TCG}
    for col in table.columns[2:]:
        col.justify = "right"
    for p in found:
        ci = p.iops_ci
        label = labels[p.config_key] + (" [emulated]" if p.config_key in emulated else "")
        label += f" {mark(p)}" if mark(p) else ""
        label += f" {STALL}" if p.stalled else ""
        label += f" {QD_SHORT}" if (p.config_key, p.workload_key) in short else ""
        label += f" {BARE}" if (p.config_key, p.workload_key) in faster else ""
        row = [label, workloads[p.workload_key],
               f"{p.samples}" + (f" ({p.failed} failed)" if p.failed else "")
               + (f" ({p.stalled} stalled{', in' if stored.with_stalled else ''})"
                  if p.stalled else ""),
               iops.text(p.iops),
               "—" if ci is None or ci.relative is None else f"±{ci.relative:.1%}",
               bw.text(p.bw_bytes), mean.text(p.lat_mean_ns),
               "r/w ↓" if p.mixed and p.lat_p50_ns is None else us(p.lat_p50_ns),
               "r/w ↓" if p.mixed and p.lat_p99_ns is None else p99.text(p.lat_p99_ns),
               figure_text(p.cpu_us_per_io),
               f"{p.steady_reached}/{p.steady_checked}" if p.steady_checked else "—"]
        if bare:
            e = bare.get((p.config_key, p.workload_key))
            row += ["—" if e is None else e.iops_text,
                    figure_text(e and e.added_lat_us, signed=True)]
        table.add_row(*row)
        for name, d in p.directions.items():   # a mixed workload: each direction on its own
            table.add_row(label, f"{workloads[p.workload_key]} · {name}", "",
                          iops.text(d.iops), "", bw.text(d.bw_bytes), mean.text(d.lat_mean_ns),
                          us(d.lat_p50_ns), p99.text(d.lat_p99_ns), "", "",
                          *([""] * (len(columns) - 11)))
    if found:
        out.print(table)
        out.print(latency.sentence, markup=False)
    _ioping_table(stored, {k: v + (" [emulated]" if k in emulated else "")
                           for k, v in labels.items()}, workloads)
    _scaling_table(stored)
    _page_cache_legend(found)
    _stall_legend(stored)
    if faster:
        out.print(BARE_RULE, markup=False, soft_wrap=True)
    if any(p.mixed for p in found):
        out.print("mixed workloads: percentiles per direction (the · read and · write rows); "
                  "percentiles of reads and writes cannot be averaged into one", markup=False)
    _trials_and_notes(stored, labels, workloads, command=command)


QD_SHORT = "[QD short]"
"""show's mark of a point with a trial whose achieved queue depth fell short (``iomatrix.fio.depth``)."""


def _short_depths(stored: Any, labels: dict[str, str],
                  workloads: dict[str, str]) -> set[tuple[str, str]]:
    """The points with an ok trial short of its queue depth, said before the table (the mark's
    legend, and per point the depth each such trial achieved)."""
    from iomatrix.fio.depth import SHORT_RULE

    short: dict[tuple[str, str], list[str]] = {}
    for t in stored.trials:
        if t.status == TrialStatus.OK and t.depth is not None and t.depth.short:
            short.setdefault((t.config_key, t.workload_key), []).append(
                f"{t.depth.achieved:.1f}")
    if short:
        out.print(f"{QD_SHORT}: a trial's {SHORT_RULE} (fio did not keep the asked depth queued)",
                  markup=False, soft_wrap=True)
    for (config, workload), achieved in short.items():
        asked = next(w.iodepth for w in stored.workloads if w.key == workload)
        out.print(f"  {labels[config]} · {workloads[workload]}: asked {asked}, achieved "
                  f"{', '.join(achieved)}", markup=False, soft_wrap=True)
    return set(short)


def _stall_legend(stored: Any) -> None:
    """The legend of show's [STALL] mark and the configurations that stalled."""
    from iomatrix.analysis.stalls import RULE, by_config

    found = by_config(stored)
    if not found:
        return
    out.print(RULE + (" (here they are in: --with-stalled)" if stored.with_stalled else ""),
              markup=False, soft_wrap=True)
    for one in found:
        out.print(f"  stalls: {one.text}", markup=False, soft_wrap=True)


def _heading(stored: Any) -> None:
    """The run's line (suite, status, host, target), its nodes, and whether it was emulated."""
    where = (f"targets {stored.host['targets']} (notes below)" if "targets" in stored.host else
             f"target {stored.host.get('target', '?')} ({stored.host.get('target_fs', '?')})")
    out.print(f"run {stored.id} · suite {stored.suite.name} · {stored.status} · "
              f"{stored.created_at} · {stored.host.get('hostname', '?')} · {where}")
    if stored.nodes and stored.suite.method.concurrent_nodes:
        counted = any("node_count" in c.params for c in stored.configs)
        out.print(("nodes, the first node_count of them loading the target at once in each "
                   "trial: " if counted else "nodes, loading the target at once in every trial: ")
                  + ", ".join(n.name for n in stored.nodes), markup=False, soft_wrap=True)
    elif stored.nodes:
        out.print("nodes: " + "; ".join(
            f"{n.name} ({n.host.get('hostname', '?')}): {n.status}" + (f": {n.reason}" if n.reason else "")
            for n in stored.nodes) + f" (`iomatrix compare {stored.id}` compares them)",
            markup=False, soft_wrap=True)
    if stored.emulated:
        out.print(EMULATED)


def _trials_and_notes(stored: Any, labels: dict[str, str], workloads: dict[str, str], *,
                      command: bool) -> None:
    """Per-VM figures, failed trials, the run's notes, and (``command``) what realized each
    configuration."""
    from iomatrix.analysis.metrics import METRICS

    iops = METRICS["iops"]
    per_vm = [t for t in stored.trials if t.vm_samples]
    if per_vm:
        vm_table = Table("configuration", "workload", "#", "per-VM IOPS", box=None)
        for t in per_vm:
            vm_table.add_row(labels[t.config_key], workloads[t.workload_key], str(t.sample_index + 1),
                             "  ".join(f"vm{s.vm}:{iops.text(s.iops)}" for s in t.vm_samples))
        out.print(vm_table)
    failed = [t for t in stored.trials if t.status == TrialStatus.FAILED]
    for t in failed:
        out.print(f"failed: {labels[t.config_key]} · {workloads[t.workload_key]} "
                  f"#{t.sample_index + 1}: {t.reason}", markup=False)
    for note in stored.notes:
        out.print(f"note: {note}", markup=False)
    if command:
        for config in stored.configs:
            trial = next((t for t in stored.trials if t.config_key == config.key and t.command), None)
            if trial is None:
                continue
            out.print(f"\n# {config.label} ({trial.accelerator})", markup=False)
            out.print(trial.command, markup=False)
            for key, value in sorted(trial.applied.items()):
                out.print(f"#   applied {key} = {value}", markup=False)


def _ioping_table(stored: Any, labels: dict[str, str], workloads: dict[str, str]) -> None:
    """The run's ioping latencies (seed 001 §9), each with the tool that measured it."""
    from iomatrix.analysis.ioping import ioping_figures
    from iomatrix.analysis.metrics import figure_text

    figures = ioping_figures(stored)
    if not figures:
        return
    us = lambda ns: figure_text(ns / 1000)  # noqa: E731
    table = Table("configuration", "workload", "measured by", "n", "requests", "mean µs",
                  "±95% CI", "min µs", "max µs", "mdev µs", "ioping iops", "+lat µs", box=None)
    for col in table.columns[3:]:
        col.justify = "right"
    for f in figures:
        ci = f.mean_ci
        table.add_row(labels[f.config_key], workloads[f.workload_key], f.measured_by,
                      str(f.trials), str(f.requests), us(f.mean_ns),
                      "—" if ci is None or ci.relative is None else f"±{ci.relative:.1%}",
                      us(f.min_ns), us(f.max_ns), us(f.mdev_ns), figure_text(f.iops),
                      figure_text(f.added_us, signed=True))
    out.print(table)
    out.print("ioping workloads (seed 001 §9): the latency of single reads that miss the page "
              "cache, one per interval, every request counted; ioping iops = 1 / mean latency, "
              "as ioping prints it (the study's \"IOPS in k\"). Measured by ioping itself where "
              "it ran (host mode), elsewhere by fio's equivalent job: 4 KiB random direct reads "
              "of the same 1 MiB, QD1, one interval apart (iomatrix/fio/ioping.py)",
              markup=False, soft_wrap=True)


def _page_cache_legend(found: list[Any]) -> None:
    """The legend of show's [RAM] and [RAM?] marks, with the shares measured."""
    from iomatrix.analysis.pagecache import ADVICE, RULE, UNKNOWN, share_range, summary

    counted = summary(found)
    if counted.from_ram:
        shares = [p.device_share for p in found if p.from_ram]
        reads = [s.read for s in shares if s.read is not None]
        writes = [s.write for s in shares if s.write is not None]
        measured = "; ".join(f"{name} {share_range(v)} reached the device"
                             for name, v in (("reads", reads), ("writes", writes)) if v)
        out.print(f"{RULE}. {counted.from_ram} of {counted.points} page-cache points ({measured}); "
                  f"{ADVICE}", markup=False, soft_wrap=True)
    if counted.unknown:
        out.print(f"{UNKNOWN} ({counted.unknown} of {counted.points} points): "
                  f"{'; '.join(counted.reasons)}", markup=False, soft_wrap=True)


def report(
    run_refs: Annotated[list[str], typer.Argument(metavar="RUN [RUN...]", help="Run number (see `iomatrix runs`), or 'last'. Several: a fleet page, every run against the first (the reference).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write index.html into.")] = Path("iomatrix-report"),
    metric: Annotated[str, typer.Option(help="A fleet page's metric: " + OPTION_HELP)] = "iops",
    db: Db = DEFAULT_DB,
    with_stalled: WithStalled = False,
) -> None:
    """Write a run's self-contained HTML report (charts and a table of every point). With several
    runs (nodes or storages of a fleet), one page that compares each with the first: which node
    or storage is slower, by how much, the method and the noise floor. A cluster run's report
    has such a page of its nodes too (``nodes/``)."""
    from iomatrix.report.fleet import build_fleet_data, write_fleet_report

    chosen = metric_named(metric)
    if chosen is None:
        raise typer.BadParameter(f"{metric!r}: choose {OPTION_CHOICES}", param_hint="--metric")
    if len(run_refs) == 1:
        out.print(f"report: {write_report(db, run_refs[0], out_dir, with_stalled=with_stalled)}")
        run = load_run(db, run_refs[0], with_stalled=with_stalled)
        if run.nodes:                # a cluster run: its nodes compared, on a page of their own
            from iomatrix.analysis.fleet import by_node

            page = write_fleet_report(build_fleet_data(by_node(run), metric=chosen.key),
                                      out_dir / "nodes")
            out.print(f"nodes report: {page}")
        return
    runs = [load_run(db, r, with_stalled=with_stalled) for r in run_refs]
    out.print(f"fleet report: {write_fleet_report(build_fleet_data(runs, metric=chosen.key), out_dir)}")


def export(
    run_ref: RunRef,
    format: Annotated[str, typer.Option("--format", help="csv (one row per trial and direction), json (the whole run) or suite (the suite text the run keeps, job files included: it runs again as a suite file).")] = "csv",
    output: Annotated[Optional[Path], typer.Option("--out", help="File to write; default standard output.")] = None,
    db: Db = DEFAULT_DB,
) -> None:
    """Export a run's raw samples as CSV or JSON, or the suite it ran."""
    from iomatrix.report.export import samples_csv

    if format not in ("csv", "json", "suite"):
        raise typer.BadParameter(f"{format!r}: choose csv or json, or suite (the suite text)",
                                 param_hint="--format")
    stored = load_run(db, run_ref)
    if format == "suite":
        text = stored.suite.runs_again
    else:
        text = stored.model_dump_json(indent=1) if format == "json" else samples_csv(stored)
    if output is None:
        # Raw text, not through rich: the file a script reads must be exactly what was exported;
        # read on a terminal, what the run's strings hold is shown, not obeyed.
        stdout = environment().stdout
        text = printable(text, lines=True) if stdout.is_terminal else text
        stdout.file.write(text if text.endswith("\n") else text + "\n")
    else:
        write_file_atomically(output, text)
        err.print(f"wrote {output}")


def _scaling_table(stored: Any) -> None:
    """A cluster-load run's scaling against the node count ([matrix] node_count), per family
    and workload (``analysis.scaling``): aggregate and per-node IOPS, latency, the efficiency
    aggregate / (N × one node), each node's share of the one-node figure, where adding a node
    stops adding IOPS."""
    from iomatrix.analysis.metrics import figure_text
    from iomatrix.analysis.scaling import SATURATION_RULE, Figure, scaling

    def ci(f: Figure | None, scale: float = 1.0, percent: bool = False) -> str:
        if f is None:
            return "—"
        text = (lambda x: f"{x * 100:.0f}%") if percent else (lambda x: figure_text(x * scale))
        bounds = "" if f.low is None or f.high is None else f" [{text(f.low)}, {text(f.high)}]"
        return text(f.mean) + bounds

    curves = scaling(stored)
    for curve in curves:
        table = Table("nodes", "aggregate IOPS [95% CI]", "IOPS per node", "mean lat µs",
                      "aggregate / (N × one node)", "each node's share of one node",
                      "each node's mean lat µs",
                      title=f"scaling: {curve.family} · {curve.workload_label}", box=None)
        for row in curve.rows:
            shares = "  ".join(f"{name}:{ci(f, percent=True)}"
                               for name, f in row.node_share.items())
            lats = "  ".join(f"{name}:{ci(f)}" for name, f in row.node_latency_us.items())
            table.add_row(str(row.nodes), ci(row.aggregate_iops), ci(row.per_node_iops),
                          ci(row.latency_us), ci(row.efficiency, percent=True), shares or "—",
                          lats or "—")
        out.print(table)
        out.print(f"scaling: {curve.saturation}", markup=False, soft_wrap=True)
    if curves:
        out.print(f"scaling rule: {SATURATION_RULE}; shares and gains are paired by round",
                  markup=False, soft_wrap=True)
