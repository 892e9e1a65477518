python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
D=studies/checks/2026-12-02-wgmma
T0=$SECONDS
timeout 300 python3 $D/exp5.py 1,64,128,256,512,2048 8 > $OUT/exp5.log 2>&1
echo "exp rc=$? t=$((SECONDS-T0))"
python3 $D/fill_cache.py 16 > $OUT/gpu_tests.log 2>&1
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" >> $OUT/gpu_tests.log 2>&1
echo "gputests rc=$? t=$((SECONDS-T0))"
grep -E "passed|failed|Error|error|compiled" $OUT/gpu_tests.log | cut -c1-300 | tail -12
cat $OUT/exp5.log | cut -c1-230 | tail -80
