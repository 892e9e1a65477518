# Pipeline depth (exp7.py), then the bench at one size, to run the final rounds' re-verification on the GPU.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 200 python3 $D/exp7.py > $OUT/exp7.log 2>&1; echo "exp7 rc=$?"; cut -c1-200 $OUT/exp7.log
timeout 200 python3 -m tuner bench gpt3 --tokens 64 --out $OUT/bench64.json > $OUT/bench64.log 2>&1; echo "bench rc=$?"
grep -v "it/s\|s/it" $OUT/bench64.log | cut -c1-300 | tail -4
