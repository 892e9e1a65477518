#!/usr/bin/env bash
# A recorded config and the library's kernels of the same shape, each run back to back for
# thousands of calls while nvidia-smi samples the SM clock, the power draw and the throttle
# reasons every 50 ms: whether one kernel runs at a lower clock than the other under sustained
# load (the power cap), which interleaved rounds after idle mostly hide. Ours and the library's
# alternate twice. GPU only.
#
#   benchmarks/sustained_clock.sh OUTDIR RECORDING LABEL RANK LIBRARY_LABEL VARIANT [RUNS]
#   benchmarks/sustained_clock.sh out studies/h200/gpt3-2048.measurements.json gpt3.gemm2/tokens=2048 1 \
#       'gpt3.gemm2/tokens=2048,hidden=12288,ffn=6144' 'torch graph' 8000
#
# LABEL and RANK pick the config as profile_config.py does, LIBRARY_LABEL and VARIANT the
# library's form as profile_library.py does. For each run: the mean clock and power of the
# samples drawing at least half the run's peak power (the timed loop, not the setup). IDLE_S:
# seconds of idle after each run (default 5). Writes OUTDIR/smi_<n>_<who>.txt (the samples) and
# OUTDIR/run_<n>_<who>.txt (the script's output).
set -uo pipefail
[ $# -ge 6 ] || { echo "usage: $0 OUTDIR RECORDING LABEL RANK LIBRARY_LABEL VARIANT [RUNS]" >&2; exit 2; }
out=$1 recording=$2 label=$3 rank=$4 lib_label=$5 variant=$6 runs=${7:-8000}
mkdir -p "$out"
here=$(dirname "${BASH_SOURCE[0]}")
n=0
for who in ours library ours library; do
    n=$((n + 1))
    smi="$out/smi_${n}_$who.txt"
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits \
        -lms 50 > "$smi" &
    sampler=$!
    if [ $who = ours ]; then
        python3 "$here/profile_config.py" "$recording" --label "$label" --rank "$rank" --runs "$runs"
    else
        python3 "$here/profile_library.py" "$lib_label" --variant "$variant" --runs "$runs"
    fi > "$out/run_${n}_$who.txt" 2>&1 || { kill $sampler; echo "$who failed: $out/run_${n}_$who.txt" >&2; exit 1; }
    kill $sampler
    wait $sampler 2> /dev/null
    sleep "${IDLE_S:-5}"  # idle between runs, so each starts from the same clock
    awk -F', ' -v who="$who" '{ w[NR] = $2; c[NR] = $1; if ($2 > peak) peak = $2 }
        END { for (i = 1; i <= NR; i++) if (w[i] >= peak / 2) { k++; mc += c[i]; mw += w[i] }
              printf "%-8s %4d samples at load: %6.0f MHz, %5.0f W (peak %.0f W)\n", who, k, mc / k, mw / k, peak }' "$smi"
done
