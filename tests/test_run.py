"""dsx run: shipped recipes validate and dry-run against DeepSeek-R1's metadata; the tiny recipe runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ds_export.cli.app import main
from ds_export.errors import DsxError, UsageError
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.run import pipeline
from ds_export.run.recipe import load
from r1_sparse import R1_METADATA

RECIPES = sorted((Path(__file__).parents[1] / "recipes").glob("*.yaml"))
REAL = [r for r in RECIPES if r.name.startswith("r1-")]
GiB = 2**30


def test_the_seeds_deployments_are_shipped():
    names = {load(r).name for r in RECIPES}
    assert {"tiny", "r1-wint4-tp8", "r1-fp8-wint4-mtp-tp8", "r1-wint4-mtp-wint8-tp8", "r1-fp8-mtp-tp16",
            "r1-wint8-mtp-tp16"} <= names
    pairs = {load(r).name: (load(r).quantize["type"], load(r).quantize.get("mtp_type"), load(r).export["tp"])
             for r in REAL}
    assert pairs["r1-fp8-wint4-mtp-tp8"] == ("a8w8_fp8_wint4", "a8w8_fp8", 8)
    assert pairs["r1-wint4-mtp-wint8-tp8"] == ("weight_only_int4", "weight_only_int8", 8)
    assert pairs["r1-fp8-mtp-tp16"] == ("a8w8_fp8", "a8w8_fp8", 16)
    assert pairs["r1-wint8-mtp-tp16"] == ("weight_only_int8", "weight_only_int8", 16)
    assert pairs["r1-wint4-tp8"] == ("weight_only_int4", None, 8)


@pytest.fixture(scope="module")
def r1_sizes():
    cfg = ds.DeepseekV3Config.from_dict(json.loads((R1_METADATA / "config.json").read_text()))
    ts = ds.expected_tensors(cfg)
    fp8 = [t for t in ts if t.dtype == "F8_E4M3" and not t.role.mtp]
    return {"total": sum(t.nbytes for t in ts), "mtp": sum(t.nbytes for t in ts if t.role.mtp),
            "fp8_base": sum(t.nbytes for t in fp8),
            "experts_base": sum(t.nbytes for t in fp8 if t.role.expert is not None)}


@pytest.mark.parametrize("recipe", REAL, ids=lambda p: p.stem)
def test_dry_run_against_r1_metadata(recipe, r1_sizes, tmp_path):
    dep = load(recipe)
    p = pipeline.dry_run(dep, tmp_path, metadata=R1_METADATA)
    tp = dep.export["tp"]
    want_in = r1_sizes["total"] - (0 if dep.quantize.get("mtp_type") else r1_sizes["mtp"])
    assert p["quantize"]["bytes_in"] == want_in
    assert p["download_bytes"] == (r1_sizes["total"] - r1_sizes["mtp"] if dep.model.get("only") == "base"
                                   else r1_sizes["total"])
    ranks = p["export"]["bytes_per_rank"]
    assert len(ranks) == tp and max(ranks) - min(ranks) < 0.01 * max(ranks)
    assert sum(ranks) >= p["quantize"]["bytes_out"]  # replicated tensors count on every rank
    assert max(ranks) < 80 * GiB  # every seed deployment fits an 80 GB GPU
    assert p["export"]["layout"][0] == "export/rank_0/"
    if dep.export.get("speculate"):
        assert p["export"]["layout"][tp:] == [f"export/mtp/rank_{r}/" for r in range(tp)]
    # Independent estimate: INT4 halves the FP8 bytes it replaces; FP8 and INT8 keep one byte per weight
    # (scale tensors and the router's bf16 -> fp32 move the total by well under 2%).
    z = r1_sizes
    no_mtp = 0 if dep.quantize.get("mtp_type") else z["mtp"]
    expected = {"weight_only_int4": z["total"] - no_mtp - z["fp8_base"] / 2,
                "a8w8_fp8_wint4": z["total"] - z["experts_base"] / 2,
                "a8w8_fp8": z["total"], "weight_only_int8": z["total"]}[dep.quantize["type"]]
    assert abs(p["quantize"]["bytes_out"] / expected - 1) < 0.02, p["quantize"]["bytes_out"] / GiB


def test_dry_run_cli(tmp_path, capsys):
    assert main(["run", str(REAL[0]), "--dry-run", "--metadata", str(R1_METADATA), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "quantize:" in out and "per rank" in out and not list(tmp_path.iterdir())


def test_dry_run_of_the_shipped_recipes_needs_no_metadata_another_repo_does(tmp_path, capsys):
    """`dsx run recipes/r1-wint4-tp8.yaml --dry-run`, the command's own --help example, failed "no local metadata"
    unless given --metadata tests/data/deepseek-r1 (a path in the source tree only): R1's metadata comes with dsx
    and plans the same; a recipe of another model still needs --metadata."""
    plans = []
    for extra in ([], ["--metadata", str(R1_METADATA)]):
        assert main(["run", str(REAL[0]), "--dry-run", "--json", "--workdir", str(tmp_path / "w"), *extra]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0].pop("planned_from") == "dsx's bundled metadata of deepseek-ai/DeepSeek-R1"
    assert plans[1].pop("planned_from") == str(R1_METADATA)
    assert plans[0] == plans[1] and not (tmp_path / "w").exists()
    other = tmp_path / "other.yaml"
    other.write_text(REAL[0].read_text().replace("deepseek-ai/DeepSeek-R1", "someone/Other-V3"))
    assert main(["run", str(other), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    assert "no local metadata for someone/Other-V3" in capsys.readouterr().err


def test_a_deployment_of_fp8_weights_on_a_gpu_without_fp8_is_refused_by_its_dry_run(tmp_path, capsys):
    """quantize.arch names the serving GPU: FP8 weights at arch 80 are refused when planned, before any download."""
    fp8 = next(r for r in REAL if load(r).quantize["type"] == "a8w8_fp8_wint4")
    low = tmp_path / "a100.yaml"
    low.write_text(fp8.read_text().replace("arch: 90", "arch: 80"))
    assert "arch: 80" in low.read_text()
    assert main(["run", str(low), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "arch 80 with FP8 weights" in err and "quantize.arch" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


_GEN = "name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {max_seq_len: 64}\ngenerate: "


@pytest.mark.parametrize("text,msg", [
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {tp: 1}\nbogus: 1\n", r":1: unknown key"),
    ("name: x\nmodel: {tiny: {}, repo: a/b}\nquantize: {type: bf16}\nexport: {}\n", "exactly one of repo and tiny"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: int3}\nexport: {}\n", "quantize.type 'int3'"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {speculate: true}\n", "needs quantize.mtp_type"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {tp: 1, colour: 2}\n", "export.colour"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16, mtp_type: bf16}\nexport: {speculate: true, draft_tokens: 9}\n",
     "1..5"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {draft_tokens: 2}\n",
     "export.draft_tokens needs export.speculate: true"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\n", "export is required"),
    # (the name is the work directory's under dsx-work/: an absolute path or ../ put it anywhere, "" was dsx-work)
    ("name: /home/me\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "name '/home/me': expected a plain name"),
    ("name: ../x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "name '../x'"),
    ("name: ''\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "name ''"),
    ("name: 5\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "name 5"),
    ("name: .hidden\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "name '.hidden'"),
    ("name: x\ndescription: [1]\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\n", "description \\[1\\]: expected text"),
    ("name: x\nmodel: {tiny: {}, revision: abc}\nquantize: {type: bf16}\nexport: {}\n", "model.revision and model.only are for"),
    ("name: x\nmodel: {tiny: {}, only: base}\nquantize: {type: bf16}\nexport: {}\n", "model.revision and model.only are for"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nserving: {nodes: -1, max_batch: 0}\n",
     r"serving.nodes = -1, serving.max_batch = 0: expected counts and sizes >= 1"),
    # (the serving plan against what the export writes into config.json, which the server reads)
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {block_size: 64}\nserving: {block_size: 32}\n",
     r"serving.block_size 32 but export.block_size 64: the server reads the export's config.json"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nserving: {block_size: 128}\n",
     r"serving.block_size 128 but export.block_size 64"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16, mtp_type: bf16}\nexport: {speculate: true, draft_tokens: 2}\n"
     "serving: {draft_tokens: 1}\n", r"serving.draft_tokens 1 but export.draft_tokens 2"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nserving: {draft_tokens: 1}\n",
     r"serving.draft_tokens 1 but export.draft_tokens 0 \(no draft: export.speculate is off\)"),
    ("name: x\nmodel: {tiny: {colour: 1}}\nquantize: {type: bf16}\nexport: {}\n", "model.tiny.colour"),
    ("name: x\nmodel: {tiny: {config: 3}}\nquantize: {type: bf16}\nexport: {}\n", "model.tiny.config = 3"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nverify: {device: tpu}\n", "verify.device"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nverify: {experts: -1}\n", "verify.experts = -1"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {}\nverify: {samples: -1}\n", "verify.samples = -1"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {max_seq_len: -1}\n", "export.max_seq_len must be >= 2"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {block_size: 0}\n", "export.block_size >= 1"),
    ("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {dtype: float64}\n",
     "export.dtype one of float32, bfloat16, float16"),
    # the generate section, as dsx generate checks its options and against the export section: these were found by
    # the last step, after the download, conversion and export, or passed (0 tokens), or were internal errors
    (_GEN + "{max_new_tokens: 4}\n", "generate needs exactly one of prompt"),
    (_GEN + "{prompt: a, input_ids: [0]}\n", "generate needs exactly one of prompt"),
    (_GEN + "{prompt: a, max_new_tokens: 0}\n", "generate.max_new_tokens must be >= 1"),
    (_GEN + "{prompt: a, speculate: 6}\n", "generate.speculate 0..5"),
    (_GEN + "{prompt: a, speculate: -1}\n", "generate.speculate 0..5"),
    (_GEN + "{prompt: a, speculate: 1}\n", "generate.speculate needs export.speculate: true"),
    (_GEN + "{input_ids: []}\n", r"generate.input_ids = \[\]: expected a list of token ids"),
    (_GEN + "{input_ids: [0, -1]}\n", r"generate.input_ids = \[0, -1\]"),
    (_GEN + "{input_ids: [0, true]}\n", r"generate.input_ids = \[0, True\]"),
    (_GEN + "{input_ids: [0, 5], max_new_tokens: 62}\n",
     r"the prompt \(2 tokens\) \+ generate.max_new_tokens \(62\) \+ drafts exceed export.max_seq_len \(64\)"),
    ("name: x\nmodel: {repo: a/b}\nquantize: {type: bf16}\nexport: {}\ngenerate: {prompt: hello}\n",
     "generate.prompt is encoded with the tiny model's byte-level tokenizer, not this model's"),
])
def test_recipe_validation(tmp_path, text, msg):
    p = tmp_path / "r.yaml"
    p.write_text(textwrap.dedent(text))
    with pytest.raises(UsageError, match=msg):
        load(p)


def test_a_generate_section_at_the_limits_is_accepted(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(_GEN + "{input_ids: [0, 5], max_new_tokens: 61}\n")  # (2 + 61 + 0 drafts + 1 = 64)
    assert load(p).generate["input_ids"] == [0, 5]
    p.write_text("name: x\nmodel: {repo: a/b}\nquantize: {type: bf16, mtp_type: bf16}\nexport: {speculate: true}\n"
                 "generate: {input_ids: [0, 5], speculate: 5}\n")
    assert load(p).generate["speculate"] == 5


def _refused_before_the_first_step(tmp_path, capsys, config: str, *wants: str) -> None:
    """dsx run (dry and not) of the tiny recipe with model.tiny.config {config}: exit 2, one line holding each of
    wants, and nothing written into the work directory."""
    r = tmp_path / "r.yaml"
    r.write_text((Path("recipes") / "tiny.yaml").read_text().replace(
        "tiny: {seed: 0, dtype: fp8}", f"tiny: {{seed: 0, dtype: fp8, config: {{{config}}}}}"))
    assert config in r.read_text()
    for dry in (["--dry-run"], []):
        assert main(["run", str(r), *dry, "--workdir", str(tmp_path / "w")]) == 2
        err = capsys.readouterr().err
        assert all(w in err for w in wants) and len(err.strip().splitlines()) == 1, err
    assert not [p for p in (tmp_path / "w").rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_a_generate_prompt_outside_the_vocabulary_is_found_before_the_first_step(tmp_path, capsys):
    """A tiny recipe whose config.vocab_size is below the byte tokenizer's ids ran download, quantize, export and
    verify, and failed at generate ("token id 103: outside the model's vocabulary 0..99")."""
    _refused_before_the_first_step(tmp_path, capsys, "vocab_size: 100",
                                   "generate: token id 114 is outside the model's vocabulary 0..99",
                                   "vocab_size to 115 or more")


def test_a_misspelt_tiny_config_key_is_refused_before_the_first_step(tmp_path, capsys):
    """model.tiny.config: {intermediate_szie: 256} was written into config.json beside the real key and changed
    nothing: the run went through with the default widths. Refused, with the key it likely meant."""
    _refused_before_the_first_step(tmp_path, capsys, "intermediate_szie: 256",
                                   "tiny config: 'intermediate_szie' is not a key of DeepSeek-V3's config.json",
                                   "did you mean 'intermediate_size'?")


def test_a_quant_recipe_file_is_found_beside_the_deployment_recipe(tmp_path, monkeypatch, capsys):
    """quantize.recipe: mix.yaml was read from the working directory: `dsx run recipes/x.yaml` from anywhere else
    said "mix.yaml: recipe not found"."""
    import json

    (tmp_path / "mix.yaml").write_text("name: my-mix\ndefaults: {linear: weight_only_int8}\n")
    r = tmp_path / "r.yaml"
    r.write_text("name: x\nmodel: {tiny: {}}\nquantize: {recipe: mix.yaml}\nexport: {}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(r), "--dry-run", "--json", "--workdir", str(tmp_path / "w")]) == 0
    assert json.loads(capsys.readouterr().out)["quantize"]["type"] == "my-mix"


def test_float16_exports_are_a_recipe_setting_too(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("name: x\nmodel: {tiny: {}}\nquantize: {type: bf16}\nexport: {dtype: float16}\n")
    assert load(p).export["dtype"] == "float16"  # (export writes it; the recipe refused it)


@pytest.mark.parametrize("export,msg", [
    ("{tp: 3}", "export section: --tp 3: {src}: num_attention_heads {heads} is not divisible by 3"),
    ("{max_seq_len: 1000000}", "export section: --max-seq-len 1000000: above the model's max_position_embeddings "
                               "163840"),
])
@pytest.mark.parametrize("base", ["tiny.yaml", "r1-wint4-tp8.yaml"])
def test_a_bad_export_section_is_found_before_the_first_step(tmp_path, capsys, base, export, msg):
    """The export section against the model's config.json (tensor-parallel split, cache length): export refused it
    only when its step came, after R1's download and conversion (hours); now the dry run and the run itself refuse
    it before any step, from the tiny recipe's config or dsx's bundled copy of R1's."""
    r = tmp_path / "r.yaml"
    text = (Path("recipes") / base).read_text()
    # (its generate section's speculate needs the export's, and its serving plan's draft token a draft: out)
    r.write_text("\n".join(f"export: {export}" if line.startswith("export:") else
                           line.replace(", draft_tokens: 1}", "}") for line in text.splitlines()
                           if not line.startswith("generate:")))
    tiny = base == "tiny.yaml"
    want = msg.format(src=f"{r} (model.tiny)" if tiny else "config.json of dsx's bundled metadata of "
                      "deepseek-ai/DeepSeek-R1", heads=4 if tiny else 128)
    assert main(["run", str(r), "--dry-run", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert want in err and len(err.strip().splitlines()) == 1, err
    assert main(["run", str(r), "--workdir", str(tmp_path / "w")]) == 2  # (no network: it stops before the download)
    err = capsys.readouterr().err
    assert "export section: --" in err and len(err.strip().splitlines()) == 1, err
    assert not [p for p in (tmp_path / "w").rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_a_damaged_config_in_the_workdir_is_left_to_the_step_that_reads_it(tmp_path, capsys, monkeypatch):
    """The check before the first step reads WORKDIR/source/config.json when a download left one: a damaged one (a
    list) was an internal error there; the run goes on to its download step, which reports what it meets."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # (nothing listens there)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from ds_export.io import writer

    monkeypatch.setattr(writer, "free_bytes", lambda p: 1 << 50)  # (R1's pipeline writes 1.2 TiB: past the space check)
    (tmp_path / "w" / "source").mkdir(parents=True)
    (tmp_path / "w" / "source" / "config.json").write_text("[1]")
    assert main(["run", str(REAL[0]), "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:" in err and "internal error" not in err, err


def test_a_disk_too_small_for_the_whole_pipeline_is_found_before_the_first_step(tmp_path, capsys, monkeypatch):
    """Each step checked only its own output: on R1 a disk too small for the conversion was found after the
    download's hours. The run adds up what its steps still write (the dry run's sizes less what their directories
    hold) and stops before the first one; a rerun after the download counts only what is left."""
    from ds_export.io import writer

    wd = tmp_path / "w"
    real = writer.free_bytes
    monkeypatch.setattr(writer, "free_bytes", lambda p: 1 << 20)
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd)]) == 1
    err = capsys.readouterr().err
    assert "the steps still write" in err and "(download " in err and ", quantize " in err and ", export " in err
    assert "only 1.00 MiB free" in err and "nothing was started" in err and len(err.strip().splitlines()) == 1, err
    assert not (wd / "source").exists()
    monkeypatch.setattr(writer, "free_bytes", real)
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]) == 0
    monkeypatch.setattr(writer, "free_bytes", lambda p: 1 << 20)
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "quantize"]) == 1
    err = capsys.readouterr().err
    assert "(quantize " in err and "download" not in err, err  # (the source is there: nothing left to fetch)
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]) == 0


def test_an_interrupted_download_is_resumed_past_the_space_check(tmp_path, capsys, monkeypatch):
    """A download stopped after its index and config (no shards yet): the space check planned from that source and
    failed "lists model-00001-of-000163.safetensors, which is missing" instead of letting the download resume; it
    plans from dsx's bundled metadata then."""
    import gzip
    import shutil
    import socket

    from ds_export.io import writer
    from ds_export.run.metadata import BUNDLED

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # (nothing listens there)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    r1 = BUNDLED["deepseek-ai/DeepSeek-R1"]
    src = tmp_path / "w" / "source"
    src.mkdir(parents=True)
    shutil.copy(r1 / "config.json", src / "config.json")
    (src / "model.safetensors.index.json").write_bytes(gzip.decompress((r1 / "model.safetensors.index.json.gz")
                                                                       .read_bytes()))
    monkeypatch.setattr(writer, "free_bytes", lambda p: 1 << 50)
    assert main(["run", str(REAL[0]), "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:" in err and "which is missing" not in err, err  # (the download step ran)
    monkeypatch.setattr(writer, "free_bytes", lambda p: 1 << 30)
    assert main(["run", str(REAL[0]), "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert "the steps still write" in err and "only 1.00 GiB free" in err, err


def test_tiny_recipe_runs_end_to_end_and_resumes(tmp_path, capsys):
    wd = tmp_path / "wd"
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert list(res["steps"]) == ["download", "quantize", "export", "verify", "generate"]
    assert list(res["seconds"]) == [*res["steps"], "total"] and res["seconds"]["total"] > 0
    rep = json.loads((wd / "verify.json").read_text())
    assert rep["ok"] and rep["kernels"]
    cfg = json.loads((wd / "export" / "config.json").read_text())
    assert cfg["quant_type"] == "a8w8_fp8_wint4" and (wd / "export" / "mtp" / "model.json").exists()
    assert len(res["steps"]["generate"]["tokens"][0]) == 16
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "quantize", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["steps"]["download"] == {"skipped": True}
    assert res["steps"]["quantize"]["converted"] == 0  # verified and kept
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "export", "--until-step", "export",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]["export"] == {"skipped": True}
    # the quantized output converted again in its place (another type, --force): the export was kept, since its
    # settings named only the path; now it records its source's content digest and is made again
    assert main(["quantize", str(wd / "source"), "--out", str(wd / "quantized"), "--type", "a8w8_fp8", "--force",
                 "-q"]) == 0
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "export", "--until-step", "export",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]["export"]["files"] > 0
    assert json.loads((wd / "export" / "config.json").read_text())["quant_type"] == "a8w8_fp8"
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "generate"]) == 0
    out = capsys.readouterr().out
    assert "step 1/1: generate" in out and "final report" in out and "16 tokens" in out
    assert main(["run", "recipes/tiny.yaml", "--from-step", "verify", "--until-step", "quantize"]) == 2
    _speculation_faults_are_caught(wd, capsys)


def _speculation_faults_are_caught(wd: Path, capsys) -> None:
    """Planted faults in speculative decoding fail the generate step: (1) an accept step that keeps
    every draft (the tiny draft is random, so most are wrong by far more than a near-tie); (2)
    check_speculative_greedy on a sequence with one token swapped for the base model's worst."""
    import numpy as np

    from ds_export.export import runtime
    from ds_export.native import kernels
    from ds_export.tiny_tokenizer import encode

    real = kernels.mtp_accept_greedy

    def keep_all(draft, target, num_draft):
        acc, cnt = real(draft, target, num_draft)
        k = draft.shape[1]
        acc[:, :k], acc[:, k] = draft, target[:, k]
        return acc, np.full_like(cnt, k + 1)

    kernels.mtp_accept_greedy = keep_all
    try:
        assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "generate"]) == 1
    finally:
        kernels.mtp_accept_greedy = real
    assert "speculative decoding changed the greedy output: sequence 0, token" in capsys.readouterr().err
    prompt = [encode("DeepSeek")]
    plain, _ = runtime.generate_any(wd / "export", prompt, 8)
    toks = plain["tokens"][0]
    assert runtime.check_speculative_greedy(wd / "export", prompt, [toks], [toks]) == []
    _, lg = runtime.generate_any(wd / "export", [prompt[0] + toks[:5]], 1, dump_logits=True)
    bad = toks[:5] + [int(lg["base_logits"][0, -1].argmin())] + toks[6:]
    with pytest.raises(DsxError, match="sequence 0, token 5: plain decoding gave"):
        runtime.check_speculative_greedy(wd / "export", prompt, [bad], [toks])


