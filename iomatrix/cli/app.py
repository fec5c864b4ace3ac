"""``iomatrix``: run suites, list and show runs, write reports and exports, check the host."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from iomatrix import __version__
from iomatrix.cli.appliance import app as appliance_app
from iomatrix.cli.status import EPILOG, ExitStatus, status_for
from iomatrix.core.errors import IomatrixError, SuiteError

app = typer.Typer(
    name="iomatrix",
    help="Which virtual-disk settings should this QEMU/KVM host use, and how sure are we? "
         "iomatrix sweeps disk configurations, measures them with fio and stores the results.",
    epilog=EPILOG, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]})

# Piped output keeps whole table rows on one line: easier to grep and diff than 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"traceback": False}

Db = Annotated[Path, typer.Option("--db", envvar="IOMATRIX_DB", help="Results database file.",
                                  show_default=True)]
RunRef = Annotated[str, typer.Argument(help="Run number (see `iomatrix runs`), or 'last'.")]
DEFAULT_DB = Path("iomatrix.db")


def _version(value: bool) -> None:
    if value:
        out.print(f"iomatrix {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    traceback: Annotated[bool, typer.Option("--traceback", help="Show the full traceback of an error.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    _state["traceback"] = traceback


def _store(db: Path, *, must_exist: bool = True):  # type: ignore[no-untyped-def]
    from iomatrix.core.errors import StoreError
    from iomatrix.store import Store

    if must_exist and not db.exists():
        raise StoreError(f"{db}: no results database here", hint="run a suite first, or pass --db")
    return Store(db)


def _load_run(db: Path, run_ref: str):  # type: ignore[no-untyped-def]
    """The stored run ``run_ref`` (a number or 'last') of the database ``db``."""
    with _store(db) as store:
        return store.load_run(store.resolve(run_ref))


EMULATED = "[bold red]EMULATED (TCG): guest figures measure QEMU's CPU emulator, not this hardware[/]"


def p_column(p: float | None) -> str:
    """A p-value as a table column shows it."""
    return "—" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def _print_plan(suite) -> None:  # type: ignore[no-untyped-def]
    """The trials in order, the sessions and the estimate, without running anything."""
    from iomatrix.suite.plan import estimate_seconds, plan
    from iomatrix.suite import expand

    expansion = expand(suite)
    seed = suite.method.seed if suite.method.seed is not None else 0
    blocks = plan(expansion, suite.method.samples, seed)
    n = 0
    for block in blocks:
        session = {"host": "fio on the target", "blocklayer": "qemu-storage-daemon start",
                   "guest": f"boot {block.config.vms or 1} VM(s)"}[block.config.mode]
        out.print(f"round {block.round + 1} · {block.config.label} · {session}", markup=False)
        for w in block.workloads:
            n += 1
            out.print(f"  {n:>4}  {w.label}", markup=False)
    boots = sum((b.config.vms or 1) for b in blocks if b.config.mode == "guest")
    starts = sum(1 for b in blocks if b.config.mode == "blocklayer")
    seconds = estimate_seconds(blocks, suite.method)
    extra = ""
    if suite.method.target_ci is not None:
        extra = (f"; then up to {suite.method.max_samples - suite.method.samples} more rounds for "
                 f"points whose 95 % CI is wider than ±{suite.method.target_ci:.1%}")
    out.print(f"{n} trials in {len(blocks)} sessions ({boots} VM boots, {starts} daemon starts), "
              f"about {seconds / 60:.1f} min plus preconditioning{extra}"
              + ("" if suite.method.seed is not None else "; the run draws its own shuffle seed"),
              markup=False)
    if any(c.mode == "guest" for c in expansion.configurations):
        out.print("guest estimates assume TCG boots (about 3 s); under KVM they are shorter, and "
                  "under TCG parts marked under_tcg run fewer trials", markup=False)


def _interrupt(signum: int, frame: object) -> None:
    from iomatrix.qemu.qmp import defer_interrupt

    if not defer_interrupt():
        raise KeyboardInterrupt


@app.command()
def run(
    suite: Annotated[str, typer.Argument(help="Suite file (TOML) or built-in suite name (see `iomatrix suites`).")] = "quick",
    db: Db = DEFAULT_DB,
    target: Annotated[Optional[Path], typer.Option(help="Use this directory as the target instead of the suite's [target] directory.")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the images and the run's scratch directory.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write the HTML report into this directory when the run ends.")] = None,
    accel: Annotated[Optional[str], typer.Option(help="How guests run: kvm, tcg, or auto (KVM when a probe boot works, else TCG). Overrides [method] accel.")] = None,
    show_plan: Annotated[bool, typer.Option("--plan", help="Print the trials in order, the sessions (daemon starts, VM boots) and the estimated time; run nothing.")] = False,
    resume: Annotated[Optional[str], typer.Option(help="Continue this stored run (a number or 'last'): measure only the trials it lacks. SUITE is then ignored.")] = None,
) -> None:
    """Run a suite: every configuration × workload, stored as one run."""
    from iomatrix.cli.progress import TerminalProgress
    from iomatrix.measure.runner import run_suite
    from iomatrix.suite import load_suite, load_suite_text

    if accel not in (None, "auto", "kvm", "tcg"):
        raise typer.BadParameter(f"{accel!r}: choose kvm, tcg or auto", param_hint="--accel")
    # SIGTERM and SIGHUP stop a run as Ctrl-C does: daemons and fio stopped, images removed.
    # SIGINT gets the same handler rather than Python's default: asyncio.run (QMP) replaces only
    # the default handler, with one that cancels its task, and a library that absorbs the
    # cancellation would absorb the Ctrl-C with it.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    if resume is not None:
        with _store(db) as store:
            stored = store.load_run(store.resolve(resume))
        if stored.status == "complete":
            raise SuiteError(f"run {stored.id} is complete: nothing to resume")
        loaded = load_suite_text(stored.suite_text, source=stored.suite_source)
        resume_id: int | None = stored.id
    else:
        loaded = load_suite(suite)
        resume_id = None
    if show_plan:
        _print_plan(loaded)
        return
    if target is not None:
        if loaded.target.device is not None:
            raise SuiteError(f"{loaded.source_path}: --target replaces a directory target, "
                             "but this suite names a device")
        loaded = loaded.model_copy(update={"target": loaded.target.model_copy(update={"directory": target})})
    with _store(db, must_exist=False) as store, TerminalProgress(err) as progress:
        try:
            outcome = run_suite(loaded, store, keep=keep, progress=progress, accel=accel,
                                resume=resume_id)
        except KeyboardInterrupt:
            err.print("interrupted: the trials measured so far are stored; the run is marked interrupted")
            raise typer.Exit(ExitStatus.INTERRUPTED) from None
    out.print(f"run {outcome.run_id}: {outcome.trials_ok} trials ok, {outcome.trials_failed} failed, "
              f"{outcome.wall_seconds:.0f} s ({db})")
    if report is not None:
        path = _write_report(db, str(outcome.run_id), report)
        out.print(f"report: {path}")
    if outcome.trials_failed:
        raise typer.Exit(ExitStatus.TRIALS_FAILED)


@app.command()
def runs(db: Db = DEFAULT_DB) -> None:
    """List the stored runs."""
    with _store(db) as store:
        rows = store.list_runs()
    table = Table("run", "suite", "started (UTC)", "status", "accel", "ok", "failed", box=None)
    for r in rows:
        table.add_row(str(r.id), r.suite_name, r.created_at, r.status,
                      r.accelerator + (" (emulated)" if r.accelerator == "tcg" else ""),
                      str(r.trials_ok), str(r.trials_failed))
    out.print(table if rows else "no runs stored")


@app.command()
def show(
    run_ref: RunRef,
    db: Db = DEFAULT_DB,
    command: Annotated[bool, typer.Option("--command", help="Also print, per configuration, the command lines that realized it and what QEMU applied.")] = False,
) -> None:
    """Print a run's points: IOPS, bandwidth and latency per configuration × workload."""
    from iomatrix.analysis.efficiency import efficiency
    from iomatrix.analysis.points import points

    stored = _load_run(db, run_ref)
    labels = {c.key: c.label for c in stored.configs}
    workloads = {w.key: w.label for w in stored.workloads}
    out.print(f"run {stored.id} · suite {stored.suite_name} · {stored.status} · "
              f"{stored.created_at} · {stored.host.get('hostname', '?')} · "
              f"target {stored.host.get('target', '?')} ({stored.host.get('target_fs', '?')})")
    if stored.emulated:
        out.print(EMULATED)
    found = points(stored)
    bare = efficiency(found)
    columns = ["configuration", "workload", "n", "IOPS", "±95% CI", "MiB/s", "p50 µs", "p99 µs",
               "CPU µs/IO", "steady"]
    if bare:
        columns += ["% bare IOPS", "+lat µs"]
    table = Table(*columns, box=None)
    emulated = {t.config_key for t in stored.trials if t.accelerator == "tcg"}
    for col in table.columns[2:]:
        col.justify = "right"
    for p in found:
        ci = p.iops_ci
        row = [labels[p.config_key] + (" [emulated]" if p.config_key in emulated else ""),
               workloads[p.workload_key],
               f"{p.samples}" + (f" ({p.failed} failed)" if p.failed else ""),
               _num(p.iops, "{:,.0f}"),
               "—" if ci is None or ci.relative is None else f"±{ci.relative:.1%}",
               _num(p.bw_bytes and p.bw_bytes / 2**20, "{:,.1f}"),
               _num(p.lat_p50_ns and p.lat_p50_ns / 1000, "{:,.1f}"),
               _num(p.lat_p99_ns and p.lat_p99_ns / 1000, "{:,.1f}"),
               _num(p.cpu_us_per_io, "{:,.1f}"),
               f"{p.steady_reached}/{p.steady_checked}" if p.steady_checked else "—"]
        if bare:
            e = bare.get((p.config_key, p.workload_key))
            row += ["—" if e is None else e.iops_text, _num(e and e.added_lat_us, "{:+,.1f}")]
        table.add_row(*row)
    out.print(table)
    per_vm = [t for t in stored.trials if t.vm_samples]
    if per_vm:
        vm_table = Table("configuration", "workload", "#", "per-VM IOPS", box=None)
        for t in per_vm:
            vm_table.add_row(labels[t.config_key], workloads[t.workload_key], str(t.sample_index + 1),
                             "  ".join(f"vm{s.vm}:{s.iops:,.0f}" for s in t.vm_samples))
        out.print(vm_table)
    failed = [t for t in stored.trials if t.status == "failed"]
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


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def _write_report(db: Path, run_ref: str, out_dir: Path) -> Path:
    from iomatrix.report.data import build_report_data
    from iomatrix.report.html import write_report

    stored = _load_run(db, run_ref)
    return write_report(build_report_data(stored), out_dir)


