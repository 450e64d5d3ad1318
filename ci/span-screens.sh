#!/usr/bin/env bash
# Session 13's span screens in one device call, for any GPU: for each (shape, M), the span-2 part of
# mma-rows (16-byte loads at blocksize 64; mtile 8 up to M = 4, 16 at M = 8) screened with the kernel the
# runtime serves on this GPU timed beside it (ci/served_config.py -> GIVEN), then the screens turned into
# serving-table entries (ci/table_from_screens.py: the fastest gated config per problem, where faster than
# bnb). Everything lands in $OUT/span-screens.tar.gz (the device returns at most 8 files) plus
# $OUT/span-table.json and $OUT/span-screens.txt (each problem's best and the served kernel's ratio).
# Usage: [PROBLEMS='28672x8192:1 8192x8192:8 ...'] [STAGE_TIMEOUT=60] [WARPS=8,14,16] [UNROLLS=1,2]
#        [KSPLITS=1,2,4] [PREFETCHES=0,1] [PQS=0] [PERSISTS=0] [LUTS=pairx] bash ci/span-screens.sh
#        (PQS=0,1,2: session 14's prmt_quarters, part of pairx's decode by byte permutes; LUTS=pairx,prmt adds
#        the decode by permutes alone (configs pairing prmt with PQS > 0 are refused by the space); PERSISTS=0,1: session
#        15's stream-K; 16-row batch tiles (M = 8) take no stream-K)
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
work=$(mktemp -d)
PROBLEMS=${PROBLEMS:-"28672x8192:1 14336x4096:1 4096x14336:1 8192x8192:1 4096x4096:1 28672x8192:4 \
28672x8192:8 14336x4096:8 8192x8192:8 4096x14336:8"}
for p in $PROBLEMS; do
  shape=${p%%:*} m=${p##*:}
  mt=8; [ "$m" -gt 4 ] && mt=16
  given=$(python3 ci/served_config.py "$shape" "$m") || { echo "span-screens: no served config for $shape M=$m" >&2; exit 1; }
  echo "== $shape M=$m (served: ${given:-bnb})"
  OUT=$work GIVEN="$given" NAME=span SPANS=2 LOADS=16 LUTS=${LUTS:-pairx} MTILES=$mt WARPS=${WARPS:-8,14,16} \
    UNROLLS=${UNROLLS:-1,2} KSPLITS=${KSPLITS:-1,2,4} PQS=${PQS:-0} PREFETCHES=${PREFETCHES:-0,1} PERSISTS=${PERSISTS:-0} \
    M=$m STAGE_TIMEOUT=${STAGE_TIMEOUT:-60} TABLES= bash "$(dirname "$0")/explore-rows.sh" "$shape" | grep -E "^(exhaustive|given)"
done 2>&1 | tee "$OUT/span-screens.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1     # the loop runs in a subshell: its exit stops the table step here
python3 ci/table_from_screens.py "$work"/span-m*-*.json -o "$OUT/span-table.json" | tee -a "$OUT/span-screens.txt"
tar -czf "$OUT/span-screens.tar.gz" -C "$work" .
rm -rf "$work"
