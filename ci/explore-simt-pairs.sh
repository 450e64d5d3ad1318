#!/usr/bin/env bash
# SIMT with the 16-bit pair decodes (lut pairx / prmt) against the 16-entry table (lut shared), M = 1,
# on the H200 (session 7). The ncu profile of the SIMT winner (examples/h200/matmul/simt-s7) had the
# L1/TEX pipe 82.7% busy, one shared-memory lookup per value; pairx looks up a packed byte (two
# values) per 4-byte load, prmt looks nothing up. Usage: bash ci/explore-simt-pairs.sh [PROBLEMS...]
# (session 7's sweep, through ci/explore-simt-stage.sh)
[ $# -eq 0 ] && set -- 28672x8192 8192x8192 14336x4096 4096x14336 4096x4096
LUTS=shared,pairx,prmt LOADS=8,16 RPWS=2,4,8 WARPS=1,2,4,8 ASTAGES=global NAME=simtpairs TABLES=lut \
  STAGE_TIMEOUT=${STAGE_TIMEOUT:-120} exec bash "$(dirname "$0")/explore-simt-stage.sh" "$@"
