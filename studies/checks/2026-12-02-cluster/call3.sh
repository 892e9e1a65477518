# After the CTA-scope remote arrive: the cluster sweep again, then the protocol taken apart.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 300 python3 studies/checks/2026-12-02-cluster/exp.py > $OUT/exp3.log 2>&1
echo "rc=$?"
timeout 200 python3 studies/checks/2026-12-02-cluster/exp2.py > $OUT/exp3b.log 2>&1
echo "rc=$?"; cut -c1-48,98-200 $OUT/exp3.log | sed 's/  */ /g'; cut -c1-46,100-200 $OUT/exp3b.log | sed 's/  */ /g;s/maxActiveClusters=(<CUresult.CUDA_SUCCESS: 0>,/occ/'
