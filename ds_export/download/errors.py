"""Errors of `dsx download` (one line each, through the CLI's DsxError mapping)."""

from __future__ import annotations

from ds_export.errors import DsxError, Interrupted as _Interrupted


class DownloadError(DsxError):
    """The hub, the network or the local disk stopped a download (exit code 1)."""


class Interrupted(DownloadError, _Interrupted):
    """Ctrl-C: partial files are kept for the next run."""

    exit_code = 130


class IntegrityError(Exception):
    """A downloaded file has the wrong size or hash: delete it and fetch again (internal, retried)."""


class TransientError(Exception):
    """A network failure or a 5xx/429 answer worth retrying after a pause (internal, retried)."""