@app.command()
def report(
    run_ref: RunRef,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write index.html into.")] = Path("iomatrix-report"),
    db: Db = DEFAULT_DB,
) -> None:
    """Write a run's self-contained HTML report (charts and a table of every point)."""
    out.print(f"report: {_write_report(db, run_ref, out_dir)}")


@app.command()
def export(
    run_ref: RunRef,
    format: Annotated[str, typer.Option("--format", help="csv (one row per trial and direction) or json (the whole run).")] = "csv",
    output: Annotated[Optional[Path], typer.Option("--out", help="File to write; default standard output.")] = None,
    db: Db = DEFAULT_DB,
) -> None:
    """Export a run's raw samples as CSV or JSON."""
    from iomatrix.report.export import samples_csv

    if format not in ("csv", "json"):
        raise typer.BadParameter(f"{format!r}: choose csv or json", param_hint="--format")
    stored = _load_run(db, run_ref)
    text = stored.model_dump_json(indent=1) if format == "json" else samples_csv(stored)
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        output.write_text(text)
        err.print(f"wrote {output}")


@app.command()
def suites(name: Annotated[Optional[str], typer.Argument(help="Print this built-in suite's TOML.")] = None) -> None:
    """List the built-in suites, or print one."""
    from iomatrix.suite import builtin_suites, load_suite_text

    texts = builtin_suites()
    if name is not None:
        if name not in texts:
            raise SuiteError(f"{name}: no built-in suite of that name",
                             hint="built-in suites: " + ", ".join(texts))
        out.print(texts[name], markup=False)
        return
    table = Table("suite", "mode", "description", box=None)
    for key, text in texts.items():
        s = load_suite_text(text, source=f"builtin:{key}")
        table.add_row(key, s.method.mode + (" + host baseline" if s.method.baseline else ""),
                      s.suite.description)
    out.print(table)


