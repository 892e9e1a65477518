# One call: bench (recordings), planted faults in a GPU study, GPU tests with a CPU-built cache, a GPU study.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
T0=$SECONDS
timeout 200 python3 -m tuner bench gpt3 --trials 10 --out $OUT/gpt3.bench.json > $OUT/bench.log 2>&1
echo "bench rc=$? t=$((SECONDS-T0))"
F=sqlite:////tmp/faults.db
timeout 60 python3 -m tuner study gpt3 --tokens 64 --trials 7 --seed 5 --deadline 10 --plant-fault 2:illegal_address --plant-fault 4:hang --plant-fault 6:missing_post --storage $F > $OUT/faults.log 2>&1
echo "faults rc=$? t=$((SECONDS-T0))"
(python3 -m tuner show gpt3 --storage $F; python3 scratch/trials.py $F) >> $OUT/faults.log 2>&1
(python3 scratch/fill_cache.py /tmp/kc all 16 | tail -1; TUNER_CARRIED_CACHE=$PWD/.kcache timeout 85 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py) > $OUT/gpu_tests.log 2>&1
echo "gputests rc=$? t=$((SECONDS-T0))"
S=sqlite:////tmp/study64.db
timeout 60 python3 -m tuner study gpt3 --tokens 64 --trials 50 --storage $S > $OUT/study64.log 2>&1
echo "study rc=$? t=$((SECONDS-T0))"
(python3 -m tuner export gpt3 --storage $S -o $OUT/gpt3.tuned.json; python3 -m tuner show gpt3 --storage $S; python3 scratch/trials.py $S) >> $OUT/study64.log 2>&1
tail -n 25 $OUT/faults.log; grep -E "passed|failed|carried" $OUT/gpu_tests.log | tail -3; grep -v "it/s\|s/it" $OUT/study64.log | head -8; tail -16 $OUT/bench.log
