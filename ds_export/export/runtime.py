"""Run an export with Paddle Inference: greedy decoding, with or without MTP speculation.

The base program is one step function (input_ids [B, S], cache_lens [B], cache) ->
(logits, hidden, cache): prefill, decode and verification are the same call.
With speculation each base step verifies 1 + K tokens ([t0, d1..dK]) and keeps
the longest prefix of drafts that equal the base model's own argmax, plus its
bonus token (the MTP accept kernel from csrc/). The draft program sees, at
position t, token t+1 and the base hidden state of position t; it catches up
on the committed positions after every verification, then chains K drafts on
its own hidden output. Greedy output is the same with and without speculation up to
near-ties: a verification step runs 1 + K tokens where plain decoding runs one, so the base
model's float sums differ in the last bits, and with FP8 activations such a difference can flip
one activation's rounding; where the top two logits are that close the two runs may pick
different tokens (`check_speculative_greedy` tells such a tie from a real inconsistency).

A tensor-parallel export (tensor_parallel_degree N > 1) runs as N processes, one per rank, under
`python -m paddle.distributed.launch --nproc_per_node N` (gloo on CPU, NCCL on GPUs): each loads
OUT/rank_{r}/ (and OUT/mtp/rank_{r}/), joins the group before its predictor runs the programs'
collectives, and computes the same tokens; `is_main_rank()` says which one reports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ds_export.errors import DsxError, UsageError
from ds_export.export.exporter import check_export
from ds_export.export.quiet import quiet_paddle


class Program:
    """One saved program under Paddle Inference (CPU; GPU when Paddle has CUDA)."""

    def __init__(self, prefix: Path, *, custom_ops: bool = False):
        quiet_paddle()
        import paddle
        from paddle import inference

        if custom_ops:  # a custom op's .so must be loaded in this process before create_predictor
            from ds_export.export.ops import load_ops

            load_ops()
        cfg = inference.Config(str(prefix) + ".json", str(prefix) + ".pdiparams")
        # The dsx ops have CPU kernels only (their CUDA kernels are not wired in yet): such programs stay on CPU.
        if not custom_ops and paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
            cfg.enable_use_gpu(256, 0)
        else:
            cfg.disable_gpu()
        cfg.disable_glog_info()
        cfg.disable_mkldnn()  # its pass check prints one line per op to stdout; the plain CPU kernels are exact
        try:
            self.pred = inference.create_predictor(cfg)
        except (RuntimeError, ValueError, OSError) as e:  # (Paddle's C++ exceptions arrive as RuntimeError)
            # (dsx generate checks an export's file sizes, not their bytes: a file damaged in place loads here)
            raise DsxError(f"{prefix}.json / .pdiparams: Paddle Inference cannot load this program "
                           f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})",
                           hint="check the export with dsx verify SRC --reference ORIGINAL --export DIR, or export "
                                "it again") from e
        self.inputs = self.pred.get_input_names()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run on numpy inputs (in the program's input order); bfloat16 goes in and out as ml_dtypes arrays.

        Paddle tensors in and out (`predictor.run(list)`): the handle API's copy_from_cpu has no
        bfloat16, which a bf16 export's cache needs.
        """
        import ml_dtypes
        import paddle

        bf16 = np.dtype(ml_dtypes.bfloat16)
        ins = []
        for a in arrays:
            a = np.ascontiguousarray(a)
            ins.append(paddle.to_tensor(a.view(np.uint16)).view(paddle.bfloat16) if a.dtype == bf16
                       else paddle.to_tensor(a))
        outs = []
        for t in self.pred.run(ins):
            if t.dtype == paddle.bfloat16:
                outs.append(t.view(paddle.uint16).numpy().view(bf16))
            else:
                outs.append(t.numpy())
        return outs


@dataclass
class Result:
    tokens: list[list[int]]  # generated tokens per sequence
    base_steps: int  # base-model calls after the prefill
    drafted: int = 0
    accepted: int = 0
    logits: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {"tokens": self.tokens, "base_steps": self.base_steps}
        if self.drafted:
            # A verification step commits one token per sequence plus its accepted drafts: 1.0 with none accepted,
            # 1 + K with all. (Counting the prefill's token, or the tokens kept after cutting to max_new_tokens,
            # would not be a step's yield: 16 tokens over 15 steps read 1.07 with nothing accepted.)
            seq_steps = max(1, self.base_steps * len(self.tokens))
            d.update(drafted=self.drafted, accepted=self.accepted, acceptance_rate=self.accepted / self.drafted,
                     tokens_per_base_step=(seq_steps + self.accepted) / seq_steps)
        return d


