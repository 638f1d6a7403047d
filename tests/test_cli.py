"""The dsx command: output modes, one-line errors, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ds_export.cli.app import main

COMMANDS = ["download", "quantize", "export", "generate", "verify", "run", "inspect", "tiny"]


def dsx(*args, env=None):
    e = dict(os.environ)
    e.pop("DSX_DEBUG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "ds_export.cli.app", *args], capture_output=True, text=True, env=e)


def test_tiny_then_inspect_json(tmp_path, capsys):
    assert main(["tiny", str(tmp_path / "t"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["inspect", str(tmp_path / "t"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["architecture"] == "DeepseekV3ForCausalLM" and s["mtp_layers"] == [3]
    roles = {r["role"]: r for r in s["roles"]}
    assert roles["kv_a"]["dtypes"] == "fp8_e4m3 + fp32 scale"
    assert roles["mtp:mtp_eh_proj"]["dtypes"] == "bf16"
    assert s["total_bytes"] == sum(r["bytes"] for r in s["roles"])


@pytest.mark.parametrize("patch,msg", [
    ({"intermediate_size": 3}, "model.layers.0.mlp.gate_proj.weight is [320, 256], but config.json (hidden_size 256, "
                               "intermediate_size 3) implies [3, 256]; 2 more tensors disagree"),
    ({"n_shared_experts": None}, "model.layers.1.mlp.shared_experts.down_proj.weight is not a tensor of the model "
                                 "config.json describes"),
])
def test_a_config_that_does_not_describe_the_weights_is_refused(tiny_fp8, tmp_path, capsys, patch, msg):
    """A config.json edited, or taken from another model, over these weights: names and dtypes fit, shapes do not.
    inspect, quantize and export refuse it (quantize copied it into its output, export into the programs), one line,
    exit 1, nothing written."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **patch}))
    for args in (["inspect", str(src)], ["quantize", str(src), "--out", str(tmp_path / "q"), "--type", "a8w8_fp8"],
                 ["export", str(src), "--out", str(tmp_path / "e")]):
        assert main([*args, "-q"] if args[0] != "inspect" else args) == 1, args
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "q").exists() and not (tmp_path / "e").exists()


