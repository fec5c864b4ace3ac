"""Progress of a run on the terminal: a rich bar with trial n/N, the current configuration and
workload, and the ETA (a cluster run: a bar per node and one for all); plain lines when stderr is
not a terminal (CI logs, pipes)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID,
                           TextColumn, TimeElapsedColumn)
from rich.text import Text

from iomatrix.suite.configuration import Configuration
from iomatrix.suite.workloads import Workload
from iomatrix.suite.plan import duration_text


def seconds_left(elapsed: float, completed: int, total: int, planned_per_trial: float) -> float:
    """Time left of ``total`` trials: the plan's per-trial time until a trial has finished,
    then the measured mean per trial; it counts down between trials instead of waiting for a
    speed estimate."""
    per_trial = elapsed / completed if completed else planned_per_trial
    return max(0.0, per_trial * total - elapsed)


def eta_text(left: float | None) -> str:
    """``ETA m:ss``, or ``ETA --:--`` when not known."""
    if left is None:
        return "ETA --:--"
    minutes, seconds = divmod(int(left + 0.5), 60)
    return f"ETA {minutes:d}:{seconds:02d}"


class PlannedEtaColumn(ProgressColumn):
    """Time left of a task (``seconds_left``), the plan's per trial in ``planned_per_trial``."""

    def render(self, task: Task) -> Text:
        left = None
        if task.total is not None and task.elapsed is not None:
            left = seconds_left(task.elapsed, int(task.completed), int(task.total),
                                task.fields.get("planned_per_trial", 0.0))
        return Text(eta_text(left), style="progress.remaining")


class TerminalProgress:
    """Implements ``iomatrix.measure.runner.Progress`` for people."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.total = 0
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        self.current = ""

    def __enter__(self) -> "TerminalProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start(self, trials: int, planned_seconds: float) -> None:
        self.total = trials
        planned = (f"{planned_seconds:.0f} s" if planned_seconds < 120
                   else f"{planned_seconds / 60:.0f} min")
        self.console.print(f"[bold]{trials} trials[/], about {planned} planned", markup=True)
        if self.console.is_terminal:
            self.bar = Progress(
                TextColumn("trial"), MofNCompleteColumn(), BarColumn(bar_width=24),
                TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                PlannedEtaColumn(), console=self.console, refresh_per_second=2, transient=False)
            self.task = self.bar.add_task("", total=trials,
                                          planned_per_trial=planned_seconds / max(trials, 1))
            self.bar.start()

    def more(self, trials: int, planned_seconds: float) -> None:
        """After the pilot, the rounds it chose: the bar grows."""
        self.total += trials
        self.console.print(f"{trials} more trials, the rounds the pilot chose "
                           f"(about {planned_seconds:.0f} s)", markup=False)
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, total=self.total)

    def trial_started(self, n: int, config: Configuration, workload: Workload, sample: int) -> None:
        suffix = f" #{sample + 1}" if sample else ""
        self.current = f"{config.label} · {workload.label}{suffix}"
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, description=self.current)

    def trial_finished(self, n: int, ok: bool, detail: str) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=n)
            if not ok:
                # Labels and reasons come from the suite and from fio: never markup.
                self.bar.console.print(Text.assemble(("failed", "red"),
                                                     f" {self.current}: {detail}"),
                                       highlight=False)
        else:
            state = "ok" if ok else "FAILED"
            self.console.print(f"[{n}/{self.total}] {self.current}: {state} {detail}",
                               markup=False, highlight=False)

    def note(self, text: str) -> None:
        target = self.bar.console if self.bar is not None else self.console
        target.print(f"note: {text}", markup=False, highlight=False)


@dataclass
class _Share:
    """A node's share of a cluster run, as its events tell it."""

    total: int
    planned: float
    """iomatrix's estimate of its seconds."""
    done: int = 0
    failed: int = 0
    started: float | None = None
    """When the node began to measure (``time.monotonic()``); None while it prepares."""
    current: str = ""
    ended: bool = False

    def left(self, now: float) -> float:
        """Its time left (``seconds_left``); all of the estimate while the node prepares."""
        if self.ended:
            return 0.0
        if self.started is None:
            return self.planned
        return seconds_left(now - self.started, self.done, self.total,
                            self.planned / max(self.total, 1))


class _LeftColumn(ProgressColumn):
    """The ETA of a task whose ``left`` field says its time left at a ``time.monotonic()``."""

    def render(self, task: Task) -> Text:
        return Text(eta_text(task.fields["left"](time.monotonic())), style="progress.remaining")


