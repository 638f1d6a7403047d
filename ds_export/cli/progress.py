"""The commands' progress bars: one rich Progress on stderr each, drawing the reporter a library entry point takes
(download.Reporter, the quantize engine's Reporter, ds_export.progress.Reporter). dsx download, quantize, export and
verify draw theirs, and dsx run draws the same ones for those steps. Where stderr is not a terminal (a log, a pipe, a
batch job's output file) a bar is not drawn: its state is written as one plain line every LOG_EVERY_S seconds instead
(none for a job shorter than that), so that an hours-long conversion's log says how far it got."""

from __future__ import annotations

import time

from ds_export.cli.output import Out
from ds_export.units import human_bytes

LOG_EVERY_S = 60.0


def human_seconds(s: float) -> str:
    """95 -> '1 min 35 s', 7260 -> '2 h 1 min'."""
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class ProgressBar:
    """A rich Progress on stderr as a context manager, which the commands' reporters build on: silent in --json /
    --quiet; on a terminal the bar, elsewhere a line of each advancing task every LOG_EVERY_S seconds."""

    def __init__(self, o: Out, *columns):
        from rich.progress import Progress

        self.o = o
        terminal = o.err.is_terminal
        self._clock = time.monotonic
        self.p = Progress(*columns, console=o.err, disable=not o.human or not terminal, get_time=lambda: self._clock())
        self.logs = o.human and not terminal
        self._since, self._logged = self._clock(), {}  # (each task's last line: phases may overlap)
        self.task = None

    def _advanced(self, task) -> None:
        """After `task` advanced: in a log, its state as one line once LOG_EVERY_S passed since its last line."""
        if not self.logs or self._clock() - self._logged.get(task, self._since) < LOG_EVERY_S:
            return
        self._logged[task] = self._clock()
        t = next(t for t in self.p.tasks if t.id == task)
        of = t.total is not None
        if t.fields.get("unit", "bytes") == "bytes":
            done = human_bytes(t.completed) + (f" of {human_bytes(t.total)}" if of else "")
            rate = f", {human_bytes(t.speed)}/s" if t.speed else ""
        else:
            done, rate = f"{t.completed:.0f}" + (f" of {t.total:.0f}" if of else "") + f" {t.fields['unit']}", ""
        pct = f" ({100 * t.completed / t.total:.0f}%)" if t.total else ""
        left = f", {human_seconds(t.time_remaining)} left" if t.time_remaining is not None and not t.finished else ""
        self.o.err.print(f"{t.description}: {done}{pct}{rate}{left}", markup=False, highlight=False)

    def __enter__(self):
        self.p.__enter__()
        self._outer = self.o.live
        if not self.p.disable:
            self.o.live = self.p.console  # (Out.print's lines go above the bar while it is drawn)
        return self

    def __exit__(self, *exc):
        self.o.live = self._outer
        self.p.__exit__(*exc)


class DownloadBar(ProgressBar):
    """download.Reporter as one rich progress line (bytes, GB/s, ETA, files); silent in --json/--quiet."""

    def __init__(self, o: Out):
        from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        super().__init__(o, TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                         TimeRemainingColumn())
        self.files = self.done = 0

    def _describe(self) -> str:
        return f"download {self.done}/{self.files} files"

    def start(self, total_bytes, done_bytes, files, files_done):
        self.files, self.done = files, files_done
        self.task = self.p.add_task(self._describe(), total=total_bytes, completed=done_bytes)

    def advance(self, n):
        if self.task is not None:
            self.p.advance(self.task, n)
            self._advanced(self.task)

    def file_done(self, path):
        if self.task is not None:
            self.done += 1
            self.p.update(self.task, description=self._describe())

    def note(self, msg):
        if self.o.human:
            from rich.markup import escape

            self.p.console.print(f"[yellow]{escape(msg)}[/yellow]", markup=True, highlight=False)


class QuantizeBar(ProgressBar):
    """engine.Reporter with a rich progress bar (bytes, GB/s, ETA); silent in --json/--quiet."""

    def __init__(self, o: Out):
        import time

        from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        super().__init__(o, TextColumn("{task.description}", style="dim"), BarColumn(), DownloadColumn(),
                         TransferSpeedColumn(), TimeRemainingColumn())
        self._t0 = time.perf_counter()
        self._clock = time.perf_counter

    def elapsed(self) -> float:
        return self._clock() - self._t0

    def start(self, total_bytes, shards, skipped):
        self._t0 = self._clock()
        self.task = self.p.add_task(f"quantize ({skipped}/{shards} shards already done)", total=total_bytes)

    def advance(self, n):
        self.p.advance(self.task, n)
        self._advanced(self.task)

    def shard_done(self, file):
        pass

    def tensor(self, name):
        self.p.update(self.task, description=f"quantize {name}")


class PhaseBar(ProgressBar):
    """ds_export.progress.Reporter as a rich bar on stderr, one line a phase (bytes and their rate, or the phase's
    units done, and the time left; a total not known ahead: what is done so far); silent in --json / --quiet."""

    def __init__(self, o: Out):
        from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.text import Text

        class Amount(ProgressColumn):
            def render(self, task):
                of = task.total is not None
                if task.fields.get("unit") != "bytes":
                    return Text(f"{task.completed:.0f}" + (f"/{task.total:.0f}" if of else "")
                                + f" {task.fields.get('unit')}")
                speed = task.finished_speed or task.speed
                return Text(human_bytes(task.completed) + (f"/{human_bytes(task.total)}" if of else "")
                            + (f" {human_bytes(speed)}/s" if speed else ""))

        super().__init__(o, TextColumn("{task.description}", style="dim"), BarColumn(bar_width=24), Amount(),
                         TimeElapsedColumn(), TimeRemainingColumn())

    def phase(self, what: str, total: int | None, unit: str = "bytes"):
        task = self.p.add_task(what, total=None if total is None else max(total, 1), unit=unit)  # (a bar each)

        def advance(n):
            self.p.advance(task, n)
            self._advanced(task)
        return advance


class VerifyBar(PhaseBar):
    """dsx verify's checks (hashes, weights, kernels), a bar each."""


class ExportBar(PhaseBar):
    """dsx export's programs built and parameters written (every rank's), then the files hashed."""
