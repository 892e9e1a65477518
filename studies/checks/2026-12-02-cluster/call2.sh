# Clusters taken apart: multicast, cluster-wide arrivals, cluster launch; occupancy per kernel.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 300 python3 studies/checks/2026-12-02-cluster/exp2.py > $OUT/exp2.log 2>&1
echo "rc=$?"; tail -40 $OUT/exp2.log | cut -c1-220
