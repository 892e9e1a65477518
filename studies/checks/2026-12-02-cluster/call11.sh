# A GPU study at 64 tokens with the bench's warm start, limited to 120 s by the study's own --timeout, then export.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
python3 -m tuner study gpt3 --tokens 64 --trials 50 --timeout 120 --storage sqlite:///$OUT/study64.db > $OUT/study64.log 2>&1
echo "study rc=$?"; grep -v "trial/s\|s/trial" $OUT/study64.log | tail -5 | cut -c1-300
cd $OUT && python3 -m tuner export gpt3 --storage sqlite:///$OUT/study64.db > $OUT/export.log 2>&1; echo "export rc=$?"; cat $OUT/export.log; ls $OUT/tuned 2>/dev/null
