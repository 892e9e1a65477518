# GPU tests with the one-writer split-K tail, then exp10 (tail old vs new, L2 prefetch of the next
# stage's weights). Kernels compiled on the CPU host and carried in scratch/kc.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-03-tail
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=$PWD/scratch/kc
T0=$SECONDS
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? t=$((SECONDS-T0))"; tail -2 $OUT/gpu_tests.log
timeout 300 python3 $D/exp10.py > $OUT/exp10.log 2>&1; echo "exp10 rc=$? t=$((SECONDS-T0))"
cut -c1-220 $OUT/exp10.log
