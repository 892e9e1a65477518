# The recorded bench at commit 7208036 (one-writer split-K tail, staged epilogue), all six sizes in one process.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
timeout 560 python3 -m tuner bench gpt3 --tokens 1,64,128,256,512,2048 --out $OUT/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
grep -v "it/s\|s/it" $OUT/bench.log | cut -c1-300 | tail -9
