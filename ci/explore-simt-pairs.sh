#!/usr/bin/env bash
# SIMT with the 16-bit pair decodes (lut pairx / prmt) against the 16-entry table (lut shared), M = 1,
# on the H200 (session 7). The ncu profile of the SIMT winner (examples/h200/matmul/simt-s7) had the
# L1/TEX pipe 82.7% busy, one shared-memory lookup per value; pairx looks up a packed byte (two
# values) per 4-byte load, prmt looks nothing up. Usage: bash ci/explore-simt-pairs.sh [PROBLEMS...]
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
s=""
for k in mma=simt lut=shared,pairx,prmt load_bytes=8,16 rows_per_warp=2,4,8 mtile=1 warps=1,2,4,8 prefetch=0,1 \
         scale=block astage=global wload=stream ksplit=1 m=1 dtype=bf16 quant=nf4; do s="$s --sweep $k"; done
python3 -m tuner.cli compile --family matmul $s --quiet 2>&1 | tail -1
problems=("$@"); [ ${#problems[@]} -eq 0 ] && problems=(28672x8192 8192x8192 14336x4096 4096x14336 4096x4096)
for sh in "${problems[@]}"; do
  timeout 120 python3 -m tuner.cli bench --exhaustive --family matmul --shape $sh --m 1 --finalists 6 --time-cap 1 $s \
     -o "$OUT/simtpairs-$sh.json" 2>&1 | tr '\r' '\n' | grep -v ' [0-9]*/[0-9]* ([0-9]*%)' >> "$OUT/simtpairs.txt"
done
python3 ci/explore_best.py --table lut "$OUT"/simtpairs-*.json
grep "exhaustive best" "$OUT/simtpairs.txt" | cut -c1-170
