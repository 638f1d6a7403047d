"""dsx-manifest.json: what a dsx run produced, file by file, with sha256.

The manifest is rewritten atomically after each finished file, so after a
crash it lists exactly the files that are complete. `complete` becomes true
only when the whole output is written; until then the directory does not look
finished to `dsx verify` or to a resuming run.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ds_export.errors import CheckpointError
from ds_export.io.writer import atomic_write_json, sha256_file
from ds_export.values import is_int

MANIFEST_NAME = "dsx-manifest.json"
MANIFEST_VERSION = 1


@dataclass
class Manifest:
    root: Path
    run: dict = field(default_factory=dict)  # what produced it: tool, version, command, source checksum
    files: dict[str, dict] = field(default_factory=dict)  # rel path -> {"size", "sha256"}
    complete: bool = False
    name: str = MANIFEST_NAME  # per-node manifests of a multi-node run have their own names

    @property
    def path(self) -> Path:
        return self.root / self.name

    @classmethod
    def load(cls, root: str | os.PathLike, name: str = MANIFEST_NAME) -> "Manifest | None":
        root = Path(root)
        p = root / name
        if not p.exists():
            return None
        try:
            obj = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{p}: unreadable manifest ({e.__class__.__name__})",
                                  hint="rerun the command that wrote this directory, with --force") from None
        newer = obj.get("version") if isinstance(obj, dict) else None
        if is_int(newer) and newer > MANIFEST_VERSION:  # (before the fields: a later layout may differ)
            raise CheckpointError(f"{p}: written by a newer dsx (manifest version {newer}; this dsx reads version "
                                  f"{MANIFEST_VERSION})", hint="use the dsx that wrote it or a newer one (its "
                                                               "run.version says which)")
        problem = _malformed(obj)
        if problem:
            raise CheckpointError(f"{p}: damaged manifest: {problem}",
                                  hint="rerun the command that wrote this directory, with --force") from None
        return cls(root, obj["run"], obj["files"], obj["complete"], name)

    def content_digest(self) -> str:
        """sha256 over the files it records (path, size, sha256): what a consumer of this output records to tell a
        later output in the same place from this one."""
        body = json.dumps(sorted((rel, e.get("size"), e.get("sha256")) for rel, e in self.files.items()))
        return hashlib.sha256(body.encode()).hexdigest()

    def save(self) -> None:
        atomic_write_json(self.path, {"version": MANIFEST_VERSION, "complete": self.complete,
                                      "run": self.run, "files": dict(sorted(self.files.items()))})

    def record(self, rel: str, sha256: str, size: int | None = None) -> None:
        if size is None:
            size = (self.root / rel).stat().st_size
        self.files[rel] = {"size": int(size), "sha256": sha256}
        self.save()

    def record_file(self, rel: str, progress=None) -> str:
        """Hash the file and record it. progress: sha256_file's."""
        sha = sha256_file(self.root / rel, progress=progress)
        self.record(rel, sha)
        return sha

    def verify_file(self, rel: str, *, hash_check: bool = True, progress=None) -> str | None:
        """None when the file matches its record, else a one-line reason. progress: sha256_file's."""
        ent = self.files.get(rel)
        p = self.root / rel
        if ent is None:
            return f"{p}: not in the manifest"
        if not p.exists():
            return f"{p}: missing"
        size = p.stat().st_size
        if size != ent["size"]:
            return f"{p}: {size} bytes, manifest says {ent['size']}"
        if hash_check and sha256_file(p, progress=progress) != ent["sha256"]:
            return f"{p}: sha256 differs from the manifest (the file changed or is corrupt)"
        return None


_HEX = frozenset("0123456789abcdef")


def _malformed(obj) -> str | None:
    """What is wrong with a parsed manifest, or None. Its fields are trusted by every reader (a file's record is
    compared with the file, `complete` decides whether the directory is finished): a list for `files`, a string
    for a record or a size, "yes" for `complete` were internal errors or taken at face value, and a record
    named "/etc/hostname" or "../x" sent verify to hash files outside the directory."""
    if not isinstance(obj, dict):
        return f"a {type(obj).__name__}, not a mapping"
    if not (is_int(obj.get("version")) and obj["version"] >= 1):
        return f"version is {obj.get('version')!r:.40}, expected a positive integer"
    for key, kind in (("run", dict), ("files", dict), ("complete", bool)):
        if not isinstance(obj.get(key), kind):
            return f"{key} is {obj.get(key)!r:.40}, expected {'a mapping' if kind is dict else 'true or false'}"
    for rel, ent in obj["files"].items():
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts or "\\" in rel:
            return f"file {rel!r:.60} is not a path inside the directory"
        if not isinstance(ent, dict):
            return f"the record of {rel} is {ent!r:.40}, expected {{size, sha256}}"
        size, sha = ent.get("size"), ent.get("sha256")
        if not (is_int(size) and size >= 0):
            return f"the size of {rel} is {size!r:.40}, expected a byte count"
        if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _HEX:
            return f"the sha256 of {rel} is {sha!r:.40}, expected 64 hex digits"
    return None


def export_manifest(root: str | os.PathLike) -> "Manifest | None":
    """The manifest of the dsx export at root (its run records the export command), or None: no manifest, another
    run's (a quantize output's), or one that does not parse (the file checks report that one)."""
    try:
        m = Manifest.load(root) if Path(root).is_dir() else None
    except CheckpointError:
        return None
    return m if m is not None and m.run.get("command") == "export" else None


def require_finished(root: str | os.PathLike, use: str) -> None:
    """Refuse a dsx output that its run has not finished (interrupted, still running, or a multi-node run whose other
    nodes are still at work), before `use` reads it: its shards may all be there while the run is not done (a
    rerun with --force in progress, the nodes' own manifests), and what is missing otherwise shows up as a
    puzzling "config.json not found". A directory without a manifest (a download, another tool's) is not judged."""
    root = Path(root)
    if not root.is_dir():
        return
    m = Manifest.load(root)
    nodes = sorted(p.name for p in root.glob("dsx-manifest.node-*-of-*.json"))
    if m is not None and m.complete:
        return
    if m is None and not nodes:
        return
    what = (f"{m.name} is not complete, {len(m.files)} files finished so far" if m is not None
            else f"only the per-node manifests {', '.join(nodes)}: the run's other nodes have not finished")
    raise CheckpointError(f"{root}: an unfinished dsx output ({what}); {use} needs a finished one",
                          hint="rerun the dsx command that writes it: it resumes where it stopped")
