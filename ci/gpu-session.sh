#!/usr/bin/env bash
# One call on the lent GPU machine: environment, GPU tests, then benchmarks. Everything lands in
# $OUT (default ./gpu-out). Usage: bash ci/gpu-session.sh [tests] [bench] [explore]
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
from tuner.compiler import nvrtc_version
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