def test_the_tiny_source_is_started_over_only_from_its_own_files(tmp_path, capsys):
    """WORKDIR/source without an index was removed whole to write the tiny checkpoint again: a --workdir whose
    source/ held the user's files lost them. Only the tiny writer's own files (an interrupted write) are cleared."""
    wd = tmp_path / "wd"
    (wd / "source").mkdir(parents=True)
    (wd / "source" / "mine.bin").write_bytes(b"keep")
    args = ["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]
    assert main(args) == 2
    assert "holds files the tiny checkpoint does not write (mine.bin)" in capsys.readouterr().err
    assert (wd / "source" / "mine.bin").read_bytes() == b"keep"
    (wd / "source" / "mine.bin").unlink()
    (wd / "source" / "model-00001-of-00006.safetensors").write_bytes(b"cut short")  # an interrupted write
    (wd / "source" / "config.json").write_text("{}")
    assert main(args) == 0
    Checkpoint.open(wd / "source").close()


def test_a_tiny_source_of_other_settings_is_not_kept(tmp_path, capsys):
    """Any WORKDIR/source with an index was "tiny checkpoint already written": after model.tiny's seed or config
    changed in the recipe (or with another checkpoint there), every step ran on the old weights under the edited
    recipe. It is kept only when it is byte for byte what the recipe's model.tiny writes, and refused (untouched)
    otherwise."""
    wd = tmp_path / "wd"
    args = ["--workdir", str(wd), "--until-step", "download", "-q"]
    assert main(["run", "recipes/tiny.yaml", *args]) == 0
    before = {p.name: p.read_bytes() for p in (wd / "source").iterdir()}
    assert main(["run", "recipes/tiny.yaml", *args]) == 0  # (the same recipe again: kept)
    text = Path("recipes/tiny.yaml").read_text()
    for change, differs in (("seed: 0", "seed: 1"), ("dtype: fp8}", "dtype: fp8, config: {vocab_size: 520}}")):
        assert change in text
        edited = tmp_path / "edited.yaml"
        edited.write_text(text.replace(change, differs))
        assert main(["run", str(edited), *args]) == 2
        err = capsys.readouterr().err
        assert "not the tiny checkpoint recipe tiny describes (" in err and "differs)" in err, err
        assert "remove that directory" in err
    assert {p.name: p.read_bytes() for p in (wd / "source").iterdir()} == before
    assert not [p for p in wd.iterdir() if p.name.startswith(".tiny-check")]  # (its scratch copy removed)


def test_a_second_run_in_the_same_workdir_is_refused_while_the_first_runs(tmp_path, capsys):
    """Two dsx runs in one workdir wrote its tiny source, verify.json and steps over each other (the tiny step
    removes an unfinished source and writes it again): the second is refused before any step."""
    from dir_lock import held_by_another_process

    wd = tmp_path / "wd"
    wd.mkdir()
    with held_by_another_process(wd):
        assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]) == 2
        assert f"{wd}: another dsx process is writing or reading it now (dsx run writes it alone)" in \
            capsys.readouterr().err
        assert list(wd.iterdir()) == []
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]) == 0
    (tmp_path / "f").write_text("x")  # (a file as the workdir: "File exists: f" before)
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(tmp_path / "f"), "-q"]) == 2
    assert "f: exists and is not a directory" in capsys.readouterr().err