@pytest.mark.parametrize("patch,msg", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu': export supports DeepSeek-V3's silu"),
    ({"scoring_func": "softmax"}, "export supports DeepSeek-V3's noaux_tc + sigmoid router"),
    ({"rope_scaling": {"type": "yarn"}}, "rope_scaling.factor None: expected a positive number"),
])
def test_export_refuses_settings_its_programs_do_not_compute(tiny_fp8, tmp_path, capsys, patch, msg):
    """The programs compute silu MLPs, the sigmoid noaux_tc router and YaRN rope: a config.json that says otherwise
    is refused (it was exported as if it said silu; a YaRN table without its factor was an internal error)."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, **patch}))
    assert main(["export", str(src), "--out", str(tmp_path / "e"), "-q"]) == 1
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    assert not (tmp_path / "e").exists()


def test_inspect_human(tiny_fp8, capsys):
    assert main(["inspect", str(tiny_fp8)]) == 0
    out = capsys.readouterr().out
    assert "MTP layers [3]" in out and "expert_gate" in out


def test_inspect_a_partial_checkpoint_whose_scale_and_weight_are_in_different_shards(tiny_fp8, tmp_path, capsys):
    """One shard of six present (an interrupted or selective download): a block scale there whose weight is in an
    absent shard was "... weight_scale_inv has no weight ...", as if the checkpoint were malformed. It is summarized
    as partial; a weight or scale missing from the index itself is still an error."""
    import json
    import shutil

    from ds_export.io.checkpoint import Checkpoint

    ck = Checkpoint.open(tiny_fp8)
    part = tmp_path / "part"
    part.mkdir()
    for f in ("config.json", "model.safetensors.index.json"):
        shutil.copy(tiny_fp8 / f, part / f)
    # a shard holding a scale whose weight is in another shard
    shard = next(f for n, f in ck.weight_map.items() if n.endswith("_scale_inv")
                 and ck.weight_map[n.removesuffix("_scale_inv")] != f)
    shutil.copy(tiny_fp8 / shard, part / shard)
    assert main(["inspect", str(part), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["missing_shards"] == len(set(ck.weight_map.values())) - 1 and s["shards"] == 1
    index = json.loads((part / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if not (f != shard and n.endswith(".weight")
                                                                                 and f"{n}_scale_inv" in index["weight_map"]
                                                                                 and index["weight_map"][f"{n}_scale_inv"] == shard)}
    (part / "model.safetensors.index.json").write_text(json.dumps(index))
    assert main(["inspect", str(part)]) == 1  # (the weight is not in the index at all: malformed)
    assert "has no weight" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_describes_every_command(cmd, capsys):
    assert main([cmd, "--help"]) == 0
    assert "Examples" in capsys.readouterr().out


def test_the_command_list_runs_each_summary_on(capsys):
    """`dsx --help` lists each command with its docstring's first paragraph, wrapped to the terminal, not broken
    where the source lines end (verify's was cut after "kernels," on an 80-column terminal)."""
    res = dsx("--help", env={"COLUMNS": "400"})
    assert res.returncode == 0
    lines = {line.split()[1]: line for line in res.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert set(COMMANDS) <= set(lines), res.stdout
    assert "numerically sound (weights, kernels, logits). Exit code 0 only when every gate passes." in lines["verify"]
    assert "one base step verifies them all" in lines["generate"]


def test_a_path_that_is_a_symlink_loop_is_one_line(tiny_fp8, tmp_path, capsys):
    """--out naming a link to itself was an internal error (pathlib's RuntimeError before Python 3.13) in quantize,
    export and tiny."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for cmd in (["quantize", str(tiny_fp8), "--out", str(loop), "--type", "bf16"], ["tiny", str(loop)]):
        assert main([*cmd, "-q"]) == 1, cmd
        err = capsys.readouterr().err
        assert f"{loop}: a symbolic link that points back at itself" in err and "internal" not in err, err
        assert len(err.strip().splitlines()) == 1


def test_errors_are_one_line_without_traceback(tiny_fp8, tmp_path):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(tiny_fp8, ck)
    shard = sorted(ck.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    r = dsx("inspect", str(ck))
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1
    assert shard.name in r.stderr and "Traceback" not in r.stderr
    r = dsx("inspect", str(ck), env={"DSX_DEBUG": "1"})
    assert "Traceback" in r.stderr and r.returncode == 1


@pytest.mark.parametrize("args,code,msg", [
    (["tiny"], 2, "Missing argument"),
    (["tiny", "x", "--bogus"], 2, "No such option"),
    (["nosuch"], 2, "No such command"),
    (["inspect", "/does/not/exist"], 1, "not a directory"),
])
def test_usage_errors(args, code, msg):
    r = dsx(*args)
    assert r.returncode == code and msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_version():
    r = dsx("--version")
    assert r.returncode == 0 and r.stdout.startswith("dsx ")


def test_ctrl_c_inside_a_command_is_exit_130_with_one_line(tiny_fp8, tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt inside a command (Typer turns it into Exit(130), which click hands back as the return value
    when not standalone): still exit 130 with the one-line message, not a silent 130."""
    from ds_export.quant import engine

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "run", interrupted)
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "q"), "--type", "bf16", "-q"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "rerun" in err and len(err.strip().splitlines()) == 1


def test_a_full_disk_says_rerunning_resumes_only_where_it_does(tmp_path, monkeypatch, capsys):
    """"rerunning resumes" was said of every command; `dsx tiny` (and export, verify's report, generate) start over."""
    import errno

    from ds_export import tiny

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "t" / "model.safetensors"))

    monkeypatch.setattr(tiny, "write_tiny", full)
    assert main(["tiny", str(tmp_path / "t"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "the disk is full: free space or choose another --out" in err and "resum" not in err, err


def test_a_shard_writer_names_its_file_in_a_write_error(tmp_path):
    """A full disk in the middle of a shard raised "No space left on device" with no path (numpy and file writes
    give none): the shard being written is named."""
    import errno

    from ds_export.io.writer import Entry, ShardWriter

    class Full:
        closed = False

        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.closed = True

    w = ShardWriter(tmp_path / "model-00001-of-00002.safetensors", [Entry("a", "F32", (4,))])
    w._f.close()
    w._f = Full()
    with pytest.raises(OSError) as e:
        w.write("a", np.zeros(4, np.float32))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "model-00001-of-00002.safetensors")


@pytest.mark.parametrize("code,want", [(28, "the disk is full: free space or choose another --out; rerunning resumes"),
                                       (13, "no permission"), (5, "I/O error"), (99999, None)])
def test_a_system_error_is_one_line_with_what_to_do(tiny_fp8, tmp_path, monkeypatch, capsys, code, want):
    """An OSError a command meets (a full disk mid-shard, a path it may not write) is one line naming the path and,
    for the usual causes, what to do."""
    from ds_export.quant import engine

    def fails(*a, **k):
        raise OSError(code, "boom", str(tmp_path / "q" / "model-00001-of-00006.safetensors.partial"))

    monkeypatch.setattr(engine, "run", fails)
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "q"), "--type", "bf16", "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "boom: " in err and "model-00001-of-00006.safetensors.partial" in err
    assert (want in err) if want else err.rstrip().endswith(".partial"), err
