# Descriptor placement, L2-invalidating acquire, prefetch: variants of exp2.py.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 400 python3 studies/checks/2026-12-02-profile/exp2.py > $OUT/exp2.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp2.log
