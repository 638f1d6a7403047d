"""`dsx download`: fetch a Hugging Face checkpoint that is complete, verified and resumable.

Stages (one direction): `hub` (resolve the revision to a commit, list files with
their sizes and hashes) -> `select` (which files, by role, from the index's
weight_map) -> `engine` (disk check, parallel transfers, publish) with
`fetch` (one file: HTTP Range resume + size/sha256/header checks) and `state`
(the pinned commit and the per-file completion record in `.dsx-download.json`).
"""

from ds_export.download.engine import Options, Reporter, download
from ds_export.download.errors import DownloadError, Interrupted

__all__ = ["DownloadError", "Interrupted", "Options", "Reporter", "download"]
