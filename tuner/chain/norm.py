"""The row norm a GEMM stage applies to its A operand, defined once: RMSNorm (LLaMA) or LayerNorm without
bias (a GPT block) of each row, as a pre-norm transformer normalizes the residual stream before its
QKV projection and before its MLP.

The norm is folded into the GEMM, not run as a stage of its own. The gain ``g`` multiplies the
columns of A, so it moves into the weights once, ahead of any run (:func:`fold_weight`:
``W' = W diag(g)``), and what is left is a scale per row:

    rmsnorm(a, g) @ W.T  ==  rs[:, None] * (a @ W'.T),    rs[r] = 1 / sqrt(mean(a[r]^2) + eps)

LayerNorm subtracts each row's mean ``mu`` first: ``(a - mu) @ w == a @ (w - mean(w))`` for any weight
row ``w``, so the fold centres each row of ``W'`` too, and the scale is over the standard deviation,
``rs[r] = 1 / sqrt(mean(a[r]^2) - mu[r]^2 + eps)``: weights so folded make the product exact.

So the MMAs multiply the stored rows as they are, and a tile's epilogue scales each accumulator
by its row's ``rs``, before the stage's epilogue (GeLU, SwiGLU) and the residual add. A tile
computes the ``rs`` of its rows itself, reading them whole through L2 (``row_rms`` in gemm.cuh):
where A is a producer stage's output, only once the tile has waited for every producer tile of
those rows, as the tile policy would chunk by chunk. A tile of a split GEMM computes them whole
too, so the split that stores the tile has them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .kind import WorkloadError


@dataclass(frozen=True)
class Norm:
    """One row norm: whether it centres the rows (LayerNorm) or not (RMSNorm), and its ``eps``."""

    name: str
    doc: str
    center: bool
    eps: float = 1e-5


NORMS: dict[str, Norm | None] = {
    "none": None,
    "rms": Norm("rms", "RMSNorm: each row over the root of its mean square (plus eps), the gain folded "
                       "into the weights", center=False),
    "layer": Norm("layer", "LayerNorm without bias: each row less its mean, over its standard deviation (plus "
                           "eps), the gain and the centring folded into the weights", center=True),
}


HEADER = "norm.cuh"  # the kernels' part of the norm, pasted into a source where a stage has one


def check(stage: Any) -> None:
    """Refuse, in one line, a stage whose norm is none of :data:`NORMS`."""
    if stage.norm not in NORMS:
        raise WorkloadError(f"stage {stage.name}: unknown norm {stage.norm!r}; accepted: {', '.join(NORMS)}")


def of(stage: Any) -> Norm | None:
    """The norm a stage applies to its A rows, or None."""
    return NORMS[getattr(stage, "norm", "none")]


def has(stage: Any) -> bool:
    return of(stage) is not None


def reference(xp: Any, a: Any, norm: Norm) -> Any:
    """float32 rows of ``a`` normalized (the gain is in the weights)."""
    a = a.astype(xp.float32)
    if norm.center:
        a = a - a.mean(axis=-1, keepdims=True)
    return a / xp.sqrt((a * a).mean(axis=-1, keepdims=True) + norm.eps)


def cupy(cp: Any, a: Any, norm: Norm) -> Any:
    """The norm on fp16 rows as a CuPy user writes it (float32 inside, fp16 out)."""
    return reference(cp, a, norm).astype(cp.float16)


def torch(F: Any, h: Any, gain: Any, norm: Norm) -> Any:
    """The norm as a PyTorch model computes it, with its gain ``gain`` (a ``[K]`` tensor)."""
    if norm.center:
        return F.layer_norm(h, (h.shape[-1],), gain, None, norm.eps)
    if hasattr(F, "rms_norm"):
        return F.rms_norm(h, (h.shape[-1],), gain, norm.eps)
    import torch as _torch  # noqa: PLC0415 - older PyTorch: as Hugging Face's LlamaRMSNorm writes it

    hf = h.float()
    return (hf * _torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + norm.eps)).to(h.dtype) * gain


def fold_weight(w: Any, gain: Any, norm: Norm) -> Any:
    """The weights a normed stage multiplies, from a model's ``[N, K]`` weights and its norm's ``[K]``
    gain (NumPy, CuPy or PyTorch arrays): ``W diag(g)``, each row centred where the norm centres,
    once, ahead of any run (in float32, rounded once)."""
    if hasattr(w, "float"):  # a torch tensor
        f = w.float() * gain.float()[None, :]
        return (f - f.mean(dim=1, keepdim=True) if norm.center else f).to(w.dtype)
    f = w.astype("float32") * gain.astype("float32")[None, :]
    return (f - f.mean(axis=1, keepdims=True) if norm.center else f).astype(w.dtype)


def folded_test_weights(xp: Any, w: Any, stage: Any) -> Any:
    """Random test weights ``w`` of a stage as its norm's fold leaves them (rows centred for LayerNorm),
    so the kernel's product is the normed one; others as they are."""
    n = of(stage)
    return w if n is None else fold_weight(w, xp.ones(w.shape[1], dtype=xp.float32), n)


def template_args(norm: Norm) -> str:
    """The template arguments of the kernels' ``row_scale`` after the tile's rows and threads."""
    return "true" if norm.center else "false"


def c_scale(value: str, row: str) -> str:
    """The C expression of accumulator ``value`` of stored row ``row`` normed: times its row's ``rs``,
    which the tile keeps in shared memory (``tuner_rs``, indexed from the tile's first row ``m0``)."""
    return f"(tuner_rs[({row}) - m0] * ({value}))"
