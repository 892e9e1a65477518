# The bench with three finalists per kind in the final rounds (kernels as at 4f7d436).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
timeout 330 python3 -m tuner bench gpt3 --tokens 1,64,128,256,512,2048 --out $OUT/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
grep -v "it/s\|s/it" $OUT/bench.log | cut -c1-400 | tail -8
