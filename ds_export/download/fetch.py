"""One file: resumable transfer (HTTP Range on a stable partial), verification, atomic publish.

`fetch_file` loops until the partial holds exactly the hub's size, then checks
it and renames it into place:

1. The partial (`state.partial_path`) is continued from its current length with
   `Range: bytes=N-` through huggingface_hub's HTTP session and headers. A 206
   must start at N and report the hub's total size; a 200 means the server
   ignored the range, so the partial restarts from 0. Bytes are hashed as they
   arrive; a partial left by another process is hashed from disk first.
2. Network failures, timeouts, 408/429/5xx and connections closed early are
   retried with exponential backoff, resuming each time; the count resets
   whenever bytes arrived, so a flaky link still finishes.
3. Integrity: the size must equal the hub's metadata (a server announcing or
   sending a different length is caught before or while streaming), and with
   `verify` the sha256 must equal the LFS oid (git blob sha1 for small non-LFS
   files). A mismatch deletes the partial and fetches the file again, then
   fails with both values in the message.
4. Publish: fsync, rename into place, then (with `verify`) the safetensors
   header is validated by `io.safetensors_file.read_header`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from huggingface_hub.utils import hf_raise_for_status

from ds_export.download.errors import DownloadError, IntegrityError, TransientError
from ds_export.download.hub import Hub, RemoteFile, TransportError, download_timeout, hub_errors
from ds_export.errors import CheckpointError
from ds_export.io.safetensors_file import read_header
from ds_export.io.writer import fsync_dir

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


class Cancelled(Exception):
    """Another file failed or the user pressed Ctrl-C: stop at the next chunk, keep the partial."""


@dataclass(frozen=True)
class FileJob:
    rf: RemoteFile
    url: str
    dest: Path
    partial: Path


@dataclass(frozen=True)
class Policy:
    verify: bool = True
    retries: int = 5  # network retries without progress
    integrity_retries: int = 2  # full refetches after a size/hash mismatch
    backoff_s: float = 1.0  # first pause; doubles per retry, capped at MAX_BACKOFF_S


class ContentHash:
    """sha256 of the content (LFS files) or git's blob sha1 ("blob <size>\\0" + content)."""

    def __init__(self, rf: RemoteFile):
        self.rf = rf
        self.reset()

    def reset(self) -> None:
        if self.rf.lfs:
            self.h = hashlib.sha256()
        else:
            self.h = hashlib.sha1(b"blob %d\0" % self.rf.size, usedforsecurity=False)
        self.pos = 0

    def update(self, b) -> None:
        self.h.update(b)
        self.pos += len(b)

    def catch_up(self, path: Path, upto: int, bufsize: int = 16 << 20) -> None:
        """Hash bytes [pos, upto) of an existing partial (written by an earlier attempt or process)."""
        if self.pos > upto:
            self.reset()
        if self.pos == upto:
            return
        with open(path, "rb") as f:
            f.seek(self.pos)
            while self.pos < upto:
                b = f.read(min(bufsize, upto - self.pos))
                if not b:
                    raise IntegrityError(f"partial file shrank to {self.pos} bytes while being resumed")
                self.update(b)

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    @property
    def kind(self) -> str:
        return "sha256" if self.rf.lfs else "git blob sha1"


def hash_file(path: Path, rf: RemoteFile) -> str:
    ch = ContentHash(rf)
    ch.catch_up(path, os.path.getsize(path))
    return ch.hexdigest()


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def _content_range(r) -> tuple[int, int | None]:
    """(first byte, total) of a 206's Content-Range: 'bytes 100-199/1000'."""
    cr = r.headers.get("Content-Range", "")
    try:
        unit, rest = cr.split(" ", 1)
        span, total = rest.split("/", 1)
        return int(span.split("-", 1)[0]), (None if total.strip() == "*" else int(total))
    except ValueError:
        raise IntegrityError(f"unreadable Content-Range {cr!r} in a 206 answer") from None


def _check_answer(r, job: FileJob, have: int, hub: Hub) -> None:
    """Classify the response status; raise for anything but a usable 200/206."""
    code = r.status_code
    if code in RETRY_STATUS:
        raise TransientError(f"HTTP {code}")
    if code == 416:
        raise IntegrityError(f"the server has fewer bytes than the {job.rf.size} the hub's metadata lists "
                             f"(HTTP 416 for bytes={have}-)")
    if code >= 400:
        r.read()
        with hub_errors(hub, None, job.rf.path):
            hf_raise_for_status(r)
    if code not in (200, 206):
        raise TransientError(f"unexpected HTTP {code}")
    if code == 206:
        start, total = _content_range(r)
        if start != have:
            raise IntegrityError(f"asked for bytes from {have}, the server sent bytes from {start}")
        if total is not None and total != job.rf.size:
            raise IntegrityError(f"the server says the file has {total} bytes, the hub's metadata says {job.rf.size}")


