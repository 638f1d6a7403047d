"""The kernel entries of a compiled unit's PTX, for the compile tests that read what nvcc made of an instance."""

from __future__ import annotations

import re
from collections.abc import Iterator


def ptx_entries(ptx: str, name: re.Pattern) -> Iterator[tuple[re.Match, str]]:
    """(match of `name` on the mangled name, the entry's PTX text) of each kernel entry whose name `name` matches."""
    for entry in re.split(r"\n(?=\.visible \.entry|\.entry)", ptx):
        m = name.search(entry[:400])
        if m and ".entry" in entry[:200]:
            yield m, entry
