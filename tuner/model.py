"""A coarse time model of one stage on a device, used only to choose which configs to try first.

The model never stands in for a measurement: it orders seed configs (``bench`` and the
study's first trials) so that the measured budget goes to tilings that fill the GPU's
waves and keep enough weight bytes in flight. Every figure it produces is an estimate.
"""
from __future__ import annotations

import math
from itertools import product
from typing import Iterable

from .backends.base import DeviceInfo
from .config import Config, StageGrid, StageTiles
from .workloads import Chain

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


def blocks_per_sm(t: StageTiles) -> int:
    by_smem = SMEM_PER_SM // (t.smem_bytes() + 1024)
    by_regs = REGS_PER_SM // (t.threads * min(255, registers(t)))
    return max(0, min(by_smem, by_regs, 2048 // t.threads, 32))


def stage_seconds(g: StageGrid, device: DeviceInfo, bandwidth: float = BANDWIDTH) -> float:
    """Estimated time of one stage run on its own: wave by wave, each block limited by its share
    of DRAM bandwidth, by its own bytes in flight, and by its SM's tensor-core rate."""
    t, st = g.tiles, g.stage
    occ = blocks_per_sm(t)
    if occ == 0:
        return math.inf
    slots = device.sms * occ
    k_elems = g.ks * t.bk
    rows = min(t.bm, st.m)
    bytes_block = (rows + t.bn) * k_elems * 2
    flops_block = 2 * t.bm * t.bn * k_elems
    in_flight = max(1, t.stages - {"sync": 1, "wgmma": 2, "wgmma_tma": 1}[t.mma]) * t.bn * t.bk * 2
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


def _tilings(m: int, mma: str) -> Iterable[StageTiles]:
    bms = [64, 128] if mma != "sync" else [16, 32, 64, 128]
    for bm, bn, bk, wn, stages, split in product(bms, (64, 128, 256), (64, 128), (1, 2), range(3, 9),
                                               (1, 2, 3, 4, 6, 8, 12, 16)):
        if bm > max(64 if mma != "sync" else 16, 1 << max(0, (m - 1).bit_length())):
            continue
        if mma != "sync":
            yield StageTiles(bm, bn, bk, bm // 64, wn, stages, split, mma)
        else:
            wm = max(1, min(4, bm // 32))
            yield StageTiles(bm, bn, bk, wm, wn * 2, stages, split)


def ranked_tilings(chain: Chain, device: DeviceInfo, mma: str, keep: int, feasible=None) -> list[list[StageTiles]]:
    """Per stage, the ``keep`` tilings the model expects to be fastest (``feasible``: a predicate on a
    StageGrid, e.g. the search space's stage constraints)."""
    out = []
    for st in chain.stages:
        grids = [StageGrid(st, t) for t in _tilings(st.m, mma)]
        grids = [g for g in grids if (feasible is None or feasible(g)) and g.ks * (g.tiles.split_k - 1) < g.kc
                 and blocks_per_sm(g.tiles) > 0]
        grids.sort(key=lambda g: (round(stage_seconds(g, device) * 1e7), -g.tiles.stages, g.tiles.split_k))
        out.append([g.tiles for g in grids[:keep]])
    return out


SEED_COMBOS = (("stream", "row", "block", "serial"), ("tile", "row", "ticket", "fused"),
               ("row", "row", "ticket", "fused"), ("tile", "row", "block", "two_stream"))


def seeds(chain: Chain, device: DeviceInfo, keep: int = 4, mmas: Iterable[str] = ("wgmma",),
          feasible=None) -> list[Config]:
    """Configs pairing each stage's model-ranked tilings (k-th with k-th) under the common sync choices."""
    out: list[Config] = []
    for mma in mmas:
        ranked = ranked_tilings(chain, device, mma, keep, feasible)
        for k in range(min(len(r) for r in ranked)):
            tiles = tuple(r[k] for r in ranked)
            for combo in SEED_COMBOS:
                cfg = Config(tiles, *combo)
                if cfg not in out:
                    out.append(cfg)
    return out
