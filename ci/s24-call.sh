#!/usr/bin/env bash
# Session 24's device call (issue 11): is batch 8-16 bound by the warps an SM holds? Session 23's ncu (H100,
# 28672x8192, M = 16) found the served kernel at one CTA of 14 warps an SM, held there by its 103 registers and
# its stage of A, latency-bound (21.6% occupancy). regcap (__maxnreg__ 80 or 72: 6 or 7 warps a register
# sub-partition, not 4) with split-K 4 or 8 (a smaller stage of A: 2-3 CTAs an SM) gives 24-28 warps; the sweep
# decides whether the spills cost more than the warps bring. On whichever card comes, everything under $OUT:
#   - the GPU tests of the register cap (its gate configs at every dtype, bit for bit against the uncapped);
#   - the mma-rows sweep with regcap 0/80/72 at M = 16 (four large shapes) and M = 8 (two), the served kernel
#     timed beside each screen;
#   - the served table rebuilt from those screens (table.json), the runtime as served against bnb (mmbench);
#   - ncu of the new served M = 16 kernel at 28672x8192 beside the old one (occupancy, stalls), if time is left.
set -uo pipefail
export PYTHONPATH=$PWD/.devsite:$PWD NF4TUNE_CACHE=$PWD/build/nf4cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
old16=$(python3 ci/served_config.py 28672x8192 16)
SW='mma=mma-rows load_bytes=8,16 rows_per_warp=16 mtile=8,16 span=1,2 warps=8,12,14,16 unroll=1,2,4'
SW="$SW ksplit=1,2,4,8 prefetch=0,1 lut=pair,pairx prmt_quarters=0 persist=0 scale=block astage=shared"
SW="$SW wload=stream dtype=bf16 quant=nf4 regcap=0,80,72"
DEADLINE=${DEADLINE:-420} SCREEN_NEED=60 STEPS='tests sweep table mmbench' \
  TEST_FILES=tests/test_matmul_gpu.py TEST_K='register_cap or m16-67 or m8-68' SWEEP="$SW" \
  SWEEP_PROBLEMS='28672x8192:16 8192x8192:16 14336x4096:16 4096x14336:16 28672x8192:8 8192x8192:8' \
  bash ci/device-call.sh
new16=$(python3 ci/served_config.py 28672x8192 16)
echo "served M = 16 at 28672x8192 before: $old16" | tee -a "$OUT/gpu.txt"
echo "served M = 16 at 28672x8192 now:    $new16" | tee -a "$OUT/gpu.txt"
if [ "${PROFILE:-1}" = 1 ] && [ -n "$new16" ] && [ "$new16" != "$old16" ]; then
  NCU='--section ComputeWorkloadAnalysis --section InstructionStats'
  NCU="$NCU --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  MM_PROFILE_SHAPE="28672 8192 16" MM_PROFILE_CONFIGS="$new16|$old16" MM_PROFILE_NCU_ARGS="$NCU" \
    timeout 150 bash ci/gpu-session.sh mmprofile > /dev/null 2>&1
  echo "mmprofile exit $?" | tee -a "$OUT/gpu.txt"
  grep -E " ok$|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|stalled_(long|short|mio|wait|barrier|lg)" \
    "$OUT/mmprofile.txt" | head -40
  grep -E "Theoretical Occ|Block Limit (Reg|Shared)|Dynamic Shared" "$OUT/mmprofile.txt"
fi
grep -E "exhaustive best|given" "$OUT/call.txt" | cut -c1-200
