#!/usr/bin/env bash
# Session 22's first device call (issue 11), useful on whichever card comes; everything under $OUT.
# On an H200 (the issue's targets are the H200's): the matmul GPU tests (the mtile-32 gate configs have not
# run there), the decode-mix screen at M = 1 and 8 (is the H200's 60% at 28672x8192 bound by the L1 pipe?),
# the mma-rows sweep with mtile 32 at M = 16 and 32 (the H200's table still serves mma-ks there), the served
# table rebuilt from those screens, then the runtime as served against bnb.
# On an H100 (its table was re-tuned at M = 16-64 in sessions 20-21): ncu's stall reasons of the served
# M = 16 kernel beside the 32-row batch tile that lost to it (121.0 against 104.0 us), then the decode (both ran in
# session 23, examples/h100/matmul/s23/call1/); with H100_STEP=m8, the served M = 8 kernel under the same sections
# instead, to set beside them.
set -uo pipefail
export PYTHONPATH=$PWD/.devsite:$PWD NF4TUNE_CACHE=$PWD/build/nf4cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if nvidia-smi --query-gpu=name --format=csv | grep -q H200; then
  SW='mma=mma-rows load_bytes=8,16 rows_per_warp=16,32 mtile=16,32 warps=4,8,14,16 unroll=1,2,4 span=1,2'
  SW="$SW ksplit=1,2,4,8 prefetch=0,1 lut=pair,pairx prmt_quarters=0 persist=0 scale=block astage=shared"
  SW="$SW wload=stream dtype=bf16 quant=nf4"
  DEADLINE=${DEADLINE:-565} SCREEN_NEED=165 STEPS='tests screens sweep table mmbench' \
    TEST_FILES=tests/test_matmul_gpu.py LUTS=pairx,prmt PQS=0,1,2 PREFETCHES=1 PERSISTS=0 WARPS=8,14,16 \
    KSPLITS=1,2,4 PROBLEMS='28672x8192:1 8192x8192:1 28672x8192:8' SWEEP="$SW" \
    SWEEP_PROBLEMS='28672x8192:16 8192x8192:16 28672x8192:32 8192x8192:32 4096x14336:16 14336x4096:16' \
    bash ci/device-call.sh
else
  NCU='--section ComputeWorkloadAnalysis --section InstructionStats'
  NCU="$NCU --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  c16=$(python3 ci/served_config.py 28672x8192 16)
  c16b='{"astage":"shared","dtype":"bf16","feed":"lanes","ksplit":2,"load_bytes":16,"lut":"pairx","m":16,"mma":"mma-rows","mtile":32,"persist":0,"prefetch":1,"prmt_quarters":0,"quant":"nf4","rows_per_warp":32,"scale":"block","span":2,"stages":0,"stats":"lanes","unroll":1,"warps":8,"wload":"stream"}'
  if [ "${H100_STEP:-}" = m8 ]; then
    MM_PROFILE_SHAPE="28672 8192 8" MM_PROFILE_CONFIGS="$(python3 ci/served_config.py 28672x8192 8)" \
      MM_PROFILE_NCU_ARGS="$NCU" timeout 240 bash ci/gpu-session.sh mmprofile > /dev/null 2>&1
    echo "mmprofile exit $?" | tee -a "$OUT/gpu.txt"
  else
    MM_PROFILE_SHAPE="28672 8192 16" MM_PROFILE_CONFIGS="$c16|$c16b" MM_PROFILE_NCU_ARGS="$NCU" \
      timeout 240 bash ci/gpu-session.sh mmprofile > /dev/null 2>&1
    echo "mmprofile exit $?" | tee -a "$OUT/gpu.txt"
    timeout 200 bash ci/gpu-session.sh decode > /dev/null 2>&1; echo "decode exit $?" | tee -a "$OUT/gpu.txt"
    tail -14 "$OUT/decode.txt"
  fi
  grep -E " ok$|Duration|DRAM Throughput|Compute \(SM\) Th|Registers Per|Achieved Occupancy|Issue Slots Busy|stalled_(long|not_sel|math|short|mio|wait|barrier|lg|selected|tex|dispatch)" \
    "$OUT/mmprofile.txt" | head -80
  grep -E "Theoretical Occ|Block Limit (Reg|Shared)|Dynamic Shared|Waves" "$OUT/mmprofile.txt"
fi
