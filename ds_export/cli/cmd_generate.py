"""dsx generate: greedy decoding with an exported program (and MTP speculation)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Json, Quiet
from ds_export.cli.output import Out
from ds_export.errors import UsageError
from ds_export.io.dirlock import shared
from ds_export.io.writer import atomic_open, atomic_write_json, check_file_target


def _parse_ids(text: str) -> list[list[int]]:
    fields = [[t.strip() for t in row.split(",")] for row in text.split(";")]
    if any(f == [""] for f in fields):
        raise UsageError(f"--input-ids {text!r}: every sequence needs at least one token")
    if any("" in f for f in fields):  # ("1,,2" was read as 1,2: a token lost in a copy went unnoticed)
        raise UsageError(f"--input-ids {text!r}: an empty token id (two commas in a row, or one at an end)")
    try:
        rows = [[int(t) for t in f] for f in fields]
    except ValueError:
        raise UsageError(f"--input-ids {text!r}: expected comma-separated integers, ';' between sequences") from None
    return rows


def generate(
    export_dir: Annotated[Path, typer.Argument(help="A `dsx export` output.", show_default=False)],
    input_ids: Annotated[str | None, typer.Option("--input-ids", help="Token ids: '1,2,3' or a batch '1,2,3;4,5,6'.")] = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text, encoded with the bundled byte-level tokenizer "
                                                "(tiny model only).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate per sequence.")] = 16,
    speculate: Annotated[int, typer.Option("--speculate", help="Draft K tokens per step with the MTP program (0: off).")] = 0,
    dump_logits: Annotated[Path | None, typer.Option("--dump-logits", help="Save the prompt's base_logits "
                                                     "[batch, seq, vocab] (and mtp_logits [batch, seq-1, vocab]) "
                                                     "to this .npz.")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Also write the result (tokens, acceptance) "
                                                "to this JSON file.")] = None,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Decode greedily with Paddle Inference. With --speculate K the MTP draft proposes K tokens and one
    base step verifies them all (longest matching prefix + a bonus token); the output is the same as
    without speculation, in fewer base steps.

    Examples:
      dsx generate build/tiny-export --input-ids 0,5,9,17 --max-new-tokens 8
      dsx generate build/tiny-export --prompt "hello" --max-new-tokens 16 --speculate 1
      python -m paddle.distributed.launch --nproc_per_node 2 $(which dsx) generate build/tp2-export --input-ids 0,5
    """
    import numpy as np

    from ds_export.export.runtime import Session, generate as run_generate, is_main_rank

    o = Out(json, quiet)
    if (input_ids is None) == (prompt is None):
        raise UsageError("give exactly one of --input-ids and --prompt")
    if max_new_tokens < 1 or not 0 <= speculate <= 5:
        raise UsageError("--max-new-tokens must be >= 1 and --speculate 0..5")
    for path, option in ((dump_logits, "--dump-logits"), (report, "--report")):
        check_file_target(path, option)
    if prompt is not None:
        from ds_export.tiny_tokenizer import encode, is_this_tokenizer

        if not is_this_tokenizer(Path(export_dir) / "tokenizer.json"):  # (R1's ids are not bytes: wrong, silently)
            raise UsageError(f"--prompt: {export_dir} is not the tiny model's export (its tokenizer.json is not dsx's "
                             "byte-level one), and dsx encodes text only with that",
                             hint="give the prompt's token ids with --input-ids (from the model's own tokenizer)")
        rows = [encode(prompt)]
    else:
        rows = _parse_ids(input_ids)
    with shared(export_dir, "dsx generate"):  # (its programs load here: not while an export --force replaces them)
        sess = Session(export_dir, speculate=bool(speculate) or dump_logits is not None and
                       (Path(export_dir) / "mtp").is_dir())
    res = run_generate(sess, rows, max_new_tokens, speculate=speculate, dump_logits=dump_logits is not None)
    if not is_main_rank():  # a tensor-parallel job: every rank computed the same; rank 0 reports
        return
    if dump_logits is not None:
        with atomic_open(dump_logits, "wb") as f:  # (exactly the path given: no .npz appended)
            np.savez(f, **res.logits)
    rep = res.to_json()
    if report is not None:
        atomic_write_json(report, rep)
    o.result(rep)
    for i, toks in enumerate(res.tokens):
        o.print(f"[{i}] " + ",".join(map(str, toks)))
    if res.drafted:
        o.print(f"acceptance rate {rep['acceptance_rate']:.2%}, {rep['tokens_per_base_step']:.2f} tokens per "
                f"base step ({res.base_steps} verify steps)")
