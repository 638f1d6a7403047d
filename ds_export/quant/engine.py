"""Execute a quantization plan: shard by shard, in bounded memory, resumable, never half-published.

On CPU: one process; `workers` threads each convert a whole output shard (the
C++ kernels and file I/O release the GIL), and each kernel call uses
cores / workers OpenMP threads, so memory stays that of one interpreter and is
bounded by `memory_budget`, split over the workers as row-chunk sizes.
With GPUs: spawned worker processes, each bound to one GPU with its own converter
(streams, pinned buffers) and each converting a whole shard at a time; by default
several per GPU (`gpu_workers`), so one worker's file reads, staging copies, hashing
and writes overlap the others' and the GPU's work: the per-chunk GPU arithmetic is
a small part of a shard's time, the host side is most of it.

Resume: `dsx-manifest.json` names the plan digest and every finished shard
with its sha256. A rerun of the same plan re-verifies those shards, skips
them, and redoes the rest; the result is byte-identical to an uninterrupted
run. A different plan's output is never overwritten without `force`. The
index, config and `complete: true` are written last.

Several nodes (`num_nodes`, `node_rank`; a shared output directory): the
shards are split by bytes, deterministically; each node records its own
`dsx-manifest.node-R-of-N.json`, and whichever node finds every node's
manifest complete merges them into the final index, config and manifest.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ds_export import __version__
from ds_export.errors import CheckpointError, DsxError, UsageError
from ds_export.interrupt import Stopped, ignore_sigint, wait_for_workers
from ds_export.io.checkpoint import INDEX_NAME, Checkpoint
from ds_export.io.dirlock import exclusive, shared
from ds_export.io.manifest import MANIFEST_NAME, Manifest
from ds_export.io.writer import (PARTIAL_SUFFIX, ShardWriter, WriteBehind, atomic_write_json, check_out_apart,
                                  free_bytes, write_index)
from ds_export.quant.backend import CpuBackend, CudaBackend
from ds_export.quant.plan import OutShard, Plan
from ds_export.quant.transforms import convert
from ds_export.units import human_bytes

SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "LICENSE", "LICENSE-MODEL", "LICENSE-CODE")


@dataclass
class Options:
    workers: int | None = None
    force: bool = False
    memory_budget: int = 768 << 20  # bytes of chunk scratch, over all workers
    verify_existing: bool = True  # re-hash finished shards before skipping them
    num_nodes: int = 1
    node_rank: int = 0
    gpus: tuple[int, ...] = ()  # --device cuda: worker processes bound to these GPUs (gpu_workers)
    # What a GPU worker process converts with: called there as gpu_backend(gpu, staging_threads). A
    # module-level class (spawned processes import it); tests pass a CPU stand-in to run this path in CI.
    gpu_backend: Callable = CudaBackend


GPU_WORKERS_PER_GPU = 4  # host-bound work: more per GPU stops paying once the cores are busy


def gpu_workers(gpus: tuple[int, ...] | list[int], workers: int | None, cores: int, shards: int) -> list[int]:
    """The GPU each worker process binds, round robin over `gpus`.

    `workers` (--workers) sets the total; at least one per GPU. By default up to
    GPU_WORKERS_PER_GPU per GPU, one per 4 cores (each worker's staging copies use
    several threads), never more than the shards to convert (nor fewer than one per GPU).
    """
    g = len(gpus)
    if workers is None:
        workers = min(g * GPU_WORKERS_PER_GPU, max(g, cores // 4), max(g, shards))
    n = max(g, workers)
    return [gpus[i % g] for i in range(n)]


def node_from_env(num_nodes: int | None, node_rank: int | None) -> tuple[int, int]:
    """--num-nodes/--node-rank, else the variables `python -m paddle.distributed.launch` sets."""
    n = num_nodes if num_nodes is not None else int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    r = node_rank if node_rank is not None else int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    if n < 1 or not 0 <= r < n:
        raise UsageError(f"node rank {r} of {n} nodes is out of range", hint="0 <= --node-rank < --num-nodes")
    return n, r


def assign(shards: list[OutShard], num_nodes: int) -> list[list[OutShard]]:
    """Split shards over nodes by bytes (largest first to the least loaded node; deterministic)."""
    loads = [0] * num_nodes
    parts: list[list[OutShard]] = [[] for _ in range(num_nodes)]
    for s in sorted(shards, key=lambda s: (-s.bytes_in, s.file)):
        i = loads.index(min(loads))
        parts[i].append(s)
        loads[i] += s.bytes_in
    return parts


def node_manifest_name(num_nodes: int, rank: int) -> str:
    return MANIFEST_NAME if num_nodes == 1 else f"dsx-manifest.node-{rank}-of-{num_nodes}.json"


class Reporter:
    """Progress sink; the CLI subclasses it with a rich display. Methods may be called from threads."""

    def start(self, total_bytes: int, shards: int, skipped: int) -> None: ...
    def advance(self, nbytes: int) -> None: ...
    def shard_done(self, file: str) -> None: ...
    def tensor(self, name: str) -> None: ...


def _ours(p: Path) -> bool:
    return p.name.startswith(("model-", "dsx-manifest")) or p.name.endswith(PARTIAL_SUFFIX)


class OutputHeld(UsageError):
    """--out holds another run's output (another recipe or source), which only --force replaces: callers without
    that option (dsx run) give their own way out."""


def _prepare_out(out: Path, plan: Plan, force: bool, name: str = MANIFEST_NAME) -> Manifest:
    digest = plan.digest()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    try:
        old, damaged = Manifest.load(out, name), False
    except CheckpointError:  # (unreadable, damaged, or a newer dsx's: its error says to pass --force)
        if not force:
            raise
        old, damaged = None, True  # (a dsx output whose records cannot be read: replaced, dsx's files by name)
    if old is not None and old.run.get("plan_digest") == digest:
        return old
    main = Manifest.load(out) if name != MANIFEST_NAME else None
    if main is not None and main.run.get("plan_digest") != digest:
        old = old or main
    # Other nodes of the same multi-node run write beside us: their files are not "other files".
    foreign = [p for p in out.iterdir() if not (name != MANIFEST_NAME and _ours(p))]
    if (old is not None and old.run.get("plan_digest") != digest) or (old is None and foreign):
        if not force:
            what = f"a different dsx run ({old.run.get('recipe', {}).get('name')})" if old else "other files"
            if old is not None and old.run.get("source_fingerprint") != plan.source_fingerprint:
                what = (f"a conversion of another source ({old.run.get('source')}: its fingerprint differs, other "
                        "weights, or planned by an older dsx)")
            raise OutputHeld(f"{out}: holds {what}", hint="choose another --out, or pass --force to replace it")
        if old is None and not damaged:  # (no dsx run wrote here: --force must not take another checkpoint's files)
            theirs = sorted(p.name for p in foreign if p.is_file() and not p.name.startswith("dsx-manifest")
                            and not p.name.endswith(PARTIAL_SUFFIX) and (p.name in (INDEX_NAME, "config.json")
                                                                        or _ours(p)))
            if theirs:
                raise UsageError(f"{out}: holds a checkpoint that no dsx run wrote ({', '.join(theirs[:3])}"
                                 f"{', ...' if len(theirs) > 3 else ''}); --force replaces only a dsx output",
                                 hint="choose another --out: a new or empty directory")
        _clear(out, old)
    m = Manifest(out, run={"tool": "dsx", "version": __version__, "plan_digest": digest, "source": plan.source,
                           "source_fingerprint": plan.source_fingerprint, "recipe": plan.recipe,
                           "selection": plan.selection}, name=name)
    m.save()
    return m


def _clear(out: Path, old: Manifest | None) -> None:
    """--force: remove what a previous dsx run wrote (never anything else)."""
    names = set(old.files) if old else set()
    names |= {INDEX_NAME, "config.json", *SIDE_FILES}
    for p in out.iterdir():
        if p.is_file() and (p.name in names or _ours(p)):
            p.unlink()


def _check_space(out: Path, need: int) -> None:
    free = free_bytes(out)
    if need > free:
        raise DsxError(f"{out}: needs {human_bytes(need)}, only {human_bytes(free)} free",
                       hint="free space or choose another --out")


_local = threading.local()  # a GPU worker process: its checkpoint, backend, progress queue and stop event


def _gpu_worker_init(root: str, partial: bool, ids, threads: int, progress, make_backend, stop) -> None:
    """A GPU worker process (spawned): opens the source itself and binds the GPU it takes from `ids`. Ctrl-C is the
    main process's to handle (a terminal sends it to the whole process group): it sets `stop`, which the worker checks
    between chunks, as the CPU path's threads do."""
    ignore_sigint()
    _local.ck = Checkpoint.open(root, partial=partial)
    _local.backend = make_backend(ids.get(), threads)
    _local.progress = progress
    _local.stop = stop


