"""The Hub side of a download, through the `huggingface_hub` client.

- `Hub.resolve(repo, revision)`: the commit a branch/tag/commit points to now
  (`HfApi.model_info`, i.e. GET /api/models/{repo}/revision/{rev}).
- `Hub.list_files(repo, commit)`: every file at that commit with its size, its
  git blob id and, for LFS files, the LFS oid = sha256 of the content
  (`HfApi.list_repo_tree(recursive=True)`, GET /api/models/{repo}/tree/{commit}).
- `Hub.url(...)` / `Hub.headers()`: the resolve URL pinned to the commit and the
  auth/user-agent headers the library would send (`hf_hub_url`, `build_hf_headers`).

The endpoint comes from HF_ENDPOINT (read when a Hub is made, so mirrors work),
the token from the usual places (HF_TOKEN, `hf auth login`). Every library or
network exception is turned into a one-line DownloadError that names the repo,
the revision or the file and what to do (`hub_errors`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, HfHubHTTPError, HFValidationError,
                                    OfflineModeIsEnabled, RemoteEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)
from huggingface_hub.utils import build_hf_headers, get_session, validate_repo_id

from ds_export.download.errors import DownloadError
from ds_export.errors import UsageError

try:  # huggingface_hub 2.x ships its HTTP stack as httpx2, 1.x used httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
    import httpx  # type: ignore[no-redef]

API_TIMEOUT_S = 60.0
TransportError = httpx.TransportError  # connect/read/protocol/timeout failures: worth a retry
Timeout = httpx.Timeout


@dataclass(frozen=True)
class RemoteFile:
    """One file of the repo at the pinned commit."""

    path: str
    size: int
    sha256: str | None  # LFS oid (lower-case hex) for LFS/Xet files
    blob_id: str | None  # git blob sha1 of the stored object (the content itself for non-LFS files)

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def oid(self) -> str:
        """The content id we verify against: sha256 for LFS files, the git blob sha1 otherwise."""
        return self.sha256 or self.blob_id or ""


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def check_repo_id(repo_id: str) -> None:
    """A repo id the hub can name ("namespace/name"), or a one-line UsageError (huggingface_hub's own rule; it raised
    HFValidationError, an internal error to the user, for 'a/b/c' or '')."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(f"{repo_id!r}: not a Hugging Face repo id ({str(e).split('. ')[0]})",
                         hint="give it as namespace/name, e.g. deepseek-ai/DeepSeek-R1") from None


class Hub:
    def __init__(self, repo_id: str, *, endpoint_url: str | None = None, token: str | bool | None = None):
        check_repo_id(repo_id)
        self.repo_id = repo_id
        self.endpoint = (endpoint_url or endpoint()).rstrip("/")
        self.token = token
        self.api = HfApi(endpoint=self.endpoint, token=token)

    def resolve(self, revision: str) -> str:
        """The 40-hex commit `revision` points to now."""
        with hub_errors(self, revision):
            info = self.api.model_info(self.repo_id, revision=revision, timeout=API_TIMEOUT_S)
        if not info.sha:
            raise DownloadError(f"{self.where(revision)}: the hub did not say which commit {revision!r} is",
                                hint="is HF_ENDPOINT a Hugging Face compatible endpoint?")
        return info.sha

    def list_files(self, commit: str) -> dict[str, RemoteFile]:
        out: dict[str, RemoteFile] = {}
        with hub_errors(self, commit):
            for e in self.api.list_repo_tree(self.repo_id, revision=commit, recursive=True):
                size = getattr(e, "size", None)
                if size is None:  # a folder
                    continue
                lfs = getattr(e, "lfs", None)
                sha = getattr(lfs, "sha256", None) if lfs is not None else None
                out[e.path] = RemoteFile(e.path, int(size), sha.lower() if sha else None, getattr(e, "blob_id", None))
        return out

    def url(self, commit: str, path: str) -> str:
        return hf_hub_url(self.repo_id, path, revision=commit, endpoint=self.endpoint)

    def headers(self) -> dict[str, str]:
        h = build_hf_headers(token=self.token, library_name="dsx")
        h["Accept-Encoding"] = "identity"  # byte ranges and sizes refer to the stored bytes
        return h

    def session(self):
        return get_session()

    def where(self, revision: str | None = None) -> str:
        at = f"@{revision}" if revision else ""
        return f"{self.repo_id}{at} on {self.endpoint}"


def download_timeout() -> Timeout:
    """Connect/read timeouts from HF_HUB_DOWNLOAD_TIMEOUT (the library's setting; default 10 s)."""
    return Timeout(float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or constants.HF_HUB_DOWNLOAD_TIMEOUT))


@contextmanager
def hub_errors(hub: Hub, revision: str | None = None, path: str | None = None):
    """Turn huggingface_hub / network exceptions into one-line DownloadErrors."""
    where = hub.where(revision)
    login = "`hf auth login` or HF_TOKEN"
    try:
        yield
    except GatedRepoError:
        raise DownloadError(f"{where}: the repository is gated",
                            hint=f"accept its terms on the model page, then log in ({login})") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"repository {hub.repo_id} not found on {hub.endpoint}",
                            hint=f"check the repo id; private repos need a token ({login})") from None
    except RevisionNotFoundError:
        raise DownloadError(f"{hub.repo_id}: revision {revision!r} not found on {hub.endpoint}",
                            hint="pass an existing branch, tag or commit with --revision") from None
    except RemoteEntryNotFoundError:
        raise DownloadError(f"{where}: file {path!r} not found in the repository",
                            hint="the hub listed it but does not serve it; retry later or report it") from None
    except DisabledRepoError:
        raise DownloadError(f"{where}: access to this repository is disabled") from None
    except OfflineModeIsEnabled:
        raise DownloadError("HF_HUB_OFFLINE is set: dsx download needs the network",
                            hint="unset HF_HUB_OFFLINE") from None
    except HfHubHTTPError as e:
        code = e.response.status_code if getattr(e, "response", None) is not None else "?"
        raise DownloadError(f"{where}: the hub answered HTTP {code}{' for ' + path if path else ''}",
                            hint="retry later; rerun resumes where it stopped") from None
    except TransportError as e:
        raise DownloadError(f"cannot reach {hub.endpoint}: {e.__class__.__name__}: {e}",
                            hint="check the network, proxy and HF_ENDPOINT; rerun resumes where it stopped") from None
