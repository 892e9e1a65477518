"""The residual add, defined once: a stage's stored output plus a tensor of its shape at the same row
and stored column (``out = epilogue(acc) + r``), as a transformer layer adds its input back after the
attention's output projection, and the attention block's output after the MLP's down projection.

A stage's ``residual`` names what it adds: :data:`INPUT` for the chain's input ``x``, which no stage
writes, so the add needs no wait; or the index of an earlier stage, whose output it adds. That read
needs no wait of its own either: the stage reads its A operand from a stage that (directly or
through the stages between) read the whole rows of the residual's producer before it posted, so
the waits that cover the stage's A cover its residual too, by the chain of releases and acquires
between them. The checker proves that for every tile (``tuner.checker.soundness.check_residual``).
Its shape must be the stage's stored output's (checked when the chain is made). The add is in
float32, on the epilogue's value, before the one rounding to fp16.
"""
from __future__ import annotations

from typing import Any

from .kind import WorkloadError

INPUT = -1  # a stage's ``residual`` that adds the chain's input x


def source(stage: Any) -> int | None:
    """What the stage adds: :data:`INPUT`, an earlier stage's index, or None (no residual)."""
    return getattr(stage, "residual", None)


def has(stage: Any) -> bool:
    return source(stage) is not None


def buffer(stage: Any) -> str:
    """The kernel's name of the buffer the stage adds: ``x``, or stage p's output ``yp``."""
    p = source(stage)
    return "x" if p == INPUT else f"y{p}"


def check(chain: Any) -> None:
    """Refuse, in one line, a residual that is not an earlier stage's output or the input, or not
    the shape of the stage's stored output."""
    x_shape = chain.stages[0].a_shape
    for i, st in enumerate(chain.stages):
        p = source(st)
        if p is None:
            continue
        if not isinstance(p, int) or isinstance(p, bool) or not (p == INPUT or 0 <= p < i):
            raise WorkloadError(f"stage {st.name}: residual {p!r}; accepted: {INPUT} (the chain's input) or the "
                                f"index of an earlier stage (0 to {i - 1})")
        if p == INPUT:
            what, shape = "the chain's", x_shape
        else:
            what, shape = f"stage {chain.stages[p].name}'s", (chain.stages[p].m, chain.stages[p].n_out)
        if shape != (st.m, st.n_out):
            raise WorkloadError(f"stage {st.name}: its residual is {what} {shape[0]}x{shape[1]} "
                                f"{'input' if p == INPUT else 'output'}, its output is {st.m}x{st.n_out}; "
                                f"accepted: equal shapes")


def c_value(value: str, row: str, col: str, bound: str) -> str:
    """The C expression of ``value`` (a float) with the residual at stored ``(row, col)`` added, where
    that lies inside the output (``row < M``, ``col < bound``); ``RES`` is the tile's pointer to it, rows
    ``NOUT`` halves apart, read through L2 (``ldcg_h2f``: never a stale line of another stage's)."""
    return f"(({row}) < M && ({col}) < {bound} ? ({value}) + ldcg_h2f(RES + (size_t)({row}) * NOUT + ({col})) : ({value}))"


def operand(stage: Any, x: Any, outs: list[Any]) -> Any:
    """The tensor the stage adds, given the chain's input and the outputs of the stages before it."""
    p = source(stage)
    return x if p == INPUT else outs[p]


def reference(xp: Any, out: Any, r: Any) -> Any:
    """float32 ``out + r``."""
    return out + r.astype(xp.float32)
