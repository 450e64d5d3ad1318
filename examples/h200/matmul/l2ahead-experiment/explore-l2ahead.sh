#!/usr/bin/env bash
# A record of the session-7 experiment: it needs l2ahead.patch applied (the knob was removed after it).
# The L2 prefetch (l2ahead) screened on the H200 (session 7): the served configs' neighbourhoods, every
# l2ahead value, so each config is paired with itself without the prefetch. Usage (on the GPU machine,
# after the site is set up): bash ci/explore-l2ahead.sh PART...
#   gate   the gate tests of the l2ahead configs (and the large-K and plain-absmax tests that use them)
#   ks     mma-ks register feed (pair/pairx, rows 16/32, unroll 1/2/4, prefetch, persist, stats) at M = 1
#   ksm    the same at M = 8 and 16 (8192x8192)
#   simt   SIMT (8/16-byte loads, 1-8 rows per warp, shared/pair LUT, prefetch, plain/stream) at M = 1
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
L2="l2ahead=0,1,2,4"
KS="mma=mma-ks stages=0 load_bytes=8 rows_per_warp=16,32 lut=pair,pairx unroll=1,2,4 prefetch=0,1 persist=0,1 stats=lanes,tile wload=stream ksplit=1,2 $L2"
SIMT="mma=simt load_bytes=8,16 rows_per_warp=1,2,4,8 mtile=1 lut=shared,pair prefetch=0,1 scale=block astage=global wload=plain,stream ksplit=1,2 $L2"
screen() {   # name, sweep, problems
  local name=$1 sweep=$2 problems=$3 s=""
  for k in $sweep; do s="$s --sweep $k"; done
  python3 -m tuner.cli compile --family matmul --dtype bf16 --quant nf4 --sweep m=${4:-1} $s --quiet 2>&1 | tail -1 | tee -a "$OUT/l2-$name.txt"
  for pm in $problems; do
    shape=${pm%%:*}; m=${pm##*:}
    timeout ${MM_TIMEOUT:-150} python3 -m tuner.cli bench --exhaustive --family matmul --shape $shape --m $m \
       --finalists ${MM_FINALISTS:-8} --time-cap ${MM_TIME_CAP:-1} $s -o "$OUT/l2-$name-$shape-m$m.json" 2>&1 \
       | tr '\r' '\n' | grep -v ' [0-9]*/[0-9]* ([0-9]*%)' | tee -a "$OUT/l2-$name.txt"
  done
}
for part in "$@"; do
  case $part in
    gate) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_matmul_gpu.py \
            -k "m1-31 or m2-32 or m1-33 or m16-34 or m4-35 or large_k or plain_absmax" 2>&1 | tee "$OUT/l2-gate.txt" ;;
    ks) screen ks "$KS mtile=8" "8192x8192:1 28672x8192:1 4096x4096:1 14336x4096:1 4096x14336:1 1024x4096:1" ;;
    ksm) screen ksm "$KS mtile=8,16" "8192x8192:8 8192x8192:16" 8,16 ;;
    simt) screen simt "$SIMT" "28672x8192:1 14336x4096:1 8192x8192:1" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
