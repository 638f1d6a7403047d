"""`dsx export`: save the inference program(s) Paddle Inference loads, published atomically.

Layout of OUT (see docs/export-model.md):

    OUT/model.json, model.pdiparams       the base step program (PIR); tp > 1: OUT/rank_{r}/model.*
    OUT/config.json                       source config + PaddleNLP-style inference keys
    OUT/generation_config.json, tokenizer files
    OUT/mtp/model.json, model.pdiparams   --speculate: the MTP draft program; tp > 1: OUT/mtp/rank_{r}/model.*
    OUT/mtp/config.json                   the draft's config (num_hidden_layers = 1)
    OUT/dsx-manifest.json                 every file with its sha256; complete = true

Everything is written into OUT.partial/ and renamed to OUT at the end, so an
interrupted export never looks complete. Weights stream: the model is built with deferred
parameters (params.py) and each rank's parameter file is written one tensor at a time, read and
converted from the checkpoint as it goes, so memory holds one tensor, not the model.

With tp > 1 every rank is written by a fresh process of its own (spawned; it opens the source
itself), as many at once as the cores and the available memory allow (`default_workers`):
building a rank's program is single-threaded Python, so N ranks at once take about the time of
one. A fresh process per rank also makes a rank's program independent of the ranks built before
it: Paddle's IR context uniques float attributes process-wide with 0.0 == -0.0, so in one
process a bias of -0.0 created for rank 0 (its vocabulary offset, 0) turned later ranks' +0.0
biases into -0.0 (a signed zero that changes no result, but changes the bytes). The files do
not depend on how many workers wrote them (tested).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import NoReturn

from ds_export import __version__
from ds_export.errors import DsxError, Interrupted, UsageError
from ds_export.export.quiet import quiet_paddle
from ds_export.io.checkpoint import Checkpoint
from ds_export.interrupt import stop_requested
from ds_export.io.dirlock import exclusive, shared
from ds_export.io.manifest import MANIFEST_NAME, Manifest, export_manifest, require_finished
from ds_export.io.writer import atomic_write_json, check_out_apart, free_bytes
from ds_export.models import deepseek_v3 as ds
from ds_export.procmem import reuse_freed_pages
from ds_export.progress import QUIET, Reporter, nothing
from ds_export.units import human_bytes

# Peak memory of one rank's export process: Paddle + dsx imported with slack, plus the program,
# which grows with the layers (measured: rank 0 of R1 at tp 8, all 61 layers, peaked at 6008 MiB
# RSS on the dev VM, ~98 MiB a layer; bench/export_program.py, docs/benchmarks.md).
RANK_MEMORY_BASE = 512 << 20
RANK_MEMORY_PER_LAYER = 100 << 20

SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model")
DTYPES = ("float32", "bfloat16", "float16")


def _source_quant(ck: Checkpoint) -> dict:
    """The source's quantization: {"weights_from", "quant_type", "mtp_quant_type"} plus PaddleNLP-style keys.

    Original FP8 checkpoints are dequantized (quant_type "none"); a `dsx quantize` output keeps its
    Linears quantized (weight-only int8/int4, block FP8, mixed), run by the dsx custom operators.
    """
    qc = ck.config.get("quantization_config") or {}
    if qc.get("quant_method") == "fp8":
        return {"weights_from": "fp8_source", "quant_type": "none", "mtp_quant_type": "none"}
    if qc.get("quant_method") == "dsx":
        qt = qc.get("quant_type", "dsx")
        out = {"weights_from": qt, "quant_type": qt, "mtp_quant_type": qc.get("mtp_quant_type", qt)}
        for key in ("weight_block_size", "weightonly_group_size", "weightonly_arch"):
            if key in qc:
                out[key] = qc[key]
        return out
    return {"weights_from": "bf16", "quant_type": "none", "mtp_quant_type": "none"}


def inference_config(src_cfg: dict, *, dtype: str, max_seq_len: int, block_size: int, tp: int,
                     speculate: bool, draft_tokens: int, source_quant: dict, custom_ops: bool = False) -> dict:
    """config.json of an export: the source config (minus quantization_config) + inference keys.

    source_quant (from `_source_quant`): quant_type / weights_from / weight-only and FP8 keys;
    custom_ops: the program calls the dsx Paddle ops (runtime loads ops.load_ops() first).
    """
    cfg = {k: v for k, v in src_cfg.items() if k != "quantization_config"}
    cfg.update({k: v for k, v in source_quant.items() if k != "mtp_quant_type"})
    cfg.update({
        "infer_model_dtype": dtype, "infer_model_max_seq_len": max_seq_len, "infer_model_block_size": block_size,
        "tensor_parallel_degree": tp, "dsx_custom_ops": "dsx_paddle_ops" if custom_ops else None,
        "mla_use_matrix_absorption": True, "mla_absorption_layout": "per_head_w_uk_w_uv",
        "speculate_method": "mtp" if speculate else None,
        "speculate_max_draft_token_num": draft_tokens if speculate else 0,
        "dsx_export": {"tool": f"dsx {__version__}", "program": "step(input_ids, cache_lens, cache) -> "
                       "(logits, hidden, cache)", "cache_layout": "[layers, batch, max_seq_len, kv_lora_rank + "
                       "qk_rope_head_dim]"},
    })
    return cfg


def _uses_ops(top: dict, layers) -> bool:
    """Whether any Linear of these weights is quantized (run by the dsx custom operators)."""
    from ds_export.export.weights import LinearWeights

    lins = [v for v in top.values() if isinstance(v, LinearWeights)]
    for lw in layers:
        lins += [v for v in lw.tensors.values() if isinstance(v, LinearWeights)]
        lins += [v for e in lw.experts for v in e.values()]
    return any(v.fmt != "dense" for v in lins)


def default_workers(tp: int, layers: int, *, cores: int | None = None, available: int | None = None) -> int:
    """Rank processes at once: one per rank, bounded by the cores and by the memory available for
    each rank's estimated peak (RANK_MEMORY_BASE + RANK_MEMORY_PER_LAYER per layer)."""
    cores = cores or os.cpu_count() or 1
    if available is None:
        from ds_export.procmem import memory_available

        available = memory_available()
    by_memory = tp if available is None else available // (RANK_MEMORY_BASE + layers * RANK_MEMORY_PER_LAYER)
    return max(1, min(tp, cores, by_memory))


