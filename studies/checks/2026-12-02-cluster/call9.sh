# Bulk-copy split-K reduction: GPU tests, then split timings.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
python3 studies/checks/2026-12-02-cluster/fill_cache.py 16 > $OUT/gpu_tests.log 2>&1
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" >> $OUT/gpu_tests.log 2>&1
echo "gputests rc=$? t=$((SECONDS-T0))"; grep -E "passed|failed|compiled|Error" $OUT/gpu_tests.log | tail -5 | cut -c1-300
timeout 120 python3 studies/checks/2026-12-02-cluster/exp8.py > $OUT/exp8.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp8.log
