"""A decode loop of several decoder layers through the runtime, against PyTorch's, in one process.

    python benchmarks/decode_loop.py --bundle DIR [--model llama|gpt3] [--layers 4] [--steps 32]
        [--tokens 1] [--rounds 5] [--json F]

``DIR``: a bundle of a layer workload (``tuner export llama-layer --format bundle``) with a decode
entry of ``--tokens`` tokens, whose room (the ``--cache`` it was tuned at) the loop fills: it starts
at ``room - (steps - 1) * tokens`` cached tokens (random keys and values) and ends with the last
step's length at the room. Each layer is ``benchmarks/layer_baseline.py``'s Hugging Face-semantics
module with its own weights and static KV cache; ours converts each layer's weights and cache once
(``tuner.shipping.layer.TunedLayer``, a chain of its own per layer) and reads the cache's length at
run time from one int32 per step, so one compiled chain serves every step.

Check: both loops run every step from the same caches and inputs (fresh random hidden states per
step, so errors do not compound through the residual stream); the hidden states of each step and
the caches after the last (in the model's order) are compared (relative error, float32).
Timing: the whole loop, each step captured in a CUDA graph, replayed in order between two events
(PyTorch eager too), in interleaved rounds after idle; quoted per step, and its share of HBM
bandwidth (the layers' weights and caches over the read bandwidth measured in the same run).
GPU only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from layer_baseline import SHAPES, make_layer  # noqa: E402

from tuner.bench.baselines import read_bandwidth  # noqa: E402
from tuner.chain.workloads import get_workload  # noqa: E402


def room_of(bundle, shape, tokens: int) -> int:
    """The largest room of the bundle's decode entries of this shape and token count."""
    rooms = [m["room"] for m in bundle.manifests if m.get("room") is not None and m["size"].get("tokens") == tokens
             and m["size"].get("hidden") == shape.hidden and m["size"].get("heads") == shape.heads]
    if not rooms:
        raise SystemExit(f"the bundle has no decode entry of {tokens} tokens for {shape.name}")
    return max(rooms)


def tuned_layers(bundle, shape, layers, tokens: int, room: int):
    """Each PyTorch layer as a TunedLayer over its own weights and (a copy of) its cache."""
    import torch

    from tuner.shipping.layer import TunedLayer, layer_weights

    chain = get_workload("llama-layer" if shape.llama else "gpt3-layer").chain(
        tokens=tokens, cache=room, hidden=shape.hidden, ffn=shape.ffn, heads=shape.heads, kv_heads=shape.kv_heads,
        head_dim=shape.head_dim)
    out = []
    with torch.no_grad():
        for m in layers:
            ws = layer_weights(chain, m.q.weight, m.k.weight, m.v.weight, m.o.weight, m.up.weight, m.down.weight,
                               m.norm1.weight, m.norm2.weight, m.k_cache[0, :, :room], m.v_cache[0, :, :room],
                               w_gate=m.gate.weight if shape.llama else None)
            out.append(TunedLayer(bundle, chain, [w.to(torch.float16).contiguous() for w in ws]))
    return out


def torch_step(layers, x, pos, end: int):
    for m in layers:
        m.end = end
        x = m(x, pos)
    return x


def tuned_step(layers, x, lens):
    for m in layers:
        x = m(x, lens)
    return x


def capture(fn):
    """``fn`` captured in a CUDA graph after a warm-up on a side stream; returns (replay, captured output)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn()
    return g.replay, y


def time_loop(steps, reps: int = 10) -> float:
    """Median µs of one run of ``steps`` (callables, in order), between two events."""
    import torch

    for fn in steps:
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for fn in steps:
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="a bundle of tuned layer chains with a decode entry")
    ap.add_argument("--model", choices=sorted(SHAPES), default="llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    if min(args.layers, args.steps, args.tokens, args.rounds) < 1:
        raise SystemExit("--layers, --steps, --tokens and --rounds must be at least 1")
    import torch

    from tuner.shipping import runtime

    shape, t = SHAPES[args.model], args.tokens
    bundle = runtime.load(args.bundle)
    room = room_of(bundle, shape, t)
    start = room - (args.steps - 1) * t
    if start < 0:
        raise SystemExit(f"a room of {room} tokens holds fewer than {args.steps} steps of {t}")
    torch.manual_seed(0)
    layers = [make_layer(shape, room + t) for _ in range(args.layers)]
    with torch.no_grad():
        for m in layers:  # the prompt's keys and values; the rows after it empty
            for c in (m.k_cache, m.v_cache):
                c.zero_()
                c[:, :, :start].normal_()
    ours = tuned_layers(bundle, shape, layers, t, room)
    xs = torch.randn(args.steps, t, shape.hidden, device="cuda", dtype=torch.float16)
    lens = [torch.tensor([start + k * t], dtype=torch.int32, device="cuda") for k in range(args.steps)]
    poss = [torch.arange(start + k * t, start + (k + 1) * t, device="cuda") for k in range(args.steps)]

    # Check: one loop each from the same caches, step by step.
    errs = []
    with torch.no_grad():
        for k in range(args.steps):
            want = torch_step(layers, xs[k], poss[k], start + (k + 1) * t).float()
            got = tuned_step(ours, xs[k], lens[k]).float()
            errs.append(float((got - want).norm() / want.norm()))
    torch.cuda.synchronize()
    end = start + args.steps * t
    cache_err = 0.0
    for m, o in zip(layers, ours):
        keys, values = o.cache()
        for got, want in ((keys, m.k_cache[0]), (values, m.v_cache[0])):
            got, want = got[:, :end].float(), want[:, :end].float()
            cache_err = max(cache_err, float((got - want).norm() / want.norm()))

    # Timing: every step of the loop, in order, each from its own graph (PyTorch eager too).
    with torch.no_grad():
        eager = [lambda k=k: torch_step(layers, xs[k], poss[k], start + (k + 1) * t) for k in range(args.steps)]
        graph = [capture(lambda k=k: torch_step(layers, xs[k], poss[k], start + (k + 1) * t))[0]
                 for k in range(args.steps)]
        tuned = [capture(lambda k=k: tuned_step(ours, xs[k], lens[k]))[0] for k in range(args.steps)]
    bw = read_bandwidth(shape.weight_bytes())
    variants = {"torch eager": eager, "torch graph": graph, "tuned graph": tuned}
    per: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, steps in variants.items():
            time.sleep(0.3)
            per[name].append(time_loop(steps) / args.steps)
    us = {k: median(v) for k, v in per.items()}
    mid = (start + end) // 2
    moved = args.layers * shape.floor_bytes(t, mid)
    result = {"device": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "model": shape.name,
              "layers": args.layers, "steps": args.steps, "tokens": t, "cache_start": start, "room": room,
              "us_per_step": us, "hbm_fraction": {k: moved / bw / 1e-6 / v for k, v in us.items()},
              "read_bandwidth_Bps": bw, "hidden_error_max": max(errs), "cache_error": cache_err,
              "speedup_vs_torch_graph": us["torch graph"] / us["tuned graph"]}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"{result['device']}: {shape.name}, {args.layers} layers, {args.steps} steps of {t} token(s), cache "
          f"{start}..{end}")
    print(f"hidden states: max relative error {max(errs):.2e} over the steps; caches after: {cache_err:.2e}")
    for k, v in us.items():
        print(f"  {k:12s} {v:8.1f} µs per step  ({result['hbm_fraction'][k]:.0%} of HBM)")
    print(f"  tuned vs torch graph: {result['speedup_vs_torch_graph']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