def _write_rank(weights, tmp: Path, r: int, tp: int, max_seq_len: int, speculate: bool, built=nothing,
                written=nothing, hashed=nothing) -> None:
    """Rank r's base program (and draft) under tmp (tp = 1: tmp itself); built(1) after each program is saved,
    written(n): each parameter's bytes once they are written, hashed((path under tmp, sha256)): each parameter
    file's hash as it was written."""
    from ds_export.export.modeling import DeepseekV3ForInference
    from ds_export.export.mtp import MTPDraft
    from ds_export.export.params import deferred, save_streamed
    from ds_export.export.tp import shard_weights

    rank = f"rank_{r}" if tp > 1 else ""
    part = shard_weights(weights, r, tp)
    with deferred() as values:
        base = DeepseekV3ForInference(part, max_seq_len)
    (tmp / rank).mkdir(parents=True, exist_ok=True)
    save_streamed(base, tmp / rank / "model", base.input_spec(), values, written, _tell(hashed, rank, "model"))
    built(1)
    if speculate:
        with deferred() as values:
            draft = MTPDraft(part, max_seq_len)
        (tmp / "mtp" / rank).mkdir(parents=True, exist_ok=True)
        save_streamed(draft, tmp / "mtp" / rank / "model", draft.input_spec(), values, written,
                      _tell(hashed, "mtp", rank, "model"))
        built(1)


def _tell(hashed, *parts: str):
    """hashed((the parameter file's path under the staging directory, its sha256)), for save_streamed."""
    rel = str(Path(*[p for p in parts if p])) + ".pdiparams"
    return lambda sha: hashed((rel, sha))


