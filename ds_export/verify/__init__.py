"""`dsx verify`: integrity (files, tensors, config) and weight numerics of a dsx output.

`verify(target, reference=...)` returns a report dict; `report["ok"]` is true
only when every check passes. Kernel and end-to-end numerics join with the
kernels and export.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from pathlib import Path

from ds_export.errors import DsxError, UsageError
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.dirlock import shared
from ds_export.models import deepseek_v3 as ds
from ds_export.values import is_number
from ds_export.verify.integrity import FileChecks, Finding, check_config, check_files, check_tensors
from ds_export.verify.kernels import check_kernels
from ds_export.progress import QUIET, Reporter
from ds_export.verify.weights import check_weights


def load_gates(path: str | Path) -> dict:
    """--gate FILE.yaml: {min_sqnr_db: {format: dB, ...}, kernel_max_rel_err: x}; unknown keys are errors."""
    from ds_export.quant.recipe import load_yaml
    from ds_export.verify.kernels import KERNEL_GATE
    from ds_export.verify.weights import MIN_SQNR

    obj = load_yaml(path, "gate file") or {}
    bad = set(obj) - {"min_sqnr_db", "kernel_max_rel_err", "e2e_max_kl", "e2e_min_top1"} \
        if isinstance(obj, dict) else {"<not a mapping>"}
    sq = obj.get("min_sqnr_db", {}) if isinstance(obj, dict) else {}
    if bad or not isinstance(sq, dict) or set(sq) - set(MIN_SQNR):
        raise UsageError(f"{path}: gates take min_sqnr_db ({', '.join(MIN_SQNR)}), kernel_max_rel_err, "
                         "e2e_max_kl and e2e_min_top1", hint="see docs/numerics.md")

    def number(key: str, v) -> float:
        # (a string was an internal error; NaN, which every comparison fails, let everything through the gate)
        if not is_number(v):
            raise UsageError(f"{path}: {key} is {v!r}, expected a finite number", hint="see docs/numerics.md")
        return float(v)

    out = {"min_sqnr_db": {k: number(f"min_sqnr_db.{k}", v) for k, v in sq.items()},
           "kernel_max_rel_err": number("kernel_max_rel_err", obj.get("kernel_max_rel_err", KERNEL_GATE))}
    out.update({k: number(k, obj[k]) for k in ("e2e_max_kl", "e2e_min_top1") if k in obj})
    return out


def verify(target: str | Path, reference: str | Path | None = None, *, expert_sample: int | None = None,
           samples: int = 4, gates: dict | None = None, export: str | Path | None = None,
           device: str = "cpu", workers: int | None = None, progress: Reporter = QUIET) -> dict:
    """device: whose kernels the kernel checks run ("cpu": csrc/cpu, "cuda": csrc/cuda on the current GPU);
    workers: threads hashing the files and comparing the weights (default: one per core, at most 16);
    progress: told each check's phase and its bytes or checks as they are done (ds_export.progress)."""
    target = Path(target)
    if expert_sample is not None and expert_sample < 1:  # (0 or -1 skipped every routed expert: 97% of R1, "ok")
        raise UsageError(f"--experts {expert_sample}: expected at least 1 routed expert a layer",
                         hint="leave it out to check every expert")
    if samples < 0:
        raise UsageError(f"--samples {samples}: expected 0 (no kernel checks) or more sampled layers")
    _refuse_an_export(target)
    if reference is not None and _same_dir(target, Path(reference)):  # (every weight "exact" against itself: a pass)
        raise UsageError(f"--reference {reference}: is {target} itself; give the checkpoint {target} was converted from",
                         hint="for the files' integrity alone, leave --reference out")
    with contextlib.ExitStack() as held:  # (none of them written by a dsx process while they are read)
        for d in (target, reference, export):
            if d is not None:
                held.enter_context(shared(d, "dsx verify"))
        return _verify(target, reference, expert_sample=expert_sample, samples=samples, gates=gates, export=export,
                       device=device, workers=workers, progress=progress)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or a.samefile(b)
    except OSError:  # (one of them missing: the checks below say which)
        return False


