"""Which files to fetch: metadata by name, weight shards by the roles of the tensors they hold.

`--only`:
- `config`: the metadata files only (config.json, the index, generation config,
  tokenizer files, remote code, license/readme).
- `all`: metadata + every shard the index's weight_map lists (a repo without an
  index: every top-level *.safetensors).
- `base`: metadata + the shards holding any tensor of the main model.
- `mtp`: metadata + the shards holding any tensor of the MTP layer(s). MTP layers
  are num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1,
  classified by the model map (`deepseek_v3.classify`), never by a fixed number.
  A shard can hold both kinds of tensors; it is then fetched for either.

`--include GLOB` adds repo files (matched against the path), `--exclude GLOB`
removes them; the index and config.json are always fetched because the
selection itself needs them.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ds_export.download.errors import DownloadError
from ds_export.errors import UsageError
from ds_export.io.checkpoint import INDEX_NAME
from ds_export.models.deepseek_v3 import DeepseekV3Config, classify

ONLY = ("all", "base", "mtp", "config")
CONFIG_NAME = "config.json"
# Top-level metadata a serving stack or `dsx quantize` reads next to the weights.
METADATA_GLOBS = (CONFIG_NAME, "generation_config.json", INDEX_NAME, "tokenizer*", "special_tokens_map.json",
                  "added_tokens.json", "vocab*", "merges.txt", "chat_template*", "*.tiktoken", "*.py",
                  "LICENSE*", "README.md")
SELECTION_INPUTS = (INDEX_NAME, CONFIG_NAME)


@dataclass(frozen=True)
class Selection:
    metadata: tuple[str, ...]  # small files, fetched first
    shards: tuple[str, ...]  # weight files chosen by role
    extra: tuple[str, ...]  # --include matches that are neither

    @property
    def files(self) -> tuple[str, ...]:
        return self.metadata + self.shards + self.extra


def check_only(only: str) -> str:
    if only not in ONLY:
        raise UsageError(f"--only {only}: expected one of {', '.join(ONLY)}")
    return only


def check_path(p, where: str, what: str = "the repository lists") -> None:
    """Only plain relative paths inside the target directory (a hostile listing could say '../x')."""
    if (not isinstance(p, str) or not p or p.startswith("/") or "\\" in p or "\0" in p
            or any(part in ("", ".", "..") for part in p.split("/"))):
        raise DownloadError(f"{where}: {what} {p!r}, not a relative file name inside the repo")


def metadata_files(names) -> list[str]:
    return sorted(n for n in names if "/" not in n and any(fnmatch.fnmatchcase(n, g) for g in METADATA_GLOBS))


def weight_files(index: dict | None, names, config: dict | None, only: str, *, where: str) -> list[str]:
    """The shards `only` asks for (empty for `config`)."""
    if only == "config":
        return []
    if index is None:
        if only != "all":
            raise DownloadError(f"{where}: no {INDEX_NAME}, so shards cannot be chosen by role",
                                hint="use --only all, or --include with the files you want")
        return sorted(n for n in names if "/" not in n and n.endswith(".safetensors"))
    wm = index.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise DownloadError(f"{where}: {INDEX_NAME} has no weight_map")
    for f in set(wm.values()):
        check_path(f, where, f"{INDEX_NAME} lists")
    if only == "all":
        return sorted(set(wm.values()))
    if config is None:
        raise DownloadError(f"{where}: no {CONFIG_NAME}, so MTP tensors cannot be told from the main model's")
    cfg = DeepseekV3Config.from_dict(config, source=f"{where}/{CONFIG_NAME}")
    if only == "mtp" and cfg.num_nextn_predict_layers == 0:
        raise DownloadError(f"{where}: {CONFIG_NAME} has num_nextn_predict_layers 0, the model has no MTP layer")
    want_mtp = only == "mtp"
    return sorted({f for name, f in wm.items() if classify(name, cfg).mtp == want_mtp})


def select(names, index: dict | None, config: dict | None, only: str, include=(), exclude=(), *,
           where: str) -> Selection:
    """Choose files from the repo's file `names` (all at the pinned commit)."""
    names = set(names)
    meta = metadata_files(names)
    shards = weight_files(index, names, config, only, where=where)
    missing = [s for s in shards if s not in names]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DownloadError(f"{where}: {INDEX_NAME} lists {missing[0]}{more}, which the repository does not hold",
                            hint="the repo is incomplete at this revision; try another --revision")
    extra: list[str] = []
    for g in include or ():
        hits = sorted(n for n in names if fnmatch.fnmatchcase(n, g))
        if not hits:
            raise UsageError(f"--include {g!r} matches no file of {where}")
        extra += [h for h in hits if h not in meta and h not in shards and h not in extra]

    def keep(n: str) -> bool:
        return n in SELECTION_INPUTS or not any(fnmatch.fnmatchcase(n, g) for g in exclude or ())

    out = Selection(tuple(m for m in meta if keep(m)), tuple(s for s in shards if keep(s)),
                    tuple(e for e in extra if keep(e)))
    for p in out.files:
        check_path(p, where)
    return out
