#!/usr/bin/env bash
# Every built-in MLP size searched from an empty database and timed against PyTorch in the same
# process: `bench` per group of sizes, in CUDA graphs, then `tuner report` of the summaries.
# This is the per-size table of the results page (studies/h100/ holds one run). GPU only.
#
#   benchmarks/mlp_sizes.sh OUTDIR [GROUP ...]
#   e.g. benchmarks/mlp_sizes.sh out gpt3-256 gpt3-2048    # two groups (a device call's 10 minutes)
#        COMPARE=studies/h100 benchmarks/mlp_sizes.sh out  # every group, earlier picks re-timed beside
#        SUSTAINED=2 benchmarks/mlp_sizes.sh out gpt3-2048  # final rounds under sustained load (bench --sustained 2)
#        SPACE=my.toml benchmarks/mlp_sizes.sh out llama-h4096-f11008-1100  # another search space (bench --space)
#
# Groups (default: all built-in ones, in this order): gpt3-1-64-128 gpt3-256 gpt3-512 gpt3-2048
# llama-1-64 llama-320 llama-1024. Shapes of other models (no recording holds them; run only when
# named): gpt3-h4096-f16384-200 (GPT-J-6B), llama-h4096-f11008-200 (Llama-2-7B) and
# llama-h5120-f13824-200 (Llama-2-13B), at 200 tokens, and llama-h4096-f11008-600 and
# llama-h4096-f11008-1100 (Llama-2-7B at 600 and 1100 tokens). A group of one mid or large size also times
# each GEMM alone against cuBLAS (--stages). With COMPARE=DIR, a group whose DIR/<group>.bench.json exists re-times that run's
# picks in the final rounds (--compare). Writes OUTDIR/<group>.{bench.json,measurements.json,log,db}
# and OUTDIR/report/ (tables and plots); prints each group's table.
set -uo pipefail
out=$1
shift
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(gpt3-1-64-128 gpt3-256 gpt3-512 gpt3-2048 llama-1-64 llama-320 llama-1024)
mkdir -p "$out"
start=$SECONDS
for g in "${groups[@]}"; do
    case $g in
        gpt3-1-64-128) args=(gpt3 --tokens 1,64,128 --trials 100) ;;
        gpt3-256) args=(gpt3 --tokens 256 --trials 200 --stages) ;;
        gpt3-512) args=(gpt3 --tokens 512 --trials 200 --stages) ;;
        gpt3-2048) args=(gpt3 --tokens 2048 --trials 200 --stages) ;;
        llama-1-64) args=(llama --tokens 1,64 --trials 100) ;;
        llama-320) args=(llama --tokens 320 --trials 200 --stages) ;;
        llama-1024) args=(llama --tokens 1024 --trials 150 --stages) ;;
        gpt3-h4096-f16384-200) args=(gpt3 --hidden 4096 --ffn 16384 --tokens 200 --trials 200 --stages) ;;
        llama-h4096-f11008-200) args=(llama --hidden 4096 --ffn 11008 --tokens 200 --trials 200 --stages) ;;
        llama-h5120-f13824-200) args=(llama --hidden 5120 --ffn 13824 --tokens 200 --trials 200 --stages) ;;
        llama-h4096-f11008-600) args=(llama --hidden 4096 --ffn 11008 --tokens 600 --trials 200 --stages) ;;
        llama-h4096-f11008-1100) args=(llama --hidden 4096 --ffn 11008 --tokens 1100 --trials 200 --stages) ;;
        *) echo "unknown group $g; accepted: gpt3-1-64-128 gpt3-256 gpt3-512 gpt3-2048 llama-1-64 llama-320" \
               "llama-1024 gpt3-h4096-f16384-200 llama-h4096-f11008-200 llama-h5120-f13824-200 llama-h4096-f11008-600 llama-h4096-f11008-1100" >&2
           exit 2 ;;
    esac
    if [ -n "${COMPARE:-}" ] && [ -f "$COMPARE/$g.bench.json" ]; then
        args+=(--compare "$COMPARE/$g.bench.json")
    fi
    [ -n "${SUSTAINED:-}" ] && args+=(--sustained "$SUSTAINED")
    [ -n "${SPACE:-}" ] && args+=(--space "$SPACE")
    t0=$SECONDS
    python3 -m tuner bench "${args[@]}" --graphs --storage "sqlite:///$(realpath "$out")/$g.db" \
        --out "$out/$g.bench.json" > "$out/$g.log" 2>&1
    echo "== $g: rc=$? $((SECONDS - t0)) s"
    grep -a -A8 "^size\|^stage " "$out/$g.log" | cut -c1-300
done
for w in gpt3 llama; do
    summaries=$(ls "$out"/$w-*.bench.json 2>/dev/null)
    [ -n "$summaries" ] && python3 -m tuner report $w --summary $summaries --out "$out/report" > /dev/null
done
echo "total $((SECONDS - start)) s; report: $out/report/"
