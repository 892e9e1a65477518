# exp9 (feed vs math decomposition, early slot release, 128x96 clusters along M).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
D=$PWD/studies/checks/2026-12-02-profile
export PYTHONPATH=/tmp/site:$PWD:$D PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 400 python3 $D/exp9.py > $OUT/exp9.log 2>&1; echo "exp9 rc=$?"; cut -c1-220 $OUT/exp9.log
