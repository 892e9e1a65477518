# GPU tests after the descriptor-slot refactor: every policy x order x launch, three MMA kinds.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
python3 studies/checks/2026-12-02-wgmma/fill_cache.py 16 > $OUT/gpu_tests_final.log 2>&1
timeout 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" >> $OUT/gpu_tests_final.log 2>&1
echo "gputests rc=$?"; grep -E "passed|failed|compiled" $OUT/gpu_tests_final.log | tail -3
