#!/usr/bin/env bash
# The device call of this session's evidence run: GPU tests, then the matmul serving table with
# the mma-ks candidates of the exploration (examples/h200/matmul/explore-ks.txt), its benchmark
# against bnb and the decode benchmark; each step time-boxed so the call fits one lease; logs
# under $OUT. Run: [STEPS='tests mmtable'] [MM_TABLE=...] bash ci/session-h200.sh
set -uo pipefail
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/.devsite:$PWD PYTHONUNBUFFERED=1
KS='"mma":"mma-ks","load_bytes":8,"lut":"pair","scale":"block","wload":"stream"'
S1='{"load_bytes":8,"rows_per_warp":2,"warps":8,"ksplit":1,"lut":"shared","scale":"block","wload":"plain"}'
S2='{"load_bytes":16,"rows_per_warp":2,"warps":4,"ksplit":1,"lut":"shared","scale":"block","wload":"stream"}'
K1="{$KS,\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":2}"
K2="{$KS,\"rows_per_warp\":16,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":4}"
K3="{$KS,\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":4,\"unroll\":2,\"prefetch\":1,\"persist\":1}"
K4="{$KS,\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":2,\"unroll\":2}"
L1="{$KS,\"rows_per_warp\":32,\"mtile\":16,\"warps\":4,\"ksplit\":1,\"unroll\":2,\"prefetch\":1,\"persist\":1}"
L2="{$KS,\"rows_per_warp\":32,\"mtile\":16,\"warps\":4,\"ksplit\":2,\"unroll\":2,\"prefetch\":1,\"persist\":1}"
L3="{$KS,\"rows_per_warp\":16,\"mtile\":16,\"warps\":8,\"ksplit\":1,\"unroll\":2}"
M16='{"mma":"mma","rows_per_warp":16,"mtile":16,"warps":4,"ksplit":2,"scale":"value"}'
# session 7 (examples/h200/matmul/l2ahead-experiment): the best SIMT screens (64-thread CTAs, 16-byte
# loads) and the best pairx register-feed screens of the M = 1 problems
S3='{"load_bytes":16,"rows_per_warp":4,"warps":2,"ksplit":1,"lut":"shared","scale":"block","wload":"stream","prefetch":1}'
S4='{"load_bytes":16,"rows_per_warp":8,"warps":2,"ksplit":1,"lut":"shared","scale":"block","wload":"stream"}'
S5='{"load_bytes":16,"rows_per_warp":4,"warps":2,"ksplit":1,"lut":"shared","scale":"block","wload":"stream"}'
X1="{$KS,\"lut\":\"pairx\",\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":2}"
X2="{$KS,\"lut\":\"pairx\",\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":2,\"persist\":1}"
X3="{$KS,\"lut\":\"pairx\",\"rows_per_warp\":16,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":4,\"persist\":1,\"stats\":\"tile\"}"
X4="{$KS,\"lut\":\"pairx\",\"rows_per_warp\":16,\"mtile\":8,\"warps\":8,\"ksplit\":1,\"unroll\":4,\"prefetch\":1,\"stats\":\"tile\"}"
X5="{$KS,\"lut\":\"pairx\",\"rows_per_warp\":32,\"mtile\":8,\"warps\":8,\"ksplit\":2,\"unroll\":2}"
# ... and SIMT with the 16-bit pair table (lut pairx, examples/h200/matmul/simt-s7/simtpairs*)
P1='{"load_bytes":16,"rows_per_warp":4,"warps":8,"ksplit":1,"lut":"pairx","scale":"block","wload":"stream"}'
P2='{"load_bytes":16,"rows_per_warp":8,"warps":8,"ksplit":1,"lut":"pairx","scale":"block","wload":"stream"}'
# ... and SIMT with A staged lane-major in shared memory, 8- and 16-warp CTAs (session 8,
# examples/h200/matmul/simt-s8/simtstage*)
SA='"astage":"shared","scale":"block","wload":"stream"'    # what the A-staged SIMT candidates share
A1='{"load_bytes":16,"rows_per_warp":4,"warps":8,"ksplit":1,"lut":"shared",'"$SA"'}'
A2='{"load_bytes":16,"rows_per_warp":4,"warps":8,"ksplit":1,"lut":"pairx",'"$SA"'}'
A3='{"load_bytes":16,"rows_per_warp":4,"warps":16,"ksplit":1,"lut":"pairx",'"$SA"'}'
A4='{"load_bytes":16,"rows_per_warp":4,"warps":16,"ksplit":1,"lut":"shared",'"$SA"'}'
A5='{"load_bytes":16,"rows_per_warp":8,"warps":8,"ksplit":1,"lut":"pairx",'"$SA"'}'
# ... split over K for the narrow shapes (4096 and 1024 rows: 64-256 CTAs of 16-64 rows)
A6='{"load_bytes":16,"rows_per_warp":4,"warps":8,"ksplit":2,"lut":"pairx",'"$SA"'}'
A7='{"load_bytes":16,"rows_per_warp":4,"warps":8,"ksplit":4,"lut":"pairx",'"$SA"'}'
A8='{"load_bytes":16,"rows_per_warp":4,"warps":16,"ksplit":2,"lut":"pairx",'"$SA"'}'
A9='{"load_bytes":16,"rows_per_warp":2,"warps":8,"ksplit":2,"lut":"pairx",'"$SA"'}'
# ... CTAs of 14 and 12 warps (session 9, examples/h200/matmul/simt-s9): with 2 CTAs of 14 warps per SM a
# wave covers 14784 rows, so 28672 rows take 1.94 waves (1.70 of 16-warp CTAs: the second wave 70% full)
A10='{"load_bytes":16,"rows_per_warp":4,"warps":14,"ksplit":1,"lut":"pairx",'"$SA"'}'
A11='{"load_bytes":16,"rows_per_warp":4,"warps":14,"ksplit":2,"lut":"pairx",'"$SA"'}'
A12='{"load_bytes":16,"rows_per_warp":4,"warps":12,"ksplit":4,"lut":"shared",'"$SA"'}'
# ... with the SIMT loop's loads cut (session 9: full warps and the statistics' kind known at compile time, 618 ->
# 508 instructions a step): the register prefetch at 14 warps (72 registers), 8-byte loads or 2 rows with it at
# 16 warps, the mixed pair table, 16-warp CTAs split four ways
A13='{"load_bytes":16,"rows_per_warp":4,"warps":14,"ksplit":1,"lut":"pairx","prefetch":1,'"$SA"'}'
A14='{"load_bytes":8,"rows_per_warp":4,"warps":16,"ksplit":1,"lut":"pairx","prefetch":1,'"$SA"'}'
A15='{"load_bytes":16,"rows_per_warp":2,"warps":16,"ksplit":1,"lut":"pairx","prefetch":1,'"$SA"'}'
A16='{"load_bytes":16,"rows_per_warp":4,"warps":14,"ksplit":1,"lut":"pairmix",'"$SA"'}'
A17='{"load_bytes":16,"rows_per_warp":4,"warps":16,"ksplit":4,"lut":"pairx",'"$SA"'}'
# ... the tensor cores with warps owning row tiles (session 10, mma-rows: mma-ks's decode, A staged once
# per CTA, a window's statistics loaded once per row; about 4 SASS instructions per packed byte and lane in
# the loop against SIMT's 8): 14- and 16-warp CTAs of 16-row warps, groups of 1-4 windows with and without
# the prefetch; the static pair table and split-K where a batch of 8 or 16 rows of A is staged
RW='"mma":"mma-rows","astage":"shared","scale":"block","wload":"stream","rows_per_warp":16'
R1="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":14,\"ksplit\":1,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R2="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":4,\"lut\":\"pairx\"}"
R3="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":1,\"prefetch\":1,\"lut\":\"pairx\"}"
R4="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":14,\"ksplit\":2,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R5="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":4,\"unroll\":2,\"prefetch\":1,\"lut\":\"pair\"}"
R6="{$RW,\"load_bytes\":4,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":4,\"prefetch\":1,\"lut\":\"pair\"}"
R7="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":14,\"ksplit\":2,\"unroll\":2,\"prefetch\":1,\"lut\":\"pair\"}"
R8="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":4,\"unroll\":4,\"lut\":\"pair\"}"
R9="{$RW,\"load_bytes\":8,\"mtile\":16,\"warps\":8,\"ksplit\":4,\"unroll\":1,\"prefetch\":1,\"lut\":\"pair\"}"
R10="{$RW,\"load_bytes\":4,\"mtile\":16,\"warps\":16,\"ksplit\":4,\"unroll\":2,\"lut\":\"pair\"}"
# (the pair table's lookups cost a shift and a mask more than pairx's permute: at 8B r16 u2 pf1 its loop takes
# 6.9 against 4.7 instructions per packed byte, ci/sass_loops.py; so pairx at M = 8 and 16 too, one CTA per SM
# where A fills the shared memory)
R11="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R12="{$RW,\"load_bytes\":8,\"mtile\":8,\"warps\":16,\"ksplit\":4,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R13="{$RW,\"load_bytes\":8,\"mtile\":16,\"warps\":16,\"ksplit\":4,\"unroll\":2,\"lut\":\"pairx\"}"
# ... with windows over two blocks (session 12, span 2: 16-byte loads at blocksize 64, each block's part in its
# own batch columns; W's loads touch 8 L1 lines per 512 bytes, not 16; the loop 229 against 260 instructions
# per 64 packed bytes and lane at 14 warps, ci/sass_loops.py); at M = 8 the 16-row batch tile holds 8 rows
R14="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":8,\"warps\":14,\"ksplit\":1,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R15="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":1,\"prefetch\":1,\"lut\":\"pairx\"}"
R16="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":2,\"lut\":\"pairx\"}"
R17="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":8,\"warps\":8,\"ksplit\":2,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R18="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":16,\"warps\":8,\"ksplit\":1,\"unroll\":2,\"prefetch\":1,\"lut\":\"pairx\"}"
R19="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":16,\"warps\":16,\"ksplit\":1,\"unroll\":1,\"prefetch\":1,\"lut\":\"pairx\"}"
# ... and the byte-permute decode (lut prmt: no table, no lookups through L1; about 7 instructions per packed
# byte against pairx's 3.6): whether mma-rows is bound by the L1's requests or by its issue slots
R20="{$RW,\"load_bytes\":16,\"span\":2,\"mtile\":8,\"warps\":16,\"ksplit\":1,\"unroll\":1,\"prefetch\":1,\"lut\":\"prmt\"}"
export MM_CANDIDATES_1="$K1|$K2|$K3|$K4|$S1|$S2|$S3|$S4|$S5|$X1|$X2|$X3|$X4|$X5|$P1|$P2|$A1|$A2|$A3|$A4|$A5|$A6|$A7|$A8|$A9|$A10|$A11|$A12|$A13|$A14|$A15|$A16|$A17|$R1|$R2|$R3|$R4|$R5|$R6|$R14|$R15|$R16|$R17|$R20"
export MM_CANDIDATES_8="$K1|$K2|$K3|$K4|$R5|$R7|$R8|$R11|$R12|$R18|$R19"
export MM_CANDIDATES_16="$L1|$L2|$L3|$M16|$R9|$R10|$R13"
export MM_CANDIDATES_32="$L1|$L2|$L3|$M16"
export MM_TABLE_BUCKETS="${MM_TABLE_BUCKETS:-1 8 16 32}" MM_TABLE="${MM_TABLE:-$OUT/matmul-configs.json}" MM_BENCH_BUCKETS="${MM_BENCH_BUCKETS:-1 8 16 32 64}"
t0=$(date +%s)
step() { echo "=== $1 at +$(( $(date +%s) - t0 )) s"; }
want() { [[ " ${STEPS:-tests mmtable mmbench decode} " == *" $1 "* ]]; }
want tests &&   step tests &&   timeout ${TESTS_TIMEOUT:-230} python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/gpu-tests.txt" 2>&1
want mmtable && step mmtable && MM_TABLE_TIMEOUT=${MM_TABLE_TIMEOUT:-70} timeout ${MMTABLE_STEP_TIMEOUT:-320} bash ci/gpu-session.sh mmtable >/dev/null 2>&1
want mmbench && step mmbench && timeout 80 bash ci/gpu-session.sh mmbench >/dev/null 2>&1
want decode &&  step decode &&  DECODE_ARGS="--table $MM_TABLE" timeout 100 bash ci/gpu-session.sh decode >/dev/null 2>&1
step done
[ -f "$OUT/gpu-tests.txt" ] && tail -4 "$OUT/gpu-tests.txt" && grep -E "^FAILED|^ERROR" "$OUT/gpu-tests.txt" | head
[ -f "$OUT/mmtable.txt" ] && grep -E "^== |^(bnb|read)|^mma|^simt" "$OUT/mmtable.txt" | cut -c1-120 | head -90
[ -f "$OUT/mmbench.txt" ] && tail -40 "$OUT/mmbench.txt" | cut -c1-160
[ -f "$OUT/decode.txt" ] && tail -12 "$OUT/decode.txt"
