"""Recipes: strict validation with line numbers; built-ins; custom rules end to end."""

from __future__ import annotations

import textwrap

import pytest

from ds_export.cli.app import main
from ds_export.errors import UsageError
from ds_export.io.checkpoint import Checkpoint
from ds_export.quant import plan as plan_mod
from ds_export.quant import recipe as rmod


def _write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("text,msg", [
    ("name: x\nbogus: 1\n", r"r.yaml:1: unknown key\(s\) bogus"),
    ("name: x\nrules:\n  - role: q_b\n    type: int3\n", r"r.yaml:3: type 'int3' is not one of"),
    ("name: x\nrules:\n  - role: qb_proj\n    type: bf16\n", r"r.yaml:3: role 'qb_proj'"),
    ("name: x\nrules:\n  - role: q_b\n    type: bf16\n    colour: red\n", r"r.yaml:3: unknown rule key"),
    ("name: x\nrules:\n  - type: bf16\n", r"r.yaml:3: a rule needs role, name, regex or mtp"),
    ("name: x\nrules:\n  - role: q_b\n    type: a8w8_fp8\n    group_size: 64\n", "group_size only applies"),
    ("name: x\nrules:\n  - regex: '[unclosed'\n    type: bf16\n", "bad regex"),
    ("name: x\narch: 81\n", "arch 81"),
    ("rules: []\n", "name .a string. is required"),
    ("name: x\nrules: [\n", "not valid YAML"),
    ("name: x\nmtp:\n  name: y\n  mtp: a8w8_fp8\n", "cannot have an mtp key"),
    ("name: x\ndefaults:\n  linear: float32\n", "defaults.linear 'float32'"),
    # (internal errors: a number where a string or a list of them goes)
    ("name: x\nrules:\n  - role: 5\n    type: bf16\n", r"r.yaml:3: role 5 must be a role or a list of roles"),
    ("name: x\nrules:\n  - name: 5\n    type: bf16\n", r"r.yaml:3: name 5 must be a string"),
    ("name: x\nrules:\n  - regex: 5\n    type: bf16\n", r"r.yaml:3: regex 5 must be a string"),
    # (taken: 90.0 == 90, and the float went into the plan and the output's config)
    ("name: x\narch: 90.0\n", r"r.yaml:1: arch 90.0 is not one of"),
    ("name: x\ngroup_size: 64.0\n", r"r.yaml:1: group_size 64.0 is not one of"),
    ("name: x\nrules:\n  - role: q_b\n    type: weight_only_int4\n    group_size: 128.0\n", "group_size 128.0"),
])
def test_strict_validation(tmp_path, text, msg):
    with pytest.raises(UsageError, match=msg):
        rmod.load(_write(tmp_path, text))


