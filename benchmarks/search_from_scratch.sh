#!/usr/bin/env bash
# The default study from an empty database, then bench on the same storage: the search is
# answered from the study's trials (no new ones), and the finalists are timed in interleaved
# rounds with PyTorch's and CuPy's chains and the picks of any --compare summary.
#
#   benchmarks/search_from_scratch.sh OUTDIR WORKLOAD TOKENS [study/bench flags...]
#   e.g. benchmarks/search_from_scratch.sh out gpt3 1,256,2048 --compare studies/gpt3.bench.json
#
# Flags after TOKENS go to both commands where they apply (--hidden, --ffn, --trials) and
# --compare to bench only. Writes OUTDIR/<name>.db, <name>.study.log, <name>.bench.json,
# <name>.measurements.json and <name>.bench.log, where name is WORKLOAD plus the size flags.
set -uo pipefail
out=$1 workload=$2 tokens=$3
shift 3
study_flags=() bench_flags=()
while [ $# -gt 0 ]; do
    case $1 in
        --compare) bench_flags+=("$1" "$2"); shift 2 ;;
        *) study_flags+=("$1" "$2"); bench_flags+=("$1" "$2"); shift 2 ;;
    esac
done
name=$workload$(printf '%s' "${study_flags[@]}" | tr -c 'a-z0-9' '-' | sed 's/-\+/-/g; s/-$//')
mkdir -p "$out"
db="sqlite:///$(realpath "$out")/$name.db"
start=$SECONDS
for t in ${tokens//,/ }; do
    t0=$SECONDS
    python3 -m tuner study "$workload" --tokens "$t" --no-warm-start --storage "$db" "${study_flags[@]}" \
        >> "$out/$name.study.log" 2>&1
    echo "study $workload ${study_flags[*]} tokens=$t: rc=$? $((SECONDS - t0)) s"
done
grep -a " on NVIDIA" "$out/$name.study.log" | cut -c1-400
python3 -m tuner bench "$workload" --tokens "$tokens" --storage "$db" --out "$out/$name.bench.json" \
    "${bench_flags[@]}" > "$out/$name.bench.log" 2>&1
echo "bench rc=$? total $((SECONDS - start)) s"
grep -a -A20 "^size" "$out/$name.bench.log"
