"""Execute a quantization plan: shard by shard, in bounded memory, resumable, never half-published.

One process; `workers` threads each convert a whole output shard (the C++
kernels and file I/O release the GIL), and each kernel call uses
cores / workers OpenMP threads. Memory is bounded by `memory_budget`, split
over the workers as row-chunk sizes.

Resume: `dsx-manifest.json` names the plan digest and every finished shard
with its sha256. A rerun of the same plan re-verifies those shards, skips
them, and redoes the rest; the result is byte-identical to an uninterrupted
run. A different plan's output is never overwritten without `force`. The
index, config and `complete: true` are written last.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ds_export import __version__
from ds_export.errors import DsxError, UsageError
from ds_export.io.checkpoint import INDEX_NAME, Checkpoint
from ds_export.io.manifest import MANIFEST_NAME, Manifest
from ds_export.io.writer import PARTIAL_SUFFIX, ShardWriter, atomic_write_json, write_index
from ds_export.quant.plan import OutShard, Plan
from ds_export.quant.transforms import convert

SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "LICENSE", "LICENSE-MODEL", "LICENSE-CODE")


@dataclass
class Options:
    workers: int | None = None
    force: bool = False
    memory_budget: int = 768 << 20  # bytes of chunk scratch, over all workers
    verify_existing: bool = True  # re-hash finished shards before skipping them


class Reporter:
    """Progress sink; the CLI subclasses it with a rich display. Methods may be called from threads."""

    def start(self, total_bytes: int, shards: int, skipped: int) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def shard_done(self, file: str) -> None: ...


def _prepare_out(out: Path, plan: Plan, force: bool) -> Manifest:
    digest = plan.digest()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    old = Manifest.load(out)
    if old is not None and old.run.get("plan_digest") == digest:
        return old
    if old is not None or any(out.iterdir()):
        if not force:
            what = f"a different dsx run ({old.run.get('recipe', {}).get('name')})" if old else "other files"
            raise UsageError(f"{out}: holds {what}", hint="choose another --out, or pass --force to replace it")
        _clear(out, old)
    m = Manifest(out, run={"tool": "dsx", "version": __version__, "plan_digest": digest, "source": plan.source,
                           "source_fingerprint": plan.source_fingerprint, "recipe": plan.recipe,
                           "selection": plan.selection})
    m.save()
    return m


def _clear(out: Path, old: Manifest | None) -> None:
    """--force: remove what a previous dsx run wrote (never anything else)."""
    names = set(old.files) if old else set()
    names |= {INDEX_NAME, MANIFEST_NAME, "config.json", *SIDE_FILES}
    for p in out.iterdir():
        if p.name in names or p.name.endswith(PARTIAL_SUFFIX) or (p.name.startswith("model-") and p.suffix == ".safetensors"):
            p.unlink()


def _check_space(out: Path, need: int) -> None:
    free = shutil.disk_usage(out).free
    if need > free:
        raise DsxError(f"{out}: needs {need / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free",
                       hint="free space or choose another --out")


def _write_shard(ck: Checkpoint, out: Path, shard: OutShard, chunk_bytes: int, threads: int,
                 reporter: Reporter) -> tuple[str, str, int]:
    path = out / shard.file
    with ShardWriter(path, shard.entries(), {"format": "pt"}) as w:
        for task in shard.tasks:
            convert(ck, task, w.write, chunk_bytes=chunk_bytes, threads=threads, progress=reporter.advance)
        sha = w.close()
    return shard.file, sha, w.size


def run(ck: Checkpoint, plan: Plan, out: str | os.PathLike, opts: Options = Options(),
        reporter: Reporter | None = None, *, on_shard: Callable[[str], None] | None = None) -> dict:
    out = Path(out)
    reporter = reporter or Reporter()
    manifest = _prepare_out(out, plan, opts.force)
    manifest.complete = False
    manifest.save()
    for p in out.glob("*" + PARTIAL_SUFFIX):
        p.unlink()  # leftovers of a killed run: never trusted
    done, todo = [], []
    for s in plan.shards:
        ok = s.file in manifest.files and manifest.verify_file(s.file, hash_check=opts.verify_existing) is None
        (done if ok else todo).append(s)
    _check_space(out, sum(s.bytes_out for s in todo))
    cores = os.cpu_count() or 1
    workers = max(1, min(opts.workers or cores, len(todo) or 1))
    threads = max(1, cores // workers)
    chunk_bytes = max(8 << 20, opts.memory_budget // (2 * workers))
    reporter.start(sum(s.bytes_in for s in todo), len(plan.shards), len(done))
    lock = threading.Lock()
    todo.sort(key=lambda s: -s.bytes_in)  # big shards first: better balance
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(_write_shard, ck, out, s, chunk_bytes, threads, reporter) for s in todo]
        try:
            for f in as_completed(futs):
                file, sha, size = f.result()
                with lock:
                    manifest.record(file, sha, size)
                reporter.shard_done(file)
                if on_shard:
                    on_shard(file)
        except BaseException:
            for f in futs:
                f.cancel()
            raise
    _finish(ck, plan, out, manifest)
    return {"out": str(out), "shards": len(plan.shards), "converted": len(todo), "skipped": len(done),
            "bytes_in": plan.bytes_in, "bytes_out": plan.bytes_out, "plan_digest": plan.digest(),
            "workers": workers}


def _finish(ck: Checkpoint, plan: Plan, out: Path, manifest: Manifest) -> None:
    for name in SIDE_FILES:
        src = ck.root / name
        if src.is_file():
            tmp = out / (name + PARTIAL_SUFFIX)
            shutil.copyfile(src, tmp)
            os.replace(tmp, out / name)
            manifest.record_file(name)
    atomic_write_json(out / "config.json", plan.config)
    manifest.record_file("config.json")
    weight_map = {e.name: s.file for s in plan.shards for e in s.entries()}
    write_index(out, weight_map, sum(e.nbytes for s in plan.shards for e in s.entries()),
                {"dsx_plan_digest": plan.digest()})
    manifest.record_file(INDEX_NAME)
    manifest.complete = True
    manifest.save()
