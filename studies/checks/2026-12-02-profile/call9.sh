# GPU tests and the bench after the evict-first weights, the fence after waits only, column order.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
python3 studies/checks/2026-12-02-cluster/fill_cache.py 16 > $OUT/gpu_tests.log 2>&1
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" >> $OUT/gpu_tests.log 2>&1
echo "gputests rc=$? t=$((SECONDS-T0))"; grep -E "passed|failed|compiled|Error" $OUT/gpu_tests.log | tail -5 | cut -c1-300
T0=$SECONDS
timeout 500 python3 -m tuner bench gpt3 --tokens 1,64,128,256,512,2048 --out $OUT/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
grep -v "it/s\|s/it" $OUT/bench.log | cut -c1-400 | tail -8
