"""Run a deployment recipe step by step, resuming from whatever is complete and verified.

WORKDIR/source       the checkpoint (dsx download, or dsx tiny for the embedded default)
WORKDIR/quantized    dsx quantize output (base + MTP, each with its own type)
WORKDIR/export       dsx export output (rank_{r}/ when tp > 1; mtp/ with speculation)
WORKDIR/verify.json  dsx verify report
Every step is itself resumable (download and quantize keep manifests; export is skipped when a
complete export with the same settings exists), so rerunning the same command continues.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ds_export.errors import CheckpointError, DsxError, UsageError
from ds_export.io.checkpoint import INDEX_NAME, Checkpoint
from ds_export.io.dirlock import exclusive
from ds_export.io.manifest import Manifest
from ds_export.io.writer import PARTIAL_SUFFIX, atomic_write_json
from ds_export.run.recipe import STEPS, Deployment, generate_ids
from ds_export.values import is_int

# Measured conversion throughput used for time estimates (docs/benchmarks.md: H200 x2 host, 32 cores).
MEASURED_GBPS = 1.68


@dataclass
class Layout:
    root: Path

    @property
    def source(self) -> Path:
        return self.root / "source"

    @property
    def quantized(self) -> Path:
        return self.root / "quantized"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def report(self) -> Path:
        return self.root / "verify.json"


def _steps(from_step: str | None, until_step: str | None) -> list[str]:
    for s in (from_step, until_step):
        if s is not None and s not in STEPS:
            raise UsageError(f"step {s!r}: expected one of {', '.join(STEPS)}")
    a = STEPS.index(from_step) if from_step else 0
    b = STEPS.index(until_step) if until_step else len(STEPS) - 1
    if a > b:
        raise UsageError(f"--from-step {from_step} comes after --until-step {until_step}")
    return list(STEPS[a:b + 1])


def _recipe(dep: Deployment):
    from ds_export.quant.plan import load_recipe
    from ds_export.quant.recipe import beside

    q = dep.quantize
    return load_recipe(q.get("type"), beside(q["recipe"], dep.source) if q.get("recipe") else None,
                       arch=q.get("arch"), group_size=q.get("group_size"), mtp_type=q.get("mtp_type"))


def _selection(dep: Deployment) -> str:
    return "all" if dep.quantize.get("mtp_type") else "base"


def run(dep: Deployment, workdir: Path, *, from_step=None, until_step=None,
        say: Callable[[str], None] = print, progress: Callable[[str], Any] | None = None) -> dict:
    """progress(step): a context manager giving the step's reporter (download.Reporter, quant engine.Reporter,
    ds_export.progress.Reporter for "download", "quantize", "export" and "verify"; None for the others), which the
    CLI draws."""
    lay = Layout(Path(workdir))
    steps = _steps(from_step, until_step)
    # (one dsx run in a workdir at a time: two would write its tiny source, reports and steps over each other)
    with exclusive(lay.root, "dsx run"):
        return _run(dep, lay, steps, say, progress)


# What each step reads, and the step that writes it (checked when that step is not run: --from-step)
_NEEDS = {"quantize": (("source", "download"),), "export": (("quantized", "quantize"),),
          "verify": (("source", "download"), ("quantized", "quantize")), "generate": (("export", "export"),)}


def _written(lay: Layout, what: str) -> bool:
    path = getattr(lay, what)
    if what == "source":
        return (path / INDEX_NAME).is_file() or (path / "model.safetensors").is_file()
    m = Manifest.load(path) if path.is_dir() else None
    return m is not None and m.complete


def _check_inputs(lay: Layout, steps: list[str]) -> None:
    """A step whose input no step of this run writes finds it there, or the run stops before any step, saying
    which step to start from (it failed with the reader's own error, 'wr/quantized: not a directory')."""
    for step in steps:
        for what, producer in _NEEDS.get(step, ()):
            if producer not in steps and not _written(lay, what):
                raise UsageError(f"step {step} reads {getattr(lay, what)}, the {producer} step's output, which "
                                 f"{'is not complete' if getattr(lay, what).exists() else 'is not there'}",
                                 hint=f"start from that step: --from-step {producer}")


def _check_export_section(dep: Deployment, config: dict, source: str) -> None:
    """The recipe's export section against the model's config.json (export.check_settings), named as the recipe's."""
    from ds_export.export.exporter import check_settings
    from ds_export.models import deepseek_v3 as ds

    e = dep.export
    try:
        check_settings(ds.DeepseekV3Config.from_dict(config, source=source), tp=int(e.get("tp", 1)),
                       max_seq_len=int(e.get("max_seq_len", 4096)), speculate=bool(e.get("speculate")),
                       source=Path(source))
    except UsageError as err:
        raise UsageError(f"{dep.source}: export section: {err}", hint=err.hint) from None


def _check_generate_vocab(dep: Deployment, config: dict, source: str) -> None:
    """The generate section's token ids inside the model's vocabulary (a tiny recipe's config.vocab_size below the
    byte tokenizer's 258 ids failed at the last step)."""
    vocab = config.get("vocab_size")
    top = max(generate_ids(dep))
    if is_int(vocab) and top >= vocab:
        hint = (f"set model.tiny.config.vocab_size to {top + 1} or more (the byte tokenizer's ids reach 257)"
                if "prompt" in dep.generate else "give token ids below vocab_size")
        raise UsageError(f"{dep.source}: generate: token id {top} is outside the model's vocabulary 0..{vocab - 1} "
                         f"(vocab_size of {source})", hint=hint)


def _model_config(dep: Deployment, lay: Layout) -> tuple[dict, str] | None:
    """The model's config.json before any step runs: the tiny recipe's, the download's, or dsx's bundled copy of
    the shipped recipes' model; None where none is at hand yet (export checks its settings when it runs)."""
    from ds_export.run.metadata import BUNDLED

    if dep.tiny:
        from ds_export.tiny import make_config

        return make_config(_tiny_spec(dep)), f"{dep.source} (model.tiny)"
    for d in (lay.source, BUNDLED.get(dep.model.get("repo", ""))):
        if d is not None and (d / "config.json").is_file():
            try:
                cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                cfg = None
            # (a damaged one: the step that reads it reports it as such)
            return (cfg, str(d / "config.json")) if isinstance(cfg, dict) else None
    return None


def _bytes_under(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0


def _check_space(dep: Deployment, lay: Layout, steps: list[str]) -> None:
    """The disk holds what the steps to run still write (the dry run's sizes, less what their directories already
    hold), or the run stops before its first step: each step checked only its own output, so a disk too small for
    R1's conversion was found after the download's hours. Skipped where no plan is at hand (another model with no
    download yet)."""
    from ds_export.io.writer import free_bytes
    from ds_export.run.metadata import BUNDLED
    from ds_export.units import human_bytes

    writes = [s for s in ("download", "quantize", "export") if s in steps]
    bundled = BUNDLED.get(dep.model.get("repo", ""))
    if not writes or not (dep.tiny or (lay.source / INDEX_NAME).exists() or bundled):
        return
    try:
        plan = dry_run(dep, lay.root)
    except CheckpointError:  # (an interrupted download: its index is there, shards are not; the step resumes it)
        if bundled is None:
            return
        plan = dry_run(dep, lay.root, metadata=bundled)
    size = {"download": plan["download_bytes"], "quantize": plan["quantize"]["bytes_out"],
            "export": sum(plan["export"]["bytes_per_rank"])}
    where = {"download": lay.source, "quantize": lay.quantized, "export": lay.export}
    need = {s: max(0, size[s] - _bytes_under(where[s])) for s in writes}
    free = free_bytes(lay.root)
    if sum(need.values()) > free:
        parts = ", ".join(f"{s} {human_bytes(n)}" for s, n in need.items() if n)
        raise DsxError(f"{lay.root}: the steps still write {human_bytes(sum(need.values()))} ({parts}), only "
                       f"{human_bytes(free)} free", hint="free space or choose another --workdir; nothing was started "
                                                         "(--dry-run shows the plan)")


def _run(dep: Deployment, lay: Layout, steps: list[str], say, progress) -> dict:
    _check_inputs(lay, steps)
    # (R1's download and conversion take hours: a bad export or generate section is found now)
    known = _model_config(dep, lay) if "export" in steps else None
    if known is not None:
        _check_export_section(dep, *known)
        if "generate" in steps and dep.generate:
            _check_generate_vocab(dep, *known)
    _check_space(dep, lay, steps)
    done: dict = {"recipe": dep.name, "workdir": str(lay.root), "steps": {}, "seconds": {}}
    t_all = time.monotonic()
    for i, step in enumerate(steps, 1):
        say(f"[bold]step {i}/{len(steps)}: {step}[/] ({time.monotonic() - t_all:.0f} s elapsed)")
        t0 = time.monotonic()
        with (progress(step) if progress is not None else None) or contextlib.nullcontext() as reporter:
            done["steps"][step] = globals()[f"_step_{step}"](dep, lay, say, reporter)
        done["seconds"][step] = round(time.monotonic() - t0, 2)
    done["seconds"]["total"] = round(time.monotonic() - t_all, 2)
    return done


def _tiny_spec(dep: Deployment):
    from ds_export.tiny import TinySpec

    t = dep.model["tiny"]
    return TinySpec(seed=int(t.get("seed", 0)), dtype=str(t.get("dtype", "fp8")),
                    overrides=tuple(sorted((str(k), v) for k, v in (t.get("config") or {}).items())))


def _tiny_writes(p: Path) -> bool:
    """A file write_tiny writes (a shard, maybe cut short, the config, generation config and tokenizer files)."""
    return p.is_file() and (p.name.startswith("model-") and ".safetensors" in p.name
                            or p.name in ("config.json", "generation_config.json", "tokenizer.json",
                                          "tokenizer_config.json") or p.name.endswith(PARTIAL_SUFFIX))


def _differs_from_tiny(lay: Layout, spec) -> str | None:
    """How lay.source differs from the tiny checkpoint `spec` writes (None: every file it writes, byte for byte),
    found by writing that checkpoint again beside it (about 10 MB, a fraction of a second for the shipped recipes)."""
    import filecmp

    from ds_export.tiny import write_tiny

    with tempfile.TemporaryDirectory(dir=lay.root, prefix=".tiny-check-") as d:
        fresh = Path(d) / "source"
        write_tiny(fresh, spec)
        for p in sorted(fresh.iterdir()):
            have = lay.source / p.name
            if not have.is_file():
                return f"no {p.name}"
            if not filecmp.cmp(p, have, shallow=False):
                return f"{p.name} differs"
    return None


def _step_download(dep: Deployment, lay: Layout, say, reporter=None) -> dict:
    if dep.tiny:
        from ds_export.tiny import write_tiny

        if (lay.source / INDEX_NAME).exists():
            Checkpoint.open(lay.source).close()  # validate what is there
            differs = _differs_from_tiny(lay, _tiny_spec(dep))
            if differs:  # (kept, it was the old model under the edited recipe's name, all the way to generate)
                raise UsageError(f"{lay.source}: not the tiny checkpoint recipe {dep.name} describes ({differs}): "
                                 "written with another model.tiny (seed, dtype, config), or another checkpoint",
                                 hint="remove that directory with quantized/ and export/ beside it to write the "
                                      "recipe's, or use another --workdir")
            say(f"  {lay.source}: tiny checkpoint already written")
            return {"skipped": True}
        if lay.source.exists():  # an interrupted write of the tiny checkpoint: start it over, and nothing else
            theirs = [p.name for p in lay.source.iterdir() if not _tiny_writes(p)]
            if theirs:
                raise UsageError(f"{lay.source}: holds files the tiny checkpoint does not write "
                                 f"({', '.join(theirs[:3])}{', ...' if len(theirs) > 3 else ''}) and no {INDEX_NAME}",
                                 hint="choose another --workdir, or empty that directory")
            shutil.rmtree(lay.source)
        res = write_tiny(lay.source, _tiny_spec(dep))
        say(f"  wrote the tiny checkpoint ({res['tensors']} tensors) to {lay.source}")
        return {"tensors": res["tensors"], "bytes": res["bytes"]}
    from ds_export.download import Options, download
    from ds_export.download.engine import UnrecordedDiffers

    m = dep.model
    try:
        res = download(m["repo"], lay.source, Options(revision=m.get("revision", "main"), only=m.get("only", "all")),
                       reporter)
    except UnrecordedDiffers as e:  # (dsx run has no --replace: say what to do here)
        more = (f" --revision {m['revision']}" if m.get("revision", "main") != "main" else "") + (
            f" --only {m['only']}" if m.get("only", "all") != "all" else "")
        raise UsageError(str(e), hint=f"use another --workdir, or fix {lay.source} in place first: dsx download "
                                      f"{m['repo']}{more} --local-dir {lay.source} --replace") from None
    say(f"  {m['repo']}@{res['commit'][:12]}: {res['files']} files, {res['bytes_downloaded'] / 1e9:.2f} GB fetched")
    return {"commit": res["commit"], "files": res["files"]}


def _step_quantize(dep: Deployment, lay: Layout, say, reporter=None) -> dict:
    from ds_export.quant import engine, plan as plan_mod

    with Checkpoint.open(lay.source) as ck:
        p = plan_mod.build(ck, _recipe(dep), selection=_selection(dep))
        try:
            res = engine.run(ck, p, lay.quantized, engine.Options(), reporter)
        except engine.OutputHeld as e:  # (dsx run has no --force: say what to do here)
            raise UsageError(str(e), hint=f"the recipe's quantize section or its source changed since {lay.quantized} "
                                          "was written: remove that directory to convert again, or use another "
                                          "--workdir") from None
    say(f"  {lay.quantized}: {res['shards']} shards ({res['converted']} converted, {res['skipped']} verified and kept)")
    return res


def _export_settings(dep: Deployment, lay: Layout) -> dict:
    from ds_export.export.exporter import source_digest

    e = dep.export
    return {"source": str(lay.quantized), "source_digest": source_digest(lay.quantized),
            "dtype": e.get("dtype", "bfloat16"), "tp": int(e.get("tp", 1)),
            "speculate": bool(e.get("speculate", False))}


def _step_export(dep: Deployment, lay: Layout, say, reporter=None) -> dict:
    from ds_export.export.exporter import export

    want = _export_settings(dep, lay)
    m = Manifest.load(lay.export)
    if m is not None and m.complete and all(m.run.get(k) == v for k, v in want.items()):
        say(f"  {lay.export}: complete export with the same settings, kept")
        return {"skipped": True}
    e = dep.export
    res = export(lay.quantized, lay.export, dtype=want["dtype"], max_seq_len=int(e.get("max_seq_len", 4096)),
                 block_size=int(e.get("block_size", 64)), tp=want["tp"], speculate=want["speculate"],
                 draft_tokens=int(e.get("draft_tokens", 1)), force=True,
                 **({"progress": reporter} if reporter is not None else {}))
    say(f"  {lay.export}: {len(res['files'])} files")
    return {"files": len(res["files"]), "bytes": res["bytes"]}


def _step_verify(dep: Deployment, lay: Layout, say, reporter=None) -> dict:
    from ds_export.verify import verify

    v = dep.verify
    from ds_export.verify.e2e import fits, memory_needed

    m = Manifest.load(lay.export)
    exported = lay.export if m is not None and m.complete else None  # end-to-end logits when there is an export
    if exported is not None and not fits(lay.source):
        say(f"  end-to-end check skipped: the float32 reference model needs about "
            f"{memory_needed(lay.source) / 2**30:.0f} GiB (weights and kernels are still checked)")
        exported = None
    kw = {"progress": reporter} if reporter is not None else {}
    rep = verify(lay.quantized, lay.source, expert_sample=v.get("experts"), samples=int(v.get("samples", 4)),
                 export=exported, device=v.get("device", "cpu"), **kw)
    atomic_write_json(lay.report, rep)
    n_w, n_k = len(rep["weights"]), len(rep["kernels"])
    if not rep["ok"]:
        raise DsxError(f"verify failed: see {lay.report}", hint=f"dsx verify {lay.quantized} --reference {lay.source}")
    e2e = rep.get("e2e")
    say(f"  all checks passed: {n_w} weights, {n_k} kernel checks"
        + (f", end to end KL {e2e['kl_mean']:.3f} / top-1 {e2e['top1_agreement']:.2f} vs the unquantized model"
           if e2e else "") + f" (report {lay.report})")
    return {"ok": True, "weights": n_w, "kernels": n_k, "e2e": e2e}


def _step_generate(dep: Deployment, lay: Layout, say, reporter=None) -> dict:
    if not dep.generate:
        say("  no generate section: skipped")
        return {"skipped": True}
    from ds_export.export.runtime import check_speculative_greedy, generate_any

    g = dep.generate
    k = int(g.get("speculate", 0))
    prompt, n = [generate_ids(dep)], int(g.get("max_new_tokens", 16))
    out, _ = generate_any(lay.export, prompt, n, speculate=k)  # in this process, or one per rank (tp > 1)
    plain, _ = generate_any(lay.export, prompt, n)
    ties = check_speculative_greedy(lay.export, prompt, out["tokens"], plain["tokens"]) if k else []
    if not k and plain["tokens"] != out["tokens"]:
        raise DsxError("greedy decoding gave different tokens in two runs of the same export: it is not deterministic")
    for t in ties:
        say(f"  token {t['position']}: speculation took {t['speculative']}, plain decoding {t['plain']}: a near-tie "
            f"(logits {t['margin']:.2g} apart, tolerance {t['tolerance']:.2g}); the rest checked from there")
    out = dict(out, near_ties=ties)
    say(f"  tokens {out['tokens'][0]}" + (f"; acceptance {out['acceptance_rate']:.0%}, "
                                          f"{out['tokens_per_base_step']:.2f} tokens per base step" if k else "")
        + (f" ({out['ranks']} ranks)" if out.get("ranks", 1) > 1 else ""))
    return out


# ------------------------------------------------------------------------------ dry run ----

def dry_run(dep: Deployment, workdir: Path, *, metadata: Path | None = None) -> dict:
    """The whole plan without touching the network or writing outputs: sizes, shards, per-rank layout,
    disk and time estimates. Real recipes plan from metadata (config.json + index[.gz])."""
    from ds_export.quant import plan as plan_mod
    from ds_export.run.metadata import BUNDLED, sparse_from_metadata

    lay = Layout(Path(workdir))
    with tempfile.TemporaryDirectory(prefix="dsx-dry-") as tmp:
        if dep.tiny:
            from ds_export.tiny import write_tiny

            src, planned_from = Path(tmp) / "tiny", "the tiny checkpoint it writes"
            write_tiny(src, _tiny_spec(dep))
        elif metadata is not None:
            src, planned_from = sparse_from_metadata(Path(metadata), Path(tmp) / "meta"), str(metadata)
        elif (lay.source / INDEX_NAME).exists():
            src, planned_from = lay.source, f"the download in {lay.source}"
        elif dep.model.get("repo") in BUNDLED:  # (the shipped recipes' model: its metadata comes with dsx)
            src = sparse_from_metadata(BUNDLED[dep.model["repo"]], Path(tmp) / "meta")
            planned_from = f"dsx's bundled metadata of {dep.model['repo']}"
        else:
            raise UsageError(f"dry run of {dep.source}: no local metadata for {dep.model['repo']}",
                             hint="pass --metadata DIR (config.json + model.safetensors.index.json[.gz])")
        with Checkpoint.open(src) as ck:
            known = (ck.config, f"{dep.source} (model.tiny)" if dep.tiny else f"config.json of {planned_from}")
            _check_export_section(dep, *known)
            if dep.generate:
                _check_generate_vocab(dep, *known)
            p = plan_mod.build(ck, _recipe(dep), selection=_selection(dep))
            src_bytes = ck.total_bytes()
            mtp_src = sum(ck.info(n).nbytes for n in ck.names() if _is_mtp(ck, n))
    tp = int(dep.export.get("tp", 1))
    ranks = rank_bytes(p, tp)
    fetch = src_bytes - (mtp_src if dep.model.get("only") == "base" else 0)
    return {
        "recipe": dep.name, "source": dep.model.get("repo", "tiny"), "planned_from": planned_from,
        "workdir": str(lay.root),
        "download_bytes": fetch, "quantize": {"type": p.recipe["name"], "mtp": p.recipe.get("mtp"),
                                              "bytes_in": p.bytes_in, "bytes_out": p.bytes_out,
                                              "shards": len(p.shards)},
        "export": {"tp": tp, "speculate": bool(dep.export.get("speculate")),
                   "layout": [f"export/rank_{r}/" if tp > 1 else "export/" for r in range(tp)]
                   + ([f"export/mtp/rank_{r}/" if tp > 1 else "export/mtp/" for r in range(tp)]
                      if dep.export.get("speculate") else []),
                   "bytes_per_rank": ranks},
        "disk_bytes": fetch + p.bytes_out + sum(ranks),
        "estimated_quantize_s": p.bytes_in / (MEASURED_GBPS * 1e9),
        "serving": dep.serving,
    }


def _is_mtp(ck: Checkpoint, name: str) -> bool:
    from ds_export.models import deepseek_v3 as ds

    cfg = ds.DeepseekV3Config.from_dict(ck.config)
    return any(name.startswith(f"model.layers.{L}.") for L in cfg.mtp_layers)


def rank_bytes(p, tp: int) -> list[int]:
    """Bytes each tensor-parallel rank holds (PaddleNLP splits: column/row/vocab split, the rest replicated)."""
    from ds_export.models import deepseek_v3 as ds

    per = [0] * tp
    for t in p.tasks():
        split = ds.ROLES[t.role][0]
        for e in t.outputs:
            if split is None:
                for r in range(tp):
                    per[r] += e.nbytes
            else:
                for r in range(tp):
                    per[r] += e.nbytes // tp + (1 if r < e.nbytes % tp else 0)
    return per
