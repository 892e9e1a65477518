# Split-K's cost taken apart, and clocks/power under sustained load.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TUNER_CACHE=/tmp/kc
timeout 300 python3 studies/checks/2026-12-02-cluster/exp4.py > $OUT/exp4.log 2>&1
echo "rc=$?"; cat $OUT/exp4.log | cut -c1-250 | tail -20
python3 - <<'PY'
import json, os, datetime
out = os.environ["OUT"]
marks = json.load(open(f"{out}/marks.json"))
rows = [l.strip().split(", ") for l in open(f"{out}/smi.csv") if l.strip()]
def ts(s): return datetime.datetime.strptime(s, "%Y/%m/%d %H:%M:%S.%f").timestamp()
for (name, t0), (_, t1) in zip(marks[::2], marks[1::2]):
    sel = [r for r in rows if t0 <= ts(r[0]) <= t1]
    if sel:
        clk = [int(r[1].split()[0]) for r in sel]; pw = [float(r[2].split()[0]) for r in sel]
        print(f"{name:28s} n={len(sel)} sm MHz {min(clk)}-{max(clk)} (last {clk[-1]}), power W {min(pw):.0f}-{max(pw):.0f}, temp {sel[-1][3]}")
PY
