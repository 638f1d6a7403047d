"""Quantization recipes: validated data that says which tensor becomes which format.

A recipe (YAML) is an ordered list of rules; the first rule that matches a
tensor decides its target. The built-in `--type` values are recipes too
(recipes/quant/*.yaml). Schema:

    name: a8w8_fp8_wint4                 # required
    description: free text
    arch: 90                              # Paddle weight-only layout (80 | 89 | 90 ...)
    group_size: -1                        # default for weight-only rules
    defaults:                             # used when no rule matches
      linear: a8w8_fp8                    # quantizable Linear weights
      other: keep                         # norms, embeddings, heads, router bias
    rules:
      - role: [expert_gate, expert_up, expert_down]   # role(s) from the model map
        name: "model.layers.*.mlp.experts.*"          # optional glob on the tensor name
        regex: "..."                                  # optional regex (search) on the name
        mtp: false                                    # optional: only base (false) / MTP (true) tensors
        type: weight_only_int4
        group_size: 128                               # optional, weight-only only
    mtp: weight_only_int8                 # optional: a type (or recipe file) for the MTP layer(s)

Targets: keep (copy bytes as they are), bf16, float32, a8w8_fp8,
weight_only_int8, weight_only_int4, skip (drop the tensor). Unknown keys,
unknown types, unknown roles and rules that can never match are errors naming
the line.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ds_export import formats
from ds_export.errors import UsageError
from ds_export.models import deepseek_v3 as ds

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "recipes" / "quant"
# Targets: every registered format, plus "skip" (drop the tensor).
LINEAR_TARGETS = tuple(n for n in formats.FORMATS if n != "float32") + ("skip",)
OTHER_TARGETS = tuple(n for n, f in formats.FORMATS.items() if not f.linear_only) + ("skip",)
TARGETS = tuple(dict.fromkeys(LINEAR_TARGETS + OTHER_TARGETS))
GROUP_SIZES = (-1, 64, 128)
ARCHS = (70, 75, 80, 86, 89, 90)
_TOP_KEYS = {"name", "description", "arch", "group_size", "defaults", "rules", "mtp"}
_RULE_KEYS = {"role", "name", "regex", "mtp", "type", "group_size"}


class _LineLoader(yaml.SafeLoader):
    """Records the line of every mapping so errors can point at it."""


def _construct_mapping(loader, node):
    d = _Map(loader.construct_mapping(node, deep=True))
    d.line = node.start_mark.line + 1
    return d


class _Map(dict):
    line = 0


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class Rule:
    type: str
    roles: tuple[str, ...] = ()
    glob: str | None = None
    regex: str | None = None
    mtp: bool | None = None
    group_size: int | None = None
    line: int = 0

    def matches(self, r: ds.TensorRole) -> bool:
        if self.roles and r.role not in self.roles:
            return False
        if self.mtp is not None and r.mtp != self.mtp:
            return False
        if self.glob and not fnmatch.fnmatchcase(r.name, self.glob):
            return False
        if self.regex and not re.search(self.regex, r.name):
            return False
        return True


@dataclass(frozen=True)
class Target:
    """What one source weight becomes."""

    type: str
    group_size: int = -1
    arch: int = 90
    rule: str = "default"  # which rule decided (for plans and reports)


@dataclass
class Recipe:
    name: str
    description: str = ""
    arch: int = 90
    group_size: int = -1
    linear_default: str = "keep"
    other_default: str = "keep"
    rules: list[Rule] = field(default_factory=list)
    mtp: "Recipe | None" = None
    source: str = "<recipe>"

    def target(self, r: ds.TensorRole) -> Target:
        if r.mtp and self.mtp is not None:
            return self.mtp.target(r)
        for i, rule in enumerate(self.rules):
            if rule.matches(r):
                self._check_kind(rule.type, r, f"rule {i + 1} (line {rule.line})")
                g = rule.group_size if rule.group_size is not None else self.group_size
                return Target(rule.type, g, self.arch, f"{self.name}: rule {i + 1}")
        t = self.linear_default if r.quantizable else self.other_default
        return Target(t, self.group_size, self.arch, f"{self.name}: default")

    def _check_kind(self, t: str, r: ds.TensorRole, where: str) -> None:
        allowed = LINEAR_TARGETS if r.quantizable else OTHER_TARGETS
        if t not in allowed:
            raise UsageError(f"{self.source}: {where} makes {r.name} ({r.role}) {t}, which only applies to "
                             f"{'non-' if r.quantizable else ''}Linear weights", hint=f"allowed: {', '.join(allowed)}")

    def unused_rules(self, roles: list[ds.TensorRole]) -> list[Rule]:
        """Rules that match no tensor of a model (a typo, usually)."""
        pool = [r for r in roles if not (r.mtp and self.mtp is not None)]
        return [rule for rule in self.rules if not any(rule.matches(r) for r in pool)]

    def describe(self) -> dict:
        d = {"name": self.name, "arch": self.arch, "group_size": self.group_size}
        if self.mtp is not None:
            d["mtp"] = self.mtp.name
        return d


# ------------------------------------------------------------------ loading ----

def _err(source: str, line: int, msg: str) -> UsageError:
    return UsageError(f"{source}:{line}: {msg}", hint="see docs/recipes.md")


def _choice(source, line, key, value, allowed):
    # (of the same type too: 90.0 == 90 and True == 1 were taken, and a float arch went into the plan and config)
    if not any(value == a and type(value) is type(a) for a in allowed):
        raise _err(source, line, f"{key} {value!r} is not one of {', '.join(map(str, allowed))}")
    return value


def parse(obj, source: str, *, _depth: int = 0) -> Recipe:
    if not isinstance(obj, dict):
        raise _err(source, 1, "a recipe must be a mapping")
    line = getattr(obj, "line", 1)
    unknown = set(obj) - _TOP_KEYS
    if unknown:
        raise _err(source, line, f"unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    if not isinstance(obj.get("name"), str):
        raise _err(source, line, "name (a string) is required")
    arch = _choice(source, line, "arch", obj.get("arch", 90), ARCHS)
    group = _choice(source, line, "group_size", obj.get("group_size", -1), GROUP_SIZES)
    defaults = obj.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - {"linear", "other"}:
        raise _err(source, getattr(defaults, "line", line), "defaults takes only linear and other")
    rec = Recipe(
        name=obj["name"], description=str(obj.get("description", "")), arch=arch, group_size=group,
        linear_default=_choice(source, line, "defaults.linear", defaults.get("linear", "keep"), LINEAR_TARGETS),
        other_default=_choice(source, line, "defaults.other", defaults.get("other", "keep"), OTHER_TARGETS),
        source=source,
    )
    rules = obj.get("rules") or []
    if not isinstance(rules, list):
        raise _err(source, line, "rules must be a list")
    rec.rules = [_parse_rule(r, source, line) for r in rules]
    if obj.get("mtp") is not None:
        if _depth:
            raise _err(source, line, "an MTP recipe cannot have an mtp key of its own")
        rec.mtp = _resolve_mtp(obj["mtp"], source, line, arch, group)
    return rec


def _parse_rule(r, source: str, parent_line: int) -> Rule:
    line = getattr(r, "line", parent_line)
    if not isinstance(r, dict):
        raise _err(source, line, "each rule must be a mapping")
    unknown = set(r) - _RULE_KEYS
    if unknown:
        raise _err(source, line, f"unknown rule key(s) {', '.join(sorted(map(str, unknown)))}")
    if "type" not in r:
        raise _err(source, line, "a rule needs a type")
    t = _choice(source, line, "type", r["type"], TARGETS)
    roles = r.get("role", [])
    if not isinstance(roles, (str, list)):  # (5 was an internal error)
        raise _err(source, line, f"role {roles!r:.40} must be a role or a list of roles")
    roles = (roles,) if isinstance(roles, str) else tuple(roles)
    for role in roles:
        _choice(source, line, "role", role, tuple(ds.ROLES))
    for key in ("name", "regex"):  # (a number was an internal error when matched)
        if key in r and not isinstance(r[key], str):
            raise _err(source, line, f"{key} {r[key]!r:.40} must be a string (a glob for name, a regular "
                                     "expression for regex)")
    if not (roles or r.get("name") or r.get("regex") or "mtp" in r):
        raise _err(source, line, "a rule needs role, name, regex or mtp to match on")
    if r.get("regex"):
        try:
            re.compile(r["regex"])
        except re.error as e:
            raise _err(source, line, f"bad regex {r['regex']!r}: {e}") from None
    g = r.get("group_size")
    if g is not None:
        _choice(source, line, "group_size", g, GROUP_SIZES)
        if not t.startswith("weight_only"):
            raise _err(source, line, f"group_size only applies to weight-only types, not {t}")
    mtp = r.get("mtp")
    if mtp is not None and not isinstance(mtp, bool):
        raise _err(source, line, "mtp must be true or false")
    return Rule(t, roles, r.get("name"), r.get("regex"), mtp, g, line)


def _resolve_mtp(spec, source: str, line: int, arch: int, group: int) -> Recipe:
    if isinstance(spec, str):
        p = Path(spec)
        if p.suffix in (".yaml", ".yml"):
            return load(beside(p, source), _depth=1)
        return builtin(spec, arch=arch, group_size=group, _depth=1)
    return parse(spec, source, _depth=1)


def beside(path: str | Path, source: str | Path) -> Path:
    """A file a recipe names, read beside the recipe (source), as its author writes it: it was read from the working
    directory, so a recipe and the files it names worked only when dsx ran in their directory. A relative path that
    only the working directory has is still read there."""
    p = Path(path)
    near = Path(source).parent / p
    return near if not p.is_absolute() and (near.is_file() or not p.is_file()) else p


def load_yaml(path: str | Path, what: str = "recipe"):
    """A YAML file (`what`: a recipe, a gate file) whose mappings remember their line (`.line`), or a one-line
    UsageError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        files = sorted(p.name for p in path.glob("*.y*ml"))
        raise UsageError(f"{path}: a directory, not a {what} file",
                         hint=f"give one of its files, e.g. {path / files[0]}" if files else
                         f"give a {what}: a YAML file") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not a text file (byte {e.start} is not UTF-8), so not a {what}",
                         hint=f"give a {what}: a YAML file") from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise UsageError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML ({getattr(e, 'problem', e)})") from None


def load(path: str | Path, *, _depth: int = 0) -> Recipe:
    return parse(load_yaml(path), str(path), _depth=_depth)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def builtin(name: str, *, arch: int | None = None, group_size: int | None = None, _depth: int = 0) -> Recipe:
    p = BUILTIN_DIR / f"{name}.yaml"
    if name not in builtin_names():  # (not a path: --type ../x read x.yaml from beside the built-in recipes)
        raise UsageError(f"unknown quant type {name!r}", hint=f"choose one of {', '.join(builtin_names())} "
                                                              "or pass --recipe FILE")
    rec = load(p, _depth=_depth)
    for option, value, allowed in (("--arch", arch, ARCHS), ("--group-size", group_size, GROUP_SIZES)):
        if value is not None and value not in allowed:  # (an option, not a recipe file's line)
            raise UsageError(f"{option} {value}: expected one of {', '.join(map(str, allowed))}",
                             hint="see docs/quantize.md")
    if arch is not None:
        rec.arch = arch
    if group_size is not None:
        rec.group_size = group_size
    return rec