def _rank_process(src: str, tmp: str, r: int, tp: int, dtype: str, max_seq_len: int, speculate: bool,
                  built=nothing, written=nothing, hashed=nothing) -> None:
    """A rank process's job: open the source itself and write rank r."""
    from ds_export.export.weights import load_weights

    quiet_paddle()
    reuse_freed_pages()
    with Checkpoint.open(src) as ck:
        _write_rank(load_weights(ck, dtype, include_mtp=speculate, lazy=True), Path(tmp), r, tp, max_seq_len,
                    speculate, built, written, hashed)


class _RankTraceback(Exception):
    """The traceback of a rank process's failure, chained to the re-raised error (shown under DSX_DEBUG)."""


def _rank_main(args: tuple, conn) -> None:
    """Entry of a spawned rank process: sends its progress as it goes, ("built", 1) after each program,
    ("written", n) after each parameter and ("hashed", (path, sha256)) after each parameter file, then ("done", None)
    or ("done", (the exception, its traceback text)).
    Ctrl-C is the main process's to handle (it kills the ranks): a rank starts with it blocked and ignores it."""
    import traceback

    from ds_export.interrupt import ignore_sigint

    ignore_sigint()
    try:
        try:
            _rank_process(*args, built=lambda n: conn.send(("built", n)), written=lambda n: conn.send(("written", n)),
                          hashed=lambda h: conn.send(("hashed", h)))
            result = None
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
            result = (e, traceback.format_exc())
        try:
            conn.send(("done", result))
        except BrokenPipeError:  # the parent is gone (interrupted, or failed on another rank): nobody to tell
            pass
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            if result is None:
                raise
            e, text = result
            conn.send(("done", (RuntimeError(f"{e.__class__.__name__}: {e}"), text)))
    finally:
        conn.close()


def _write_ranks_in_processes(src, tmp: Path, tp: int, workers: int, dtype: str, max_seq_len: int,
                              speculate: bool, built=nothing, written=nothing, hashed=nothing) -> None:
    """Every rank, each by a fresh spawned process, `workers` at once, their progress counted here (built, written,
    hashed: _write_rank's). The first failure stops the others (the output is discarded anyway) and is raised here as
    the rank's own exception."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from ds_export.interrupt import sigint_blocked

    ctx = mp.get_context("spawn")
    src, tmp = os.fspath(Path(src).resolve()), os.fspath(Path(tmp).resolve())
    pending, running = list(range(tp)), {}  # rank -> (process, receiving end)
    try:
        while pending or running:
            while pending and len(running) < workers:
                r = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_rank_main, args=((src, tmp, r, tp, dtype, max_seq_len, speculate), send),
                                   name=f"dsx-export-rank-{r}")
                with sigint_blocked():  # (a Ctrl-C meanwhile comes when it ends, here in the main process)
                    proc.start()
                    running[r] = (proc, recv)  # (before that Ctrl-C: the finally below must stop this one too)
                send.close()
            ready = set(wait([c for _, c in running.values()] + [p.sentinel for p, _ in running.values()]))
            for r, (proc, recv) in list(running.items()):
                if recv not in ready and proc.sentinel not in ready:
                    continue
                try:
                    kind, res = recv.recv()
                    died = False
                except EOFError:  # it ended without a word: killed (out of memory?)
                    kind, res, died = "done", None, True
                if kind != "done":  # (its progress: the rank goes on)
                    {"built": built, "written": written, "hashed": hashed}[kind](res)
                    continue
                proc.join()
                recv.close()
                del running[r]
                if died:
                    raise DsxError(f"{tmp}: the process exporting rank {r} died ({workers} ranks at once: "
                                   "out of memory?)", hint="rerun with fewer --workers")
                if res is not None:
                    err, text = res
                    raise err from (_RankTraceback(f"rank {r}:\n{text}") if text else None)
    finally:
        # SIGKILL, not SIGTERM: a rank's output is discarded anyway, and Paddle (imported by then) catches SIGTERM
        # with a handler that prints a C++ "FatalError: `Termination signal`" block on the terminal's stdout for
        # every rank stopped, and that formats text inside a signal handler (it may hang in malloc's lock)
        for proc, recv in running.values():
            proc.kill()
            proc.join()
            recv.close()


def check_routing(cfg: ds.DeepseekV3Config, source: Path) -> None:
    """What the programs' router and rope need of config.json (each was an internal error from Paddle's ops in the
    export, or the first generate): DeepSeek's noaux_tc router ranks each group of experts by its two best, so a
    group needs two; the chosen groups must hold num_experts_per_tok experts; the rope turns pairs of dims."""
    per_group = cfg.n_routed_experts // cfg.n_group
    if per_group < 2:
        raise UsageError(f"{source}: n_routed_experts {cfg.n_routed_experts} in n_group {cfg.n_group} groups is "
                         f"{per_group} expert a group; DeepSeek's router ranks each group by its two best experts",
                         hint="give n_group at most n_routed_experts / 2")
    if cfg.num_experts_per_tok > cfg.topk_group * per_group:
        raise UsageError(f"{source}: num_experts_per_tok {cfg.num_experts_per_tok} is more than the topk_group "
                         f"{cfg.topk_group} groups it picks from hold ({cfg.topk_group} x {per_group})",
                         hint="raise topk_group or lower num_experts_per_tok")
    if cfg.qk_rope_head_dim % 2:
        raise UsageError(f"{source}: qk_rope_head_dim {cfg.qk_rope_head_dim} is odd; the rope turns pairs of dims",
                         hint="fix config.json, or take the model repository's own")


def check_settings(cfg: ds.DeepseekV3Config, *, tp: int, max_seq_len: int, speculate: bool, source: Path) -> None:
    """The export settings against the model's config.json (`source`): the tensor-parallel split, the cache length
    against the rope's, a draft that exists. Export checks them first; dsx run checks them before its first step, so
    that a recipe's bad export section does not wait for the download and the conversion to be found."""
    from ds_export.export.tp import check_tp

    check_tp(cfg, tp, str(source))
    check_routing(cfg, source)
    longest = cfg.raw.get("max_position_embeddings")
    if isinstance(longest, int) and max_seq_len > longest:  # (rope tables of --max-seq-len rows are built)
        raise UsageError(f"--max-seq-len {max_seq_len}: above the model's max_position_embeddings {longest} "
                         f"({source}), the longest context its rope is made for", hint=f"give at most {longest}")
    if speculate and not cfg.num_nextn_predict_layers:
        raise UsageError(f"{source}: --speculate needs an MTP layer, and num_nextn_predict_layers is 0")