def test_an_mtp_recipe_file_is_found_beside_the_recipe(tmp_path, monkeypatch):
    """mtp: sub/m.yaml was read from the working directory: a recipe and its MTP recipe worked only when dsx ran in
    their directory. It is read beside the recipe (a path only the working directory has still works)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.yaml").write_text("name: m\ndefaults: {linear: bf16}\n")
    p = _write(tmp_path, "name: x\nmtp: sub/m.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert rmod.load(p).mtp.name == "m"
    (elsewhere / "cwd.yaml").write_text("name: c\n")
    assert rmod.load(_write(tmp_path, "name: x\nmtp: cwd.yaml\n")).mtp.name == "c"
    with pytest.raises(UsageError, match=r"sub/none.yaml: recipe not found"):
        rmod.load(_write(tmp_path, "name: x\nmtp: sub/none.yaml\n"))


def test_a_directory_or_a_binary_file_given_as_a_recipe_is_one_line(tmp_path, capsys):
    """`dsx run recipes/quant` printed "Is a directory: recipes/quant", and a binary file an internal error
    (UnicodeDecodeError) that asked to be reported."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "a.yaml").write_text("name: a\n")
    (tmp_path / "blob.yaml").write_bytes(b"name: \xff\xfe\x00\x01")
    for target, want in ((tmp_path / "recipes", f"recipes: a directory, not a recipe file (give one of its files, "
                                                f"e.g. {tmp_path / 'recipes' / 'a.yaml'})"),
                         (tmp_path, "a directory, not a recipe file"),
                         (tmp_path / "blob.yaml", "blob.yaml: not a text file (byte 6 is not UTF-8), so not a recipe")):
        assert main(["run", str(target), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert want in err and "internal error" not in err and len(err.strip().splitlines()) == 1, err


def test_builtins_exist_and_load():
    names = rmod.builtin_names()
    assert {"bf16", "weight_only_int8", "weight_only_int4", "a8w8_fp8", "a8w8_fp8_wint4"} <= set(names)
    for n in names:
        assert rmod.builtin(n).name == n


def test_rule_matching_nothing_is_an_error(tiny_fp8, tmp_path):
    p = _write(tmp_path, """\
        name: typo
        rules:
          - name: "model.layers.*.self_attn.q_proj.weight"
            type: bf16
    """)
    ck = Checkpoint.open(tiny_fp8)
    with pytest.raises(UsageError, match=r"r.yaml:3: rule matches no tensor"):
        plan_mod.build(ck, rmod.load(p))


def test_rule_for_mtp_tensors_only_is_unused_when_mtp_has_its_own_recipe(tiny_fp8, tmp_path):
    p = _write(tmp_path, "name: x\nrules:\n  - role: mtp_eh_proj\n    type: skip\nmtp: a8w8_fp8\n")
    with pytest.raises(UsageError, match="r.yaml:3: rule matches no tensor"):
        plan_mod.build(Checkpoint.open(tiny_fp8), rmod.load(p))


def test_kind_mismatch_is_an_error(tiny_fp8, tmp_path):
    p = _write(tmp_path, "name: x\nrules:\n  - role: input_norm\n    type: weight_only_int8\n")
    with pytest.raises(UsageError, match="only applies to non-Linear|only applies to Linear"):
        plan_mod.build(Checkpoint.open(tiny_fp8), rmod.load(p))


def test_custom_recipe_end_to_end(tiny_fp8, tmp_path):
    p = _write(tmp_path, """\
        name: custom
        description: first layer's attention kept bf16, experts int8 g64, rest FP8
        defaults:
          linear: a8w8_fp8
          other: bf16
        rules:
          - regex: '^model\\.layers\\.0\\.self_attn\\.'
            role: [q_a, q_b, kv_a, kv_b, o_proj]
            type: bf16
          - role: [expert_gate, expert_up, expert_down]
            type: weight_only_int8
            group_size: 64
          - name: "model.layers.2.mlp.shared_experts.*"
            type: skip
        mtp: weight_only_int4
    """)
    out = tmp_path / "o"
    assert main(["quantize", str(tiny_fp8), "--out", str(out), "--recipe", str(p), "-q"]) == 0
    ck = Checkpoint.open(out)
    assert ck.info("model.layers.0.self_attn.q_b_proj.weight").dtype == "BF16"
    assert ck.info("model.layers.1.self_attn.q_b_proj.weight").dtype == "F8_E4M3"
    assert ck.info("model.layers.2.mlp.experts.3.up_proj.weight_scale").shape[0] == 256 // 64
    assert ck.info("model.layers.3.mlp.experts.3.up_proj.weight_scale").shape == (192,)  # MTP: int4 per channel
    assert "model.layers.2.mlp.shared_experts.up_proj.weight" not in ck
    assert "model.layers.3.mlp.shared_experts.up_proj.weight" in ck  # MTP tensors follow the MTP recipe
    qc = ck.config["quantization_config"]
    assert qc["quant_type"] == "custom" and qc["mtp_quant_type"] == "weight_only_int4"
