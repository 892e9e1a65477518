# The epilogue's and the split-K tail's share of a stage.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 200 python3 studies/checks/2026-12-02-cluster/exp6.py > $OUT/exp6.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp6.log