def export(src: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float32", max_seq_len: int = 4096,
           block_size: int = 64, tp: int = 1, speculate: bool = False, draft_tokens: int = 1,
           force: bool = False, workers: int | None = None, progress: Reporter = QUIET) -> dict:
    """workers: rank processes at once for tp > 1 (None: default_workers; 1: one rank after another). progress: told
    the programs built, the parameters' bytes written and the files hashed, as they are (ds_export.progress).
    Sets this process's malloc to reuse freed pages (procmem.reuse_freed_pages), as the rank processes do."""
    quiet_paddle()
    reuse_freed_pages()

    from ds_export.export.weights import load_weights

    shown = Path(out)  # (the path as given, in messages and the result)
    # A symlink to a directory stands for that directory: the new export replaces it there (replacing the link by a
    # directory, or failing to remove a link as a tree, is not what was asked); "." or "dir/.." name one by its path
    out = shown.resolve() if shown.is_symlink() else Path(os.path.abspath(shown))
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: this version exports {', '.join(DTYPES)}")
    if max_seq_len < 2 or not 1 <= draft_tokens <= 5:
        raise UsageError("--max-seq-len must be >= 2 and --draft-tokens 1..5")
    if block_size < 1:  # (written into config.json for the server's paged cache: 0 or less was written as given)
        raise UsageError(f"--block-size {block_size}: expected the cache's tokens a block, at least 1 (Paddle's "
                         "servers use 64)")
    if workers is not None and workers < 1:
        raise UsageError("--workers must be at least 1")
    if out.exists() and not force:
        raise UsageError(f"{shown}: exists", hint="choose a new --out or pass --force to replace it")
    check_out_apart(out, src, "dsx export")
    if out.exists() and not _replaceable(out):  # (--force removes OUT whole)
        raise UsageError(f"{shown}: not a dsx export; --force replaces only a dsx export (or an empty directory)",
                         hint="choose another --out")
    # (the source is not written meanwhile, nor is the export that --force replaces read: dsx verify --export)
    with shared(src, "dsx export"), (exclusive(out, "dsx export --force") if out.exists()
                                     else contextlib.nullcontext()):
        require_finished(src, "dsx export")
        with Checkpoint.open(src) as ck:
            cfg = ds.DeepseekV3Config.from_dict(ck.config, source=str(Path(src) / "config.json"))
            check_settings(cfg, tp=tp, max_seq_len=max_seq_len, speculate=speculate, source=Path(src) / "config.json")
            weights = load_weights(ck, dtype, include_mtp=speculate, lazy=True)  # shapes now, data when written
            if speculate and not weights.mtp:
                raise UsageError(f"{src}: --speculate needs the MTP layer's tensors, which are not in the checkpoint")
            layers = cfg.num_hidden_layers + (1 if speculate else 0)
            workers = min(tp, workers or default_workers(tp, layers))
            tmp = out.with_name(out.name + ".partial")
            # (one export into OUT at a time: a second one would clear and write the same staging directory while the
            # first hashes it into its manifest; the lock moves with the directory to OUT, and goes with the process)
            with exclusive(tmp, "dsx export"):
                try:
                    if out.exists() and not force:  # (written by another export since the check above)
                        raise UsageError(f"{shown}: exists", hint="choose a new --out or pass --force to replace it")
                    aside = _clear_aside(out)  # (before the work: a refusal here costs nothing)
                    digests: dict[str, str] = {}  # parameter file -> its sha256 as written
                    _write_staged(ck, cfg, weights, src, tmp, dtype=dtype, max_seq_len=max_seq_len,
                                  block_size=block_size, tp=tp, speculate=speculate, draft_tokens=draft_tokens,
                                  workers=workers, progress=progress, hashed=lambda h: digests.__setitem__(*h))
                    del weights
                    m = _manifest(tmp, src, dtype, tp, speculate, progress, digests)
                    if stop_requested():  # (a stop whose KeyboardInterrupt Python dropped: a weakref callback's)
                        raise KeyboardInterrupt
                    _publish(tmp, out, aside)
                except BaseException as e:
                    # Ctrl-C or a failure (rank processes, if any, are stopped by now): an export starts over, so its
                    # partial output is only disk taken (hundreds of GB for R1); the one already at OUT, if --force
                    # was given, is untouched.
                    shutil.rmtree(tmp, ignore_errors=True)
                    # (stop_requested: Paddle's graph tracing turns a KeyboardInterrupt raised inside it into a
                    # SystemError, "returned a result with an exception set")
                    if isinstance(e, KeyboardInterrupt) or stop_requested():
                        raise Interrupted(f"interrupted; {shown} was not written" + (
                            " (the one there is unchanged)" if out.exists() else ""),
                            hint="rerun the command: an export starts over") from None
                    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                        _disk_full(e, shown, out, tmp)
                    raise
    files = sorted(m.files)
    return {"out": str(shown), "files": files, "bytes": sum(e["size"] for e in m.files.values()),
            "speculate": speculate, "dtype": dtype, "workers": workers}


