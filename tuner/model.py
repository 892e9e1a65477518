"""A coarse time model of one stage on a device, used only to choose which configs to try first.

The model never stands in for a measurement: it orders the tilings ``bench`` times first,
so that the measured budget goes to tilings that fill the GPU's waves and keep enough
weight bytes in flight. Every figure it produces is an estimate.
"""
from __future__ import annotations

import math

from .device import DeviceInfo
from .stages import kind_of
from .tiling import StageGrid, StageTiles

SMEM_PER_SM = 228 * 1024  # bytes; each block also reserves 1 KiB
REGS_PER_SM = 65536
LATENCY_S = 2.0e-6  # DRAM round trip under load: bytes in flight per block / this caps its read rate
RATES = {"sync": 300e12, "wgmma": 650e12, "wgmma_tma": 650e12}  # fp16 tensor-core FLOP/s each instruction reaches (H200, measured)
BANDWIDTH = 3.8e12  # B/s, what a 300 MB weight read reaches on the H200 (measured)


def registers(t: StageTiles) -> int:
    """Estimated registers per thread: the accumulators plus a fixed overhead."""
    if t.warpgroup:
        return (t.bn // t.wn) // 2 + 56
    wtm, wtn = t.bm // t.wm, t.bn // t.wn
    return wtm * wtn // 32 + (wtm // 16) * 4 + (wtn // 8) * 2 + 40


def blocks_per_sm(t: StageTiles, smem: int) -> int:
    """Blocks of this tiling an SM holds at once, each with ``smem`` bytes of shared memory (its
    stage kind's, see ``smem_bytes``)."""
    by_smem = SMEM_PER_SM // (smem + 1024)
    by_regs = REGS_PER_SM // (t.threads * min(255, registers(t)))
    return max(0, min(by_smem, by_regs, 2048 // t.threads, 32))


def stage_seconds(g: StageGrid, device: DeviceInfo, bandwidth: float = BANDWIDTH) -> float:
    """Estimated time of one stage run on its own: wave by wave, each block limited by its share
    of DRAM bandwidth, by its own bytes in flight, and by its SM's tensor-core rate."""
    t, st = g.tiles, g.stage
    kind = kind_of(st)
    occ = blocks_per_sm(t, kind.smem_bytes(g))
    if occ == 0:
        return math.inf
    slots = device.sms * occ
    bytes_block, flops_block, slot = kind.block_work(g)
    in_flight = max(1, t.stages - {"sync": 1, "wgmma": 2, "wgmma_tma": 1}[t.mma]) * slot
    per_sm_rate = RATES[t.mma] / device.sms
    total, left = 0.0, g.blocks
    while left > 0:
        active = min(left, slots)
        share = min(bandwidth / active, in_flight / LATENCY_S)
        per_sm = math.ceil(active / device.sms)
        total += max(bytes_block / share, flops_block / (per_sm_rate / per_sm))
        left -= active
    if t.split_k > 1:
        total += 2 * t.split_k * st.m * st.n * 4 / bandwidth  # partial sums written, then read back
    return total
