#!/usr/bin/env bash
# Recorded configs and the library's kernel for the same shape under Nsight Compute with the
# clocks locked at base: duration, cycles (the most of any SM), tensor pipe activity, L2 sectors
# (all of them; those the SMs read, and the SMs' requests; those crossing between the L2's two
# halves), DRAM bytes read, and the bytes the SMs receive from TMA loads (multicast ones apart,
# with the multicast requests and their replays), each the median over the profiled launches. Interleaved rounds at
# boost clocks compare what kernels cost under the power cap; this compares their cycles and
# traffic at one clock. GPU only (ncu).
#
#   benchmarks/ncu_gemm.sh OUTDIR RECORDING LABEL RANKS LIBRARY_LABEL VARIANT [LAUNCHES]
#   benchmarks/ncu_gemm.sh out studies/h200/gpt3-2048.measurements.json gpt3.gemm2/tokens=2048 1,6 \
#       'gpt3.gemm2/tokens=2048,hidden=12288,ffn=6144' 'torch graph'
#
# RANKS: comma-separated ranks of recorded configs as profile_config.py picks them, each optionally
# with fields changed as its --also changes them, joined by + (1+order=row, 1+cm=2+stages=4); LIBRARY_LABEL
# and VARIANT as profile_library.py takes them. Each source is profiled for LAUNCHES launches
# (default 5) after 10. LIBRARY_KERNELS: the regex naming the library's kernels (default
# nvjet|gemm|xmma). Writes OUTDIR/ncu_<source>.csv (ncu's own) and prints the table.
set -uo pipefail
[ $# -ge 6 ] || { echo "usage: $0 OUTDIR RECORDING LABEL RANKS LIBRARY_LABEL VARIANT [LAUNCHES]" >&2; exit 2; }
out=$1 recording=$2 label=$3 ranks=$4 lib_label=$5 variant=$6 launches=${7:-5}
mkdir -p "$out"
here=$(dirname "${BASH_SOURCE[0]}")
# The table: what each column reads (ncu's metric), its heading and its scale from ncu's base unit
# (ns, cycles, %, sectors, requests, bytes). ncu is asked for exactly these metrics.
table=$(cat <<'EOF'
import csv
import sys
from pathlib import Path
from statistics import median

columns = [("gpu__time_duration.sum", "µs", 1e-3), ("sm__cycles_elapsed.max", "cycles", 1),
           ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor %", 1),
           ("lts__t_sectors.sum", "L2 sectors M", 1e-6), ("lts__t_sectors_srcunit_tex_op_read.sum", "SM reads M", 1e-6),
           ("lts__t_requests_srcunit_tex.sum", "SM requests M", 1e-6),
           ("lts__t_sectors_srcunit_ltcfabric.sum", "across halves M", 1e-6), ("dram__bytes_read.sum", "DRAM read MB", 1e-6),
           # The L2's request coalescer: sectors it sends the SMs for each it reads from L2 (requests for
           # the same lines from several SMs at nearly the same time are read once).
           ("lrc__average_xbar2gpc_sectors_op_read.ratio", "coalesced", 1),
           # What the SMs receive from TMA loads (all; those multicast to the cluster), and the multicast
           # read requests with those replayed for each further block they reach: how the L2's counts
           # see a multicast.
           ("l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum", "TMA in MB", 1e-6),
           ("l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld_dest_multicast.sum", "multicast in MB", 1e-6),
           ("l1tex__m_l1tex2xbar_read_requests_mem_global_op_tma_ld_dest_multicast.sum", "multicast requests M", 1e-6),
           ("l1tex__m_l1tex2xbar_read_requests_replayed_mem_global_op_tma_ld_dest_multicast.sum", "replayed M", 1e-6)]
if sys.argv[1] == "--metrics":
    print(",".join(c[0] for c in columns))
    sys.exit()
out, sources = Path(sys.argv[1]), sys.argv[2:]
print("| source | kernel | launches | " + " | ".join(c[1] for c in columns) + " |")
print("| --- | --- | ---: | " + " | ".join("---:" for _ in columns) + " |")
for who in sources:
    text = (out / f"ncu_{who}.csv").read_text()
    rows = list(csv.DictReader(line for line in text.splitlines() if line.startswith('"')))
    if not rows:
        sys.exit(f"{who}: ncu profiled no kernel (ncu_{who}.csv); is the kernel regex right?")
    values: dict[str, list[float]] = {}
    for r in rows:
        values.setdefault(r["Metric Name"], []).append(float(r["Metric Value"].replace(",", "")))
    cells = []
    for name, _, scale in columns:
        v = median(values[name]) * scale if values.get(name) else None
        cells.append("-" if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}")
    kernel = rows[0]["Kernel Name"].split("(")[0][:48]
    launches = len({r["ID"] for r in rows})
    print(f"| {who} | `{kernel}` | {launches} | " + " | ".join(cells) + " |")
EOF
)
metrics=$(python3 -c "$table" --metrics)
runs=$((launches + 15))  # the calls profile_*.py make: enough for the skipped and the profiled launches
profile() {  # who, kernel regex, command...
    local who=$1 kernels=$2
    shift 2
    ncu --clock-control base --metrics "$metrics" -k "regex:$kernels" --launch-skip 10 --launch-count "$launches" \
        --csv --print-units base "$@" > "$out/ncu_$who.csv" 2> "$out/ncu_$who.err" \
        || { echo "$who: ncu failed, see $out/ncu_$who.err" >&2; return 1; }
}
sources=()
for item in ${ranks//,/ }; do
    rank=${item%%+*} also=()
    [ "$item" != "$rank" ] && also=(--also "$(echo "${item#*+}" | tr + ,)")
    who="rank$(echo "$item" | tr -c 'A-Za-z0-9_\n' _)"
    profile "$who" stage python3 "$here/profile_config.py" "$recording" --label "$label" --rank "$rank" \
        "${also[@]}" --runs "$runs" || exit 1
    sources+=("$who")
done
profile library "${LIBRARY_KERNELS:-nvjet|gemm|xmma}" python3 "$here/profile_library.py" "$lib_label" \
    --variant "$variant" --runs "$runs" || exit 1
sources+=(library)
python3 -c "$table" "$out" "${sources[@]}"