def _disk_full(e: OSError, shown: Path, out: Path, tmp: Path) -> NoReturn:
    """The disk filled while the export was staged (removed by now): the path and what a rerun needs. Paddle's and
    numpy's writes raise it without a file name, and the CLI's generic hint ("rerunning resumes") is not true here."""
    quota = " (the quota is used up)" if e.errno == errno.EDQUOT else ""
    free = free_bytes(out.parent)
    keep = " (--force keeps the export at OUT until the new one is complete: remove it first if the disk cannot " \
           "hold both)" if out.exists() else ""
    raise DsxError(f"{shown}: the disk is full{quota} while the export was written into {tmp.name}; nothing was "
                   f"published and the partial output was removed ({human_bytes(free)} free now)",
                   hint=f"free space or choose another --out, then rerun: an export starts over{keep}") from None


def _write_staged(ck: Checkpoint, cfg, weights, src, tmp: Path, *, dtype: str, max_seq_len: int, block_size: int,
                  tp: int, speculate: bool, draft_tokens: int, workers: int, progress: Reporter = QUIET,
                  hashed=nothing) -> None:
    """The export's files written into the staging directory tmp (its lock held by the caller): programs, configs,
    side files; the manifest comes next. hashed((path, sha256)): each parameter file's hash as it was written."""
    _clear(tmp)  # (what an export stopped before it finished left)
    need, free = weights.nbytes(), free_bytes(tmp)
    if need > free:  # (before hours of writing: the weights alone, a lower bound of the export, do not fit)
        raise DsxError(f"{tmp.parent}: the export needs more than {human_bytes(need)} (its weights alone), only "
                       f"{human_bytes(free)} free", hint="free space or choose another --out" + (
                           " (--force keeps the export there until the new one is complete)" if tmp.with_name(
                               tmp.name.removesuffix(".partial")).exists() else ""))
    sq = _source_quant(ck)
    programs = tp * (2 if speculate else 1)
    built = progress.phase(f"programs ({tp} rank{'s' if tp > 1 else ''}{', each with its draft' if speculate else ''})",
                           programs, "programs")
    written = progress.phase("parameters written", None)  # (their bytes: known once each program is built)
    if tp > 1:  # one program per rank, each built in a fresh process, `workers` at once
        _write_ranks_in_processes(src, tmp, tp, workers, dtype, max_seq_len, speculate, built, written, hashed)
    else:  # OUT/ itself
        _write_rank(weights, tmp, 0, 1, max_seq_len, speculate, built, written, hashed)
    icfg = inference_config(ck.config, dtype=dtype, max_seq_len=max_seq_len, block_size=block_size, tp=tp,
                            speculate=speculate, draft_tokens=draft_tokens, source_quant=sq,
                            custom_ops=_uses_ops(weights.top, weights.layers))
    atomic_write_json(tmp / "config.json", icfg)
    for name in SIDE_FILES:
        if (ck.root / name).is_file():
            shutil.copyfile(ck.root / name, tmp / name)
    if speculate:
        mcfg = dict(icfg, num_hidden_layers=1, num_nextn_predict_layers=0, speculate_method=None,
                    quant_type=sq["mtp_quant_type"], dsx_custom_ops="dsx_paddle_ops" if _uses_ops(
                        {}, weights.mtp[:1]) else None,
                    mtp_source_layer=cfg.mtp_layers[0], dsx_export=dict(icfg["dsx_export"], program=(
                        "draft(input_ids, hidden, cache_lens, cache) -> (logits, hidden, cache): token t+1 "
                        "and the base hidden state of position t predict token t+2")))
        atomic_write_json(tmp / "mtp" / "config.json", mcfg)


