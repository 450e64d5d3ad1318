#!/usr/bin/env bash
# One call on the lent GPU machine: environment, GPU tests, then benchmarks. Everything lands in
# $OUT (default ./gpu-out). Usage: bash ci/gpu-session.sh [tests] [bench] [explore] [search] [runtime]
# [exhaustive] [fp32probe] [nightly] [multigpu]
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
py=python3
want() { for a in "${MODES[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
MODES=("$@"); [ ${#MODES[@]} -eq 0 ] && MODES=(tests bench)

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
  $py -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.txt"
fi
if want bench; then
  # the six shapes of the speed targets: presets, plus a small sweep around the best hand-picked config
  BEST='{"bytes_per_thread": 4, "unroll": 4, "threads": 128, "lut": "shared", "index": "hoisted"}'
  $py -m tuner.cli bench --dtype bf16 --quant nf4 --blocksize 64 \
     --shape 4096x4096 --shape 4096x14336 --shape 14336x4096 --shape 8192x8192 --shape 8192x28672 --shape 16384x16384 \
     --config "$BEST" --preset blog --preset bnb-like \
     --sweep threads=128,256 --sweep store=plain,streaming \
     --db "$OUT/nf4tune.db" -o "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  $py -m tuner.cli bench --dtype fp16 --shape 4096x4096 --shape 16384x16384 --config "$BEST" --preset blog --preset bnb-like \
     --db "$OUT/nf4tune.db" -o "$OUT/bench-fp16.json" 2>&1 | tee "$OUT/bench-fp16.txt"
  $py -m tuner.cli bench --dtype fp32 --shape 8192x8192 --config "$BEST" --preset blog --preset bnb-like \
     --db "$OUT/nf4tune.db" -o "$OUT/bench-fp32.json" 2>&1 | tee "$OUT/bench-fp32.txt"
  $py -m tuner.cli bench --quant fp4 --shape 8192x8192 --config "$BEST" --preset blog --preset bnb-like \
     --db "$OUT/nf4tune.db" -o "$OUT/bench-fp4.json" 2>&1 | tee "$OUT/bench-fp4.txt"
fi
if want explore; then
  $py -m tuner.cli bench --shape 16384x16384 --shape 4096x4096 --top 12 --time-cap 2 \
     --sweep bytes_per_thread=4,8,16 --sweep unroll=1,2,4 --sweep threads=128,256,512 \
     --sweep lut=shared,register --sweep store=plain,streaming --sweep index=hoisted \
     -o "$OUT/explore.json" 2>&1 | tee "$OUT/explore.txt"
fi
if want script; then
  $py ${SCRIPT:?} 2>&1 | tee "$OUT/script.txt"
fi
if want search; then
  # warm the compile cache, then time 30-trial searches (default sampler), one per shape x dtype
  for dtype in ${SEARCH_DTYPES:-bf16}; do
    $py -m tuner.cli compile --dtype $dtype --quant nf4 --quiet 2>&1 | tee -a "$OUT/compile.txt"
  done
  for dtype in ${SEARCH_DTYPES:-bf16}; do
    for shape in ${SEARCH_SHAPES:-4096x4096 16384x16384}; do
      /usr/bin/time -f "search $shape $dtype: %e s wall" $py -m tuner.cli search --shape $shape --dtype $dtype \
         --trials ${TRIALS:-30} ${SEARCH_TIMEOUT:+--timeout $SEARCH_TIMEOUT} --db "$OUT/nf4tune.db" 2>&1 | tee -a "$OUT/search.txt"
    done
  done
  $py -m tuner.cli export --db "$OUT/nf4tune.db" -o "$OUT/configs.json" 2>&1 | tee -a "$OUT/search.txt"
fi
if want runtime; then
  # the serving runtime against bnb on eight shapes, its host time per call, Linear4bit patched/unpatched
  $py -m tuner.cli bench --runtime ${RUNTIME_JSON:+-o "$OUT/runtime.json"} 2>&1 | tee "$OUT/runtime.txt"
fi
if want fp32probe; then
  $py -m tuner.cli bench --dtype fp32 --shape 8192x8192 --shape 4096x4096 --top 8 --preset blog --no-db \
     --config '{"bytes_per_thread": 2, "unroll": 4, "threads": 256, "lut": "shared", "index": "hoisted"}' \
     --sweep bytes_per_thread=1,2,4 --sweep unroll=2,4,8 --sweep threads=128,256 2>&1 | tee "$OUT/fp32probe.txt"
fi
if want exhaustive; then
  # every config of the bf16/nf4 space screened, the fastest re-measured in full beside the search's best
  $py -m tuner.cli compile --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/exhaustive.txt"
  $py -m tuner.cli bench --exhaustive --shape 4096x4096 --shape 8192x8192 --shape 16384x16384 \
     --compare-db "${SEARCH_DB:-examples/h200/search.db}" -o "$OUT/exhaustive.json" 2>&1 | tee -a "$OUT/exhaustive.txt"
fi
if want nightly; then
  # the nightly job on a copy of the search database: quiet nights, then a planted slow config
  cp "${SEARCH_DB:-examples/h200/search.db}" "$OUT/nightly.db"
  export NF4TUNE_CMD="$py -m tuner.cli" NF4TUNE_SKIP_REPORT=1
  for night in $(seq 1 ${QUIET_NIGHTS:-3}); do
    bash ci/nightly.sh "$OUT/nightly.db" 2>&1 | tee -a "$OUT/nightly.txt"; echo "night $night exit ${PIPESTATUS[0]}" | tee -a "$OUT/nightly.txt"
  done
  $py ci/plant_slow_config.py --db "$OUT/nightly.db" --shape 8192x8192 --dtype bf16 2>&1 | tee -a "$OUT/nightly.txt"
  bash ci/nightly.sh "$OUT/nightly.db" 2>&1 | tee -a "$OUT/nightly.txt"; echo "planted night exit ${PIPESTATUS[0]}" | tee -a "$OUT/nightly.txt"
fi
if want quality; then
  # search quality: fresh 30-trial searches (default sampler) of three problems, then the exhaustive
  # best of each with the search's best measured beside it in the same process
  $py -m tuner.cli compile --dtype bf16 --quant nf4 --quiet 2>&1 | tee -a "$OUT/quality.txt"
  for shape in 4096x4096 8192x8192 16384x16384; do
    /usr/bin/time -f "search $shape bf16: %e s wall" $py -m tuner.cli search --shape $shape --trials 30 \
       --db "$OUT/quality.db" 2>&1 | tr '\r' '\n' | grep -v '^\S* bf16 nf4 bs64 \[' | tee -a "$OUT/quality.txt"
  done
  $py -m tuner.cli bench --exhaustive --shape 4096x4096 --shape 8192x8192 --shape 16384x16384 \
     --compare-db "$OUT/quality.db" -o "$OUT/exhaustive.json" 2>&1 | tr '\r' '\n' | grep -v '/9240 (' | tee -a "$OUT/quality.txt"
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
