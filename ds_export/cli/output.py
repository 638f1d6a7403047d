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
        self.live = None  # the console of a progress bar being drawn (cli.progress.ProgressBar sets it)

    @property
    def human(self) -> bool:
        return not (self.json or self.quiet)

    def print(self, *objs, **kw) -> None:
        if not self.human:
            return
        if self.live is not None and self.console.is_terminal and self.live.is_terminal:
            # (stdout and the bar's stderr are both terminals: a line printed past the bar lands on the bar's line, so
            # it goes through the bar's console, which prints it above the bar; rich's stdout redirection does not
            # catch a Console's own writes)
            self.live.print(*objs, **kw)
        else:
            self.console.print(*objs, **kw)

    def result(self, obj: dict) -> None:
        if self.json:
            sys.stdout.write(dumps_json(obj, indent=2) + "\n")
