#!/usr/bin/env bash
# The GPU suite, on any machine with a CUDA GPU and nf4-tune installed (pip install -e ".[dev,bench]"):
#   check   ci/machine_check.py first: a faulty GPU stops the suite (exit 3) before anything is judged;
#   tests   every test marked gpu (parallel workers when pytest-xdist is there), then the ones marked alone
#           (they time host-side launches) without workers beside them;
#   bench   the benchmark commands whose tables docs/results.md holds, each into its own file;
#   screen  (not in the default steps) the re-screen of this GPU: `nf4-tune bench --exhaustive` of each
#           shape x M x dtype of SCREEN_SHAPES, SCREEN_M and SCREEN_DTYPES (the matmul family's default
#           space, SCREEN_SPACE_ARGS added: e.g. "--experimental --sweep mma=mma-cols"), the dequant family's
#           at DEQUANT_SHAPES x SCREEN_DTYPES, every finalist stored in OUTDIR/screens.db, then
#           OUTDIR/tuned_configs.json: the packaged table with this GPU's screened problems replaced
#           (`nf4-tune export --default-space --over`), ready to copy over tuner/serve/tuned_configs.json.
# Everything goes to OUTDIR (default ./gpu-suite-out): suite.txt (the summary), machine-check.txt,
# gpu-tests.txt, bench-*.txt, screen-*.txt. Exit 0 when every step that ran passed, 1 when a test,
# benchmark or screen failed, 3 when the machine check failed.
#
# Usage: ci/gpu-suite.sh [OUTDIR]
# Environment:
#   STEPS         the steps to run, in order (default: "check tests bench")
#   PYTEST_ARGS   extra pytest arguments for the tests step (e.g. "-k matmul")
#   WORKERS       pytest-xdist workers for the tests step (default 8; 0: none)
#   BENCH         the bench commands to run (default: all of "dequant matmul host generate")
#   SCREEN_SHAPES, SCREEN_M, SCREEN_DTYPES, DEQUANT_SHAPES, SCREEN_SPACE_ARGS  the screen step's problems
#                 (defaults: the 8 matmul shapes of docs/results.md; M 1 2 4 8 16 32 64; bf16 fp16; the 6
#                 dequant shapes; none); an empty list leaves that family out
#   PACKAGED      the table the screen is laid over (default: tuner/serve/tuned_configs.json)
#   NF4TUNE_CMD   how to call the CLI (default: nf4-tune; e.g. "python3 -m nf4tune.cli")
set -uo pipefail
OUTDIR=${1:-gpu-suite-out}
mkdir -p "$OUTDIR"
STEPS=${STEPS:-check tests bench}
read -r -a NF4 <<< "${NF4TUNE_CMD:-nf4-tune}"
log=$OUTDIR/suite.txt
: > "$log"
say() { echo "gpu-suite: $(date -u +%T) $*" | tee -a "$log"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
rc=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$log"
if want check; then
  if ! python3 "$(dirname "$0")/machine_check.py" > "$OUTDIR/machine-check.txt" 2>&1; then
    tail -15 "$OUTDIR/machine-check.txt"
    say "machine check FAILED: nothing else runs on this machine"
    exit 3
  fi
  say "machine check clean"
fi

if want tests; then
  par=()
  if [ "${WORKERS:-8}" != 0 ] && python3 -c "import xdist" 2>/dev/null; then par=(-n "${WORKERS:-8}"); fi
  # shellcheck disable=SC2086
  python3 -m pytest -q -m "gpu and not alone" -p no:cacheprovider "${par[@]}" ${PYTEST_ARGS:-} tests \
    > "$OUTDIR/gpu-tests.txt" 2>&1
  t=$?
  # shellcheck disable=SC2086
  python3 -m pytest -q -m "gpu and alone" -p no:cacheprovider ${PYTEST_ARGS:-} tests >> "$OUTDIR/gpu-tests.txt" 2>&1
  a=$?; [ $a -eq 5 ] && a=0          # no test marked alone selected
  say "GPU tests exit $t, alone exit $a: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUTDIR/gpu-tests.txt" | tail -2 | tr '\n' ' ')"
  grep -E "^(FAILED|ERROR)" "$OUTDIR/gpu-tests.txt" | head -20 | tee -a "$log"
  [ $t -ne 0 ] || [ $a -ne 0 ] && rc=1
