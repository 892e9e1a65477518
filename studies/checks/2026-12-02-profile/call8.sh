# Each L2 hint alone: variants of exp6.py.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 400 python3 $D/exp6.py > $OUT/exp6.log 2>&1; echo "rc=$?"; cut -c1-200 $OUT/exp6.log
