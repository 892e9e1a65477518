# Multicast operands split between the cluster blocks: variants of exp3.py.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
cd studies/checks/2026-12-02-profile && PYTHONPATH=$PYTHONPATH:$PWD timeout 400 python3 ./exp3.py > $OUT/exp3.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp3.log; exit 0; python3 studies/checks/2026-12-02-profile/exp3.py > $OUT/exp3.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp3.log
