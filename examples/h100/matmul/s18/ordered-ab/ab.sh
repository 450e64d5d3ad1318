#!/bin/bash
# A/B of the split-K finish: old18 (fp32 atomics), the working tree (part slots, 4 loads a round), vs18 (butterfly)
R=$PWD; NEW=$R/tuner/serve/tuned_configs.json
for d in old18 vs18; do ln -sfn $R/.devsite $R/$d/.devsite; done
for v in old18 vs18 .; do (cd $R/$v && PYTHONPATH=$R/.devsite:$PWD python3 $R/tmp18/regs2.py "$v" $PWD); done 2>&1 | tee $OUT/regs.txt
for round in 1 2; do for v in old18 . vs18; do
  o=$OUT/$v-$round; [ $v = . ] && o=$OUT/new-$round; mkdir -p $o
  (cd $R/$v && OUT=$o MM_TABLE=$NEW MM_BENCH_BUCKETS="${BUCKETS:-1 8}" MM_SHAPES="${SHAPES:-1024x4096 4096x4096 14336x4096 4096x14336}" timeout 100 bash ci/gpu-session.sh mmbench > /dev/null 2>&1; echo "$v $round rc=$?")
  grep -E "^matmul" $o/mmbench.txt | awk -v v=$v -v r=$round '{print v, r, $2, $6, $8, $11, $12}'
done; done | tee $OUT/ab.txt
(cd $R/vs18 && PYTHONPATH=$R/.devsite:$PWD timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 -k "split_k_gives or stream_k_over or same_output or two_groups_ahead_give or prmt_quarters_give or cuda_graph" tests/test_matmul_gpu.py 2>&1 | tail -3) | tee $OUT/vs18-tests.txt