class _QueueReporter(Reporter):
    """What a GPU worker process reports: bytes, batched, through a multiprocessing queue."""

    def __init__(self, q):
        self.q, self.pending = q, 0

    def advance(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= 64 << 20:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.q.put(self.pending)
            self.pending = 0


def _write_shard_gpu(out: Path, shard: OutShard, chunk_bytes: int) -> tuple[str, str, int]:
    rep = _QueueReporter(_local.progress)
    try:
        return _write_shard(_local.ck, out, shard, chunk_bytes, 0, rep, _local.stop)
    finally:
        rep.flush()


def _drain(q, reporter: Reporter, done: threading.Event) -> None:
    while not done.is_set() or not q.empty():
        try:
            reporter.advance(q.get(timeout=0.1))
        except queue.Empty:
            pass


def _write_shard(ck: Checkpoint, out: Path, shard: OutShard, chunk_bytes: int, threads: int,
                 reporter: Reporter, stop) -> tuple[str, str, int]:
    """Convert one output shard; `stop` (an Event) is checked before each tensor and after each chunk."""
    backend = getattr(_local, "backend", None) or CpuBackend(threads)
    path = out / shard.file

    def progress(nbytes: int) -> None:
        reporter.advance(nbytes)
        if stop.is_set():
            raise Stopped(shard.file)  # (ShardWriter removes the partial file)

    with ShardWriter(path, shard.entries(), {"format": "pt"}) as w:
        wb = WriteBehind(w.write)
        try:
            for task in shard.tasks:
                if stop.is_set():
                    raise Stopped(shard.file)
                reporter.tensor(task.src)
                convert(ck, task, wb.put, chunk_bytes=chunk_bytes, backend=backend, progress=progress)
        finally:
            wb.drain()
        sha = w.close()
    return shard.file, sha, w.size


def run(ck: Checkpoint, plan: Plan, out: str | os.PathLike, opts: Options = Options(),
        reporter: Reporter | None = None, *, on_shard: Callable[[str], None] | None = None,
        stop: threading.Event | None = None) -> dict:
    """Convert what is left of `plan` into `out`. `stop`: set to end the run early (from another thread): the workers
    abandon their shards at their next chunk and run raises KeyboardInterrupt, as on Ctrl-C; run sets it itself on
    Ctrl-C or on a worker's failure. Either way the finished shards are recorded and the output is not published.
    One run at a time writes `out` (a second, or a dsx export / verify reading it, is refused while the first holds
    its lock)."""
    out = Path(out)
    check_out_apart(out, plan.source, "dsx quantize")  # (before the locks: the same directory would hold both)
    with shared(ck.root, "dsx quantize"):  # (not while a dsx download or quantize writes the source)
        if opts.num_nodes > 1 or (out.exists() and not out.is_dir()):  # (nodes share --out by design)
            return _run(ck, plan, out, opts, reporter, on_shard, stop)
        with exclusive(out, "dsx quantize"):
            return _run(ck, plan, out, opts, reporter, on_shard, stop)


def _run(ck: Checkpoint, plan: Plan, out: Path, opts: Options, reporter: Reporter | None,
         on_shard: Callable[[str], None] | None, stop: threading.Event | None) -> dict:
    stop = stop or threading.Event()
    reporter = reporter or Reporter()
    n_nodes, rank = opts.num_nodes, opts.node_rank
    mine = plan.shards if n_nodes == 1 else assign(plan.shards, n_nodes)[rank]
    manifest = _prepare_out(out, plan, opts.force, node_manifest_name(n_nodes, rank))
    manifest.complete = False
    manifest.save()
    done, todo = [], []
    for s in mine:
        ok = s.file in manifest.files and manifest.verify_file(s.file, hash_check=opts.verify_existing) is None
        (done if ok else todo).append(s)
    for s in todo:  # leftovers of a killed run are never trusted (other nodes' partials are left alone)
        (out / (s.file + PARTIAL_SUFFIX)).unlink(missing_ok=True)
    _check_space(out, sum(s.bytes_out for s in todo))
    cores = os.cpu_count() or 1
    gpu_ids = gpu_workers(opts.gpus, opts.workers, cores, len(todo)) if opts.gpus else []
    workers = len(gpu_ids) if opts.gpus else max(1, min(opts.workers or cores, len(todo) or 1))
    threads = max(1, cores // workers)
    # Per worker: the chunk being converted, its float32 scratch and two chunks queued for writing.
    chunk_bytes = max(4 << 20, opts.memory_budget // (4 * workers))
    reporter.start(sum(s.bytes_in for s in todo), len(mine), len(done))
    todo.sort(key=lambda s: -s.bytes_in)  # big shards first: better balance
    if opts.gpus:
        _run_gpu_processes(ck, out, todo, chunk_bytes, gpu_ids, threads, opts.gpu_backend, manifest, reporter,
                           on_shard, stop)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            _collect(lambda: [pool.submit(_write_shard, ck, out, s, chunk_bytes, threads, reporter, stop) for s in todo],
                     manifest, reporter, on_shard, stop)
    res = {"out": str(out), "shards": len(mine), "converted": len(todo), "skipped": len(done),
           "bytes_in": sum(s.bytes_in for s in mine), "bytes_out": sum(s.bytes_out for s in mine),
           "plan_digest": plan.digest(), "workers": workers, "node": f"{rank}/{n_nodes}", "complete": True,
           "device": f"cuda:{','.join(map(str, opts.gpus))}" if opts.gpus else "cpu"}
    if n_nodes == 1:
        _finish(ck, plan, out, manifest)
        return res
    manifest.complete = True  # this node's share
    manifest.save()
    res["complete"] = _merge_nodes(ck, plan, out, n_nodes)
    return res


def _collect(start, manifest: Manifest, reporter: Reporter, on_shard, stop, workers_stop=None) -> None:
    """Submit the shards (`start()`: their futures) and record each finished shard in the manifest as it completes
    (this thread is the only writer).

    On Ctrl-C, `stop` set by a caller, or the first failure (interrupt.wait_for_workers): `stop` (and `workers_stop`,
    the worker processes' own event, given where `start` submits to a process pool) tells the running workers to
    abandon their shards at their next chunk, the queued ones are cancelled, shards that finished meanwhile are still
    recorded (a rerun skips them), and KeyboardInterrupt or the failure goes on up."""

    def record(f) -> None:
        file, sha, size = f.result()
        manifest.record(file, sha, size)
        reporter.shard_done(file)
        if on_shard:
            on_shard(file)

    wait_for_workers(start, record, [stop] if workers_stop is None else [stop, workers_stop],
                     processes=workers_stop is not None)


def _run_gpu_processes(ck: Checkpoint, out: Path, todo: list[OutShard], chunk_bytes: int, gpu_ids: list[int],
                       threads: int, make_backend, manifest: Manifest, reporter: Reporter, on_shard,
                       stop: threading.Event) -> None:
    """One spawned worker process per entry of `gpu_ids` (bound to that GPU), each taking whole shards as
    it frees up (balanced by bytes: the largest shards go first). Output bytes do not depend on which
    worker or GPU wrote a shard."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")
    ids, progress = ctx.Queue(), ctx.Queue()
    for g in gpu_ids:
        ids.put(g)
    drained = threading.Event()
    stop_workers = ctx.Event()
    drainer = threading.Thread(target=_drain, args=(progress, reporter, drained), daemon=True)
    drainer.start()
    try:
        with ProcessPoolExecutor(max_workers=len(gpu_ids), mp_context=ctx, initializer=_gpu_worker_init,
                                 initargs=(str(ck.root), bool(ck.missing_shards), ids, threads, progress,
                                           make_backend, stop_workers)) as pool:
            _collect(lambda: [pool.submit(_write_shard_gpu, out, s, chunk_bytes) for s in todo], manifest, reporter,
                     on_shard, stop, stop_workers)
    except BrokenProcessPool:
        raise DsxError(f"a GPU worker process died while converting ({len(gpu_ids)} workers on GPU(s) "
                       f"{','.join(map(str, sorted(set(gpu_ids))))}); {len(manifest.files)} finished shard(s) are "
                       "kept and the output is not published",
                       hint="rerun the same command to resume; if memory ran out (dmesg, nvidia-smi), pass fewer "
                            "--workers") from None
    finally:
        drained.set()
        drainer.join()
        for s in todo:  # (the pool is shut down: a worker that was killed, or died, left its shard's partial file)
            if s.file not in manifest.files:
                (out / (s.file + PARTIAL_SUFFIX)).unlink(missing_ok=True)


def _merge_nodes(ck: Checkpoint, plan: Plan, out: Path, n_nodes: int) -> bool:
    """Publish the whole output once every node's manifest is complete for this plan."""
    digest = plan.digest()
    merged = Manifest(out, run=None)
    for r in range(n_nodes):
        m = Manifest.load(out, node_manifest_name(n_nodes, r))
        if m is None or not m.complete or m.run.get("plan_digest") != digest:
            return False
        merged.run = dict(m.run)
        merged.files.update(m.files)
    merged.run["nodes"] = n_nodes
    _finish(ck, plan, out, merged)
    return True


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