def _publish(tmp: Path, out: Path, aside: Path) -> None:
    """The finished export at tmp takes out's place. An export already there moves aside first (a rename to `aside`,
    made free by _clear_aside), so OUT is at every moment the old export or the new one, never one half removed, and
    is removed after."""
    if not out.exists():
        os.replace(tmp, out)
        return
    os.replace(out, aside)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside)


def _clear_aside(out: Path) -> Path:
    """OUT.replaced, where _publish moves the export it replaces, made free: one left there by an export killed
    between its two renames is removed (only a dsx export: anything else there is the user's, and refused)."""
    old = out.with_name(out.name + ".replaced")
    if old.exists() or old.is_symlink():
        if not old.is_dir() or old.is_symlink() or export_manifest(old) is None:
            raise UsageError(f"{old}: in the way (an export replacing {out.name} moves the old one there first), "
                             "and not a dsx export", hint="move or remove it")
        shutil.rmtree(old)
    return old


def _clear(d: Path) -> None:
    for p in d.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _replaceable(out: Path) -> bool:
    """What --force may remove whole: an empty directory, or a dsx export (a directory of other files, a quantize
    output, the user's home given by mistake, is not). An export whose manifest is damaged is one still when it holds
    nothing but an export's files: readers of it say to export again with --force."""
    return out.is_dir() and (not any(out.iterdir()) or export_manifest(out) is not None or _export_shaped(out))


