#!/usr/bin/env bash
# The row-tile tensor-core path (mma-rows, session 10) screened on the H200: each warp owns 16 rows over the
# CTA's K slice, A staged once per CTA in the operand order, mma-ks's pair decode (a permute and one shared
# load per packed byte), a window's statistics loaded once per row. Built on a session without a device:
# its loop is about 4 SASS instructions per packed byte and lane (SIMT's served loop: about 8), and the
# question this screen answers is whether the H200 turns that into time. The sweep: 4- and 8-byte loads
# (windows of 32 and 64 values, one block at blocksize 64), 8-16 warps, groups of 1-4 windows with and
# without the prefetch, both pair tables, split-K 1-4.
# Usage: [M=1] [MTILES=8] [LUTS=pair,pairx] [WARPS=8,14,16] [UNROLLS=1,2,4] [LOADS=4,8] [KSPLITS=1,2,4]
#        [NAME=rows] [TABLES=..] bash ci/explore-rows.sh [PROBLEMS...]
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
m=${M:-1}
name=${NAME:-rows}-m$m
s=""
for k in mma=mma-rows lut=${LUTS:-pair,pairx} load_bytes=${LOADS:-4,8} rows_per_warp=16 mtile=${MTILES:-8} \
         warps=${WARPS:-8,14,16} unroll=${UNROLLS:-1,2,4} prefetch=0,1 scale=block astage=shared wload=stream \
         ksplit=${KSPLITS:-1,2,4} m=$m dtype=bf16 quant=nf4; do
  s="$s --sweep $k"
done
python3 -m tuner.cli compile --family matmul $s --quiet 2>&1 | tail -1
problems=("$@"); [ ${#problems[@]} -eq 0 ] && problems=(28672x8192 8192x8192 14336x4096 4096x14336)
for sh in "${problems[@]}"; do
  timeout ${STAGE_TIMEOUT:-150} python3 -m tuner.cli bench --exhaustive --family matmul --shape $sh --m $m --finalists 6 \
     --time-cap 1 $s -o "$OUT/$name-$sh.json" 2>&1 | tr '\r' '\n' | grep -v ' [0-9]*/[0-9]* ([0-9]*%)' >> "$OUT/$name.txt"
done
for t in ${TABLES:-warps unroll load_bytes lut ksplit}; do python3 ci/explore_best.py --table $t "$OUT"/$name-*.json; done
grep "exhaustive best" "$OUT/$name.txt" | cut -c1-170
