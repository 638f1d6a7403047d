"""Integrity of a dsx output: files, hashes, tensors and config agree with each other and the architecture.

Every problem is a `Finding` naming the file or tensor; nothing here raises on
a bad target (a report lists all problems at once), except for a target that
cannot be opened at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ds_export.errors import DsxError
from ds_export import formats
from ds_export.io.checkpoint import INDEX_NAME, Checkpoint
from ds_export.io.manifest import Manifest
from ds_export.models import deepseek_v3 as ds
from ds_export.progress import QUIET, Reporter


@dataclass(frozen=True)
class Finding:
    check: str  # "files" | "tensors" | "config"
    where: str  # file or tensor name
    problem: str

    def line(self) -> str:
        return f"{self.where}: {self.problem}"


def check_files(root: Path, *, workers: int | None = None,
                progress: Reporter = QUIET) -> tuple[list[Finding], Manifest | None]:
    """Manifest present and complete; every listed file present with its size and sha256 (files hashed by
    `workers` threads at once, default one per core up to 16: hashlib hashes without the GIL)."""
    with FileChecks(root, workers=workers, progress=progress) as files:
        return files.finish(), files.manifest


class FileChecks:
    """check_files in steps, for verify to read each file from disk once for its hash and its weights.

    Opening checks the manifest and every listed file's presence and size (a stat each). `reading(file)` starts that
    file's hash on a thread of its own as the weight check starts reading its tensors, so the two read the same
    bytes at about the same time and the disk gives them once (hashing every file first and then checking the
    weights read R1's target from disk twice: it is larger than any page cache; hashing files ahead of the weight
    check was little better where the page cache is small, as the source's pages, read meanwhile, pushed them
    out). `finish()` hashes the rest and returns every finding; verify reports nothing else when a file fails, so
    what was read out of it beside its hash is dropped."""

    def __init__(self, root: Path, *, workers: int | None = None, progress: Reporter = QUIET):
        from concurrent.futures import ThreadPoolExecutor

        from ds_export.verify.weights import default_workers

        self.root, self.findings, self.manifest = Path(root), [], Manifest.load(root)
        self.futures: dict = {}
        if self.manifest is None:
            self.findings.append(Finding("files", str(root), "no dsx-manifest.json: not a dsx output (or written by "
                                         "an older tool)"))
            self.rels, self.at, self.pool = [], {}, None
            return
        m = self.manifest
        if not m.complete:
            self.findings.append(Finding("files", str(m.path), "the run is not complete (interrupted?): rerun the "
                                         "same command"))
        listed = self.rels = sorted(m.files)  # (the order the weight check reads the shards in)
        self.at = {rel: i for i, rel in enumerate(listed)}
        self.unreadable = {r for r in listed if m.verify_file(r, hash_check=False)}  # missing, or the wrong size
        sizes = (m.files[r].get("size") if isinstance(m.files[r], dict) else None for r in listed)
        self.advance = progress.phase(f"sha256 ({len(listed)} files)", sum(s for s in sizes if isinstance(s, int)))
        workers = workers or default_workers()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsx-hash")
        self.next = 0  # rels[:next] are submitted

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:  # an error or an interrupt drops the files not started yet
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _submit_to(self, i: int) -> None:
        while self.next <= min(i, len(self.rels) - 1):
            rel = self.rels[self.next]
            self.futures[rel] = self.pool.submit(self.manifest.verify_file, rel, progress=self.advance)
            self.next += 1

    def ok_without_hash(self) -> bool:
        """Every listed file is present with its size (so its tensors can be opened)."""
        return self.manifest is not None and not self.unreadable

    def reading(self, file: str | Path) -> None:
        """`file` (a path under the root, or relative to it) is about to be read: hash it now (and the listed files
        before it not started yet), beside the reads."""
        if self.manifest is None:
            return
        p, root = Path(file).resolve(), self.root.resolve()
        rel = p.relative_to(root).as_posix() if p.is_relative_to(root) else str(file)
        if rel in self.at:
            self._submit_to(self.at[rel])

    def finish(self) -> list[Finding]:
        """Every file hashed; the findings, the manifest's first."""
        if self.manifest is None:
            return list(self.findings)
        self._submit_to(len(self.rels))
        out = list(self.findings)
        for rel in self.rels:  # (sorted)
            why = self.futures[rel].result()
            if why:
                out.append(Finding("files", rel, why.split(": ", 1)[-1]))
        listed = set(self.manifest.files)
        for p in sorted(self.root.glob("*.safetensors")):
            if p.name not in listed:
                out.append(Finding("files", p.name, "present but not in the manifest (a stray or foreign file)"))
        return out


