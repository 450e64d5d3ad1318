#!/usr/bin/env bash
# Session 25's device call (issue 11): does reading A a chunk at a time (achunk) free enough registers for more
# warps an SM at batch 8-32, and do the warps pay for the exposed shared loads? On the CPU (NVRTC 13.5, sm_90)
# achunk takes the served M = 16 kernel from 109 to 89 registers, the 16-byte span-2 32-row batch tile (W read
# once at batch 16, as batch 8's served kernel does) from 182 to 128, batch 8's served kernel from 135 to 103, with
# no spills. On whichever card comes, everything under $OUT:
#   - the GPU tests of achunk (its gate configs at every dtype, bit for bit against achunk 0) and of regcap;
#   - the mma-rows sweep with achunk 0/1 (mtile 8/16/32) at M = 16 (four large shapes), M = 8, 32 and 1 (two
#     each), the served kernel timed beside each screen;
#   - the served table rebuilt from those screens (table.json), the runtime as served against bnb (mmbench).
set -uo pipefail
export PYTHONPATH=$PWD/.devsite:$PWD NF4TUNE_CACHE=$PWD/build/nf4cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
SW='mma=mma-rows load_bytes=8,16 rows_per_warp=16 mtile=8,16,32 span=1,2 warps=8,12,14,16 unroll=1,2,4'
SW="$SW ksplit=1,2,4,8 prefetch=0,1 lut=pair,pairx prmt_quarters=0 persist=0 scale=block astage=shared"
SW="$SW wload=stream dtype=bf16 quant=nf4 regcap=0 achunk=0,1"
DEADLINE=${DEADLINE:-560} SCREEN_NEED=${SCREEN_NEED:-60} STEPS=${STEPS:-'tests sweep table mmbench'} \
  TEST_FILES=${TEST_FILES:-tests/test_matmul_gpu.py} \
  TEST_K=${TEST_K:-'chunk_at_a_time or register_cap or m16-69 or m16-70 or m8-71 or m1-72 or (stream_k and 72)'} \
  SWEEP="$SW" \
  SWEEP_PROBLEMS=${SWEEP_PROBLEMS:-'28672x8192:16 8192x8192:16 14336x4096:16 4096x14336:16 28672x8192:8 8192x8192:8 28672x8192:32 8192x8192:32 28672x8192:1 8192x8192:1'} \
  bash ci/device-call.sh