_EXPORT_ENTRY = re.compile("|".join([r"rank_\d+", "mtp", *map(re.escape, ("model.json", "model.pdiparams", "config.json",
                                                                          MANIFEST_NAME, *SIDE_FILES))]))


def _export_shaped(out: Path) -> bool:
    """A dsx export's entries only (a manifest, a program, nothing else at the top)."""
    names = {p.name for p in out.iterdir()}
    return (MANIFEST_NAME in names and bool(names & {"model.json", "rank_0"})
            and all(_EXPORT_ENTRY.fullmatch(n) for n in names))


def source_digest(src) -> str | None:
    """What the export was made from: the content digest of the source's dsx manifest (None for a checkpoint without
    one). dsx run keeps an export only while its quantized source is the same: the same path is not enough once that
    was converted again (another recipe, or --force)."""
    m = Manifest.load(src)
    return m.content_digest() if m is not None else None


def _manifest(tmp: Path, src, dtype: str, tp: int, speculate: bool, progress: Reporter = QUIET,
              known: dict[str, str] | None = None) -> Manifest:
    """The complete manifest of the export written in tmp (every file's size and hash). known: sha256 of files
    hashed as they were written (the parameter files, most of the bytes: not read again); the rest are read."""
    m = Manifest(tmp, run={"tool": "dsx", "version": __version__, "command": "export", "source": str(src),
                           "source_digest": source_digest(src), "dtype": dtype, "tp": tp, "speculate": speculate})
    for p in sorted(tmp.rglob("*")):
        if p.is_file() and p.name != m.name:
            m.files[str(p.relative_to(tmp))] = {}
    known = {rel: sha for rel, sha in (known or {}).items() if rel in m.files}
    todo = [rel for rel in m.files if rel not in known]
    hashed = progress.phase(f"sha256 ({len(todo)} files)", sum((tmp / rel).stat().st_size for rel in todo))
    for rel in list(m.files):
        if rel in known:
            m.record(rel, known[rel])
        else:
            m.record_file(rel, hashed)
    m.complete = True
    m.save()
    return m


# Files of an export up to this size are hashed by every reader (generate, verify --export) before it loads them: an
# edit of config.json or a program that keeps its size (eos_token_id 1 -> 2, a flipped byte) is caught for
# milliseconds; parameter files are checked by size (R1's are hundreds of GB: dsx verify --export hashes them).
HASHED_ON_LOAD = 64 << 20


def check_export(path: str | os.PathLike) -> Manifest:
    """An export directory that is complete and intact (every file's size; the sha256 of the small ones), or a clear
    error."""
    path = Path(path)
    if not path.is_dir():
        raise DsxError(f"{path}: {'not a directory' if path.exists() else 'does not exist'} (expected a dsx export)",
                       hint="check the path")
    m = Manifest.load(path)
    if (m is None or m.run.get("command") != "export") and any(path.glob("*.safetensors")):
        # (the checkpoint instead of its export: an original, or a dsx quantize output)
        what = "a dsx quantize output" if m is not None and "plan_digest" in m.run else "a checkpoint"
        raise DsxError(f"{path}: {what}, not an export", hint=f"export it first: dsx export {path} --out DIR, then "
                                                              "pass DIR")
    if m is None or not m.complete:
        raise DsxError(f"{path}: not a complete dsx export (no complete dsx-manifest.json)",
                       hint="run dsx export again")
    if m.run.get("command") != "export":
        raise DsxError(f"{path}: a dsx output of another kind, not an export (its manifest records no export run)",
                       hint="pass a dsx export's directory")
    for rel, ent in m.files.items():  # (sizes of all; sha256 of what is cheap to hash: configs, programs, tokenizer)
        why = m.verify_file(rel, hash_check=ent["size"] <= HASHED_ON_LOAD)
        if why:
            raise DsxError(why, hint="the export is damaged: run dsx export again")
    return m
