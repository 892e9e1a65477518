# Early slot release (exp8.py), prepared for the next device session.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 200 python3 $D/exp8.py > $OUT/exp8.log 2>&1; echo "exp8 rc=$?"; cut -c1-200 $OUT/exp8.log

