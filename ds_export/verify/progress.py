"""What `dsx verify` tells about its progress while it runs (on R1 its checks read about a terabyte).

Each check announces a phase (what it does, how much it will do, in bytes read or in checks) and counts it as it
goes; the CLI draws a bar on stderr, the default says nothing.
"""

from __future__ import annotations

from collections.abc import Callable


class Reporter:
    """Progress sink. Phases may overlap (verify hashes files while it checks weights); the counting functions may be
    called from worker threads (implementations must be thread-safe; rich's Progress is)."""

    def phase(self, what: str, total: int, unit: str = "bytes") -> Callable[[int], None]:
        """A check starts: what it does and how much it will do (`unit`: "bytes" read or "checks"). Returns the
        function that counts it: advance(n), n more done."""
        return _nothing


def _nothing(n: int) -> None:
    pass


QUIET = Reporter()