class ClusterTerminalProgress:
    """Implements ``iomatrix.measure.cluster.ClusterProgress`` for people: a bar per node (its
    trials done of its share, failures, the trial it measures, its ETA) and one for all nodes,
    whose ETA is the slowest node's (they measure at once); node events as lines. Without a
    terminal, a line per trial: the node's count, the trial, all nodes' count and the ETA."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.shares: dict[str, _Share] = {}
        self.bar: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.all: TaskID | None = None

    def __enter__(self) -> "ClusterTerminalProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def left(self, now: float) -> float:
        return max((s.left(now) for s in self.shares.values()), default=0.0)

    def _print(self, text: str) -> None:
        # labels, reasons and notes come from suites, fio and SSH: never markup
        (self.bar.console if self.bar is not None else self.console).print(
            text, markup=False, highlight=False)

    def _update_all(self) -> None:
        if self.bar is not None and self.all is not None:
            self.bar.update(self.all, total=sum(s.total for s in self.shares.values()),
                            completed=sum(s.done for s in self.shares.values()))

    def start(self, shares: Mapping[str, tuple[int, float]]) -> None:
        self.shares = {name: _Share(trials, seconds) for name, (trials, seconds) in shares.items()}
        total = sum(s.total for s in self.shares.values())
        self._print(f"{total} trials on {len(shares)} nodes at once, about "
                    f"{duration_text(self.left(time.monotonic()))} planned: "
                    + ", ".join(f"{name} {s.total}" for name, s in self.shares.items()))
        if not self.console.is_terminal:
            return
        self.bar = Progress(
            TextColumn("{task.fields[node]}", markup=False), BarColumn(bar_width=20),
            MofNCompleteColumn(), TextColumn("{task.fields[failed]}", style="red", markup=False),
            TextColumn("{task.description}", markup=False), TimeElapsedColumn(), _LeftColumn(),
            console=self.console, refresh_per_second=2, transient=False)
        for name, share in self.shares.items():
            self.tasks[name] = self.bar.add_task("starting", total=share.total, start=False,
                                                 node=name, failed="", left=share.left)
        self.all = self.bar.add_task("", total=total, node="all nodes", failed="",
                                     left=self.left)
        self.bar.start()

    def node_started(self, node: str, trials: int, planned_seconds: float) -> None:
        share = self.shares[node]
        share.total, share.planned, share.started = trials, planned_seconds, time.monotonic()
        self._print(f"{node}: {trials} trials, about {duration_text(planned_seconds)} planned")
        if self.bar is not None:
            self.bar.update(self.tasks[node], total=trials, description="")
            self.bar.start_task(self.tasks[node])
            self._update_all()

    def trial_started(self, node: str, config: Configuration, workload: Workload,
                      sample: int) -> None:
        share = self.shares[node]
        share.current = f"{config.label} · {workload.label}" + (f" #{sample + 1}" if sample else "")
        if self.bar is not None:
            self.bar.update(self.tasks[node], description=share.current)

    def trial_finished(self, node: str, ok: bool, detail: str) -> None:
        share = self.shares[node]
        share.done += 1
        share.failed += not ok
        trial = share.current + (f": {detail}" if detail else "")
        if self.bar is not None:
            self.bar.update(self.tasks[node], completed=share.done,
                            failed=f"{share.failed} failed" if share.failed else "")
            self._update_all()
            if not ok:
                self._print(f"failed {node}: {trial}")
            return
        self._print(f"{node} [{share.done}/{share.total}] {'ok' if ok else 'FAILED'}: {trial} "
                    f"(all nodes {sum(s.done for s in self.shares.values())}/"
                    f"{sum(s.total for s in self.shares.values())}, "
                    f"{eta_text(self.left(time.monotonic()))})")

    def node_ended(self, node: str, status: str, reason: str | None, *, ok: int, failed: int,
                   left: int) -> None:
        share = self.shares[node]
        share.ended = True
        share.done, share.failed = max(0, share.total - left), failed
        self._print(f"{node}: {status}, {ok} trials ok, {failed} failed"
                    + (f", {left} left" if left else "") + (f": {reason}" if reason else ""))
        if self.bar is not None:
            self.bar.update(self.tasks[node], completed=share.done,
                            failed=f"{failed} failed" if failed else "", description=status)
            self._update_all()

    def note(self, text: str) -> None:
        self._print(f"note: {text}")
