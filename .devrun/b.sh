#!/bin/bash
# call B: record_hopper, then the full benchmark sweep (v5)
T0=$(date +%s)
make env > /dev/null 2>&1 || { echo env failed; exit 1; }
export PYTHONPATH=$PWD/.gpu-site:$PWD
timeout 170 python scripts/record_hopper.py > $OUT/hopper.log 2>&1
echo "hopper rc=$? at $(( $(date +%s) - T0 )) s"; tail -2 $OUT/hopper.log
cp flashtext/data/h200_hopper.json $OUT/ 2>/dev/null
left=$(( 575 - ($(date +%s) - T0) ))
budget=$(python -c "print(round(max(1.0, ($left - 45) / 60), 2))")
echo "bench budget $budget min"
timeout $(( left - 5 )) python -m flashtext.bench --providers ours triton gluon cudnn flash flex --flex-compile static --out bench_h200_v5 --budget-min $budget > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s"
cp flashtext/data/bench_h200_v5.json $OUT/ 2>/dev/null
grep -A30 "^Targets" $OUT/bench.log | head -30; tail -8 $OUT/bench.log
