# exp11 (split-K reduction: loads in flight), then the 50-trial GPU study at 64 tokens with the
# bench's warm start (studies/gpt3.bench.json of call15), limited to 120 s by its own --timeout, and export.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-03-tail
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1
T0=$SECONDS
TUNER_CACHE=$PWD/scratch/kc timeout 200 python3 $D/exp11.py > $OUT/exp11.log 2>&1; echo "exp11 rc=$? t=$((SECONDS-T0))"
export TUNER_CACHE=/tmp/kc
python3 -m tuner study gpt3 --tokens 64 --trials 50 --timeout 120 --storage sqlite:///$OUT/study64.db > $OUT/study64.log 2>&1
echo "study rc=$? t=$((SECONDS-T0))"; grep -v "trial/s\|s/trial" $OUT/study64.log | tail -5 | cut -c1-300
cd $OUT && python3 -m tuner export gpt3 --storage sqlite:///$OUT/study64.db > $OUT/export.log 2>&1; echo "export rc=$?"; cat $OUT/export.log; ls $OUT/tuned 2>/dev/null
grep -v "registers" $OUT/exp11.log | cut -c1-200
