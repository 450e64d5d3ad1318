#!/usr/bin/env bash
# Session 24's second device call (issue 11): ncu of 28672x8192, M = 16, on whichever card comes: the served
# kernel (8-byte loads, unroll 4, split-K 2, one 14-warp CTA an SM) beside split-K 8 with 12 warps a CTA,
# uncapped (149.2 us on the H100 in call 1) and capped at 80 registers (120.1 us: 3 CTAs, 24 warps an SM).
# What does the cap's occupancy buy, and what binds the 24-warp kernel? Everything under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD/.devsite:$PWD NF4TUNE_CACHE=$PWD/build/nf4cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
served=$(python3 ci/served_config.py 28672x8192 16)
k8='{"astage":"shared","dtype":"bf16","feed":"lanes","ksplit":8,"load_bytes":8,"lut":"pair","m":16,"mma":"mma-rows","mtile":16,"persist":0,"prefetch":0,"prmt_quarters":0,"quant":"nf4","regcap":0,"rows_per_warp":16,"scale":"block","span":1,"stages":0,"stats":"lanes","unroll":4,"warps":12,"wload":"stream"}'
k8c=${k8/\"regcap\":0/\"regcap\":80}
NCU='--section ComputeWorkloadAnalysis --section InstructionStats'
NCU="$NCU --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes_read.sum,lts__t_bytes.sum"
MM_PROFILE_SHAPE="28672 8192 16" MM_PROFILE_CONFIGS="$served|$k8|$k8c" MM_PROFILE_NCU_ARGS="$NCU" \
  timeout ${PROFILE_TIMEOUT:-300} bash ci/gpu-session.sh mmprofile > /dev/null 2>&1
echo "mmprofile exit $?" | tee -a "$OUT/gpu.txt"
grep -E " ok$|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|Executed Ipc A|stalled_(long|short|mio|wait|barrier|lg|math|not_sel)|local_op|op_red|op_atom|dram__bytes_read|lts__t_bytes|Block Limit (Reg|Shared)" \
  "$OUT/mmprofile.txt" | head -90
