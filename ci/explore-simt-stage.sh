#!/usr/bin/env bash
# SIMT with A staged lane-major in shared memory, 16-warp CTAs and a register cap, M = 1, on the H200
# (session 8). The L1/TEX wavefronts of a SIMT step (examples/h200/matmul/simt-s7's profile: 83% busy)
# counted per 2 KiB of W (r4): 16 for W, 64 for A read as it lies (each 16-byte load of a warp spans 16
# lines), 64 (pairx) or 128 (shared) for the code lookups. Lane-major A takes 16; 16-warp CTAs share one
# 64 KiB pair table. (Session 8 also screened a register cap, __maxnreg__ 64 / 80: it tied or lost at every
# shape and was removed; examples/h200/matmul/simt-s8.)
# Session 9 adds lut pairf (the float pair table with 256-byte rows: a permute, an 8-byte load and two FMAs
# per packed byte, against pairx's permute, load, two widening instructions and two FMAs) and screens it
# beside pairx and pair with A staged: LUTS=pairx,pairf,pair ASTAGES=shared WARPS=8,16 KSPLITS=1,2.
# Usage: [LUTS=..] [ASTAGES=..] [WARPS=..] [RPWS=..] [LOADS=..] [KSPLITS=..] [NAME=..] [TABLES=..]
#        bash ci/explore-simt-stage.sh [PROBLEMS...]
# (the defaults are session 8's sweep; NAME prefixes the output files, TABLES names the knobs whose best
# screens are tabulated; ci/explore-simt-pairs.sh is session 7's sweep through this script; the screen
# itself is ci/explore-screen.sh)
set -uo pipefail
[ $# -eq 0 ] && set -- 28672x8192 8192x8192 14336x4096
SWEEP="mma=simt lut=${LUTS:-shared,pairx} load_bytes=${LOADS:-16} rows_per_warp=${RPWS:-4,8} mtile=1 \
warps=${WARPS:-2,8,16} prefetch=0,1 scale=block astage=${ASTAGES:-global,shared} wload=stream ksplit=${KSPLITS:-1} \
m=1 dtype=bf16 quant=nf4" NAME=${NAME:-simtstage} M=1 TABLES=${TABLES-astage warps lut} \
  exec bash "$(dirname "$0")/explore-screen.sh" "$@"
