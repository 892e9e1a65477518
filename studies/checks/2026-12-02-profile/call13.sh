# exp9 (feed vs math, early slot release, wait2, staged vs direct epilogue, 128x96 clusters along M),
# then the GPU tests with the staged epilogue.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 330 python3 $D/exp9.py > $OUT/exp9.log 2>&1; echo "exp9 rc=$?"
python3 studies/checks/2026-12-02-cluster/fill_cache.py 16 > $OUT/fill.log 2>&1
timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.log
cut -c1-200 $OUT/exp9.log
