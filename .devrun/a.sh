#!/bin/bash
# call A: make test on the H200, then the accuracy recording
make env > $OUT/env.log 2>&1 || { tail -30 $OUT/env.log; exit 1; }
export PYTHONPATH=$PWD/.gpu-site:$PWD
t0=$(date +%s)
PYTEST_ADDOPTS="-rfE" FLASHTEXT_TEST_TIMES=$OUT/test_times.tsv timeout 360 make test > $OUT/test.log 2>&1
echo "make test rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/test.log | tail -40
cp artifacts/chapters.log $OUT/ 2>/dev/null
t0=$(date +%s)
timeout 170 python scripts/record_accuracy.py --jobs 12 > $OUT/acc.log 2>&1
echo "accuracy rc=$? in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/acc.log
cp flashtext/data/accuracy_h200.json $OUT/ 2>/dev/null
