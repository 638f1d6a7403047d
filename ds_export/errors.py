"""User-facing errors. The CLI maps these to one line and an exit code.

Raise a DsxError (or a subclass) for anything a user can cause or fix: the
message names the file/tensor, what was expected, and what to do.
"""

from __future__ import annotations


class DsxError(Exception):
    """A failure the user can act on. exit_code 1 = failure, 2 = usage."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        msg = str(self).replace("\n", " ")
        return f"{msg} ({self.hint})" if self.hint else msg


class UsageError(DsxError):
    """Bad command-line usage or option values."""

    exit_code = 2


class Interrupted(DsxError):
    """Ctrl-C: what was finished is kept; the message says what a rerun does."""

    exit_code = 130


class CheckpointError(DsxError):
    """A source checkpoint is malformed, incomplete or inconsistent."""


class ModelMapError(DsxError):
    """A tensor or config does not fit the architecture's map."""