def launch_env() -> tuple[int, int]:
    """(rank, world) of this process in a paddle.distributed.launch job; (0, 1) outside one."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0")), int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def is_main_rank() -> bool:
    return launch_env()[0] == 0


def _rank_dir(d: Path, tp: int) -> Path:
    """Where this process's program of a tp-degree export lives (joins the process group when tp > 1)."""
    if tp == 1:
        return d
    rank, world = launch_env()
    if world != tp:
        raise UsageError(f"{d}: a tensor-parallel export over {tp} ranks; this is {world} process(es)",
                         hint=f"run it as python -m paddle.distributed.launch --nproc_per_node {tp} $(which dsx) "
                              "generate ...")
    import paddle.distributed as dist

    if not dist.is_initialized():
        dist.init_parallel_env()
    return d / f"rank_{rank}"


class Session:
    def __init__(self, export_dir: str | Path, *, speculate: bool = False):
        d = Path(export_dir)
        check_export(d)
        self.cfg = json.loads((d / "config.json").read_text())
        tp = int(self.cfg.get("tensor_parallel_degree") or 1)
        self.max_len = int(self.cfg["infer_model_max_seq_len"])
        import ml_dtypes

        self.dtype = {"float32": np.float32, "float16": np.float16}.get(self.cfg["infer_model_dtype"],
                                                                        ml_dtypes.bfloat16)
        self.width = int(self.cfg["kv_lora_rank"]) + int(self.cfg["qk_rope_head_dim"])
        self.layers = int(self.cfg["num_hidden_layers"])
        self.base = Program(_rank_dir(d, tp) / "model", custom_ops=bool(self.cfg.get("dsx_custom_ops")))
        self.mtp = None
        if speculate:
            if not (d / "mtp" / "config.json").exists():
                raise UsageError(f"{d}: has no MTP draft (export it with --speculate)")
            mcfg = json.loads((d / "mtp" / "config.json").read_text())
            self.mtp = Program(_rank_dir(d / "mtp", tp) / "model", custom_ops=bool(mcfg.get("dsx_custom_ops")))

    def cache(self, layers: int, batch: int) -> np.ndarray:
        return np.zeros((layers, batch, self.max_len, self.width), self.dtype)


def export_tp(export_dir: str | Path) -> int:
    return int(json.loads((Path(export_dir) / "config.json").read_text()).get("tensor_parallel_degree") or 1)


def dsx_executable() -> str:
    """The `dsx` console script of this installation (what a launched rank process runs)."""
    exe = Path(sys.executable).with_name("dsx")
    found = str(exe) if exe.is_file() else shutil.which("dsx")
    if not found:
        raise DsxError("cannot find the dsx command next to this Python or on PATH",
                       hint="install dsx (pip install -e .) in the environment that runs this")
    return found


