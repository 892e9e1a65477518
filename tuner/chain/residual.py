"""The residual add, defined once: a stage's stored output plus the chain's input ``x`` at the same
row and stored column (``out = epilogue(acc) + x``), as a transformer layer adds its input back
after the attention's output projection or the MLP's down projection.

A stage with ``residual=True`` reads ``x`` in its epilogue: the chain's input, which no stage
writes, so the add needs no wait. Its shape must be the stage's stored output's (checked when the
chain is made). The add is in float32, on the epilogue's value, before the one rounding to fp16.
"""
from __future__ import annotations

from typing import Any

from .kind import WorkloadError


def check(chain: Any) -> None:
    """Refuse, in one line, a stage whose residual is not the shape of its stored output."""
    x_shape = chain.stages[0].a_shape
    for st in chain.stages:
        if has(st) and x_shape != (st.m, st.n_out):
            raise WorkloadError(f"stage {st.name}: its residual is the chain's {x_shape[0]}x{x_shape[1]} input, "
                                f"its output is {st.m}x{st.n_out}; accepted: equal shapes")


def c_value(value: str, row: str, col: str, bound: str) -> str:
    """The C expression of ``value`` (a float) with the residual at stored ``(row, col)`` added, where
    that lies inside the output (``row < M``, ``col < bound``); ``RES`` is the tile's pointer to x, rows
    ``NOUT`` halves apart, read through L2 (``ldcg_h2f``: never a stale line of another stage's)."""
    return f"(({row}) < M && ({col}) < {bound} ? ({value}) + ldcg_h2f(RES + (size_t)({row}) * NOUT + ({col})) : ({value}))"


def reference(xp: Any, out: Any, x: Any) -> Any:
    """float32 ``out + x``."""
    return out + x.astype(xp.float32)


def has(stage: Any) -> bool:
    return bool(getattr(stage, "residual", False))
