#!/usr/bin/env bash
# The GPU suite, on any machine with a CUDA GPU and nf4-tune installed (pip install -e ".[dev,bench]"):
#   check   ci/machine_check.py first: a faulty GPU stops the suite (exit 3) before anything is judged;
#   tests   every test marked gpu (parallel workers when pytest-xdist is there), then the ones marked alone
#           (they time host-side launches) without workers beside them;
#   bench   the benchmark commands whose tables docs/results.md holds, each into its own file.
# Everything goes to OUTDIR (default ./gpu-suite-out): suite.txt (the summary), machine-check.txt,
# gpu-tests.txt, bench-*.txt. Exit 0 when every step that ran passed, 1 when a test or benchmark failed,
# 3 when the machine check failed.
#
# Usage: ci/gpu-suite.sh [OUTDIR]
# Environment:
#   STEPS         the steps to run, in order (default: "check tests bench")
#   PYTEST_ARGS   extra pytest arguments for the tests step (e.g. "-k matmul")
#   WORKERS       pytest-xdist workers for the tests step (default 8; 0: none)
#   BENCH         the bench commands to run (default: all of "dequant matmul host generate")
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
say "done (exit $rc)"
exit $rc