def test_a_step_whose_input_no_step_writes_says_where_to_start(tmp_path, capsys):
    """--from-step export in a fresh workdir failed with the reader's own error ("wr/quantized: not a directory"),
    --from-step verify only after verify had run: the run stops before any step, naming the step to start from."""
    wd = tmp_path / "wd"
    for frm, want in (("export", "step export reads " + str(wd / "quantized") + ", the quantize step's output, "
                       "which is not there"), ("verify", "--from-step download"), ("generate", "--from-step export")):
        assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", frm, "-q"]) == 2
        assert want in capsys.readouterr().err
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "download", "-q"]) == 0
    (wd / "quantized").mkdir()
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--from-step", "export", "-q"]) == 2
    assert "which is not complete (start from that step: --from-step quantize)" in capsys.readouterr().err
    assert sorted(p.name for p in wd.iterdir()) == ["quantized", "source"]


def test_a_changed_recipe_says_what_to_do_without_force(tmp_path, capsys):
    """The quantize section changed after WORKDIR/quantized was written: the engine's refusal said "pass --force",
    an option dsx run does not have; it says to remove the directory or use another --workdir."""
    wd = tmp_path / "wd"
    assert main(["run", "recipes/tiny.yaml", "--workdir", str(wd), "--until-step", "quantize", "-q"]) == 0
    changed = tmp_path / "tiny-int8.yaml"
    changed.write_text(Path("recipes/tiny.yaml").read_text().replace("type: a8w8_fp8_wint4", "type: weight_only_int8"))
    assert main(["run", str(changed), "--workdir", str(wd), "--until-step", "quantize", "-q"]) == 2
    err = capsys.readouterr().err
    assert "holds a different dsx run (a8w8_fp8_wint4)" in err and "remove that directory" in err, err
    assert "--force" not in err


