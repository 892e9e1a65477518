"""Epilogues: what a stage does to its fp32 accumulators before it stores them. One entry each.

An entry says everything that differs between epilogues: how many accumulator columns make
one stored column (``fold``), the C expression the kernel template writes, the float32
reference, and the forms a CuPy user and a PyTorch user write. Everything else (the stage's
stored width, the policy formulas' tile widths, the checker's column map, the baselines)
is derived from these fields.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

_GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Epilogue:
    """One epilogue.

    With ``fold == 1`` each accumulator is mapped alone: ``c_elem`` is C text with ``{x}`` for
    the fp32 accumulator. With ``fold == 2`` the stage's weights interleave two projections
    (columns ``2c`` and ``2c + 1``) and one output column ``c`` is made from the pair:
    ``c_pair`` is C text with ``{a}`` and ``{b}``. ``reference(xp, c)`` maps a float32 array of
    accumulators (``xp`` is numpy or cupy) to the stored values, and ``cupy(cp, c)`` does it
    on fp16 as a CuPy user writes it.

    A PyTorch model holds the weights its own way: ``torch_weight(w)`` is our weight as the
    model keeps it (SwiGLU: gate rows, then up rows), ``torch(F, c)`` the epilogue on the
    output of ``F.linear`` with that weight (``F`` is ``torch.nn.functional``), and
    ``torch_fused(torch, w)``, where cuBLASLt has the epilogue built in, returns ``f(x)``: the
    GEMM and the epilogue as one call (``w`` as ``torch_weight`` returns it; anything ``f``
    needs besides is made here, once, outside any timing).
    """

    name: str
    doc: str
    fold: int
    reference: Callable[[Any, Any], Any]
    cupy: Callable[[Any, Any], Any]
    torch: Callable[[Any, Any], Any]
    torch_weight: Callable[[Any], Any] = lambda w: w
    torch_fused: Callable[[Any, Any], Callable[[Any], Any]] | None = None
    c_elem: str = "{x}"
    c_pair: str = ""
    fold_doc: str = ""  # a comment the kernel carries beside a folding store

    def __post_init__(self) -> None:
        if self.fold not in (1, 2) or (self.fold == 2) != bool(self.c_pair):
            raise ValueError(f"epilogue {self.name}: fold 1 maps each accumulator (c_elem), fold 2 a pair (c_pair)")

    def elem(self, x: str) -> str:
        """The C expression of one stored value from accumulator ``x`` (fold 1)."""
        return self.c_elem.format(x=x)

    def pair(self, a: str, b: str) -> str:
        """The C expression of one stored value from the accumulator pair ``a``, ``b`` (fold 2)."""
        return self.c_pair.format(a=a, b=b)


def _gelu(xp: Any, c: Any) -> Any:
    return 0.5 * c * (1.0 + xp.tanh(_GELU_C * (c + 0.044715 * c ** 3)))


def _silu_mul(xp: Any, c: Any) -> Any:
    g, u = c[..., 0::2], c[..., 1::2]
    return g / (1.0 + xp.exp(-g)) * u


_cupy_gelu = None


def _cupy_gelu_kernel(cp: Any) -> Any:
    global _cupy_gelu
    if _cupy_gelu is None:
        _cupy_gelu = cp.ElementwiseKernel(
            "T x", "T y", "float v = x; y = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))",
            "tuner_gelu")
    return _cupy_gelu


def _torch_gelu_fused(torch: Any, w: Any) -> Callable[[Any], Any]:
    # cuBLASLt's GELU epilogue (tanh form), reached through addmm with a zero bias made once.
    bias = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    return lambda x: torch._addmm_activation(bias, x, w.t(), use_gelu=True)


def _torch_swiglu(F: Any, c: Any) -> Any:
    g, u = c.chunk(2, dim=-1)
    return F.silu(g) * u


def _gate_then_up(w: Any) -> Any:
    import torch  # noqa: PLC0415 - only where PyTorch runs

    return torch.cat([w[0::2], w[1::2]]).contiguous()  # once, outside any timing


EPILOGUES: dict[str, Epilogue] = {e.name: e for e in (
    Epilogue("none", "store the accumulators as they are", 1,
             reference=lambda xp, c: c, cupy=lambda cp, c: c, torch=lambda F, c: c),
    Epilogue("gelu", "GeLU, tanh form", 1, c_elem="gelu({x})",
             reference=_gelu, cupy=lambda cp, c: _cupy_gelu_kernel(cp)(c),
             torch=lambda F, c: F.gelu(c, approximate="tanh"), torch_fused=_torch_gelu_fused),
    Epilogue("relu", "ReLU", 1, c_elem="fmaxf({x}, 0.f)",
             reference=lambda xp, c: xp.maximum(c, 0), cupy=lambda cp, c: cp.maximum(c, 0), torch=lambda F, c: F.relu(c)),
    Epilogue("silu_mul", "SwiGLU: silu(gate) * up, gate and up interleaved column by column", 2,
             c_pair="silu({a}) * {b}",
             fold_doc="(gate, up) columns are interleaved: the pair at col, col+1 folds into output column col/2.",
             reference=_silu_mul, cupy=lambda cp, c: _silu_mul(cp, c).astype(cp.float16),
             torch=_torch_swiglu, torch_weight=_gate_then_up),
)}


def get_epilogue(name: str) -> Epilogue:
    """The epilogue called ``name``; a ValueError lists the accepted names."""
    try:
        return EPILOGUES[name]
    except KeyError:
        raise ValueError(f"unknown epilogue {name!r}; accepted: {', '.join(EPILOGUES)}") from None
