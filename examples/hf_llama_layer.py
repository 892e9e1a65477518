"""Replace a Hugging Face ``LlamaDecoderLayer``'s decode step with the tuned layer chain, and check it
against the layer's own forward.

    python -m tuner study llama-layer --tokens 1 --cache 4096 --graphs
    python -m tuner export llama-layer --format bundle -o tuned/llama-layer-bundle
    python examples/hf_llama_layer.py tuned/llama-layer-bundle --tokens 1 --prompt 4000

The layer is ``transformers``' own (one tensor-parallel shard of LLaMA-2-70B by default: hidden
8192, 8 query heads sharing one KV head of 128, MLP 3584), its weights random. The tuned chain takes
them as the module holds them (``tuner.shipping.layer.TunedLayer.from_llama``: converted once), and
a KV cache holding the prompt's keys and values (computed here with the layer's own norm,
projections and rotary embedding). One decode step of ``--tokens`` new tokens then runs through the
chain, reading the cache's length (the prompt's) at run time and appending the step's keys and
values, and is compared with the layer's forward over the whole sequence (its last rows: the same
causal attention, without a cache); the appended keys and values with the layer's. Then the step
is timed from a CUDA graph (CUDA events, medians). GPU only; needs ``transformers``.
"""
from __future__ import annotations

import argparse
import statistics

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding, apply_rotary_pos_emb

import tuner.shipping.runtime
from tuner.shipping.layer import TunedLayer


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=1, help="new tokens of the step (a tuned size of the bundle)")
    ap.add_argument("--prompt", type=int, default=1000, help="cached tokens before the step (at most the room)")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=3584)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    d, p, t = 128, args.prompt, args.tokens
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, head_dim=d, rms_norm_eps=1e-5,
                         max_position_embeddings=p + t, attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    block = LlamaDecoderLayer(config, layer_idx=0).to("cuda", torch.float16).eval()
    with torch.no_grad():
        for name, w in block.named_parameters():
            if w.dim() == 2:
                w.normal_(0.0, w.shape[1] ** -0.5)
            else:  # the norms' gains
                w.uniform_(0.8, 1.2)
    rope = LlamaRotaryEmbedding(config).to("cuda")
    seq = torch.randn(1, p + t, args.hidden, device="cuda", dtype=torch.float16)
    pos = torch.arange(p + t, device="cuda")[None]
    with torch.no_grad():
        cos, sin = rope(seq, pos)
        out = block(seq, position_embeddings=(cos, sin), position_ids=pos)
        want = (out[0] if isinstance(out, tuple) else out)[0, p:]  # the step's rows
        # Every token's keys and values as the layer computes them: the prompt's fill the cache.
        h = block.input_layernorm(seq)
        k = block.self_attn.k_proj(h).view(1, p + t, args.kv_heads, d).transpose(1, 2)
        v = block.self_attn.v_proj(h).view(1, p + t, args.kv_heads, d).transpose(1, 2)
        _, k = apply_rotary_pos_emb(k, k, cos, sin)

    bundle = tuner.shipping.runtime.load(args.bundle)
    layer = TunedLayer.from_llama(bundle, block, tokens=t)  # the largest room the bundle has for this shape
    room = layer.chain.stages[1].cache
    if p > room:
        raise SystemExit(f"--prompt {p}: the bundle's room is {room} cached tokens")
    layer.set_cache(k[0, :, :p], v[0, :, :p])
    cache_len = torch.tensor([p], dtype=torch.int32, device="cuda")  # as a model's cache_position
    with torch.no_grad():
        got = layer(seq[0, p:], cache_len).clone()
        keys, values = layer.cache()
    torch.cuda.synchronize()
    errs = {"hidden states": rel(got, want), "appended keys": rel(keys[:, p:p + t], k[0, :, p:]),
            "appended values": rel(values[:, p:p + t], v[0, :, p:])}

    g = torch.cuda.CUDAGraph()
    x = seq[0, p:].contiguous()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x, cache_len)  # warm-up off the capture (the runtime builds its descriptors once)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        layer(x, cache_len)
    times = []
    for _ in range(60):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    print(f"{torch.cuda.get_device_name()}: LLaMA layer (hidden {args.hidden}, {args.heads} heads, {args.kv_heads} KV "
          f"heads, MLP {args.ffn}), {t} new token(s) after {p} cached (room {room})")
    print("relative error against the Hugging Face layer: "
          + ", ".join(f"{k} {e:.2e}" for k, e in errs.items()) + " (limit 1e-2)")
    print(f"tuned step from a CUDA graph: {statistics.median(times[10:]):.1f} us (median of 50)")
    return 0 if max(errs.values()) < 1e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
