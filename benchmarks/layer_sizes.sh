#!/usr/bin/env bash
# The decoder layer's table: a layer workload tuned per size from an empty database (`bench`, in
# CUDA graphs, PyTorch's chain eager, in a graph and through torch.compile beside it), its bundle
# exported, then the Hugging Face-semantics layer in PyTorch timed with the tuned layer in the same
# rounds (benchmarks/layer_baseline.py --bundle), and a decode loop of 4 layers x 32 steps through
# the runtime against PyTorch's (benchmarks/decode_loop.py). GPU only.
#
#   benchmarks/layer_sizes.sh OUTDIR MODEL GROUP [GROUP ...]
#   e.g. benchmarks/layer_sizes.sh out llama decode-1-4096          # one group: a device call's 10 minutes
#        TRIALS=40 benchmarks/layer_sizes.sh out gpt3 decode-4-1024 prompt-512
#
# MODEL: llama (llama-layer, the LLaMA-2-70B shard) or gpt3 (gpt3-layer). Groups: decode-T-C (T new
# tokens after C cached: 1, 4 or 16 after 1024 or 4096) and prompt-P (P tokens on an empty cache:
# 512 or 2048). Writes OUTDIR/MODEL-GROUP.{bench.json,measurements.json,log}, OUTDIR/MODEL.db (one
# storage for the groups), OUTDIR/MODEL-bundle/ and OUTDIR/MODEL-{layer,loop}.json; prints each table.
set -uo pipefail
out=$1
model=$2
shift 2
[ $# -eq 0 ] && { echo "usage: $0 OUTDIR MODEL GROUP [GROUP ...]" >&2; exit 2; }
case $model in
    llama|gpt3) ;;
    *) echo "$0: model $model; accepted: llama, gpt3" >&2; exit 2 ;;
esac
mkdir -p "$out"
db="sqlite:///$out/$model.db"
tokens=() caches=() prompts=()
for g in "$@"; do
    case $g in
        decode-*-*) t=${g#decode-}; c=${t#*-}; t=${t%-*}; args=(--tokens "$t" --cache "$c"); tokens+=("$t"); caches+=("$c") ;;
        prompt-*) p=${g#prompt-}; args=(--tokens "$p" --cache 0); prompts+=("$p") ;;
        *) echo "$0: group $g; accepted: decode-T-C, prompt-P" >&2; exit 2 ;;
    esac
    start=$SECONDS
    python3 -m tuner bench "$model-layer" "${args[@]}" --trials "${TRIALS:-30}" --graphs --compile --storage "$db" \
        -o "$out/$model-$g.bench.json" > "$out/$model-$g.log" 2>&1
    echo "$model-$g: bench rc=$? in $((SECONDS - start)) s"
    tail -n 12 "$out/$model-$g.log"
done
python3 -m tuner export "$model-layer" --storage "$db" --format bundle -o "$out/$model-bundle" || exit 1
join() { local IFS=,; echo "$*"; }
python3 benchmarks/layer_baseline.py --model "$model" --tokens "$(join "${tokens[@]}")" --cache "$(join "${caches[@]}")" \
    --prompt "$(join "${prompts[@]}")" --compile --bundle "$out/$model-bundle" --json "$out/$model-layer.json"
if [ ${#tokens[@]} -gt 0 ]; then
    python3 benchmarks/decode_loop.py --bundle "$out/$model-bundle" --model "$model" --tokens "${tokens[0]}" \
        --json "$out/$model-loop.json"
fi
