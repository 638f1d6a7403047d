"""The commands' progress bars: one rich Progress on stderr each, drawing the reporter a library entry point takes
(download.Reporter, the quantize engine's Reporter, verify.progress.Reporter). dsx download, quantize and verify draw
theirs, and dsx run draws the same ones for those steps."""

from __future__ import annotations

from ds_export.cli.output import Out
from ds_export.units import human_bytes


class ProgressBar:
    """A rich Progress on stderr as a context manager, which the commands' reporters build on: silent in --json /
    --quiet, and where terminal_only also when stderr is not a terminal."""

    def __init__(self, o: Out, *columns, terminal_only: bool = False):
        from rich.progress import Progress

        self.o = o
        self.p = Progress(*columns, console=o.err, disable=not o.human or (terminal_only and not o.err.is_terminal))
        self.task = None

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

    def shard_done(self, file):
        pass

    def tensor(self, name):
        self.p.update(self.task, description=f"quantize {name}")


class VerifyBar(ProgressBar):
    """verify.progress.Reporter as a rich bar on stderr, one line a phase (bytes and their rate, or checks done, and
    the time left); only on a terminal (a log or a pipe gets the report and a failure's one line, as before), silent
    in --json / --quiet."""

    def __init__(self, o: Out):
        from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.text import Text

        class Amount(ProgressColumn):
            def render(self, task):
                if task.fields.get("unit") != "bytes":
                    return Text(f"{task.completed:.0f}/{task.total:.0f} checks")
                speed = task.finished_speed or task.speed
                return Text(f"{human_bytes(task.completed)}/{human_bytes(task.total or 0)}"
                            + (f" {human_bytes(speed)}/s" if speed else ""))

        super().__init__(o, TextColumn("{task.description}", style="dim"), BarColumn(bar_width=24), Amount(),
                         TimeElapsedColumn(), TimeRemainingColumn(), terminal_only=True)

    def phase(self, what: str, total: int, unit: str = "bytes"):
        task = self.p.add_task(what, total=max(total, 1), unit=unit)  # (phases may overlap: a bar each)
        return lambda n: self.p.advance(task, n)
