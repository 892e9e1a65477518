# The GPU tests with the staged epilogue, exp9 (feed vs math, early slot release, wait2, staged vs
# direct epilogue, 128x96 clusters along M), then the bench. Kernels for the first two compiled on
# the CPU host and carried in scratch/kc.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=$PWD/scratch/kc
T0=$SECONDS
timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k "not carried" > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc=$? t=$((SECONDS-T0))"; tail -2 $OUT/gpu_tests.log
timeout 200 python3 $D/exp9.py > $OUT/exp9.log 2>&1; echo "exp9 rc=$? t=$((SECONDS-T0))"
timeout $((560-SECONDS+T0)) python3 -m tuner bench gpt3 --tokens 1,64,128,256 --out $OUT/small/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
timeout $((570-SECONDS+T0)) python3 -m tuner bench gpt3 --tokens 512,2048 --out $OUT/large/gpt3.bench.json > $OUT/bench_large.log 2>&1
echo "bench large rc=$? t=$((SECONDS-T0))"
grep -v "it/s\|s/it" $OUT/bench.log | cut -c1-300 | tail -6; grep -v "it/s\|s/it" $OUT/bench_large.log | cut -c1-300 | tail -4
cut -c1-200 $OUT/exp9.log