def _attempt(job: FileJob, hub: Hub, ch: ContentHash | None, stop, progress: Callable[[int], None]) -> None:
    """One GET: bring the partial towards the full size. Returns when the stream ends."""
    size = job.rf.size
    have = _size(job.partial)
    if have > size:
        raise IntegrityError(f"partial file has {have} bytes, more than the {size} the hub lists")
    if have == size:
        return
    if ch is not None:
        ch.catch_up(job.partial, have)
    headers = hub.headers()
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        with hub.session().stream("GET", job.url, headers=headers, timeout=download_timeout()) as r:
            _check_answer(r, job, have, hub)
            if r.status_code == 200:
                if have:  # the server ignored the range: start over
                    os.truncate(job.partial, 0)
                    progress(-have)
                    have = 0
                    if ch is not None:
                        ch.reset()
                cl = r.headers.get("Content-Length", "")
                enc = r.headers.get("Content-Encoding", "identity").lower()
                if cl.strip().isdigit() and enc == "identity" and int(cl) != size:
                    raise IntegrityError(f"the server sends {cl} bytes, the hub's metadata says {size}")
            with open(job.partial, "r+b" if have else "wb", buffering=0) as f:
                f.seek(have)
                f.truncate()
                for chunk in r.iter_bytes():
                    if stop.is_set():
                        raise Cancelled()
                    if have + len(chunk) > size:
                        raise IntegrityError(f"the server sent more than the {size} bytes the hub's metadata lists")
                    mv = memoryview(chunk)
                    while mv:
                        mv = mv[f.write(mv):]
                    if ch is not None:
                        ch.update(chunk)
                    have += len(chunk)
                    progress(len(chunk))
    except TransportError as e:
        raise TransientError(f"{e.__class__.__name__}: {e}") from None
    if have < size:
        raise TransientError(f"connection closed after {have} of {size} bytes")


def _verify_partial(job: FileJob, ch: ContentHash | None) -> None:
    have = _size(job.partial)
    if have != job.rf.size:
        raise IntegrityError(f"{have} bytes on disk, the hub's metadata says {job.rf.size}")
    if ch is not None:
        ch.catch_up(job.partial, have)
        got = ch.hexdigest()
        if got != job.rf.oid:
            raise IntegrityError(f"{ch.kind} is {got}, the hub's metadata says {job.rf.oid}")


def check_header(path: Path, rel: str) -> None:
    """A downloaded .safetensors must parse; the hub's own bytes being bad is not worth a refetch."""
    if not rel.endswith(".safetensors"):
        return
    try:
        read_header(path)
    except CheckpointError as e:
        path.unlink(missing_ok=True)
        raise DownloadError(f"{e} (its bytes match the hub's sha256, so the file on the hub itself is broken; "
                            "deleted it)", hint="report it to the repo owner or try another --revision") from None


def publish(job: FileJob, verify: bool) -> None:
    with open(job.partial, "rb") as f:
        os.fsync(f.fileno())
    job.dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(job.partial, job.dest)
    fsync_dir(job.dest.parent)
    if verify:
        check_header(job.dest, job.rf.path)


def fetch_file(job: FileJob, hub: Hub, policy: Policy, stop, progress: Callable[[int], None],
               note: Callable[[str], None] = lambda m: None) -> dict:
    """Download, verify and publish one file. Returns {"path", "bytes", "resumed_from", "refetched"}."""
    job.partial.parent.mkdir(parents=True, exist_ok=True)
    ch = ContentHash(job.rf) if policy.verify and job.rf.oid else None
    if _size(job.partial) > job.rf.size:  # the caller counted only partials up to the size as done
        job.partial.unlink()
    if job.rf.size == 0:
        job.partial.touch()
    fetched = 0  # bytes received in this run
    appended = 0  # bytes received since the partial last restarted from 0
    net_failures = integrity_failures = 0

    def counted(n: int) -> None:
        nonlocal fetched, appended
        if n < 0:  # the partial was discarded (server ignored the range)
            appended = 0
        fetched += max(n, 0)
        appended += max(n, 0)
        progress(n)

    while True:
        if stop.is_set():
            raise Cancelled()
        before = _size(job.partial)
        try:
            _attempt(job, hub, ch, stop, counted)
            _verify_partial(job, ch)
            break
        except TransientError as e:
            net_failures = 1 if _size(job.partial) > before else net_failures + 1
            if net_failures > policy.retries:
                raise DownloadError(f"{job.rf.path}: {e}; gave up after {policy.retries} retries with no progress",
                                    hint=f"rerun to resume from byte {_size(job.partial)}") from None
            note(f"{job.rf.path}: {e}; retry {net_failures}/{policy.retries}")
            _pause(stop, policy.backoff_s, net_failures)
        except IntegrityError as e:
            progress(-_size(job.partial))
            appended = 0
            job.partial.unlink(missing_ok=True)
            if ch is not None:
                ch.reset()
            integrity_failures += 1
            if integrity_failures > policy.integrity_retries:
                raise DownloadError(f"{job.rf.path}: {e} (deleted; {integrity_failures} downloads gave the same "
                                    "kind of mismatch)",
                                    hint="a proxy or mirror may serve a different file: check HF_ENDPOINT") from None
            note(f"{job.rf.path}: {e}; deleted, fetching it again")
    publish(job, policy.verify)
    kept = job.rf.size - appended  # bytes of an earlier run's partial that were continued, not refetched
    return {"path": job.rf.path, "bytes": fetched, "resumed_from": kept, "refetched": integrity_failures}


def _pause(stop, base: float, k: int) -> None:
    if stop.wait(min(base * 2 ** (k - 1), MAX_BACKOFF_S)):
        raise Cancelled()
