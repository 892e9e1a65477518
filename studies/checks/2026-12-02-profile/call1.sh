# cuBLAS's kernels for the chain (names, grids), and ncu on ours and theirs at 256 tokens.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
D=studies/checks/2026-12-02-profile
which ncu; nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 120 python3 $D/prof.py names > $OUT/names.log 2>&1; echo "names rc=$?"
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
timeout 150 ncu --clock-control none $S -k regex:stage0 --launch-skip 4 --launch-count 1 python3 $D/prof.py ours 256 1 > $OUT/ncu_ours_g2.txt 2>&1; echo "ours g2 rc=$?"
timeout 150 ncu --clock-control none $S -k regex:stage0 --launch-skip 4 --launch-count 1 python3 $D/prof.py ours 256 0 > $OUT/ncu_ours_g1.txt 2>&1; echo "ours g1 rc=$?"
timeout 150 ncu --clock-control none $S -k regex:"gemm|sm90|cutlass|xmma" --launch-skip 10 --launch-count 2 python3 $D/prof.py torch 256 > $OUT/ncu_torch.txt 2>&1; echo "torch rc=$?"
cat $OUT/names.log
for f in ncu_ours_g2 ncu_ours_g1 ncu_torch; do echo "=== $f"; grep -E "^  [a-zA-Z_]|Duration|Throughput|Pipe|Issue|Eligible|Active Warps|Grid Size|Cluster|Registers|Shared Memory Config|L2 Hit|L1/TEX Hit|Stall|Block Size|One or More|No Eligible" $OUT/$f.txt | head -60; done
