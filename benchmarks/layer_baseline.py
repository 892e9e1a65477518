"""What a whole decoder layer costs in PyTorch today, and its floor: the bar a tuned layer chain must beat.

    python benchmarks/layer_baseline.py [--model llama|gpt3|llama-13b ...] [--tokens 1,4,16] [--cache 1024,4096]
        [--prompt 512,2048] [--rounds 5] [--compile] [--bundle DIR ...] [--json F]

One pre-norm decoder layer per size, written as Hugging Face's ``LlamaDecoderLayer`` computes
it (RMSNorm, rotary embeddings on queries and keys, the new keys and values written into a
static KV cache, grouped-query attention through SDPA, the O projection plus the residual,
RMSNorm, SwiGLU, the down projection plus the residual) or as a GPT block does (LayerNorm, no
RoPE, multi-head attention, GELU MLP); fp16, no biases, one GPU's shard of an 8-way
tensor-parallel model (the all-reduce left out, as in the chains). Each variant is timed with
CUDA events in interleaved rounds after idle (the median of each round, then the median of the
rounds): eager, captured in a CUDA graph, and with ``--compile`` ``torch.compile`` (its default
mode, then captured in a graph). The floor is the bytes the layer must move (its weights, the KV
cache it reads, the keys and values it writes, its input and output) over the read bandwidth
measured in the same run; each variant's share of that bandwidth is the floor over its time.
The floor is the larger of that and the FLOPs over the fp16 GEMM rate measured in the same run.
A check runs first: each variant's output and the cache rows it wrote against the eager
layer's (relative error). With ``--bundle`` (a folder ``tuner export --format bundle`` wrote for
``llama-layer`` or ``gpt3-layer``), the tuned chain of each size the bundle holds runs too, in the
same rounds: on the layer module's own weights, converted once (``tuner.shipping.layer``), its
output and the cache rows it appended checked against the eager layer's. GPU only.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.bench.baselines import gemm_rate, read_bandwidth, time_torch, torch_graph  # noqa: E402
from tuner.chain.workloads import get_workload  # noqa: E402


GQA_IN_SDPA = False  # whether this PyTorch's SDPA takes grouped-query attention itself (set by make_layer)


@dataclass(frozen=True)
class LayerShape:
    """One GPU's shard of a decoder layer."""

    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    llama: bool  # RMSNorm, RoPE, SwiGLU; else LayerNorm, GELU (a GPT block)

    def weight_bytes(self) -> int:
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim * self.hidden
        out = self.heads * self.head_dim * self.hidden
        mlp = (3 if self.llama else 2) * self.ffn * self.hidden
        norms = 2 * self.hidden * (1 if self.llama else 2)
        return 2 * (qkv + out + mlp + norms)

    def floor_bytes(self, tokens: int, cache: int) -> int:
        kv_row = 2 * self.kv_heads * self.head_dim * 2  # a token's key and value, fp16
        return self.weight_bytes() + cache * kv_row + tokens * kv_row + 2 * tokens * self.hidden * 2

    def flops(self, tokens: int, cache: int) -> int:
        """The GEMMs' and the attention's multiply-adds, twice (causal: each query its keys up to itself)."""
        keys = tokens * cache + tokens * (tokens + 1) // 2  # (query, key) pairs
        return tokens * (self.weight_bytes() // 2) * 2 + 4 * self.heads * self.head_dim * keys


def builtin(model: str) -> LayerShape:
    """The layer of the built-in MLP and attention workloads of ``model`` (their 8-way tensor-parallel shard)."""
    mlp, attn = get_workload(model).defaults, get_workload(f"{model}-attn").defaults
    return LayerShape(model, mlp["hidden"], mlp["ffn"], attn["heads"], attn["kv_heads"], attn["head_dim"],
                      llama=model == "llama")


# The built-in shards and Llama-2-13B on one GPU.
SHAPES = {s.name: s for s in (builtin("llama"), builtin("gpt3"),
                              LayerShape("llama-13b", 5120, 13824, 40, 40, 128, llama=True))}


def make_layer(shape: LayerShape, max_len: int, device: str = "cuda"):
    """The layer as a ``torch.nn.Module`` holding its weights and a static KV cache of ``max_len`` tokens."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class RMSNorm(nn.Module):
        def __init__(self, n: int, eps: float = 1e-5):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

        def forward(self, x):  # as LlamaRMSNorm: in float32, then back to the input's type
            xf = x.float()
            return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def rotate_half(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            s, d = shape, shape.head_dim
            norm = (lambda: RMSNorm(s.hidden)) if s.llama else (lambda: nn.LayerNorm(s.hidden, bias=False))
            self.norm1, self.norm2 = norm(), norm()
            self.q = nn.Linear(s.hidden, s.heads * d, bias=False)
            self.k = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
            self.v = nn.Linear(s.hidden, s.kv_heads * d, bias=False)
            self.o = nn.Linear(s.heads * d, s.hidden, bias=False)
            if s.llama:
                self.gate = nn.Linear(s.hidden, s.ffn, bias=False)
            self.up = nn.Linear(s.hidden, s.ffn, bias=False)
            self.down = nn.Linear(s.ffn, s.hidden, bias=False)
            self.register_buffer("k_cache", torch.zeros(1, s.kv_heads, max_len, d))
            self.register_buffer("v_cache", torch.zeros(1, s.kv_heads, max_len, d))
            inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
            ang = torch.outer(torch.arange(max_len).float(), inv)
            self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
            self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

        def forward(self, x, pos):
            """``x``: [tokens, hidden]; ``pos``: the tokens' positions (the cache holds those before)."""
            s, d, t = shape, shape.head_dim, x.shape[0]
            h = self.norm1(x)
            q = self.q(h).view(t, s.heads, d).transpose(0, 1)[None]
            k = self.k(h).view(t, s.kv_heads, d).transpose(0, 1)[None]
            v = self.v(h).view(t, s.kv_heads, d).transpose(0, 1)[None]
            if s.llama:
                cos, sin = self.cos[pos].to(x.dtype), self.sin[pos].to(x.dtype)
                q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            end = self.end  # the cache's tokens and the new ones: set per size, never read back from the GPU
            keys, values = self.k_cache[:, :, :end], self.v_cache[:, :, :end]
            if s.kv_heads != s.heads and not GQA_IN_SDPA:  # as Hugging Face's repeat_kv
                keys = keys.repeat_interleave(s.heads // s.kv_heads, dim=1)
                values = values.repeat_interleave(s.heads // s.kv_heads, dim=1)
            # A query sees the keys up to its own position.
            mask = None if t == 1 else (torch.arange(end, device=x.device)[None, :] <= pos[:, None])
            gqa = {"enable_gqa": True} if s.kv_heads != s.heads and GQA_IN_SDPA else {}
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, **gqa)
            x = x + self.o(a[0].transpose(0, 1).reshape(t, s.heads * d))
            h = self.norm2(x)
            m = F.silu(self.gate(h)) * self.up(h) if s.llama else F.gelu(self.up(h), approximate="tanh")
            return x + self.down(m)

    global GQA_IN_SDPA
    q, kv = torch.zeros(1, 2, 1, 8, device=device), torch.zeros(1, 1, 1, 8, device=device)
    try:  # PyTorch 2.5 and later
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        GQA_IN_SDPA = True
    except TypeError:
        GQA_IN_SDPA = False
    layer = Layer().to(device=device, dtype=torch.float16)
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    return layer


def variants(layer, x, pos, cache: int, compile_: bool) -> dict:
    """Each form of one step, as a callable; the cache is filled with random keys and values first."""
    import torch

    with torch.no_grad():
        layer.k_cache.normal_()
        layer.v_cache.normal_()
    layer.end = cache + x.shape[0]
    step = torch.no_grad()(lambda: layer(x, pos))
    out = {"torch eager": step, "torch graph": torch_graph(step, output=True)}
    if compile_:
        try:
            fast = torch.compile(layer)
            run = torch.no_grad()(lambda: fast(x, pos))
            run()
            out["torch.compile graph"] = torch_graph(run, output=True)
        except Exception as exc:  # noqa: BLE001 - a compiler that fails here is reported, not fatal
            print(f"  torch.compile: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    return out


def tuned_step(layer, shape: "LayerShape", bundles: list, x, pos, cache: int):
    """Our tuned chain of this size on the layer's own weights (None where no bundle holds the size), and
    a check of it: its output and appended keys and values against the eager step's (relative error)."""
    import torch

    from tuner.shipping import runtime
    from tuner.shipping.layer import cache_after, layer_weights

    tokens = x.shape[0]
    chain = get_workload("llama-layer" if shape.llama else "gpt3-layer").chain(
        tokens=tokens, cache=cache, hidden=shape.hidden, ffn=shape.ffn, heads=shape.heads, kv_heads=shape.kv_heads,
        head_dim=shape.head_dim)
    with torch.no_grad():
        ws = layer_weights(chain, layer.q.weight, layer.k.weight, layer.v.weight, layer.o.weight, layer.up.weight,
                           layer.down.weight, layer.norm1.weight, layer.norm2.weight, layer.k_cache[0, :, :cache],
                           layer.v_cache[0, :, :cache], w_gate=layer.gate.weight if shape.llama else None)
        ws = [w.to(torch.float16).contiguous() for w in ws]
    # A decode layer reads the cache's length at run time (its room is this size's cache): as a model's
    # cache_position, one int32 on the GPU.
    lens = {"cache_len": torch.tensor([cache], dtype=torch.int32, device=x.device)} if cache else {}
    for path in bundles:
        run = runtime.load(path)
        try:
            run.entry_for(x, ws)
        except Exception:  # noqa: BLE001 - this bundle has no entry of this size
            continue

        def step():
            return run(x, *ws, **lens)

        def check_it() -> float:
            with torch.no_grad():
                want = layer(x, pos).float()
                keys, values = layer.k_cache[0, :, pos].float(), layer.v_cache[0, :, pos].float()
            got = step().float()
            torch.cuda.synchronize()
            k2, v2 = cache_after(chain, ws[1])
            errs = [(got - want).norm() / want.norm(), (k2[:, cache:].float() - keys).norm() / keys.norm(),
                    (v2[:, cache:].float() - values).norm() / values.norm()]
            return max(float(e) for e in errs)

        return step, check_it
    return None


def check(layer, x, pos, fns: dict) -> dict[str, float]:
    """Each variant's output and written cache rows against the eager layer's in float32 (relative error)."""
    import torch

    def run(fn):
        layer.k_cache[:, :, pos] = 0
        layer.v_cache[:, :, pos] = 0
        y = fn()
        torch.cuda.synchronize()
        return y.float().clone(), layer.k_cache[:, :, pos].float().clone(), layer.v_cache[:, :, pos].float().clone()

    ref = run(fns["torch eager"])
    errs = {}
    for name, fn in fns.items():
        got = run(fn)
        errs[name] = max(float((g - r).norm() / r.norm()) for g, r in zip(got, ref))
    return errs


def timed_rounds(fns: dict, rounds: int, reps: int = 30, idle_s: float = 0.3) -> dict[str, float]:
    """The median over ``rounds`` interleaved rounds of each variant's median per-call µs, each after idle."""
    per: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            time.sleep(idle_s)
            per[name].append(median(time_torch(fn, 5, reps)))
    return {k: median(v) for k, v in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    ap.add_argument("--model", nargs="+", choices=sorted(SHAPES), default=["llama", "gpt3"])
    ap.add_argument("--tokens", type=ints, default=[1, 4, 16], help="decode steps' new tokens (default 1,4,16)")
    ap.add_argument("--cache", type=ints, default=[1024, 4096], help="decode steps' cached tokens (default 1024,4096)")
    ap.add_argument("--prompt", type=ints, default=[512, 2048],
                    help="prompt lengths, on an empty cache (default 512,2048)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also torch.compile's layer, in a CUDA graph")
    ap.add_argument("--bundle", type=Path, nargs="+", default=[],
                    help="bundles of tuned layer chains (tuner export --format bundle): each size one holds runs too")
    ap.add_argument("--json", type=Path, help="write the rows here (after each size)")
    args = ap.parse_args()
    import torch

    sizes = [(t, c) for c in args.cache for t in args.tokens] + [(p, 0) for p in args.prompt]
    shapes = [SHAPES[m] for m in args.model]
    bw, rate = read_bandwidth(max(s.weight_bytes() for s in shapes)), gemm_rate()
    print(f"{torch.cuda.get_device_name()}: read bandwidth {bw / 1e12:.2f} TB/s, fp16 GEMM {rate / 1e12:.0f} TFLOP/s "
          "(measured)")
    rows = []
    for shape in shapes:
        layer = make_layer(shape, max(t + c for t, c in sizes))
        for tokens, cache in sizes:
            x = torch.randn(tokens, shape.hidden, device="cuda", dtype=torch.float16)
            pos = torch.arange(cache, cache + tokens, device="cuda")
            try:
                fns = variants(layer, x, pos, cache, args.compile)
                errs = check(layer, x, pos, fns)
                ours = tuned_step(layer, shape, args.bundle, x, pos, cache) if args.bundle else None
                if ours is not None:
                    fns["tuned"], errs["tuned"] = ours[0], ours[1]()
                times = timed_rounds(fns, args.rounds)
            except Exception as exc:  # noqa: BLE001 - one size failing leaves the others to run
                print(f"{shape.name} tokens {tokens} cache {cache}: {type(exc).__name__}: {exc}", flush=True)
                continue
            moved = shape.floor_bytes(tokens, cache) / bw * 1e6
            floor = max(moved, shape.flops(tokens, cache) / rate * 1e6)
            # The share of the measured bandwidth each variant uses: the bytes it must move over its time.
            row = {"model": shape.name, "shape": asdict(shape), "tokens": tokens, "cache": cache, "floor_us": floor,
                   "bytes": shape.floor_bytes(tokens, cache), "us": times, "error": errs,
                   "hbm_fraction": {k: moved / v for k, v in times.items()}}
            rows.append(row)
            if args.json:  # after every size: a run cut short keeps what it measured
                args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "read_bandwidth_Bps": bw,
                                                 "gemm_flops": rate, "command": " ".join(sys.argv), "rows": rows},
                                                indent=1))
            cells = ", ".join(f"{k} {v:.1f} µs ({moved / v:.0%} of HBM, err {errs[k]:.1e})" for k, v in times.items())
            print(f"{shape.name} tokens {tokens} cache {cache}: floor {floor:.1f} µs; {cells}", flush=True)
        del layer
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
