#!/usr/bin/env bash
# The row-tile tensor-core path (mma-rows, session 10) screened on the H200: each warp owns 16 rows over the
# CTA's K slice, A staged once per CTA in the operand order, mma-ks's pair decode (a permute and one shared
# load per packed byte), a window's statistics loaded once per row. Built on a session without a device:
# its loop is about 4 SASS instructions per packed byte and lane (SIMT's served loop: about 8), and the
# question this screen answers is whether the H200 turns that into time. The sweep: 4- and 8-byte loads
# (windows of 32 and 64 values, one block at blocksize 64), 8-16 warps, groups of 1-4 windows with and
# without the prefetch, both pair tables, split-K 1-4.
# Session 12 (no device): SPANS=2 LOADS=16 screens 16-byte loads at blocksize 64, a window over two blocks
# with each block's part in its own batch columns of the n8 (span 2: 4 batch rows per n8, so M <= 4 with
# MTILES=8, M = 8 with MTILES=16). Session 11's profile: the 8-byte loads touch 16 L1 lines per 512 bytes
# (L1/TEX 80% busy); 16-byte loads touch 8. A span that does not match the problem's blocksize is refused
# at plan time (a failed config in the screen, with the reason). LUTS=pairx,prmt adds the byte-permute decode
# (codes in registers: no lookups through the L1, about twice the loop's instructions).
# Session 15 (no device): PERSISTS=0,1 adds stream-K (persist 1: the resident CTAs take even runs of
# (row tile, group) units; rows_per_warp 16 and mtile 8; ksplit: CTAs per resident slot).
# Usage: [M=1] [MTILES=8] [LUTS=pair,pairx] [WARPS=8,14,16] [UNROLLS=1,2,4] [LOADS=4,8] [SPANS=1]
#        [KSPLITS=1,2,4] [PQS=0] [PREFETCHES=0,1] [PERSISTS=0] [NAME=rows] [TABLES=..] bash ci/explore-rows.sh [PROBLEMS...]
#        (TABLES= empty: no knob tables; unset: the default knobs)
#        (the screen: ci/explore-screen.sh)
set -uo pipefail
[ $# -eq 0 ] && set -- 28672x8192 8192x8192 14336x4096 4096x14336
m=${M:-1}
SWEEP="mma=mma-rows lut=${LUTS:-pair,pairx} load_bytes=${LOADS:-4,8} rows_per_warp=16 mtile=${MTILES:-8} \
warps=${WARPS:-8,14,16} unroll=${UNROLLS:-1,2,4} span=${SPANS:-1} prmt_quarters=${PQS:-0} prefetch=${PREFETCHES:-0,1} persist=${PERSISTS:-0} scale=block astage=shared wload=stream \
ksplit=${KSPLITS:-1,2,4} m=$m dtype=bf16 quant=nf4" NAME=${NAME:-rows}-m$m M=$m \
TABLES=${TABLES-warps unroll load_bytes lut ksplit} exec bash "$(dirname "$0")/explore-screen.sh" "$@"
