"""What a long job tells about its progress while it runs: `dsx verify` (on R1 its checks read about a terabyte) and
`dsx export` (programs built and parameters written for every rank).

Each part announces a phase (what it does, how much it will do, in bytes or in other units; None: not known ahead)
and counts it as it goes; the CLI draws a bar on stderr, the default says nothing.
"""

from __future__ import annotations

from collections.abc import Callable


class Reporter:
    """Progress sink. Phases may overlap (verify hashes files while it checks weights); the counting functions may be
    called from worker threads (implementations must be thread-safe; rich's Progress is)."""

    def phase(self, what: str, total: int | None, unit: str = "bytes") -> Callable[[int], None]:
        """A part starts: what it does and how much it will do (`unit`: "bytes", "checks", "programs"; total None:
        not known ahead). Returns the function that counts it: advance(n), n more done."""
        return nothing


def nothing(n: int) -> None:
    """A count nobody is told of."""


QUIET = Reporter()
