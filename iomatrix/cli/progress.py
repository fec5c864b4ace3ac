"""Progress of a run on the terminal: a rich bar with trial n/N, the current configuration and
workload, and the ETA; plain lines when stderr is not a terminal (CI logs, pipes)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID,
                           TextColumn, TimeElapsedColumn)
from rich.text import Text

from iomatrix.suite.model import Configuration, Workload


class PlannedEtaColumn(ProgressColumn):
    """Time left: the plan's per-trial time until a trial has finished, then the measured mean
    per trial; it counts down between trials instead of waiting for a speed estimate."""

    def render(self, task: Task) -> Text:
        if task.total is None or task.elapsed is None:
            return Text("ETA --:--", style="progress.remaining")
        per_trial = (task.elapsed / task.completed if task.completed
                     else task.fields.get("planned_per_trial", 0.0))
        left = max(0.0, per_trial * task.total - task.elapsed)
        minutes, seconds = divmod(int(left + 0.5), 60)
        return Text(f"ETA {minutes:d}:{seconds:02d}", style="progress.remaining")


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
        self.console.print(f"[bold]{trials} trials[/], about {planned} planned")
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
