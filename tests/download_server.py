"""A small Hugging Face Hub look-alike on 127.0.0.1 that can misbehave on purpose (tests only).

It implements what `huggingface_hub` and `dsx download` call:
- GET /api/models/{repo}/revision/{rev}                 -> {"id", "sha", "siblings"}
- GET /api/models/{repo}/tree/{rev}[/{dir}]?recursive=1 -> [{"type", "oid", "size", "path", "lfs"?}]
- HEAD/GET /{repo}/resolve/{rev}/{path}                 -> the bytes, with X-Repo-Commit, ETag,
  X-Linked-Etag / X-Linked-Size (LFS files), Accept-Ranges, and 206 + Content-Range for ranges;
  with `redirect_lfs`, LFS files answer 302 to /cdn/{repo}/{commit}/{path} as huggingface.co does.
Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound).

Faults (`Fault`) apply to the next matching GETs of a file: cut the connection after
byte `at`, stall there until released, flip the byte at `at`, serve `delta` bytes more
or fewer than the metadata says, ignore the Range header, or answer an HTTP status.
Every request is logged (method, path, Range header, status) for the tests to assert on.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


@dataclass
class Fault:
    path: str  # fnmatch pattern of the repo path
    kind: str  # cut | stall | corrupt | size | ignore_range | status
    at: int = 0  # absolute byte offset (cut, stall, corrupt)
    times: int = 1  # GETs it applies to; -1 = every one
    delta: int = 0  # size: bytes more (>0) or fewer (<0) than the real file
    status: int = 503  # status: the HTTP code (404 gets X-Error-Code EntryNotFound)


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)  # paths stored as LFS


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # clients hang up on purpose in these tests
        pass


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.faults: list[Fault] = []
        self.log: list[dict] = []
        self.lock = threading.Lock()
        self.stalled = threading.Event()  # set when a stall fault has sent its bytes
        self.release = threading.Event()  # set to let stalled responses end
        self.server: ThreadingHTTPServer | None = None
        self.redirect_lfs = False  # like huggingface.co: LFS resolves answer 302 to a CDN path

    # -- content ----------------------------------------------------------------
    def commit(self, repo_id: str, files: dict[str, bytes], branch: str = "main", lfs_glob: str = "*.safetensors",
               plain: tuple[str, ...] = ()) -> str:
        """Add a commit holding exactly `files` and move `branch` to it. Returns the commit sha."""
        repo = self.repos.setdefault(repo_id, Repo())
        h = hashlib.sha1(repo_id.encode() + str(len(repo.commits)).encode())
        for p in sorted(files):
            h.update(p.encode() + hashlib.sha256(files[p]).digest())
        sha = h.hexdigest()
        repo.commits[sha] = dict(files)
        repo.branches[branch] = sha
        repo.lfs |= {p for p in files if fnmatch.fnmatch(p, lfs_glob) and p not in plain}
        return sha

    def gets(self, pattern: str = "*") -> list[dict]:
        with self.lock:
            return [e for e in self.log if e["method"] == "GET" and e["file"] and fnmatch.fnmatch(e["file"], pattern)]

    def take_fault(self, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.times != 0 and fnmatch.fnmatch(path, f.path):
                    if f.times > 0:
                        f.times -= 1
                    return f
        return None

    # -- server -----------------------------------------------------------------
    def __enter__(self) -> "FakeHub":
        self.server = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def _make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _log(self, status: int, file: str | None = None) -> None:
            with hub.lock:
                hub.log.append({"method": self.command, "path": self.path, "file": file,
                                "range": self.headers.get("Range"), "status": status})

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, file: str | None = None):
            self._log(status, file)
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str, file: str | None = None):
            self._send(status, json.dumps({"error": code}).encode(),
                       {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "application/json"}, file)

        def _repo(self, repo_id: str, rev: str):
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound")
            sha = repo.branches.get(rev, rev)
            if sha not in repo.commits:
                return self._error(404, "RevisionNotFound")
            return repo, sha

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            u = urlsplit(self.path)
            parts = [unquote(p) for p in u.path.split("/")[1:]]
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                return self._api(parts[2] + "/" + parts[3], parts[4], parts[5], "/".join(parts[6:]),
                                 parse_qs(u.query))
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
            if len(parts) >= 5 and parts[0] == "cdn":
                return self._resolve(parts[1] + "/" + parts[2], parts[3], "/".join(parts[4:]), cdn=True)
            return self._error(404, "NotFound")

        def _api(self, repo_id, kind, rev, sub, query):
            got = self._repo(repo_id, rev)
            if got is None:
                return
            repo, sha = got
            files = repo.commits[sha]
            if kind == "revision":
                body = {"id": repo_id, "sha": sha, "siblings": [{"rfilename": p} for p in sorted(files)]}
            else:
                body = []
                for p in sorted(files):
                    if sub and not p.startswith(sub.rstrip("/") + "/"):
                        continue
                    data = files[p]
                    stored = lfs_pointer(data) if p in repo.lfs else data
                    e = {"type": "file", "oid": git_blob_sha1(stored), "size": len(data), "path": p}
                    if p in repo.lfs:
                        e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "pointerSize": len(stored)}
                    body.append(e)
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _resolve(self, repo_id, rev, path, cdn=False):
            got = self._repo(repo_id, rev)
            if got is None:
                return
            repo, sha = got
            data = repo.commits[sha].get(path)
            if data is None:
                return self._error(404, "EntryNotFound", path)
            h = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
            if path in repo.lfs:
                h["ETag"] = f'"{hashlib.sha256(data).hexdigest()}"'
                h["X-Linked-Etag"] = h["ETag"]
                h["X-Linked-Size"] = len(data)
            else:
                h["ETag"] = f'"{git_blob_sha1(data)}"'
            if hub.redirect_lfs and path in repo.lfs and not cdn:
                return self._send(302, b"", dict(h, Location=f"/cdn/{repo_id}/{sha}/{path}"), path)
            fault = hub.take_fault(path) if self.command == "GET" else None
            if fault is not None and fault.kind == "status":
                code = "EntryNotFound" if fault.status == 404 else "Fault"
                return self._error(fault.status, code, path)
            if fault is not None and fault.kind == "size":
                data = data + b"\0" * fault.delta if fault.delta > 0 else data[:fault.delta]
            if fault is not None and fault.kind == "corrupt":
                data = data[:fault.at] + bytes([data[fault.at] ^ 0xFF]) + data[fault.at + 1:]
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and not (fault is not None and fault.kind == "ignore_range"):
                start = int(rng.split("=", 1)[1].split("-", 1)[0])
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, path)
                status = 206
                h["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            if fault is None or fault.kind not in ("cut", "stall"):
                return self._send(status, body, h, path)
            self._log(status, path)  # cut / stall: promise the whole body, send up to `at`
            self.send_response(status)
            for k, v in h.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:max(fault.at - start, 0)])
            self.wfile.flush()
            if fault.kind == "stall":
                hub.stalled.set()
                hub.release.wait(60)
            self.close_connection = True

    return Handler


# ------------------------------------------------------------------ olah ----

def git_mirror(mirrors: Path, repo_id: str, files: dict[str, bytes], plain: tuple[str, ...] = ()) -> str:
    """A git repo for olah's `mirrors-path`: *.safetensors as LFS pointers with blobs under .git/lfs/objects
    (except `plain`), everything else committed as is. Returns the commit sha."""
    import subprocess

    repo = Path(mirrors) / "models" / repo_id
    repo.mkdir(parents=True)

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=dsx-test", "-c", "user.email=dsx@test", "-c",
                               "init.defaultBranch=main", *args], cwd=repo, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    for p, data in files.items():
        (repo / p).parent.mkdir(parents=True, exist_ok=True)
        if p.endswith(".safetensors") and p not in plain:
            oid = hashlib.sha256(data).hexdigest()
            blob = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            (repo / p).write_bytes(lfs_pointer(data))
        else:
            (repo / p).write_bytes(data)
    git("add", "-A")
    git("commit", "-q", "-m", "tiny checkpoint")
    git("branch", "-M", "main")
    return git("rev-parse", "HEAD")