@app.command()
def doctor(kvm_timeout: Annotated[float, typer.Option(help="Seconds to wait for a kernel to boot under KVM.")] = 10.0) -> None:
    """Check this host: QEMU, qemu-storage-daemon, qemu-img, fio, io_uring, libaio, FUSE, KVM."""
    from iomatrix.measure.doctor import failed_required, run_checks

    checks = run_checks(kvm_timeout=kvm_timeout)
    table = Table("check", "", "detail", box=None)
    for c in checks:
        mark = "[green]ok[/]" if c.ok else ("[red]MISSING[/]" if c.required else "[yellow]no[/]")
        table.add_row(c.name, mark, c.detail + (f"\n  → {c.hint}" if c.hint and not c.ok else ""))
    out.print(table)
    if failed_required(checks):
        raise typer.Exit(ExitStatus.ENVIRONMENT)


app.add_typer(appliance_app)

# Commands kept in their own modules register themselves on ``app`` when imported (each does
# ``from iomatrix.cli.app import app`` and decorates its functions with ``@app.command()``).
from iomatrix.cli import analyze, compare, ingest, recommend  # noqa: E402

COMMAND_MODULES = (analyze, compare, ingest, recommend)


def main() -> None:
    """Console entry point: runs the app and turns errors into one stderr line and an exit code."""
    try:
        app()
    except IomatrixError as exc:
        if _state["traceback"]:
            raise
        for line in str(exc).splitlines():
            err.print(f"iomatrix: {line}", markup=False)
        if exc.hint:
            err.print(f"iomatrix: hint: {exc.hint}", markup=False)
        sys.exit(status_for(exc))
