#!/usr/bin/env bash
# Re-tune the weight-only GEMM's measured table at some rows and layouts, in one call on the GPU machine
# (the procedure of the seventeenth to twenty-fifth sessions, done by hand before):
#   1. this tree's weight-only GEMM built alone (bench/wo_alt_lib.sh, seconds, no CUTLASS) times the candidate
#      words against the rules at every DeepSeek-V3 tensor-parallel shape (bench/tune_auto.py, tables off);
#   2. the confirmed words are emitted over the shipped table (tune_auto --emit TABLE new.jsonl: the new
#      sweep decides the rows it swept, the table keeps the rest);
#   3. a build with the new table is timed against this tree's (bench/wo_ab.sh, interleaved with torch) at every
#      row whose word changed (tune_auto --changed), or at AB_SHAPES x AB_MS where AB_SHAPES is given.
# The shipped table is not touched here (the tree on the GPU machine is a copy): the new one comes back in
# $OUT/<the table's file name> with its diff; copy it into csrc/cuda/ and run the GPU tests on it.
#   OUT=out/retune LAYOUTS=4,-1/4,128 MS=9,10,11,12,13,14,15,16 ROWS_FROM=9 bench/wo_retune.sh
#   OUT=out/retune LAYOUTS=4,-1/4,128/4,64 MS=40,48,56,64 ROWS_FROM=33 bench/wo_retune.sh   (33..64: one launch through wgmma)
# MS lies inside one row band (1..16, 17..32, 33..64), ROWS_FROM its first row or later (bench/tune_auto.py).
# Environment: LAYOUTS (bits,group pairs separated by /; 4,-1), MS (9..16), ROWS_FROM (the first row the
# smallest M stands for; 9), TP (1,2,4,8), AB_SHAPES (none: the changed rows), AB_MS (MS), AB_LAYOUT (the
# first of LAYOUTS), AB_AT (of the changed rows, only these, e.g. MS), ROUNDS (4), BASE_SO (this tree's build by bench/wo_alt_lib.sh, made beforehand: not built
# again), CARD (h200 / h100: the card whose table is emitted over, csrc/cuda/gemm_weight_only_tuned.inc /
# gemm_weight_only_tuned_h100.inc; the GPU must be that card, since the A/B's builds pick their table by the card
# they run on), PACK (set: the five files packed into $OUT.tgz, one file: the GPU machine returns about eight a call).
# Five files come back: tune.jsonl, tune.log, the table, its diff against the shipped one, ab.log (its last lines
# the sums, and both builds' outputs checked against torch's at every row: `tune_auto --emit ... --slower ab.log`
# keeps the shipped word where the new output is off, as where the new word was timed slower).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-out/retune}
layouts=${LAYOUTS:-4,-1}
ms=${MS:-9,10,11,12,13,14,15,16}
mkdir -p "$out"
work=$(mktemp -d)
card=${CARD:-h200}
case $card in
  h200) table=csrc/cuda/gemm_weight_only_tuned.inc ;;
  h100) table=csrc/cuda/gemm_weight_only_tuned_h100.inc ;;
  *) echo "wo_retune.sh: CARD=$card: expected h200 or h100" >&2; exit 2 ;;
esac
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || true)
case $gpu in
  *"${card^^}"*) ;;
  *) echo "wo_retune.sh: CARD=$card but the GPU is '${gpu:-none}': the A/B would time another card's table" >&2
     exit 2 ;;
esac
new_table=$out/$(basename "$table")

tree_src=$(bench/wo_src_hash.sh .)
if [ -n "${BASE_SO:-}" ] && [ "$(head -1 "$BASE_SO.src" 2>/dev/null)" = "$tree_src" ] && [ "$(sed -n 2p "$BASE_SO.src")" = "flags: " ]; then
  # (built beforehand from this tree's sources, e.g. on a machine without a GPU: a minute saved)
  echo "== this tree's weight-only GEMM: $BASE_SO"
  cp "$BASE_SO" "$work/base.so"
else
  [ -z "${BASE_SO:-}" ] || echo "== BASE_SO $BASE_SO was not built from this tree's sources (its .src): building"
  echo "== build: this tree's weight-only GEMM"
  bench/wo_alt_lib.sh . "$work/base.so"
fi

echo "== sweep: layouts $layouts, rows $ms (from ${ROWS_FROM:-9}), tp ${TP:-1,2,4,8}"
# (straight into $out: a sweep cut short by the call's time limit still comes back, row by row)
rm -f "$out/tune.jsonl"
python3 bench/wo_with_lib.py "$work/base.so" bench/tune_auto.py --kernel wo --out "$out" --layouts "$layouts" \
  --ms "$ms" --rows-from "${ROWS_FROM:-9}" --tp "${TP:-1,2,4,8}" > "$out/tune.log" 2>&1 \
  || { tail -30 "$out/tune.log"; exit 1; }
grep -v '^{' "$out/tune.log" | tail -15 || true

echo "== emit over the shipped table"
python3 bench/tune_auto.py --kernel wo --emit "$table" "$out/tune.jsonl" --card "$card" > "$new_table"
diff "$table" "$new_table" > "$out/table.diff" || true
echo "$(grep -c '^[<>] {' "$out/table.diff" || true) entry lines changed (table.diff)"

echo "== A/B: the new table's build (new) against this tree's (old)"
cp "$table" "$work/shipped.inc" && cp "$new_table" "$table"
bench/wo_alt_lib.sh . "$work/new.so" || { cp "$work/shipped.inc" "$table"; exit 1; }
cp "$work/shipped.inc" "$table"
if [ -n "${AB_SHAPES:-}" ]; then  # fixed shapes and rows
  echo "${AB_LAYOUT:-${layouts%%/*}} $AB_SHAPES ${AB_MS:-$ms}" > "$work/ab_rows.txt"
else  # every row whose word changed
  python3 bench/tune_auto.py --kernel wo --changed "$work/shipped.inc" "$new_table" > "$work/ab_rows.txt"
  echo "$(tail -1 "$work/ab_rows.txt" | cut -c3-) (keys rows) whose word changed"
  if [ -n "${AB_AT:-}" ]; then  # only those rows (e.g. the sweep's M: a wide band changes hundreds of rows)
    python3 - "$work/ab_rows.txt" "$AB_AT" <<'PY'
import sys
keep = {int(m) for m in sys.argv[2].split(",")}
lines = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
out = [f"{a} {b} {','.join(r)}" for a, b, rows in lines if (r := [m for m in rows.split(",") if int(m) in keep])]
open(sys.argv[1], "w").write("".join(l + "\n" for l in out))
print(f"A/B at rows {sys.argv[2]} only: {len(out)} keys")
PY
  fi
fi
{ grep -v '^#' "$work/ab_rows.txt" || true; } | while read -r layout shapes rows; do
  OUT="$work" NEW="$work/new.so" OLD="$work/base.so" SHAPES="$shapes" MS="$rows" LAYOUT="$layout" \
    ROUNDS="${ROUNDS:-4}" bench/wo_ab.sh < /dev/null
done | tee "$out/ab.log"
# summed over the rows timed, and the rows that moved more than 2% either way
python3 bench/tune_auto.py --ab-summary "$out/ab.log" | tee -a "$out/ab.log"
rm -rf "$work"
if [ -n "${PACK:-}" ]; then
  tar -C "$(dirname "$out")" -czf "$out.tgz" "$(basename "$out")" && rm -rf "$out" && echo "packed: $out.tgz"
fi
