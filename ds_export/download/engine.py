"""Run a download: pin the revision, choose files, check disk space, fetch in parallel, record.

Order of work:
1. Resolve `--revision` to a commit. The first run records it in
   `.dsx-download.json`; a later run whose revision now points elsewhere stops
   with both commits named instead of mixing files of two commits.
2. List the repo's files at that commit (sizes, LFS sha256, git blob ids).
3. Fetch the index and config.json (the selection needs them), then select
   files by role (`select.py`).
4. Skip files recorded complete and unchanged; re-check files that exist but
   are not recorded (size, then sha256 and header with verify); count partials.
5. Check free space against the bytes still to fetch; fail before any shard.
6. Fetch with `workers` threads (`fetch.fetch_file`); the first failure stops
   the others at their next chunk, leaving their partials for the next run.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ds_export.download import select as sel_mod
from ds_export.download.errors import DownloadError
from ds_export.download.fetch import Cancelled, FileJob, Policy, check_header, fetch_file, hash_file
from ds_export.download.hub import Hub, RemoteFile
from ds_export.download.state import State, WORK_DIR, partial_path
from ds_export.errors import UsageError
from ds_export.interrupt import wait_for_workers
from ds_export.io.checkpoint import INDEX_NAME
from ds_export.io.dirlock import exclusive
from ds_export.io.writer import free_bytes
from ds_export.units import human_bytes

DEFAULT_WORKERS = 8


class UnrecordedDiffers(UsageError):
    """A file in the target directory that no dsx download recorded differs from the hub's (Options.replace)."""


@dataclass(frozen=True)
class Options:
    revision: str = "main"
    only: str = "all"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    workers: int = DEFAULT_WORKERS
    verify: bool = True
    retries: int = 5
    backoff_s: float = 1.0
    endpoint: str | None = None  # default: HF_ENDPOINT, else huggingface.co
    token: str | bool | None = None  # default: HF_TOKEN / the stored login
    replace: bool = False  # files no dsx download recorded that differ from the hub's: fetched again in place


class Reporter(Protocol):
    def start(self, total_bytes: int, done_bytes: int, files: int, files_done: int) -> None: ...
    def advance(self, n: int) -> None: ...  # n < 0 when a bad partial is discarded
    def file_done(self, path: str) -> None: ...
    def note(self, msg: str) -> None: ...


class NullReporter:
    def start(self, total_bytes, done_bytes, files, files_done):
        pass

    def advance(self, n):
        pass

    def file_done(self, path):
        pass

    def note(self, msg):
        pass


def pin(root: Path, hub: Hub, revision: str, commit: str) -> State:
    """The download record of `root`, pinned to `commit`; refuses a moved revision."""
    st = State.load(root)
    if st is not None and st.repo_id != hub.repo_id:
        raise DownloadError(f"{root} holds a download of {st.repo_id}, not {hub.repo_id}",
                            hint="choose another --local-dir")
    if st is not None and st.commit != commit and st.files:
        moved = f"{revision!r} now points to {commit[:12]}" if revision != commit else f"you asked for {commit[:12]}"
        raise DownloadError(
            f"{root}: its files come from {hub.repo_id}@{st.commit[:12]} (revision {st.revision!r}, pinned "
            f"{st.pinned_at}) but {moved}; refusing to mix files of two commits",
            hint=f"pass --revision {st.commit} to finish the pinned download, or use a new --local-dir")
    if st is None or st.commit != commit:
        st = State.new(root, hub.repo_id, hub.endpoint, revision, commit)
        st.save()
    return st


class _Run:
    """One download's shared context: hub, record, policy, reporter, stop flag."""

    def __init__(self, hub: Hub, root: Path, state: State, opts: Options, reporter: Reporter):
        self.hub, self.root, self.state, self.opts, self.rep = hub, root, state, opts, reporter
        self.policy = Policy(verify=opts.verify, retries=opts.retries, backoff_s=opts.backoff_s)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.downloaded: list[dict] = []

    def job(self, rf: RemoteFile) -> FileJob:
        return FileJob(rf, self.hub.url(self.state.commit, rf.path), self.root / rf.path,
                       partial_path(self.root, rf.path, rf.oid))

    def recorded(self, rf: RemoteFile) -> bool:
        return self.state.is_complete(rf.path, rf.size, rf.oid, need_verified=self.opts.verify)

    def adopt(self, rf: RemoteFile) -> bool:
        """A file already at its place but not recorded: keep it if it checks out, else delete it."""
        dest = self.root / rf.path
        if not dest.is_file():
            return False
        if dest.stat().st_size != rf.size:
            why = f"has {dest.stat().st_size} bytes, the hub's has {rf.size}"
        elif self.opts.verify and rf.oid and hash_file(dest, rf) != rf.oid:
            why = "differs from the hub's (hash)"
        else:
            if self.opts.verify and rf.oid:
                check_header(dest, rf.path)
            self.state.mark_complete(rf.path, rf.size, rf.oid, verified=self.opts.verify and bool(rf.oid))
            return True
        if rf.path not in self.state.files and not self.opts.replace:
            # (not a file this download fetched and recorded: an earlier `hf download` gone bad, or another
            # checkpoint's, e.g. V3 asked into R1's directory, which shares its names and sizes: not deleted)
            raise UnrecordedDiffers(f"{dest} {why}, and no dsx download recorded it: another checkpoint's file, or "
                                    f"a damaged copy of {self.hub.repo_id}'s; nothing deleted",
                                    hint="use a new --local-dir, or pass --replace to fetch the hub's in its place")
        self.rep.note(f"{dest} {why}: deleted, fetching it again")
        dest.unlink()
        return False

    def one(self, rf: RemoteFile) -> None:
        if self.stop.is_set():
            raise Cancelled()
        job = self.job(rf)
        if self.adopt(rf):
            self.rep.advance(rf.size - _partial_done(job))
            job.partial.unlink(missing_ok=True)  # a leftover partial of a file that is complete after all
        else:
            res = fetch_file(job, self.hub, self.policy, self.stop, self.rep.advance, self.rep.note)
            self.state.mark_complete(rf.path, rf.size, rf.oid, verified=self.opts.verify and bool(rf.oid))
            with self.lock:
                self.downloaded.append(res)
        self.rep.file_done(rf.path)

    def run(self, files: list[RemoteFile], workers: int) -> None:
        if not files:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(files))), thread_name_prefix="dsx-dl") as ex:
            # Ctrl-C or the first failure: self.stop makes the other workers stop at their next chunk (their
            # partials stay for the next run)
            wait_for_workers(lambda: [ex.submit(self.one, rf) for rf in files], lambda f: f.result(), [self.stop])


