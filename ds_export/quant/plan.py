"""The quantization plan: every output tensor, its source, its format and its shard, before any weight is read.

One output shard per source shard that yields output (tensors stay in the
shard of their source weight; an FP8 weight's scale_inv is consumed with it
even when it sits in another shard). The plan is plain data: it prints as a
table (`--dry-run`), and its hash identifies a run for resume and `--force`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ds_export import __version__
from ds_export.errors import CheckpointError, UsageError
from ds_export import formats
from ds_export.formats import fp8_block, weight_only
from ds_export.io.checkpoint import INDEX_NAME, Checkpoint
from ds_export.io.writer import Entry
from ds_export.models import deepseek_v3 as ds
from ds_export.quant.recipe import Recipe, Target



@dataclass(frozen=True)
class Task:
    src: str  # source tensor name
    src_dtype: str
    shape: tuple[int, ...]
    src_scale: str | None  # the FP8 source's weight_scale_inv, consumed with it
    src_block: tuple[int, int] | None
    target: Target
    role: str
    layer: int | None
    mtp: bool
    outputs: tuple[Entry, ...]
    bytes_in: int

    @property
    def bytes_out(self) -> int:
        return sum(e.nbytes for e in self.outputs)

    @property
    def passthrough(self) -> bool:
        """Copied bit-exactly: kept as is, or FP8 with 128x128 blocks to a8w8_fp8."""
        t = self.target.type
        return t == "keep" or (t == "a8w8_fp8" and self.src_dtype == "F8_E4M3" and self.src_block == fp8_block.BLOCK) \
            or (t == "bf16" and self.src_dtype == "BF16") or (t == "float32" and self.src_dtype == "F32")


@dataclass
class OutShard:
    file: str
    source_files: list[str]
    tasks: list[Task] = field(default_factory=list)

    def entries(self) -> list[Entry]:
        return [e for t in self.tasks for e in t.outputs]

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tasks)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tasks)


@dataclass
class Plan:
    source: str
    source_fingerprint: str
    recipe: dict
    selection: str  # "all" | "base" | "mtp"
    shards: list[OutShard]
    config: dict  # the output config.json

    @property
    def bytes_in(self) -> int:
        return sum(s.bytes_in for s in self.shards)

    @property
    def bytes_out(self) -> int:
        return sum(s.bytes_out for s in self.shards)

    def tasks(self) -> list[Task]:
        return [t for s in self.shards for t in s.tasks]

    def digest(self) -> str:
        """Identifies the run: same source, recipe, selection and layout -> same digest."""
        body = {"fp": self.source_fingerprint, "recipe": self.recipe, "sel": self.selection,
                "shards": [[s.file, [[e.name, e.dtype, list(e.shape)] for e in s.entries()],
                            [[t.src, t.target.type, t.target.group_size, t.target.arch] for t in s.tasks]]
                           for s in self.shards]}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"source": self.source, "source_fingerprint": self.source_fingerprint, "recipe": self.recipe,
                "selection": self.selection, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "digest": self.digest(),
                "shards": [{"file": s.file, "from": s.source_files, "bytes_out": s.bytes_out,
                            "tensors": [{"src": t.src, "type": t.target.type, "group_size": t.target.group_size,
                                         "outputs": [asdict(e) for e in t.outputs]} for t in s.tasks]}
                           for s in self.shards]}


FINGERPRINT_SAMPLES, FINGERPRINT_WINDOW = 16, 4096  # pages of each shard's data read into the fingerprint


def source_fingerprint(ck: Checkpoint) -> str:
    """sha256 over the index and every shard's name, size, header bytes and FINGERPRINT_SAMPLES pages of its data,
    evenly spaced from the first to the last (about 10 MB read on R1: cheap; content hashes are `dsx download`'s
    job). Headers alone do not tell checkpoints of one architecture apart (DeepSeek-V3 and R1 share every shape and
    offset, and so do two tiny checkpoints of different seeds): a rerun with another source into the same --out
    took the first one's shards as finished."""
    h = hashlib.sha256()
    idx = ck.root / INDEX_NAME
    if idx.exists():
        h.update(idx.read_bytes())
    for rel in sorted(ck.shards):
        p = ck.shards[rel].path
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            size = p.stat().st_size
            h.update(rel.encode())
            h.update(str(size).encode())
            h.update(f.read(n))
            start, data = 8 + n, size - 8 - n
            w = min(FINGERPRINT_WINDOW, data)
            for i in range(FINGERPRINT_SAMPLES if data > 0 else 0):
                f.seek(start + (data - w) * i // (FINGERPRINT_SAMPLES - 1))
                h.update(f.read(w))
    return h.hexdigest()


def _outputs(name: str, shape: tuple[int, ...], src_dtype: str, t: Target) -> tuple[Entry, ...]:
    fmt = formats.get(t.type)
    if fmt.bits:
        weight_only.check_args(shape[0], shape[1], fmt.bits, t.group_size, t.arch, name=name)
    return tuple(Entry(name + suffix, dtype, shape_) for suffix, dtype, shape_ in
                 fmt.outputs(shape, src_dtype, t.group_size, t.arch))


def build(ck: Checkpoint, recipe: Recipe, *, selection: str = "all") -> Plan:
    """Decide every tensor's fate. Raises before any work for anything that cannot be converted."""
    if selection not in ("all", "base", "mtp"):
        raise UsageError(f"selection {selection!r} must be all, base or mtp")
    cfg = ds.DeepseekV3Config.from_dict(ck.config, source=str(ck.root / "config.json"))
    infos = {t.name: t for t in ck.infos()}
    # (a partial checkpoint, e.g. `dsx download --only mtp`: a present tensor's partner may sit in an absent shard)
    roles = ds.map_tensors(list(infos) + list(ck.absent), cfg, source=str(ck.root))
    ds.check_fp8_partners(roles, {n: t.dtype for n, t in infos.items()}, source=str(ck.root))
    block = cfg.fp8_block or fp8_block.BLOCK
    ds.check_source(roles, {n: (t.dtype, tuple(t.shape)) for n, t in infos.items()}, block, source=str(ck.root))
    ds.check_shapes({n: t.shape for n, t in infos.items()}, cfg, source=str(ck.root))
    if selection == "mtp" and not cfg.num_nextn_predict_layers:
        raise UsageError(f"{ck.root}: the checkpoint has no MTP layer (num_nextn_predict_layers is 0)")
    unused = recipe.unused_rules([roles[n] for n in infos if roles[n].kind != "scale_inv"])
    if unused:
        raise UsageError(f"{recipe.source}:{unused[0].line}: rule matches no tensor of {ck.root}",
                         hint="fix the role/name/regex or remove the rule")
    by_file: dict[str, OutShard] = {}
    for name, info in infos.items():
        r = roles[name]
        if r.kind == "scale_inv" or (selection == "base" and r.mtp) or (selection == "mtp" and not r.mtp):
            continue
        t = recipe.target(r)
        if t.type == "skip":
            continue
        task = task_for(ck, r, t, infos, block)
        rel = ck.weight_map[name]
        by_file.setdefault(rel, OutShard("", [rel])).tasks.append(task)
    _check_fp8_arch([t for s in by_file.values() for t in s.tasks])
    files = [f for f in sorted(by_file) if by_file[f].entries()]
    shards = []
    for i, rel in enumerate(files):
        s = by_file[rel]
        s.file = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        shards.append(s)
    fp = source_fingerprint(ck)
    plan = Plan(str(ck.root), fp, recipe.describe(), selection, shards, {})
    plan.config = output_config(ck.config, plan, recipe)
    return plan


def task_for(ck: Checkpoint, r: ds.TensorRole, t: Target, infos: dict, block: tuple[int, int]) -> Task:
    """What converting source tensor r.name to t takes and writes (infos: the checkpoint's tensor infos by name;
    block: its FP8 block). The plan's tasks, and dsx verify's conversion of the reference that it compares the
    stored bytes with."""
    name, info = r.name, infos[r.name]
    src_scale = r.scale_name if info.dtype in ("F8_E4M3", "F8_E5M2") else None
    if src_scale and src_scale not in infos:  # (listed, in a shard this partial checkpoint lacks)
        raise CheckpointError(f"{ck.root}: {name} is converted, and its block scale {src_scale} is in "
                              f"{ck.absent[src_scale]}, which is absent",
                              hint="download that shard too (dsx download, with --include for that file)")
    if src_scale and info.dtype != "F8_E4M3":
        raise UsageError(f"{ck.root}: {name} is {info.dtype}; only F8_E4M3 block-scaled sources are supported")
    if src_scale and t.type == "keep":
        t = Target("a8w8_fp8", t.group_size, t.arch, t.rule) if block == fp8_block.BLOCK else t
    outs = _outputs(name, info.shape, info.dtype, t)
    if src_scale and t.type == "keep":
        outs += (Entry(src_scale, "F32", infos[src_scale].shape),)
    bytes_in = info.nbytes + (infos[src_scale].nbytes if src_scale else 0)
    return Task(name, info.dtype, info.shape, src_scale, block if src_scale else None, t, r.role, r.layer,
                r.mtp, outs, bytes_in)


FP8_MIN_ARCH = 89  # FP8 tensor cores: Ada (sm_89) and Hopper (sm_90); a GPU below cannot serve FP8 weights


def _writes_fp8(t: Task) -> bool:
    return t.target.type == "a8w8_fp8" or (t.target.type == "keep" and t.src_dtype == "F8_E4M3")


def _check_fp8_arch(tasks: list[Task]) -> None:
    """A recipe's arch names the GPU the output is served on (it lays out the weight-only bytes); FP8 weights
    for a GPU without FP8 tensor cores (arch 70..86) cannot be served there: refuse before any work rather than
    write a checkpoint whose config says sm_80 and whose weights need sm_89."""
    low = [t for t in tasks if _writes_fp8(t) and t.target.arch < FP8_MIN_ARCH]
    if low:
        t = low[0]
        raise UsageError(f"arch {t.target.arch} with FP8 weights: {len(low)} tensors would be written in FP8 (e.g. "
                         f"{t.src}, by {t.target.rule}), and FP8 GEMMs need sm_{FP8_MIN_ARCH} or newer",
                         hint=f"set arch {FP8_MIN_ARCH} or 90 for Ada or Hopper (--arch; quantize.arch in a deployment "
                              "recipe), or use a weight-only or bf16 type for an older GPU")


def output_config(src_cfg: dict, plan: Plan, recipe: Recipe) -> dict:
    """config.json of the output: the source's, minus its quantization_config, plus what was done."""
    cfg = {k: v for k, v in src_cfg.items() if k != "quantization_config"}
    types: dict[str, dict] = {}
    base_types, mtp_types = set(), set()
    groups, uses_fp8 = set(), False
    for t in plan.tasks():
        ent = {"type": t.target.type}
        if t.target.type.startswith("weight_only"):
            ent["group_size"] = t.target.group_size
            groups.add(t.target.group_size)
        types.setdefault(("mtp." if t.mtp else "") + t.role, ent)
        (mtp_types if t.mtp else base_types).add(t.target.type)
        uses_fp8 |= _writes_fp8(t)
    if base_types | mtp_types <= {"bf16", "float32", "keep", "skip"} and not uses_fp8:
        return cfg  # plain bf16 checkpoint: no quantization_config at all
    qc = {
        "quant_method": "dsx", "pre_quantized": True, "quant_type": recipe.name,
        "mtp_quant_type": recipe.mtp.name if recipe.mtp else (recipe.name if mtp_types else None),
        "types_by_role": types, "tool": f"dsx {__version__}",
        "source_fingerprint": plan.source_fingerprint, "selection": plan.selection,
    }
    if uses_fp8:
        qc.update(fmt="e4m3", activation_scheme="dynamic", weight_block_size=list(fp8_block.BLOCK))
    if groups:
        qc["weightonly_group_size"] = sorted(groups)[0] if len(groups) == 1 else sorted(groups)
        qc["weightonly_arch"] = recipe.arch
    cfg["quantization_config"] = qc
    return cfg


def load_recipe(type_: str | None, recipe_file: Path | None, *, arch: int | None, group_size: int | None,
                mtp_type: str | None) -> Recipe:
    from ds_export.quant import recipe as rmod

    if (type_ is None) == (recipe_file is None):
        raise UsageError("give exactly one of --type and --recipe",
                         hint=f"built-in types: {', '.join(rmod.builtin_names())}")
    rec = rmod.builtin(type_, arch=arch, group_size=group_size) if type_ else rmod.load(recipe_file)
    if recipe_file and arch is not None:
        rec.arch = arch
    if mtp_type:
        rec.mtp = rmod.builtin(mtp_type, arch=rec.arch, group_size=group_size, _depth=1)
    return rec
