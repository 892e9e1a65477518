"""The cache's length read at run time, defined once.

A decode loop grows the KV cache by its tokens every step. A chain whose attention stage is
``dynamic`` (and whose rotation, where it has one, too) reads the length from a kernel argument,
``lens`` (one ``int32`` in device memory, as a model's ``cache_position`` is), instead of compiling
it in, so one kernel serves the whole loop and a CUDA graph of a step replays with only that
integer changed. The chain is compiled, tuned and timed at its room, the stage's ``cache``: a run
reads ``min(*lens, cache)`` cached tokens, so no value a caller passes reaches past the buffer.

What depends on the length reads it here: the attention's keys (and the chunk that holds the new
tokens), the append's rows, the rotation's positions. The waits are those of every length at once
(:mod:`tuner.chain.attention`), so the checker's proof at the room holds for each run.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from . import rope
from .kind import WorkloadError

C_NAME = "cache_len"  # the tile's run-time length in the kernel template
ARG = "lens"  # the kernel argument it is read from


def room(stage: Any) -> int | None:
    """The most cached tokens a stage that reads the run-time length serves (None: it reads none)."""
    if getattr(stage, "dynamic", False):
        return stage.cache
    r = rope.of(stage)
    return r.offset if r is not None and r.dynamic else None


def of(chain: Any) -> int | None:
    """The chain's room: the one of every stage that reads the run-time length, or None."""
    rooms = {r for st in chain.stages if (r := room(st)) is not None}
    if len(rooms) > 1:
        raise WorkloadError(f"{chain.workload}: stages read a run-time cache length of different rooms "
                            f"({', '.join(map(str, sorted(rooms)))}); accepted: one")
    return rooms.pop() if rooms else None


def at(chain: Any, length: int | None) -> Any:
    """The chain as one run at ``length`` cached tokens computes it (each dynamic stage with the length
    compiled in, in the same buffers), for the references; ``None``: at its room."""
    cap = of(chain)
    if cap is None or length is None or length == cap:
        return chain
    if not 0 <= length <= cap:
        raise WorkloadError(f"{chain.label}: a cache length of {length}; accepted: 0..{cap}")
    stages = []
    for st in chain.stages:
        if getattr(st, "dynamic", False):
            st = st.at_length(length)
        r = rope.of(st)
        if r is not None and r.dynamic:
            st = replace(st, rope=replace(r, offset=length, dynamic=False))
        stages.append(st)
    return replace(chain, stages=tuple(stages))


def c_prologue(stage: Any) -> str:
    """The C line a dynamic stage's tile starts with: its run-time length, clamped to its room."""
    return f"const int {C_NAME} = max(min(__ldg({ARG}), {room(stage)}), 0);  // tuner/chain/length.py"
