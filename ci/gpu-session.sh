#!/usr/bin/env bash
# One call on the lent GPU machine: environment, then the modes asked for. Everything lands in
# $OUT (default ./gpu-out). Usage: bash ci/gpu-session.sh MODE...
#   tests        every GPU test (pytest -m gpu)
#   bench        dequant: the six target shapes (presets and the best hand-picked config)
#   quality      dequant: a fresh 30-trial search at 8192x8192, then the exhaustive best beside it
#   readfloor    matmul: a read-only reduction of exactly each target's bytes, torch.sum and a tuned Triton sweep (the small-size floor)
#   inflight     read bandwidth against bytes in flight per SM (a persistent Triton read)
#   mmtests      matmul: the family's GPU tests only
#   mmexplore    matmul: the space (or $MM_SWEEP's part) screened at $MM_PROBLEMS, finalists in full
#   mmsearch     matmul: searches of the target shapes x batch buckets ($MM_SHAPES, $MM_BUCKETS)
#   mmbench      matmul: the served table against bnb at the target shapes and batches
#   decode       matmul: Llama-3-8B-shaped decode, patched / bnb / bf16, under CUDA graphs
#   nightly      the nightly job on a copy of the search database (quiet nights, then a planted slow config)
#   multigpu     a whole-model search on GPU 0 alone, then on every visible GPU (--gpus all)
#   model        a Llama-3-8B whole-model search (bf16), timed from a cold compile cache
#   bnbnights    10 nightly runs of a 4096x4096 study, then bnb's medians and IQRs across them
#   fp32         searches of the six target shapes in fp32 output, exported
#   blocksizes   searches at blocksizes 128 and 256 (4096x14336, 8192x8192: the served table; two
#                hidden shapes: the yardstick), then the fallback's distance from the yardstick
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
py=python3
NF4="$py -m tuner.cli"
want() { for a in "${MODES[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
MODES=("$@"); [ ${#MODES[@]} -eq 0 ] && MODES=(tests bench)
SIX="--shape 4096x4096 --shape 4096x14336 --shape 14336x4096 --shape 8192x8192 --shape 8192x28672 --shape 16384x16384"

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  $py - <<'PY'
import torch, cuda.core, bitsandbytes, numpy
from tuner.kernel.compiler import nvrtc_version
print("torch", torch.__version__, "cuda.core", cuda.core.__version__, "bnb", bitsandbytes.__version__,
      "numpy", numpy.__version__, "nvrtc", nvrtc_version())
PY
} 2>&1 | tee "$OUT/env.txt"

if want tests; then
  # warm the compile cache in parallel first (the tests compile what they use, one by one otherwise)
  $NF4 compile --dtype bf16 --quant nf4 --quiet >/dev/null 2>&1
  $py -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.txt"
fi
if want bench; then
  BEST='{"bytes_per_thread": 4, "unroll": 4, "threads": 128, "lut": "shared", "index": "hoisted"}'
  $NF4 bench --dtype bf16 --quant nf4 --blocksize 64 $SIX --config "$BEST" --preset blog --preset bnb-like \
     --sweep threads=128,256 --sweep store=plain,streaming --db "$OUT/nf4tune.db" -o "$OUT/bench.json" 2>&1 \
     | tee "$OUT/bench.txt"
fi
if want quality; then
  $NF4 compile --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/quality.txt"
  /usr/bin/time -f "search 8192x8192 bf16: %e s wall" $NF4 search --shape 8192x8192 --trials 30 --quiet \
     --db "$OUT/quality.db" 2>&1 | tee -a "$OUT/quality.txt"
  $NF4 bench --exhaustive --shape 8192x8192 --compare-db "$OUT/quality.db" -o "$OUT/exhaustive.json" 2>&1 \
     | tr '\r' '\n' | grep -v '/9240 (' | tee -a "$OUT/quality.txt"
fi
if want mmexplore; then
  # $MM_SWEEP: space restrictions (KNOB=V1,V2 ...); $MM_EXPLORE_CONFIGS: configs (JSON, |-separated)
  # measured beside the finalists; the screened sources are compiled in parallel first
  sweeps=""; for s in ${MM_SWEEP:-}; do sweeps="$sweeps --sweep $s"; done
  IFS='|' read -r -a ecs <<< "${MM_EXPLORE_CONFIGS:-}"; given=()
  for c in "${ecs[@]}"; do [ -n "$c" ] && given+=(--config "$c"); done
  for pm in ${MM_PROBLEMS:-8192x8192:1 4096x4096:1 8192x8192:16}; do
    shape=${pm%%:*}; m=${pm##*:}
    timeout ${MM_TIMEOUT:-150} $NF4 bench --exhaustive --family matmul --shape $shape --m $m \
       --finalists ${MM_FINALISTS:-8} --time-cap ${MM_TIME_CAP:-1} $sweeps "${given[@]}" \
       -o "$OUT/mmexplore-$shape-m$m.json" 2>&1 | tr '\r' '\n' | grep -v ' [0-9]*/[0-9]* ([0-9]*%)' \
       | tee -a "$OUT/mmexplore.txt"
  done
fi
if want readfloor; then
  # what a pure read of each target's bytes costs (the floor a decode-sized matmul cannot beat)
  $py ci/read_floor.py --tuned 2>&1 | tee "$OUT/readfloor.txt"
fi
if want inflight; then
  # read bandwidth against the bytes each SM keeps in flight (a persistent Triton read, no pipelining)
  $py ci/read_inflight.py 2>&1 | tee "$OUT/inflight.txt"
fi
if want mmtests; then
  # the matmul family's GPU tests only
  $py -m pytest -q -m gpu -p no:cacheprovider tests/test_matmul_gpu.py 2>&1 | tee "$OUT/mmtests.txt"
fi
if want mmprofile; then
  # ncu (clocks left alone) of matmul variants: speed of light, occupancy, warp states, memory
  # (MM_PROFILE_NCU_ARGS: more ncu arguments, e.g. the stall reasons as metrics)
  IFS='|' read -r -a cfgs <<< "${MM_PROFILE_CONFIGS:-}"     # configs as JSON, separated by |
  for cfg in "${cfgs[@]}"; do
    [ -z "$cfg" ] && continue
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section LaunchStats ${MM_PROFILE_NCU_ARGS:-} -k nf4t_matmul -c 1 \
        $py ci/profile_matmul.py ${MM_PROFILE_SHAPE:-8192 8192 1} "$cfg" 2 2>&1 | grep -v "^==PROF==" \
        | tee -a "$OUT/mmprofile.txt"
  done
fi
if want mmtable; then
  # the serving table of the decode shapes: hand-picked candidates from the exploration, gated and
  # timed against bnb per (shape, batch bucket), stored, exported
  # (MM_TABLE_COMPILE=0: no whole-space compile first; bench compiles its candidates one by one)
  [ "${MM_TABLE_COMPILE:-1}" = 0 ] || $NF4 compile --family matmul --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/mmtable.txt"
  shapes=""; for s in ${MM_SHAPES:-4096x4096 1024x4096 14336x4096 4096x14336 8192x8192 28672x8192}; do shapes="$shapes --shape $s"; done
  for m in ${MM_TABLE_BUCKETS:-1 8 16}; do
    var="MM_CANDIDATES_$m"; cands=""
    IFS='|' read -r -a cs <<< "${!var:-}"
    for c in "${cs[@]}"; do [ -n "$c" ] && cands="$cands --config $c"; done
    timeout ${MM_TABLE_TIMEOUT:-150} $NF4 bench --family matmul $shapes --m $m $cands --time-cap 0.8 --top 3 \
       --db "$OUT/matmul.db" -o "$OUT/mmtable-m$m.json" 2>&1 | tee -a "$OUT/mmtable.txt"
  done
  $NF4 export --db "$OUT/matmul.db" -o "$OUT/matmul-configs.json" 2>&1 | tee -a "$OUT/mmtable.txt"
fi
if want mmsearch; then
  $NF4 compile --family matmul --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/mmsearch.txt"
  shapes=""; for s in ${MM_SHAPES:-4096x4096 1024x4096 14336x4096 4096x14336 8192x8192 28672x8192}; do shapes="$shapes --shape $s"; done
  ms=""; for m in ${MM_BUCKETS:-1 8 16}; do ms="$ms --m $m"; done
  /usr/bin/time -f "matmul searches: %e s wall" $NF4 search --family matmul $shapes $ms --trials ${TRIALS:-16} \
     --time-cap ${TIME_CAP:-0.5} --quiet --db "$OUT/matmul.db" 2>&1 | tee -a "$OUT/mmsearch.txt"
  $NF4 export --db "$OUT/matmul.db" -o "$OUT/matmul-configs.json" 2>&1 | tee -a "$OUT/mmsearch.txt"
fi
if want mmbench; then
  shapes=""; for s in ${MM_SHAPES:-4096x4096 1024x4096 14336x4096 4096x14336 8192x8192 28672x8192}; do shapes="$shapes --shape $s"; done
  ms=""; for m in ${MM_BENCH_BUCKETS:-1 8 16 32 64}; do ms="$ms --m $m"; done
  $NF4 bench --family matmul --runtime $shapes $ms ${MM_TABLE:+--table "$MM_TABLE"} -o "$OUT/mmbench.json" 2>&1 \
     | tee "$OUT/mmbench.txt"
fi
if want decode; then
  $NF4 bench --family matmul --decode ${DECODE_ARGS:-} -o "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"
fi
if want nightly; then
  cp "${SEARCH_DB:-examples/h200/search.db}" "$OUT/nightly.db"
  export NF4TUNE_CMD="$NF4" NF4TUNE_SKIP_REPORT=1
  for night in $(seq 1 ${QUIET_NIGHTS:-3}); do
    bash ci/nightly.sh "$OUT/nightly.db" 2>&1 | tee -a "$OUT/nightly.txt"; echo "night $night exit ${PIPESTATUS[0]}" | tee -a "$OUT/nightly.txt"
  done
  $py ci/plant_slow_config.py --db "$OUT/nightly.db" --shape 8192x8192 --dtype bf16 2>&1 | tee -a "$OUT/nightly.txt"
  bash ci/nightly.sh "$OUT/nightly.db" 2>&1 | tee -a "$OUT/nightly.txt"; echo "planted night exit ${PIPESTATUS[0]}" | tee -a "$OUT/nightly.txt"
fi
if want model; then
  /usr/bin/time -f "model search (cold compile cache): %e s wall" env NF4TUNE_CACHE=/tmp/nf4tune-cold-$$ \
     $NF4 search --model examples/models/llama-3-8b.json --trials ${TRIALS:-30} --quiet --db "$OUT/model.db" 2>&1 \
     | tee -a "$OUT/model.txt"
fi
if want bnbnights; then
  $NF4 search --shape 4096x4096 --trials 8 --quiet --db "$OUT/nights.db" >/dev/null 2>&1
  for night in $(seq 1 ${NIGHTS:-10}); do
    $NF4 regress --db "$OUT/nights.db" --quiet 2>&1 | tail -1 | tee -a "$OUT/bnbnights.txt"
  done
  $py ci/bnb_nights.py "$OUT/nights.db" --shape 4096x4096 --last ${NIGHTS:-10} 2>&1 | tee -a "$OUT/bnbnights.txt"
fi
if want fp32; then
  /usr/bin/time -f "fp32 searches: %e s wall" $NF4 search --dtype fp32 $SIX --trials ${TRIALS:-30} --quiet \
     --db "$OUT/fp32.db" 2>&1 | tee -a "$OUT/fp32.txt"
  $NF4 export --db "$OUT/fp32.db" -o "$OUT/fp32-configs.json" 2>&1 | tee -a "$OUT/fp32.txt"
fi
if want blocksizes; then
  for bs in 128 256; do
    $NF4 search --blocksize $bs --shape 4096x14336 --shape 8192x8192 --trials ${TRIALS:-30} --quiet \
       --db "$OUT/bs.db" 2>&1 | tee -a "$OUT/blocksizes.txt"
    $NF4 search --blocksize $bs --shape 3584x18944 --shape 5120x13824 --trials ${TRIALS:-30} --quiet \
       --db "$OUT/hidden.db" 2>&1 | tee -a "$OUT/blocksizes.txt"
    $NF4 bench --blocksize $bs --shape 3584x18944 --shape 5120x13824 --table "$OUT/bs.db" \
       --fallback-vs "$OUT/hidden.db" -o "$OUT/fallback-bs$bs.json" 2>&1 | tee -a "$OUT/blocksizes.txt"
  done
fi
if want multigpu; then
  # wall time of one problem set (Llama-3-8B's four shapes) on GPU 0 alone and on every visible GPU,
  # each into a fresh database, the compile cache warmed first: the speedup is the ratio of the two
  $py -m tuner.cli compile --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/multigpu.txt"
  for g in 0 all; do
    $py -m tuner.cli search --model examples/models/llama-3-8b.json --trials ${TRIALS:-30} --gpus $g --quiet \
       --db "$OUT/gpus-$g.db" 2>&1 | tee -a "$OUT/multigpu.txt"
  done
fi
