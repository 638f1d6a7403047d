"""Byte counts as people read them (messages of every layer, not only the CLI's)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units, as `df -h` and `du -h` count)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
