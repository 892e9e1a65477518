# Clusters with TMA multicast: stage-alone and chain times at 64/256/2048 tokens.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 500 python3 studies/checks/2026-12-02-cluster/exp.py > $OUT/exp1.log 2>&1
echo "rc=$?"; tail -60 $OUT/exp1.log | cut -c1-200