def test_tiny_tp2_recipe_runs_on_two_ranks(tmp_path, capsys):
    """recipes/tiny-tp2.yaml: export over 2 ranks; verify's end-to-end logits and generate run as 2 processes."""
    wd = tmp_path / "wd"
    assert main(["run", "recipes/tiny-tp2.yaml", "--workdir", str(wd), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for r in range(2):
        assert (wd / "export" / f"rank_{r}" / "model.json").is_file()
        assert (wd / "export" / "mtp" / f"rank_{r}" / "model.json").is_file()
    rep = json.loads((wd / "verify.json").read_text())
    assert rep["ok"] and rep["e2e"]["tp"] == 2 and rep["e2e"]["top1_agreement"] > 0.3
    gen = res["steps"]["generate"]
    assert gen["ranks"] == 2 and len(gen["tokens"][0]) == 16


def test_run_gives_each_step_its_progress_reporter(tmp_path):
    """dsx run hands the quantize and verify steps the reporters the CLI draws (their bars, as dsx quantize and dsx
    verify show them on their own), and each is told its work."""
    import contextlib
    import threading

    from ds_export.quant import engine

    asked, told = [], {"quantize": 0, "verify": []}

    class Quantize(engine.Reporter):
        def advance(self, nbytes):
            told["quantize"] += nbytes

    lock = threading.Lock()

    class Verify:
        def phase(self, what, total, unit="bytes"):
            entry = [what.split(" (")[0], total, 0]
            told["verify"].append(entry)

            def advance(n):
                with lock:
                    entry[2] += n
            return advance

    def progress(step):
        asked.append(step)
        made = {"quantize": Quantize, "verify": Verify}.get(step)
        return contextlib.nullcontext(made()) if made else None

    dep, wd = load(Path("recipes/tiny.yaml")), tmp_path / "wd"
    pipeline.run(dep, wd, until_step="quantize", say=lambda s: None, progress=progress)
    res = pipeline.run(dep, wd, from_step="verify", until_step="verify", say=lambda s: None, progress=progress)
    assert asked == ["download", "quantize", "verify"] and res["steps"]["verify"]["ok"]
    assert told["quantize"] > 0
    assert [p[0] for p in told["verify"]] == ["sha256", "weights", "kernels"]
    assert all(done == total > 0 for _, total, done in told["verify"])
