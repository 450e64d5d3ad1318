#!/usr/bin/env bash
# One exhaustive matmul screen on a lent GPU, the runner behind ci/explore-simt-stage.sh and
# ci/explore-rows.sh: compiles the sweep's sources, benches every config of it per problem (gated,
# timed, the 6 best re-timed), writes $OUT/$NAME.txt and $OUT/$NAME-<shape>.json, tabulates the best
# screen per value of each knob in TABLES and prints each problem's best (this call's problems; $NAME.txt
# appends, so calls with the same NAME and OUT keep every screen).
# GIVEN='json|json' adds configs outside the sweep (e.g. the served one) to the finalists, timed in the same
# run; a given config that does not fit a problem (its m) fails that problem's stage with the reason.
# Usage: SWEEP='mma=simt lut=shared,pairx ...' NAME=... [M=1] [TABLES='lut warps'] [STAGE_TIMEOUT=150]
#        [GIVEN='json|json'] bash ci/explore-screen.sh PROBLEMS...
set -uo pipefail
: "${SWEEP:?SWEEP (knob=v1,v2 ...) is required}" "${NAME:?NAME is required}"
[ $# -gt 0 ] || { echo "explore-screen.sh: no problems given (NxK ...)" >&2; exit 1; }
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
export NF4TUNE_CACHE=${NF4TUNE_CACHE:-/tmp/nf4tune-cache}
s=""
for k in $SWEEP; do s="$s --sweep $k"; done
given=()
IFS='|' read -r -a cfgs <<< "${GIVEN:-}"     # configs as JSON, separated by |
for cfg in "${cfgs[@]}"; do [ -n "$cfg" ] && given+=(--config "$cfg"); done
python3 -m tuner.cli compile --family matmul $s --quiet 2>&1 | tail -1
start=$(( $( [ -f "$OUT/$NAME.txt" ] && wc -l < "$OUT/$NAME.txt" || echo 0) + 1 ))   # $NAME.txt may hold earlier calls' screens
for sh in "$@"; do
  timeout ${STAGE_TIMEOUT:-150} python3 -m tuner.cli bench --exhaustive --family matmul --shape $sh --m ${M:-1} \
     --finalists 6 --time-cap 1 $s "${given[@]}" -o "$OUT/$NAME-$sh.json" 2>&1 | tr '\r' '\n' | grep -v ' [0-9]*/[0-9]* ([0-9]*%)' \
     >> "$OUT/$NAME.txt"
done
for t in ${TABLES:-}; do python3 ci/explore_best.py --table $t "$OUT"/$NAME-*.json; done
tail -n +"$start" "$OUT/$NAME.txt" | grep "exhaustive best" | cut -c1-170     # this call's problems only