def _verify(target: Path, reference, *, expert_sample, samples, gates, export, device, workers, progress) -> dict:
    if export is not None and reference is not None:  # (before the weight checks, which take hours on R1)
        from ds_export.verify.e2e import require_fit

        require_fit(reference)
    if reference is not None and samples > 0:  # (the kernels' device, before the hashes and weights: hours on R1)
        from ds_export.verify.kernels import backend

        backend(device)
    report: dict = {"target": str(target), "reference": str(reference) if reference else None}

    def files_alone(findings: list) -> dict | None:
        """The report of a target whose files fail their hashes (or are missing, or the wrong size): that alone,
        no figure of a tensor read out of them (or out of the others)."""
        if not any(f.check == "files" and ("sha256" in f.problem or "missing" in f.problem or "bytes" in f.problem)
                   for f in findings):
            return None
        report.update(findings=[f.__dict__ for f in findings], weights=[], by_format={}, kernels=[], e2e=None,
                      ok=False)
        return report

    with FileChecks(target, workers=workers, progress=progress) as files:
        manifest = files.manifest
        # With a reference, each shard is hashed as its weights are checked, so its bytes come off the disk once for
        # both (a shard that fails its hash makes the report the files' findings alone, whatever was read out of it);
        # without one, or with a file missing or of the wrong size, every file is hashed first.
        beside = reference is not None and files.ok_without_hash()
        ck = None
        if beside:
            try:
                ck = Checkpoint.open(target)
            except DsxError:  # (a header that does not parse: the hashes name the file)
                beside = False
        if not beside:
            findings = files.finish()
            if files_alone(findings):
                return report
            ck = Checkpoint.open(target)
        with ck:
            cfg = ds.DeepseekV3Config.from_dict(ck.config, source=str(target / "config.json"))
            more = check_tensors(ck, cfg) + check_config(ck, cfg)
            stats, kstats = [], []
            if reference is not None:
                with Checkpoint.open(reference) as ref:
                    report["reference_is_source"] = _is_source(ck, ref)
                    g = gates or {}
                    # (a dsx quantize output of this reference: its bytes too, not only their numbers)
                    reproduce = (manifest is not None and "plan_digest" in manifest.run
                                 and report["reference_is_source"] is not False)
                    stats = check_weights(ck, ref, cfg, expert_sample=expert_sample, gates=g.get("min_sqnr_db"),
                                          workers=workers, progress=progress,
                                          on_file=files.reading if beside else None, reproduce=reproduce)
                    if beside:
                        findings = files.finish()
                        if files_alone(findings):
                            return report
                    if samples > 0:
                        kw = {"gate": g["kernel_max_rel_err"]} if "kernel_max_rel_err" in g else {}
                        kstats = check_kernels(ck, ref, cfg, samples=samples, device=device, workers=workers,
                                               progress=progress, **kw)
            findings += more
    export_ok = True
    if export is not None and reference is not None:  # (the export's own files: sizes and sha256, before its logits)
        export_findings, em = check_files(Path(export), workers=workers, progress=progress)
        made_from = (em.run or {}).get("source_digest") if em is not None else None
        if made_from and manifest is not None and made_from != manifest.content_digest():
            export_findings.append(Finding("files", str(export), f"exported from {em.run.get('source')}, whose files "
                                           f"differ from {target}'s: export {target} again (dsx export --force)"))
        findings += [Finding(f.check, f.where if f.where.startswith(str(export)) else f"{export}/{f.where}", f.problem)
                     for f in export_findings]
        export_ok = not export_findings
    report["findings"] = [f.__dict__ for f in findings]
    report["weights"] = [s.to_json() for s in stats]
    report["by_format"] = _aggregate(stats)
    report["kernels"] = [k.to_json() for k in kstats]
    report["run"] = manifest.run if manifest else None
    report["device"] = device
    report["e2e"] = None
    if export is not None and reference is not None and export_ok:
        from ds_export.verify.e2e import E2E_MAX_KL, E2E_MIN_TOP1, check_export

        g = gates or {}
        advance = progress.phase("end to end (logits)", 1, "checks")
        report["e2e"] = check_export(export, reference, max_kl=g.get("e2e_max_kl", E2E_MAX_KL),
                                     min_top1=g.get("e2e_min_top1", E2E_MIN_TOP1))
        advance(1)
    report["ok"] = (not findings and all(s.ok for s in stats) and all(k.ok for k in kstats)
                    and (report["e2e"] is None or report["e2e"]["ok"]))
    # (what "ok" covers: without a reference, integrity only)
    report["checked"] = (["files", "tensors", "config"] + (["weights"] if reference is not None else [])
                         + (["bytes"] if any(s.reproduced is not None for s in stats) else [])
                         + (["kernels"] if kstats else [])
                         + (["export files"] if export is not None and reference is not None else [])
                         + (["end to end"] if report["e2e"] else []))
    return report


def _refuse_an_export(target: Path) -> None:
    """An export given as the target (its programs hold no safetensors to check): say where it goes."""
    from ds_export.errors import UsageError
    from ds_export.io.manifest import export_manifest

    m = export_manifest(target)
    if m is not None:
        src = m.run.get("source") or "SOURCE_OF_THE_EXPORT"
        raise UsageError(f"{target}: a dsx export; verify checks a converted checkpoint, and an export end to end "
                         "through --export", hint=f"dsx verify {src} --reference ORIGINAL --export {target}")


def _is_source(target: Checkpoint, reference: Checkpoint) -> bool | None:
    """Whether the reference is the checkpoint the target was converted from, by the source fingerprint dsx quantize
    recorded (index, shard headers and pages of their data: a resharded copy of the same weights differs too); None
    where none was recorded."""
    from ds_export.quant.plan import source_fingerprint

    recorded = (target.config.get("quantization_config") or {}).get("source_fingerprint")
    return None if not recorded else source_fingerprint(reference) == recorded


def _aggregate(stats) -> dict:
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for s in stats:
        groups[(s.format, ("mtp:" if s.mtp else "") + s.role)].append(s)
    out = {}
    for (fmt, role), ss in sorted(groups.items()):
        def finite(xs):  # (NaN / Inf figures belong to failed tensors, counted in "failed"; min / max skip them)
            return [x for x in xs if math.isfinite(x)]

        sq = finite(s.sqnr_db for s in ss)
        out[f"{fmt} {role}"] = {
            "format": fmt, "role": role, "tensors": len(ss), "failed": sum(not s.ok for s in ss),
            "min_sqnr_db": min(sq) if sq else None, "exact": sum(s.sqnr_db == math.inf for s in ss),
            "max_rel_fro": max(finite(s.rel_fro for s in ss), default=None),
            "min_cosine": min(finite(s.cosine for s in ss), default=None),
            "max_saturated": max(s.saturated for s in ss), "gate_db": ss[0].gate,
            "reproduced": sum(s.reproduced is True for s in ss), "differ": sum(s.reproduced is False for s in ss),
        }
    return out
