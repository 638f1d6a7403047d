"""`.dsx-download.json`: the pinned commit and which files are complete and verified.

    {"format": 1, "repo_id": "deepseek-ai/DeepSeek-R1", "endpoint": "https://huggingface.co",
     "revision": "main", "commit": "<40 hex>", "pinned_at": "2026-11-30T05:00:00Z",
     "files": {"config.json": {"size": 1725, "oid": "<git sha1 or sha256>", "verified": true,
                               "mtime_ns": 1764478800000000000}, ...}}

A file is listed only after its size (and, with --verify, its sha256 / git
blob id and safetensors header) checked out and it was renamed into place; the
record is rewritten atomically after each file. On a later run a listed file
whose size, mtime and oid still match is trusted without re-hashing; anything
else in the directory is checked again before it is kept.

Partial files live in `.dsx-download/partial/` under stable names derived from
the path and the expected content id, so a later process (after a crash, a
Ctrl-C or a reboot) continues the same bytes with an HTTP Range request and a
changed upstream file never continues a stale partial.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ds_export.download.errors import DownloadError
from ds_export.io.writer import atomic_write_json

STATE_NAME = ".dsx-download.json"
WORK_DIR = ".dsx-download"
STATE_FORMAT = 1


def partial_path(root: Path, path: str, oid: str) -> Path:
    """Stable partial name: readable prefix + hash of (path, expected content id)."""
    key = hashlib.sha256(f"{path}\0{oid}".encode()).hexdigest()[:20]
    stem = path.replace("/", "__")[-80:]
    return root / WORK_DIR / "partial" / f"{stem}.{key}.part"


@dataclass
class State:
    root: Path
    repo_id: str
    endpoint: str
    revision: str
    commit: str
    pinned_at: str = ""
    files: dict[str, dict] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def path(self) -> Path:
        return self.root / STATE_NAME

    @classmethod
    def load(cls, root: Path) -> "State | None":
        p = Path(root) / STATE_NAME
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            if d.get("format") != STATE_FORMAT:
                raise ValueError(f"format {d.get('format')!r}")
            files = d.get("files") or {}
            if not isinstance(files, dict) or not all(isinstance(r, dict) for r in files.values()):
                raise ValueError("files is not a mapping of file records")  # (a record's fields are checked in use)
            return cls(Path(root), d["repo_id"], d["endpoint"], d["revision"], d["commit"], d.get("pinned_at", ""),
                       dict(files))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DownloadError(f"{p}: unreadable download record ({e})",
                                hint="delete it to re-verify the files in the directory from scratch") from None

    @classmethod
    def new(cls, root: Path, repo_id: str, endpoint: str, revision: str, commit: str) -> "State":
        return cls(Path(root), repo_id, endpoint, revision, commit, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        atomic_write_json(self.path, {
            "format": STATE_FORMAT, "repo_id": self.repo_id, "endpoint": self.endpoint, "revision": self.revision,
            "commit": self.commit, "pinned_at": self.pinned_at, "files": dict(sorted(self.files.items())),
        })

    def is_complete(self, path: str, size: int, oid: str, *, need_verified: bool) -> bool:
        """Recorded as complete for this oid (and verified, if asked), and unchanged on disk since."""
        rec = self.files.get(path)
        if not rec or rec.get("oid") != oid or rec.get("size") != size:
            return False
        if need_verified and not rec.get("verified"):
            return False
        try:
            st = os.stat(self.root / path)
        except OSError:
            return False
        return st.st_size == size and st.st_mtime_ns == rec.get("mtime_ns")

    def mark_complete(self, path: str, size: int, oid: str, verified: bool) -> None:
        st = os.stat(self.root / path)
        with self._lock:
            self.files[path] = {"size": size, "oid": oid, "verified": verified, "mtime_ns": st.st_mtime_ns}
            self._save_locked()
