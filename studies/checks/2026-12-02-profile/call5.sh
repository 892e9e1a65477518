# Per-instruction warp stall samples (ncu source page, SASS) of our GEMM2 at 2048 and 256 tokens.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
D=studies/checks/2026-12-02-profile
for tok in 2048 256; do
  timeout 200 ncu --clock-control none --set full -k regex:stage0 --launch-skip 4 --launch-count 1 -o $OUT/g2_$tok python3 $D/prof.py ours $tok 1 > $OUT/ncu_g2_$tok.log 2>&1; echo "ncu $tok rc=$?"
  ncu -i $OUT/g2_$tok.ncu-rep --page source --csv --print-source sass > $OUT/src_g2_$tok.csv 2>&1; echo "src rc=$?"
  ncu -i $OUT/g2_$tok.ncu-rep --page details > $OUT/details_g2_$tok.txt 2>&1
done
python3 $D/stalls.py $OUT/src_g2_2048.csv $OUT/src_g2_256.csv