fi

# bench NAME ARGS...: one benchmark command of docs/results.md into bench-NAME.txt
bench() {
  local name=$1; shift
  [[ " ${BENCH:-dequant matmul host generate} " == *" $name "* ]] || return 0
  say "bench $name: nf4-tune $*"
  "${NF4[@]}" "$@" > "$OUTDIR/bench-$name.txt" 2>&1
  local b=$?
  tail -40 "$OUTDIR/bench-$name.txt" | tee -a "$log"
  say "bench $name exit $b"
  [ $b -ne 0 ] && rc=1
  return 0
}
if want bench; then
  # the commands of docs/results.md's tables, as written there
  bench dequant bench --runtime --dtype bf16
  bench matmul bench --family matmul --runtime --no-linear --shape 4096x4096 --shape 1024x4096 --shape 14336x4096 \
    --shape 4096x14336 --shape 8192x8192 --shape 28672x8192 --shape 18944x3584 --shape 3072x8192 \
    --m 1 --m 2 --m 4 --m 8 --m 16 --m 32 --m 64
  bench host bench --host
  bench generate bench --generate --batch 1 --batch 8
fi
if want screen; then
  read -r -a shapes <<< "${SCREEN_SHAPES-14336x4096 4096x14336 8192x8192 28672x8192 18944x3584 3072x8192 4096x4096 1024x4096}"
  read -r -a ms <<< "${SCREEN_M-1 2 4 8 16 32 64}"
  read -r -a dtypes <<< "${SCREEN_DTYPES-bf16 fp16}"
  read -r -a dshapes <<< "${DEQUANT_SHAPES-4096x4096 8192x8192 14336x4096 4096x14336 8192x28672 16384x16384}"
  read -r -a space <<< "${SCREEN_SPACE_ARGS:-}"
  db=$OUTDIR/screens.db
  n=0
  for dt in "${dtypes[@]}"; do
    for shape in "${shapes[@]}"; do
      for m in "${ms[@]}"; do
        n=$((n + 1))
        say "screen matmul $shape m$m $dt"
        if ! "${NF4[@]}" bench --family matmul --exhaustive "${space[@]}" --shape "$shape" --m "$m" --dtype "$dt" \
            --db "$db" > "$OUTDIR/screen-matmul-$dt-$shape-m$m.txt" 2>&1; then
          say "screen matmul $shape m$m $dt FAILED"; tail -5 "$OUTDIR/screen-matmul-$dt-$shape-m$m.txt" | tee -a "$log"; rc=1
        fi
      done
    done
    if [ ${#dshapes[@]} -gt 0 ]; then
      n=$((n + 1))
      say "screen dequant $dt: ${dshapes[*]}"
      dargs=(); for shape in "${dshapes[@]}"; do dargs+=(--shape "$shape"); done
      if ! "${NF4[@]}" bench --exhaustive "${dargs[@]}" --dtype "$dt" --db "$db" > "$OUTDIR/screen-dequant-$dt.txt" 2>&1; then
        say "screen dequant $dt FAILED"; tail -5 "$OUTDIR/screen-dequant-$dt.txt" | tee -a "$log"; rc=1
      fi
    fi
  done
  if [ "$n" -eq 0 ]; then
    say "screen: no problem named (SCREEN_SHAPES, SCREEN_M, SCREEN_DTYPES, DEQUANT_SHAPES)"; rc=1
  elif "${NF4[@]}" export --db "$db" --default-space --over "${PACKAGED:-tuner/serve/tuned_configs.json}" \
      -o "$OUTDIR/tuned_configs.json" 2>&1 | tee -a "$log"; then
    say "screen: $OUTDIR/tuned_configs.json is the packaged table with this GPU's screened problems replaced"
  else
    say "screen: export FAILED"; rc=1
  fi
fi
say "done (exit $rc)"
exit $rc