def launch_ranks(n: int, args: list[str], log_dir: Path, timeout: float | None = None) -> None:
    """Run `dsx ARGS` as n processes of one paddle.distributed job on this machine (one per rank)."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(n), "--log_dir",
           str(log_dir), dsx_executable(), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        # each rank's last error line; the launcher stops the others with SIGTERM once one fails, and they say
        # "interrupted" (dsx handles SIGTERM as Ctrl-C): the cause is the line of a rank that was not stopped
        said = [next((ln for ln in reversed(p.read_text(errors="replace").splitlines())
                      if ln.startswith("dsx: error:")), None) for p in sorted(Path(log_dir).glob("workerlog.*"))]
        said = [ln for ln in said if ln]
        last = next((ln for ln in said if not ln.startswith("dsx: error: interrupted")), said[0] if said else None)
        raise DsxError(f"{n}-rank job failed (exit {res.returncode}): {last or 'see the worker logs'}",
                       hint=f"worker logs: {log_dir}")


def generate_any(export_dir: str | Path, prompts: list[list[int]], max_new_tokens: int, *, speculate: int = 0,
                 dump_logits: bool = False) -> tuple[dict, dict]:
    """`generate` on any export: in this process (tp = 1, or already one rank of a job), else as one
    process per rank through `launch_ranks`. Returns (Result.to_json() + "ranks", logits by name)."""
    d = Path(export_dir)
    tp = export_tp(d)
    if tp == 1 or launch_env()[1] == tp:
        s = Session(d, speculate=bool(speculate) or dump_logits and (d / "mtp" / "config.json").exists())
        res = generate(s, prompts, max_new_tokens, speculate=speculate, dump_logits=dump_logits)
        return dict(res.to_json(), ranks=tp), res.logits
    with tempfile.TemporaryDirectory(prefix="dsx-ranks-") as tmp:
        t = Path(tmp)
        args = ["generate", str(d), "--input-ids", ";".join(",".join(map(str, p)) for p in prompts),
                "--max-new-tokens", str(max_new_tokens), "--speculate", str(speculate), "--report",
                str(t / "result.json"), "-q"] + (["--dump-logits", str(t / "logits.npz")] if dump_logits else [])
        launch_ranks(tp, args, t / "log")
        out = json.loads((t / "result.json").read_text())
        logits = dict(np.load(t / "logits.npz")) if dump_logits else {}
    return dict(out, ranks=tp), logits


# A divergence between speculative and plain greedy output counts as a near-tie when, given the
# common prefix, both tokens' base logits lie within this fraction of the logits' range (max - min)
# of the top one. Measured on the tiny recipe (a8w8 FP8 activations, float32): verification steps
# move later logits by up to 0.12 (range ~5) once one activation's FP8 rounding flips, ~1e-6 before.
TIE_FRACTION = 0.03


def check_speculative_greedy(export_dir: str | Path, prompts: list[list[int]], spec: list[list[int]],
                             plain: list[list[int]], *, tie_fraction: float = TIE_FRACTION) -> list[dict]:
    """Check that speculative output `spec` is the base model's greedy output, as `plain` is, up to
    near-ties. At each divergence (first, then again after continuing plain decoding from the
    speculative prefix) both tokens must be within tie_fraction of the logits' range of the top
    logit, given the common prefix (one prefill); else DsxError. Returns the ties found."""
    d = Path(export_dir)
    ties = []
    for b, prompt in enumerate(prompts):
        want, got = list(plain[b]), list(spec[b])
        n = len(got)
        while want != got:
            i = next((j for j, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
            if i >= n:
                break
            _, lg = generate_any(d, [prompt + got[:i]], 1, dump_logits=True)
            row = lg["base_logits"][0, -1].astype(np.float64)
            top, span = float(row.max()), float(row.max() - row.min())
            a, s = int(want[i]), int(got[i])
            worst = max(top - row[a], top - row[s])
            tie = dict(sequence=b, position=i, plain=a, speculative=s, margin=float(abs(row[a] - row[s])),
                       below_top=float(worst), tolerance=tie_fraction * span)
            if worst > tie_fraction * span:
                raise DsxError(
                    f"speculative decoding changed the greedy output: sequence {b}, token {i}: plain decoding gave "
                    f"{a}, speculation {s}, and one of them is {worst:.4g} below the base model's top logit "
                    f"(a near-tie is within {tie_fraction * span:.4g}): the export or the draft is inconsistent",
                    hint="re-export (dsx export --speculate --force) and rerun; if it persists, report it with the recipe")
            ties.append(tie)
            # Continue plain decoding from the speculative prefix: the rest must agree again (or tie again).
            rest, _ = generate_any(d, [prompt + got[: i + 1]], n - i - 1) if i + 1 < n else ({"tokens": [[]]}, {})
            want = got[: i + 1] + rest["tokens"][0]
    return ties


def _pad(rows: list[list[int]]) -> np.ndarray:
    width = max(len(r) for r in rows)
    return np.array([r + [0] * (width - len(r)) for r in rows], np.int64)


def _gather(a: np.ndarray, idx) -> np.ndarray:
    return a[np.arange(a.shape[0]), np.asarray(idx)]


def generate(s: Session, prompts: list[list[int]], max_new_tokens: int, *, speculate: int = 0,
             dump_logits: bool = False) -> Result:
    if not prompts or any(not p for p in prompts):
        raise UsageError("every prompt needs at least one token")
    vocab = int(s.cfg["vocab_size"])
    bad = next((t for p in prompts for t in p if not 0 <= t < vocab), None)
    if bad is not None:  # (Paddle's embedding raised an internal error on it)
        raise UsageError(f"token id {bad}: outside the model's vocabulary 0..{vocab - 1}")
    lens = np.array([len(p) for p in prompts], np.int64)
    if int(lens.max()) + max_new_tokens + speculate + 1 > s.max_len:
        raise UsageError(f"prompt ({int(lens.max())}) + --max-new-tokens ({max_new_tokens}) + drafts exceed the "
                         f"export's max sequence length {s.max_len}", hint="export with a larger --max-seq-len")
    if speculate and s.mtp is None:
        raise UsageError("--speculate needs a session opened with the MTP draft")
    b = len(prompts)
    cache = s.cache(s.layers, b)
    logits, hidden, cache = s.base(_pad(prompts), np.zeros(b, np.int64), cache)
    prompt_hidden = hidden  # the draft's prompt logits reuse this prefill
    res = Result([[] for _ in prompts], 0)
    if dump_logits:
        res.logits["base_logits"] = logits.astype(np.float32)
    t0 = _gather(logits, lens - 1).argmax(-1)
    for i in range(b):
        res.tokens[i].append(int(t0[i]))
    if not speculate:
        L = lens.copy()
        while min(map(len, res.tokens)) < max_new_tokens:
            logits, hidden, cache = s.base(t0[:, None].astype(np.int64), L, cache)
            res.base_steps += 1
            t0 = logits[:, 0].argmax(-1)
            L += 1
            for i in range(b):
                res.tokens[i].append(int(t0[i]))
    else:
        _speculative(s, prompts, lens, hidden, cache, t0, max_new_tokens, speculate, res)
    if dump_logits and s.mtp is not None and int(lens.min()) > 1:
        res.logits["mtp_logits"] = _mtp_prompt_logits(s, prompts, prompt_hidden)
    for t in res.tokens:
        del t[max_new_tokens:]
    return res


def _mtp_prompt_logits(s: Session, prompts, hidden: np.ndarray) -> np.ndarray:
    """The draft's prediction at each prompt position t from token t+1 and the base hidden of t
    (hidden: the prompt's prefill output)."""
    b = len(prompts)
    ids = _pad([p[1:] for p in prompts])
    lg, _, _ = s.mtp(ids, np.ascontiguousarray(hidden[:, : ids.shape[1]].astype(np.float32)), np.zeros(b, np.int64),
                     s.cache(1, b))
    return lg.astype(np.float32)


def _speculative(s: Session, prompts, lens, hidden, cache, t0, max_new: int, k: int, res: Result) -> None:
    from ds_export.native.kernels import mtp_accept_greedy

    b = len(prompts)
    mcache = s.cache(1, b)
    # Draft catch-up on the prompt: draft position t gets token t+1 (the last one is t0) and base hidden t.
    ids = _pad([p[1:] + [int(t0[i])] for i, p in enumerate(prompts)])
    hid = np.ascontiguousarray(hidden[:, : ids.shape[1]].astype(np.float32))
    mstart = np.zeros(b, np.int64)  # draft-cache position of the catch-up's first token
    last = lens - 1  # index (in the catch-up) of each sequence's newest committed position
    L = lens.copy()  # positions the base cache holds per sequence
    while min(map(len, res.tokens)) < max_new:
        mlg, mh, mcache = s.mtp(ids, hid, mstart, mcache)
        drafts = [_gather(mlg, last).argmax(-1)]
        h = _gather(mh, last)[:, None].astype(np.float32)
        for j in range(1, k):  # chain on the draft's own hidden output, at positions L, L+1, ...
            lg, h, mcache = s.mtp(drafts[-1][:, None].astype(np.int64), h, L + j - 1, mcache)
            drafts.append(lg[:, 0].argmax(-1))
            h = h.astype(np.float32)
        d = np.stack(drafts, 1).astype(np.int64)  # [B, K]
        logits, vh, cache = s.base(np.concatenate([t0[:, None].astype(np.int64), d], 1), L, cache)
        res.base_steps += 1
        accepted, count = mtp_accept_greedy(d, logits.argmax(-1).astype(np.int64), np.full(b, k, np.int32))
        res.drafted += b * k
        res.accepted += int((count - 1).sum())
        for i in range(b):
            res.tokens[i].extend(int(x) for x in accepted[i, : count[i]])
        # Committed: t0 and the accepted drafts at positions L .. L+n_acc; the bonus token is the new t0.
        # The draft catches up on exactly those positions (token p+1, base hidden p), overwriting its chain.
        n_acc = count.astype(np.int64) - 1
        ids = _pad([[int(x) for x in accepted[i, : count[i]]] for i in range(b)])
        hid = np.ascontiguousarray(vh[:, : ids.shape[1]].astype(np.float32))
        mstart, last = L.copy(), n_acc
        t0 = _gather(accepted, n_acc)
        L = L + n_acc + 1
        if int(L.max()) + k + 1 > s.max_len:
            raise DsxError(f"generation reached the export's max sequence length {s.max_len}")
