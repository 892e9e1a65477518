# The bench recorded in studies/gpt3.bench.json and studies/gpt3.measurements.json.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
timeout 280 python3 -m tuner bench gpt3 --tokens 1,64,128,256,512,2048 --out $OUT/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
grep -v "it/s\|s/it" $OUT/bench.log | cut -c1-400 | tail -9
