"""A coarse time model of one stage on a device, used only to choose which configs to try first.

The model never stands in for a measurement: it orders the tilings ``bench`` times first,
so that the measured budget goes to tilings that fill the GPU's waves and keep enough
weight bytes in flight. Every figure it produces is an estimate.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from ..chain import norm, residual
from ..chain.kinds import kind_of
from ..chain.tiling import WG_OVERHEAD_REGS, StageGrid, StageTiles, even_share
from ..device import DeviceInfo

SMEM_PER_SM = 228 * 1024  # bytes; each block also reserves 1 KiB
REGS_PER_SM = 65536
LATENCY_S = 2.0e-6  # DRAM round trip under load: bytes in flight per block / this caps its read rate
RATES = {"sync": 300e12, "wgmma": 650e12, "wgmma_tma": 650e12, "wgmma_tma_t": 650e12}  # fp16 tensor-core FLOP/s each instruction reaches (H200, measured)
BANDWIDTH = 3.8e12  # B/s, what a 300 MB weight read reaches on the H200 (measured)
L2_BANDWIDTH = 3 * BANDWIDTH  # B/s, reads that hit L2 (a normed tile's second read of its rows): a rough figure
FIT_FILE = Path(__file__).with_name("cost_fit.json")  # written by benchmarks/fit_cost_model.py


def registers(t: StageTiles) -> int:
    """Estimated registers per thread: the accumulators plus a fixed overhead (a block that
    reallocates registers starts with the even share of the register file, and keeps the sum)."""
    if t.realloc:
        return even_share(t.threads)
    if t.warpgroup:
        return t.acc_regs + WG_OVERHEAD_REGS
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
    in_flight = max(1, t.stages - {"sync": 1, "wgmma": 2, "wgmma_tma": 1, "wgmma_tma_t": 1}[t.mma]) * slot
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
    if residual.has(st):
        total += st.m * st.n_out * 2 / bandwidth  # the residual read beside the output
    if norm.has(st):
        total += g.blocks * min(t.bm, st.m) * st.k * 2 / L2_BANDWIDTH  # each block reads its rows whole again
    return total


def features(g: StageGrid, device: DeviceInfo, estimate: float | None = None) -> dict[str, float]:
    """What the fitted ranking reads of a stage tiling: the coarse estimate (``stage_seconds``,
    unless given), how the tiling fills the GPU, and its shape, each as a number (logs where a
    factor matters more than a step)."""
    t, kind = g.tiles, kind_of(g.stage)
    occ = max(1, blocks_per_sm(t, kind.smem_bytes(g)))
    waves = g.blocks / (device.sms * occ)
    attn = float(kind.name == "attention")
    # An attention tile's BN is its packed heads: its own feature (weight 0 until a fit has seen
    # one), not the GEMMs' width, whose fitted weight would rank by the pack.
    heads = kind.heads_per_tile(g)
    return {
        "log_estimate": math.log(stage_seconds(g, device) if estimate is None else estimate), "log_blocks": math.log(g.blocks),
        "log_waves": math.log(waves), "wave_tail": math.ceil(waves) - waves, "log_split_k": math.log(t.split_k),
        "stages": float(t.stages), "log_bm": math.log(t.bm), "log_bn": math.log(t.bn // heads), "log_bk": math.log(t.bk),
        "log_threads": math.log(t.threads), "log_chunks_per_split": math.log(g.ks), "log_occupancy": math.log(occ),
        # A transposed tile is the same TMA-fed instruction: it shares that feature, and has its own
        # for what the transposition changes (weight 0 until a fit has seen one).
        "clustered": float(t.cluster > 1), **{f"mma_{m}": float(t.mma == m) for m in ("sync", "wgmma")},
        "mma_wgmma_tma": float(t.tma), "transposed": float(t.transposed),
        "conv": float(kind.name == "conv"), "attention": attn,
        "attention_log_wn": attn * math.log(t.wn), "attention_log_chunks_per_split": attn * math.log(g.ks),
        "attention_log_heads": math.log(heads),
    }


@lru_cache(maxsize=1)
def _fitted() -> dict[str, float]:
    try:
        return json.loads(FIT_FILE.read_text())["weights"]
    except (OSError, ValueError, KeyError):
        return {}


def rank_seconds(g: StageGrid, device: DeviceInfo) -> float:
    """The coarse estimate, corrected by a linear fit (in logs) to stage-alone timings recorded on
    a GPU, to order a stage's tilings: the fit is made to rank tilings within a stage, so only
    the order of its figures for one stage means anything. Without a fit, the coarse estimate."""
    est = stage_seconds(g, device)
    weights = _fitted()
    if not weights or not math.isfinite(est):
        return est
    return math.exp(sum(weights.get(k, 0.0) * v for k, v in features(g, device, est).items()))