def _partial_done(job: FileJob) -> int:
    try:
        n = job.partial.stat().st_size
    except FileNotFoundError:
        return 0
    return n if n <= job.rf.size else 0


def _load_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DownloadError(f"{path}: not valid JSON ({e})") from None
    return obj if isinstance(obj, dict) else None


def check_space(root: Path, need: int, what: str) -> None:
    free = free_bytes(root)
    if need > free:
        raise DownloadError(f"{root}: {human_bytes(need)} to download ({what}) but only {human_bytes(free)} free there",
                            hint="free some space or choose another --local-dir; nothing was fetched")


def download(repo_id: str, local_dir: str | Path, opts: Options = Options(),
             reporter: Reporter | None = None) -> dict:
    """Fetch `repo_id` at `opts.revision` into `local_dir`; returns a summary dict (see docs/download.md)."""
    sel_mod.check_only(opts.only)
    if opts.workers < 1:
        raise UsageError("--workers must be at least 1")
    rep = reporter or NullReporter()
    t0 = time.perf_counter()
    root = Path(local_dir)
    if root.exists() and not root.is_dir():
        raise DownloadError(f"{root}: exists and is not a directory", hint="choose another --local-dir")
    hub = Hub(repo_id, endpoint_url=opts.endpoint, token=opts.token)
    commit = hub.resolve(opts.revision)
    remote = hub.list_files(commit)
    for p in remote:
        sel_mod.check_path(p, f"{repo_id}@{commit[:12]}")
    with exclusive(root, "dsx download"):  # (creates root; two downloads into one directory share its partials)
        return _fetch_locked(repo_id, hub, root, commit, remote, opts, rep, t0)


def _fetch_locked(repo_id: str, hub: Hub, root: Path, commit: str, remote: dict, opts: Options, rep: Reporter,
                  t0: float) -> dict:
    run = _Run(hub, root, pin(root, hub, opts.revision, commit), opts, rep)

    # 1. the files the selection is computed from
    inputs = [remote[n] for n in sel_mod.SELECTION_INPUTS if n in remote]
    todo = [rf for rf in inputs if not run.recorded(rf)]
    check_space(root, sum(rf.size - _partial_done(run.job(rf)) for rf in todo), "index and config")
    run.run(todo, opts.workers)
    selection = sel_mod.select(remote, _load_json(root / INDEX_NAME), _load_json(root / sel_mod.CONFIG_NAME),
                               opts.only, opts.include, opts.exclude, where=f"{repo_id}@{commit[:12]}")

    # 2. everything else, after the disk check
    files = [remote[n] for n in selection.files if n not in sel_mod.SELECTION_INPUTS]
    done = [rf for rf in files if run.recorded(rf)]
    todo = [rf for rf in files if not run.recorded(rf)]
    have = {rf.path: _partial_done(run.job(rf)) for rf in todo}
    check_space(root, sum(rf.size - have[rf.path] for rf in todo if not _maybe_complete(root, rf)),
                f"{len(todo)} files")
    rep.start(sum(rf.size for rf in files + inputs), sum(rf.size for rf in done + inputs) + sum(have.values()),
              len(files) + len(inputs), len(done) + len(inputs))
    run.run(sorted(todo, key=lambda rf: rf.path), opts.workers)
    _cleanup(root, {run.job(rf).partial for rf in remote.values()})
    got = sorted(run.downloaded, key=lambda r: r["path"])
    return {
        "repo_id": repo_id, "revision": opts.revision, "commit": commit, "endpoint": hub.endpoint,
        "local_dir": str(root), "only": opts.only, "verified": opts.verify,
        "files": len(selection.files), "shards": list(selection.shards),
        "downloaded": [r["path"] for r in got],
        "already_complete": len(selection.files) - len(got),
        "bytes_total": sum(remote[n].size for n in selection.files),
        "bytes_downloaded": sum(r["bytes"] for r in got),
        "resumed": {r["path"]: r["resumed_from"] for r in got if r["resumed_from"]},
        "refetched": {r["path"]: r["refetched"] for r in got if r["refetched"]},
        "seconds": time.perf_counter() - t0,
    }


def _maybe_complete(root: Path, rf: RemoteFile) -> bool:
    """A file already in place with the right size (to be verified by its worker): needs no space."""
    p = root / rf.path
    return p.is_file() and p.stat().st_size == rf.size


def _cleanup(root: Path, keep: set[Path]) -> None:
    """Drop partials that no file of the pinned commit can continue; remove the folder once empty.
    Partials of files this run did not select stay for a later run."""
    part = root / WORK_DIR / "partial"
    if part.is_dir():
        for p in part.iterdir():
            if p not in keep:
                p.unlink(missing_ok=True)
    for d in (part, root / WORK_DIR):
        try:
            d.rmdir()
        except OSError:
            break
