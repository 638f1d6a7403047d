"""Deployment recipes (`recipes/*.yaml`): validated data for `dsx run`. Schema (docs/recipes.md):

    name: r1-wint4-tp8
    description: text
    model:                      # exactly one of repo / tiny
      repo: deepseek-ai/DeepSeek-R1
      revision: main
      only: all                 # all | base (no MTP needed)
      tiny: {seed: 0, dtype: fp8, config: {intermediate_size: 256}}   # config: config.json overrides
    quantize: {type: weight_only_int4, mtp_type: null, arch: 90, group_size: -1, recipe: null}
    export: {tp: 8, speculate: false, draft_tokens: 1, dtype: bfloat16, max_seq_len: 8192, block_size: 64}
    verify: {experts: 8, samples: 4, device: cpu}                   # device: whose kernels (cpu | cuda)
    generate: {prompt: "...", max_new_tokens: 16, speculate: 1}     # optional smoke test (tiny: text;
                                                                    # any model: input_ids: [0, 5, 9])
    serving: {gpus: "8x H800 80 GB", nodes: 1, max_batch: 128, block_size: 64, draft_tokens: 1,
              gpu_memory_gb: 80, notes: "..."}                       # documentation only

Unknown keys and bad values are errors naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ds_export.errors import UsageError
from ds_export.quant.recipe import GROUP_SIZES, builtin_names, load_yaml
from ds_export.values import is_int

SECTIONS = {
    "model": {"repo": str, "revision": str, "only": str, "tiny": dict},
    "quantize": {"type": str, "mtp_type": (str, type(None)), "arch": int, "group_size": int, "recipe": (str, type(None))},
    "export": {"tp": int, "speculate": bool, "draft_tokens": int, "dtype": str, "max_seq_len": int,
               "block_size": int},
    "verify": {"experts": (int, type(None)), "samples": int, "device": str},
    "generate": {"prompt": str, "input_ids": list, "max_new_tokens": int, "speculate": int},
    "serving": {"gpus": str, "nodes": int, "max_batch": int, "block_size": int, "draft_tokens": int,
                "gpu_memory_gb": int, "notes": str},
}
STEPS = ("download", "quantize", "export", "verify", "generate")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


@dataclass
class Deployment:
    name: str
    description: str
    model: dict
    quantize: dict
    export: dict
    verify: dict = field(default_factory=dict)
    generate: dict | None = None
    serving: dict = field(default_factory=dict)
    source: str = "<recipe>"

    @property
    def tiny(self) -> bool:
        return "tiny" in self.model


def _err(source, line, msg) -> UsageError:
    return UsageError(f"{source}:{line}: {msg}", hint="see docs/recipes.md")


def parse(obj, source: str) -> Deployment:
    if not isinstance(obj, dict):
        raise _err(source, 1, "a deployment recipe must be a mapping")
    line = getattr(obj, "line", 1)
    unknown = set(obj) - {"name", "description", *SECTIONS}
    if unknown:
        raise _err(source, line, f"unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    for req in ("name", "model", "quantize", "export"):
        if req not in obj:
            raise _err(source, line, f"{req} is required")
    # (the name is the work directory's under dsx-work/: "/home/me" or "../x" put it anywhere, "" was dsx-work itself)
    if not (isinstance(obj["name"], str) and NAME.fullmatch(obj["name"])):
        raise _err(source, line, f"name {obj['name']!r}: expected a plain name (letters, digits, '.', '_', '-'; "
                                 "starting with a letter, digit or '_'), the work directory's under dsx-work/")
    if not isinstance(obj.get("description", ""), str):
        raise _err(source, line, f"description {obj['description']!r}: expected text")
    sec = {}
    for name, keys in SECTIONS.items():
        val = obj.get(name) or {}
        vline = getattr(val, "line", line)
        if not isinstance(val, dict):
            raise _err(source, vline, f"{name} must be a mapping")
        for k, v in val.items():
            if k not in keys:
                raise _err(source, vline, f"{name}.{k} is not a known key ({', '.join(keys)})")
            if not isinstance(v, keys[k]) or (keys[k] is int and isinstance(v, bool)):
                raise _err(source, vline, f"{name}.{k} = {v!r} has the wrong type")
        sec[name] = dict(val)
    d = Deployment(obj["name"], obj.get("description", ""), sec["model"], sec["quantize"], sec["export"],
                   sec["verify"], sec["generate"] if obj.get("generate") else None, sec["serving"], source)
    _check(d, obj, source)
    return d


def _check(d: Deployment, obj, source: str) -> None:
    m, q, e = d.model, d.quantize, d.export
    line = lambda k: getattr(obj.get(k), "line", 1)  # noqa: E731
    if ("repo" in m) == ("tiny" in m):
        raise _err(source, line("model"), "model needs exactly one of repo and tiny")
    if "tiny" in m:
        tiny_keys = {"seed": int, "dtype": str, "config": dict}
        for k, v in m["tiny"].items():
            if k not in tiny_keys or not isinstance(v, tiny_keys[k]) or isinstance(v, bool):
                raise _err(source, line("model"), f"model.tiny.{k} = {v!r}: expected seed (int), dtype (fp8 | bf16) "
                           "or config (a mapping of config.json values)")
    if "tiny" in m and {"revision", "only"} & set(m):  # (they were ignored: the tiny checkpoint is written, not fetched)
        raise _err(source, line("model"), "model.revision and model.only are for model.repo: a tiny checkpoint is "
                                          "written locally, whole")
    if m.get("only", "all") not in ("all", "base"):
        raise _err(source, line("model"), "model.only must be all or base")
    if ("type" in q) == bool(q.get("recipe")):
        raise _err(source, line("quantize"), "quantize needs exactly one of type and recipe")
    for k in ("type", "mtp_type"):
        if q.get(k) and q[k] not in builtin_names():
            raise _err(source, line("quantize"), f"quantize.{k} {q[k]!r} is not one of {', '.join(builtin_names())}")
    if q.get("group_size", -1) not in GROUP_SIZES:
        raise _err(source, line("quantize"), f"quantize.group_size must be one of {GROUP_SIZES}")
    from ds_export.export.weights import DTYPES  # (what export writes)

    if e.get("tp", 1) < 1 or e.get("dtype", "bfloat16") not in DTYPES:
        raise _err(source, line("export"), f"export.tp must be >= 1 and export.dtype one of {', '.join(DTYPES)}")
    if e.get("max_seq_len", 4096) < 2 or e.get("block_size", 64) < 1:  # (export refused them only after quantize)
        raise _err(source, line("export"), "export.max_seq_len must be >= 2 and export.block_size >= 1")
    if e.get("speculate") and not q.get("mtp_type"):
        raise _err(source, line("export"), "export.speculate needs quantize.mtp_type (the draft's quant type)")
    if "draft_tokens" in e and not e.get("speculate"):  # (it was ignored: the export's config says 0 draft tokens)
        raise _err(source, line("export"), "export.draft_tokens needs export.speculate: true (without the draft "
                                           "there are no draft tokens)")
    if not 1 <= e.get("draft_tokens", 1) <= 5:
        raise _err(source, line("export"), "export.draft_tokens must be 1..5 (the seeds' serving limit)")
    if d.verify.get("device", "cpu") not in ("cpu", "cuda"):
        raise _err(source, line("verify"), "verify.device must be cpu or cuda")
    for k, least in (("experts", 1), ("samples", 0)):
        v = d.verify.get(k)
        if v is not None and not (is_int(v) and v >= least):
            raise _err(source, line("verify"), f"verify.{k} = {v!r}: expected an integer >= {least}"
                       + (" (leave it out to check every expert)" if k == "experts" else ""))
    bad = [f"{k} = {v!r}" for k, v in d.serving.items() if is_int(v) and not v >= (0 if k == "draft_tokens" else 1)]
    if bad:  # (documentation only, but printed by dsx run and in its summary as the deployment's serving plan)
        raise _err(source, line("serving"), f"serving.{', serving.'.join(bad)}: expected counts and sizes >= 1 "
                                            "(draft_tokens >= 0)")
    # (the server reads the export's config.json: a serving plan that says otherwise describes another deployment)
    exported = {"block_size": e.get("block_size", 64),
                "draft_tokens": e.get("draft_tokens", 1) if e.get("speculate") else 0}
    differ = [f"serving.{k} {d.serving[k]!r} but export.{k} {v!r}" + ("" if k != "draft_tokens" or e.get("speculate")
                                                                     else " (no draft: export.speculate is off)")
              for k, v in exported.items() if k in d.serving and d.serving[k] != v]
    if differ:
        raise _err(source, line("serving"), f"{'; '.join(differ)}: the server reads the export's config.json, so "
                                            "the serving plan must say what the export writes (give one value)")
    if m.get("only") == "base" and e.get("speculate"):
        raise _err(source, line("model"), "model.only: base downloads no MTP layer, but export.speculate needs it")
    if d.generate is not None:
        _check_generate(d, source, line("generate"))


def _check_generate(d: Deployment, source: str, line: int) -> None:
    """The generate section, as dsx generate checks its options, and against the export section: each of these was
    found by the last step, after the download, conversion and export (a prompt longer than the export's
    max_seq_len), or not at all (max_new_tokens 0 passed having generated nothing, text encoded with the tiny
    model's byte tokenizer was fed to R1, a missing prompt was an internal error)."""
    g, e = d.generate, d.export
    if ("prompt" in g) == ("input_ids" in g):
        raise _err(source, line, "generate needs exactly one of prompt (text, tiny models) and input_ids (token ids)")
    if "prompt" in g and not d.tiny:
        raise _err(source, line, "generate.prompt is encoded with the tiny model's byte-level tokenizer, not this "
                                 "model's: give generate.input_ids (token ids from the model's own tokenizer)")
    ids = generate_ids(d)
    if not ids or not all(is_int(t) and t >= 0 for t in ids):
        raise _err(source, line, f"generate.input_ids = {g['input_ids']!r:.60}: expected a list of token ids "
                                 "(integers >= 0), at least one")
    n, k = g.get("max_new_tokens", 16), g.get("speculate", 0)
    if n < 1 or not 0 <= k <= 5:
        raise _err(source, line, "generate.max_new_tokens must be >= 1 and generate.speculate 0..5")
    if k and not e.get("speculate"):
        raise _err(source, line, "generate.speculate needs export.speculate: true (the MTP draft drafts the tokens)")
    if len(ids) + n + k + 1 > e.get("max_seq_len", 4096):
        raise _err(source, line, f"the prompt ({len(ids)} tokens) + generate.max_new_tokens ({n}) + drafts exceed "
                                 f"export.max_seq_len ({e.get('max_seq_len', 4096)})")


def generate_ids(d: Deployment) -> list:
    """The generate section's prompt as token ids."""
    if "input_ids" in d.generate:
        return list(d.generate["input_ids"])
    from ds_export.tiny_tokenizer import encode

    return encode(d.generate["prompt"])


def load(path: str | Path) -> Deployment:
    return parse(load_yaml(path), str(path))
