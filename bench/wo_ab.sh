#!/usr/bin/env bash
# Weight-only A/B on the GPU machine, one line a row: a standalone weight-only build (NEW) as "new",
# another (OLD) as "old", any further builds (LIBS) and algo words (WORDS), and torch, all timed
# interleaved by bench/gpu_gemm_weight_only.py --ab. Builds come from bench/wo_alt_lib.sh (seconds, no
# CUTLASS), so a kernel change is timed without the full libdsx build:
#   bench/wo_alt_lib.sh . new.so && bench/wo_alt_lib.sh HEAD old.so        (here)
#   NEW=new.so OLD=old.so SHAPES=36864x7168 MS=1,8,16 bench/wo_ab.sh       (there, $OUT set)
# Environment: NEW, OLD (required); SHAPES (default the six DeepSeek-V3 shapes), MS (1,8,9,12,16),
# LAYOUT (bits,group; 4,-1), LIBS (comma-separated .so), WORDS (e.g. w8s8d2b2+30000000: warps, splits,
# slots, steps a slot, + hex algo bits), ROUNDS (8). The raw rows go to $OUT/ab (or out/ab).
# Each line also gives both builds' outputs checked against torch's ("err new E old E": the largest difference, in
# units of torch's rms; bench/tune_auto.py --ab-summary flags a row whose new error is far above the old's).
set -euo pipefail
: "${NEW:?NEW=standalone build to time}" "${OLD:?OLD=build to time against}"
out=${OUT:-out}/ab
log=$(mktemp)
python3 bench/wo_with_lib.py "$NEW" bench/gpu_gemm_weight_only.py --out "$out" \
  --shapes "${SHAPES:-36864x7168,7168x18432,2048x7168,4096x7168,7168x2048,24576x1536}" --ms "${MS:-1,8,9,12,16}" \
  --ab "${WORDS:-w3s1d1b1}" --alt-lib "$OLD" --ab-rounds "${ROUNDS:-8}" --ab-layout "${LAYOUT:-4,-1}" \
  ${LIBS:+--ab-libs "$LIBS"} > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
# (w3s1d1b1, the default word, is refused on purpose: only auto, old, the builds and torch are timed)
python3 - "$log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith('{"N"') or '"us_auto"' not in line:
        continue
    r = json.loads(line)
    extra = " ".join(f"{k[3:]} {v}" for k, v in r.items() if k.startswith("us_") and k not in ("us_auto", "us_alt", "us_torch"))
    print(f"{r['bits']}/{r['group']} {r['N']}x{r['K']} M={r['M']:>2} new {r['us_auto']:>7} old {r.get('us_alt', '-'):>7} "
          f"torch {r.get('us_torch', '-'):>7} x{r.get('x_auto', '-')} (old x{r.get('x_alt', '-')}) {extra} "
          f"err new {r.get('err_auto', '-')} old {r.get('err_alt', '-')} cfg {tuple(r['config'].values())}")
PY
rm -f "$log"
