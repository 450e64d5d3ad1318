#!/usr/bin/env bash
# The device call of this session's evidence run (issues 10, 11, 13): each step time-boxed so the
# whole call fits one lease; logs under $OUT. Run: bash ci/session-h200.sh
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
S1='{"load_bytes":8,"rows_per_warp":2,"warps":8,"ksplit":1,"lut":"shared","scale":"block","wload":"plain"}'
S2='{"load_bytes":16,"rows_per_warp":2,"warps":4,"ksplit":1,"lut":"shared","scale":"block","wload":"stream"}'
S3='{"load_bytes":8,"rows_per_warp":2,"warps":8,"ksplit":1,"lut":"shared","scale":"block","wload":"plain","prefetch":1}'
S4='{"load_bytes":16,"rows_per_warp":2,"warps":4,"ksplit":1,"lut":"shared","scale":"block","wload":"stream","prefetch":1}'
S5='{"load_bytes":16,"rows_per_warp":2,"warps":4,"ksplit":4,"lut":"shared","scale":"block","wload":"stream","prefetch":1}'
S6='{"mma":"mma","rows_per_warp":16,"mtile":8,"warps":4,"ksplit":2,"scale":"value"}'
export MM_CANDIDATES_1="$S1|$S2|$S3|$S4|$S5|$S6"
export MM_CANDIDATES_8='{"mma":"mma","rows_per_warp":16,"mtile":8,"warps":4,"ksplit":1,"scale":"value"}|{"mma":"mma","rows_per_warp":16,"mtile":8,"warps":4,"ksplit":2,"scale":"value"}|{"mma":"mma","rows_per_warp":32,"mtile":8,"warps":4,"ksplit":2,"scale":"value","lut":"pair"}|{"load_bytes":4,"rows_per_warp":4,"mtile":8,"warps":4,"ksplit":1,"prefetch":1}'
export MM_CANDIDATES_16='{"mma":"mma","rows_per_warp":16,"mtile":16,"warps":4,"ksplit":1,"scale":"value"}|{"mma":"mma","rows_per_warp":16,"mtile":16,"warps":4,"ksplit":2,"scale":"value"}|{"mma":"mma","rows_per_warp":32,"mtile":16,"warps":4,"ksplit":2,"scale":"value","lut":"pair"}'
export MM_TABLE="$OUT/matmul-configs.json" MM_BENCH_BUCKETS="1 8 16 32"
export MM_PROFILE_CONFIGS="$S1|$S4"
t0=$(date +%s)
step() { echo "=== $1 at +$(( $(date +%s) - t0 )) s"; }
step quality;  timeout 120 bash ci/gpu-session.sh quality >/dev/null 2>&1
step mmtable;  timeout 170 bash ci/gpu-session.sh mmtable >/dev/null 2>&1
step mmbench;  timeout 70 bash ci/gpu-session.sh mmbench >/dev/null 2>&1
step decode;   DECODE_ARGS="--table $OUT/matmul-configs.json" timeout 100 bash ci/gpu-session.sh decode >/dev/null 2>&1
step tests;    timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_matmul_gpu.py tests/test_runtime_gpu.py \
                 tests/test_timing_gpu.py tests/test_reference.py > "$OUT/gpu-tests-2.txt" 2>&1
step profile;  MM_PROFILE_SHAPE="8192 8192 1" timeout 40 bash ci/gpu-session.sh mmprofile >/dev/null 2>&1
step done
grep -E "search 8192|search best|exhaustive best" "$OUT/quality.txt"
grep -E "^== |^(bnb|dense|read)|^\{|^simt|^mma" "$OUT/mmtable.txt" | head -60
cat "$OUT/mmbench.txt" | tail -30
tail -12 "$OUT/decode.txt"
tail -4 "$OUT/gpu-tests-2.txt"
grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots|Warp Cycles Per Issued|Stall|simt" "$OUT/mmprofile.txt" | head -30
