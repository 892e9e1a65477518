# A 50-trial GPU study at 64 tokens through the CLI (TPE over the three MMA kinds), then export.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
S=sqlite:////tmp/study64.db
timeout 230 python3 -m tuner study gpt3 --tokens 64 --trials 50 --storage $S > $OUT/study64.log 2>&1
echo "study rc=$?"
(python3 -m tuner export gpt3 --storage $S -o $OUT/gpt3.tuned.json; python3 -m tuner show gpt3 --storage $S) >> $OUT/study64.log 2>&1
grep -v "it/s\|s/it" $OUT/study64.log | tail -25 | cut -c1-300
