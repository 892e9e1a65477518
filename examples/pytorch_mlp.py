"""Replace a PyTorch GPT-3 MLP block's forward with the tuned chain from a bundle, and check it.

    python -m tuner export gpt3 --format bundle -o tuned/gpt3-bundle
    python examples/pytorch_mlp.py tuned/gpt3-bundle --tokens 256

The module holds its weights as nn.Linear does ([out, in], fp16, on the GPU); the tuned chain
computes gelu(x @ w1.T) @ w2.T in one tile-synchronized run on PyTorch's current stream. The
script compares the two forwards on random input and times both (CUDA events, medians).
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import tuner.shipping.runtime


class MLP(torch.nn.Module):
    """GPT-3's MLP block (one tensor-parallel shard): fc1, GeLU (tanh), fc2, no biases."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn, bias=False)
        self.fc2 = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def tuned_forward(module: MLP, chain: tuner.shipping.runtime.Runtime):
    """A forward for ``module`` that runs the tuned chain on its weights."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        return chain(x.contiguous(), module.fc1.weight, module.fc2.weight).clone()  # the chain reuses its buffer
    return forward


def median_us(fn, x: torch.Tensor, reps: int = 50) -> float:
    for _ in range(10):
        fn(x)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=12288)
    ap.add_argument("--ffn", type=int, default=6144)
    args = ap.parse_args()
    torch.manual_seed(0)
    module = MLP(args.hidden, args.ffn).half().cuda()
    x = torch.randn(args.tokens, args.hidden, dtype=torch.float16, device="cuda")
    chain = tuner.shipping.runtime.load(args.bundle)
    with torch.no_grad():
        want = module(x)
        module.forward = tuned_forward(module, chain)
        got = module(x)
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        ours = median_us(module.forward, x)
        theirs = median_us(lambda t: MLP.forward(module, t), x)
    print(f"relative error against PyTorch {err:.2e} (limit 1e-2); tuned chain {ours:.1f} us, "
          f"PyTorch eager {theirs:.1f} us (each call with its own launches, medians of 50)")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
