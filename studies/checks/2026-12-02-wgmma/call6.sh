python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
D=studies/checks/2026-12-02-wgmma
T0=$SECONDS
timeout 60 python3 -m pytest -x -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "wgmma_tma and 64" > $OUT/tma_quick.log 2>&1
echo "quick rc=$? t=$((SECONDS-T0))"; tail -5 $OUT/tma_quick.log | cut -c1-600
timeout 240 python3 $D/exp6.py 1,64,128,256,512,2048 6 wgmma_tma > $OUT/exp6.log 2>&1
echo "exp rc=$? t=$((SECONDS-T0))"
python3 $D/fill_cache.py 16 > $OUT/gpu_tests.log 2>&1
timeout 100 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" >> $OUT/gpu_tests.log 2>&1
echo "gputests rc=$? t=$((SECONDS-T0))"
grep -E "passed|failed|Error|error|compiled" $OUT/gpu_tests.log | cut -c1-300 | tail -12
cat $OUT/exp6.log | cut -c1-230 | tail -70
