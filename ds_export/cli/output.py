"""Human / JSON / quiet output. Commands build a result dict and hand it here."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rich.console import Console

from ds_export.io.writer import dumps_json


@dataclass
class Out:
    json: bool = False
    quiet: bool = False

    def __post_init__(self):
        self.console = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def human(self) -> bool:
        return not (self.json or self.quiet)

    def print(self, *objs, **kw) -> None:
        if self.human:
            self.console.print(*objs, **kw)

    def result(self, obj: dict) -> None:
        if self.json:
            sys.stdout.write(dumps_json(obj, indent=2) + "\n")


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
        return self

    def __exit__(self, *exc):
        self.p.__exit__(*exc)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
