#!/bin/bash
# call C: finish the sweep's 24 rows, then the models benchmark (every mode)
T0=$(date +%s)
make env > /dev/null 2>&1 || { echo env failed; exit 1; }
export PYTHONPATH=$PWD/.gpu-site:$PWD
timeout 150 python -m flashtext.bench --dtype bf16 --d 64 --causal true --n 8192 16384 --mode fwd fwd_bwd --providers ours triton gluon cudnn flash flex --flex-compile static --merge --out bench_h200_v5 --budget-min 0 --no-plot > $OUT/bench_merge.log 2>&1
echo "merge rc=$? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/bench_merge.log
cp flashtext/data/bench_h200_v5.json $OUT/ 2>/dev/null
left=$(( 580 - ($(date +%s) - T0) ))
budget=$(python -c "print(round(max(1.0, ($left - 50) / 60), 2))")
echo "models budget $budget min"
timeout $(( left - 5 )) python -m flashtext.bench.models --budget-min $budget > $OUT/models.log 2>&1
echo "models rc=$? at $(( $(date +%s) - T0 )) s"
cp flashtext/data/bench_h200_models.json flashtext/data/bench_h200_models_decode.json $OUT/ 2>/dev/null
grep -E "mode|INCOMPLETE|skipped|wrong|WRONG" $OUT/models.log | tail -20; tail -5 $OUT/models.log
