"""L2 prefetch of the later stages' inputs: the one definition of the ``prefetch`` choice.

A stage after the first reads two things: the previous stage's output, which it must wait
for, and a chain input that depends on no stage (a GEMM's weights, a convolution's filters,
an attention stage's KV cache). With ``prefetch = "l2"`` every block of the stage before asks
L2 for its share of that input as it starts, before any wait (``cp.async.bulk.prefetch.L2``),
so it streams in from memory while the stage before runs, rather than after. That pays where
memory would otherwise idle between stages (decode, whose stages are short and latency-bound)
and only where the prefetched bytes stay in L2 until read, hence the hard constraint
:func:`prefetch_allowed`.

One stage ahead, not everything from the first stage: prefetching a later stage's inputs from
the first stage as well competed with the first stage's own reads and made a decode chain slower
(studies/notes/design-figures.md), while the stage just before, which often reads little and
waits much, has the time to spare.
"""
from __future__ import annotations

import math

from ..chain.workloads import Chain
from ..device import DeviceInfo

PREFETCHES = ("none", "l2")
# At most this share of L2 is prefetched: the first stage's own operands stream through L2 at
# the same time and would evict a prefetch that filled it.
L2_SHARE = 0.5
PREFETCH_ARCHS = ("sm_90", "sm_90a")  # bulk copies exist from Hopper on


def prefetched_bytes(chain: Chain) -> list[tuple[int, int]]:
    """``(stage index, bytes)`` of the input each stage after the first reads besides its
    predecessor's output: the whole B operand buffer (:func:`b_operand` of its kind)."""
    from ..chain.kinds import kind_of  # noqa: PLC0415 - the kinds import the sync formulas

    return [(i, math.prod(kind_of(st).b_operand(st)[0]) * 2) for i, st in enumerate(chain.stages) if i > 0]


def prefetch_allowed(prefetch: str, chain: Chain, device: DeviceInfo) -> str | None:
    """Why ``prefetch`` cannot be used for ``chain`` on ``device``, or None when it can."""
    if prefetch not in PREFETCHES:
        raise ValueError(f"unknown prefetch {prefetch!r}; accepted: {', '.join(PREFETCHES)}")
    if prefetch == "none":
        return None
    if device.arch not in PREFETCH_ARCHS:
        return f"an L2 bulk prefetch needs a Hopper GPU ({' or '.join(PREFETCH_ARCHS)}), not {device.arch}"
    if len(chain.stages) < 2:
        return "a single stage has no later input to prefetch"
    total = sum(b for _, b in prefetched_bytes(chain))
    if total > L2_SHARE * device.l2_bytes:
        return (f"the later stages read {total / 2**20:.1f} MiB of inputs, more than {L2_SHARE:.0%} of the "
                f"{device.l2_bytes / 2**20:.0f} MiB L2, so a prefetch would evict itself")
    return None
