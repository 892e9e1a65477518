"""Rotary position embeddings, defined once: the QKV GEMM's epilogue rotates the column pairs of each query
and key head by its token's position, as LLaMA does before attention.

Layout. Hugging Face's ``rotate_half`` pairs dimension ``i`` of a head with ``i + D/2``. The weights
are laid out instead so that a pair is two adjacent output columns, which one MMA thread holds
(``acc[e]``, ``acc[e + 1]``): :func:`interleave_weight` reorders each query and key head's weight rows
once (row ``2i`` the model's row ``i``, row ``2i + 1`` its row ``i + D/2``). Attention's scores are
dot products over a head's dimensions, the same whichever order queries and keys both take, so
nothing downstream changes; the keys in a KV cache are in this order too (:func:`interleave_cache`
reorders a model's cache once). Values are not rotated and keep their order.

Pair ``j`` of a head (columns ``2j``, ``2j + 1``) of the token at position ``p`` (the cache's length
plus its row) turns by ``p * base ** (-2j / D)``: ``(a, b) -> (a cos - b sin, a sin + b cos)``, in
float32 after the norm's scale and before the rounding to fp16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .kind import WorkloadError

HEADER = "rope.cuh"  # the kernels' part, pasted into a source where a stage rotates


@dataclass(frozen=True)
class Rope:
    """The rotation of a QKV GEMM's output laid out by KV head (see :mod:`tuner.chain.attention`): groups
    of ``group`` query heads, then a key head, then a value head, each ``head_dim`` columns; the new
    tokens sit at positions ``offset``, ``offset + 1``, ... (``offset``: the cache's length; where
    ``dynamic``, the length the kernels read at run time, at most ``offset``)."""

    head_dim: int
    group: int
    offset: int
    base: float = 10000.0
    dynamic: bool = False  # the offset read at run time, at most ``offset`` (tuner.chain.length)

    def __post_init__(self) -> None:
        if self.head_dim < 2 or self.head_dim % 2 or self.group < 1 or self.offset < 0 or not self.base > 1:
            raise WorkloadError(f"rotary embedding: head size {self.head_dim}, group {self.group}, offset "
                                f"{self.offset}, base {self.base}; accepted: an even head size, a group of at "
                                f"least 1, an offset of at least 0, a base above 1")

    @property
    def heads_per_group(self) -> int:
        """Heads of a group's columns: its query heads, its key head, its value head."""
        return self.group + 2

    def rotated(self, col: Any) -> Any:
        """Whether output column ``col`` (an int or an array) is in a query or key head."""
        return (col // self.head_dim) % self.heads_per_group != self.group + 1


def of(stage: Any) -> Rope | None:
    """The rotation a stage's epilogue applies, or None."""
    return getattr(stage, "rope", None)


def has(stage: Any) -> bool:
    return of(stage) is not None


def check(stage: Any) -> None:
    """Refuse a rotation whose layout does not fit the stage's output columns."""
    r = of(stage)
    if r is not None and stage.n % (r.head_dim * r.heads_per_group):
        raise WorkloadError(f"stage {stage.name}: rotary embedding over groups of {r.heads_per_group} heads of "
                            f"{r.head_dim}; its {stage.n} columns are not whole groups")


def _angles(xp: Any, rows: int, cols: int, r: Rope) -> Any:
    pos = xp.arange(r.offset, r.offset + rows, dtype=xp.float32)[:, None]
    pair = (xp.arange(cols) % r.head_dim) // 2
    return pos * xp.exp(-(2.0 * pair / r.head_dim) * math.log(r.base)).astype(xp.float32)[None, :]


def reference(xp: Any, out: Any, r: Rope) -> Any:
    """``out`` (float32 ``[rows, N]``) with each query and key pair rotated."""
    rows, cols = out.shape
    ang = _angles(xp, rows, cols, r)[:, 0::2]
    a, b = out[:, 0::2], out[:, 1::2]
    c, s = xp.cos(ang), xp.sin(ang)
    keep = ~r.rotated(xp.arange(0, cols, 2))[None, :]
    res = out.copy()
    res[:, 0::2] = xp.where(keep, a, a * c - b * s)
    res[:, 1::2] = xp.where(keep, b, a * s + b * c)
    return res


def torch(torch_mod: Any, out: Any, r: Rope, tables: tuple[Any, Any, Any]) -> Any:
    """The rotation as a PyTorch user writes it on this layout, with ``tables`` from :func:`torch_tables`
    (made once, outside any timing)."""
    cos, sin, keep = tables
    a, b = out[:, 0::2], out[:, 1::2]
    rot = torch_mod.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(1)
    return torch_mod.where(keep, out, rot)


def torch_tables(torch_mod: Any, rows: int, cols: int, r: Rope, device: str = "cuda") -> tuple[Any, Any, Any]:
    """The cosines and sines of each pair (fp16, ``[rows, cols/2]``) and which columns stay (``[cols]``)."""
    import numpy as np  # noqa: PLC0415

    ang = _angles(np, rows, cols, r)[:, 0::2]
    cos = torch_mod.tensor(np.cos(ang), dtype=torch_mod.float16, device=device)
    sin = torch_mod.tensor(np.sin(ang), dtype=torch_mod.float16, device=device)
    keep = torch_mod.tensor(~r.rotated(np.arange(cols)), device=device)
    return cos, sin, keep


def interleave_weight(w: Any, r: Rope) -> Any:
    """A model's ``[N, K]`` QKV weight (query and key heads in ``rotate_half`` order) in the order the
    rotation reads: within each query and key head, row ``2i`` its row ``i``, row ``2i + 1`` its row
    ``i + D/2``. Value heads stay."""
    return w[_order(w.shape[0], r)]


def interleave_cache(cache: Any, head_dim: int) -> Any:
    """A model's keys ``[..., D]`` (``rotate_half`` order) in the order the rotation writes them."""
    half = head_dim // 2
    idx = [i // 2 + (i % 2) * half for i in range(head_dim)]
    return cache[..., idx]


def _order(n: int, r: Rope) -> list[int]:
    d, half = r.head_dim, r.head_dim // 2
    out = []
    for head in range(n // d):
        base = head * d
        if r.rotated(base):
            out += [base + i // 2 + (i % 2) * half for i in range(d)]
        else:
            out += list(range(base, base + d))
    return out


def c_pair(r: Rope, a: str, b: str, row: str, col: str, out0: str, out1: str) -> str:
    """The C statement that sets floats ``out0``, ``out1`` to the pair ``a``, ``b`` at stored ``(row, col)``
    (``col`` even) rotated (``rope_pair`` in rope.cuh); a dynamic rotation's offset is the tile's
    run-time length (``tuner.chain.length.C_NAME``)."""
    from .length import C_NAME  # noqa: PLC0415 - length reads this module's stages

    offset = C_NAME if r.dynamic else str(r.offset)
    return (f"rope_pair<{r.head_dim}, {r.group}>({a}, {b}, {row}, {col}, {offset}, {math.log2(r.base)!r}f, "
            f"{out0}, {out1});")