def expected_outputs(name: str, shape: tuple[int, ...], src_dtype: str, t: dict) -> dict[str, tuple[str, tuple]]:
    """Tensors a source weight must become under a type entry {"type", "group_size"} of types_by_role."""
    typ = t.get("type")
    if typ in (None, "keep") or typ not in formats.FORMATS:
        return {}
    outs = formats.get(typ).outputs(shape, src_dtype, t.get("group_size", -1), t.get("arch", 90))
    return {name + suffix: (dtype, shape_) for suffix, dtype, shape_ in outs}


def check_tensors(target: Checkpoint, cfg: ds.DeepseekV3Config) -> list[Finding]:
    """Every tensor the architecture needs is there, with the dtype and shape its type implies."""
    out: list[Finding] = []
    qc = target.config.get("quantization_config") or {}
    types = qc.get("types_by_role") or {}
    arch = qc.get("weightonly_arch", 90)
    selection = qc.get("selection", "all")
    try:
        roles = ds.map_tensors(target.names(), cfg, source=str(target.root))
    except DsxError as e:
        return [Finding("tensors", str(target.root), str(e))]
    src_cfg = ds.DeepseekV3Config.from_dict({**cfg.raw, "quantization_config": None}, source="config")
    for et in ds.expected_tensors(src_cfg, fp8=False):
        r = et.role
        if (selection == "base" and r.mtp) or (selection == "mtp" and not r.mtp):
            continue
        t = dict(types.get(("mtp." if r.mtp else "") + r.role, {}))
        t.setdefault("arch", arch)
        want = expected_outputs(et.name, et.shape, et.dtype, t) if types else {et.name: (None, et.shape)}
        if not want and et.name not in target:
            out.append(Finding("tensors", et.name, "missing"))
        for name, (dtype, shape) in want.items():
            if name not in target:
                out.append(Finding("tensors", name, f"missing (its type is {t.get('type', 'unquantized')})"))
                continue
            info = target.info(name)
            if tuple(info.shape) != tuple(shape) or (dtype and info.dtype != dtype):
                out.append(Finding("tensors", name, f"is {info.dtype} {list(info.shape)}, its type "
                                                   f"{t.get('type')} implies {dtype} {list(shape)}"))
    del roles
    return out


_STALE_FP8_KEYS = ("fmt", "activation_scheme", "weight_block_size")


def check_config(target: Checkpoint, cfg: ds.DeepseekV3Config) -> list[Finding]:
    """config.json agrees with the tensors: no stale quantization keys, MTP settings right."""
    out: list[Finding] = []
    where = str(target.root / "config.json")
    qc = target.config.get("quantization_config")
    dtypes = {target.info(n).dtype for n in target.names()}
    if qc is None:
        if dtypes & {"F8_E4M3", "I8"}:
            out.append(Finding("config", where, "tensors are quantized but config.json has no quantization_config"))
    elif qc.get("quant_method") == "fp8" and "I8" in dtypes:
        out.append(Finding("config", where, "quantization_config is the source's FP8 one, but tensors are weight-only"))
    elif qc.get("quant_method") == "dsx":
        has_fp8 = "F8_E4M3" in dtypes
        for k in _STALE_FP8_KEYS:
            if (k in qc) != has_fp8:
                out.append(Finding("config", where, f"quantization_config.{k} is "
                                                    f"{'present without' if k in qc else 'missing despite'} FP8 tensors"))
        if ("weightonly_group_size" in qc) != ("I8" in dtypes):
            out.append(Finding("config", where, "quantization_config.weightonly_group_size disagrees with the tensors"))
        for k in ("source_fingerprint", "quant_type", "tool"):
            if not qc.get(k):
                out.append(Finding("config", where, f"quantization_config.{k} is missing"))
    mtp_present = any(n.startswith(f"model.layers.{L}.") for L in cfg.mtp_layers for n in target.names())
    selection = (qc or {}).get("selection", "all")
    if cfg.num_nextn_predict_layers and not mtp_present and selection != "base":
        out.append(Finding("config", where, f"num_nextn_predict_layers is {cfg.num_nextn_predict_layers} but no MTP "
                                            "tensors are present"))
    if not (target.root / INDEX_NAME).exists():
        out.append(Finding("files", INDEX_NAME, "missing: the output is not complete"))
    return out
