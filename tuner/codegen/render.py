"""Render a chain and a config into one self-contained CUDA source, plus its launch plan.

Only validated numbers and names from :mod:`tuner.sync.policies` reach the template
(Jinja2 with StrictUndefined). The plan says which kernels to launch, on which
stream, with what grid, block and dynamic shared memory, and how large the
semaphore state and split-K workspace must be.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2

from ..chain import length, norm, residual, rope
from ..chain.epilogues import get_epilogue
from ..chain.expr import Expr
from ..chain.kinds import kind_of
from ..chain.tiling import (
    PRODUCER_REGS,
    SPLIT_BEGIN,
    TAIL,
    TAIL_GAINS,
    TAIL_PARTS,
    TAIL_SPLIT,
    whole_clusters,
    whole_groups,
)
from ..chain.workloads import Chain, edges
from ..config import Config, ConfigError, StageGrid, StageTiles
from ..device import DeviceInfo
from ..paths import templates_dir
from ..sync.policies import ORDERS, POLICIES, STREAM_ORDERED, order_env, pair_env, policy_for
from ..sync.prefetch import prefetched_bytes

HEADERS = ("sync.cuh", "gemm.cuh")
WGMMA_HEADER = "wgmma.cuh"  # follows the generated wgmma_k16 wrappers, only in sources that use wgmma
FAULTS = ("none", "missing_post", "illegal_address", "hang")  # planted faults, for tests only


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the chain."""

    kernel: str
    grid: int
    threads: int
    smem: int
    stream: int  # 0 or 1
    pdl: bool = False  # a programmatic dependent launch (the pdl launch mode, every stage after the first)
    # A persistent stage's largest grid (its tiles; with its last wave split along K, the blocks its
    # workspace was laid out for): its grid follows the device that runs it (device_grid). 0: the grid is fixed.
    grid_cap: int = 0
    cluster: int = 1  # blocks of a thread-block cluster (a persistent grid holds whole clusters)


def device_grid(launch: Launch, sms: int) -> int:
    """The blocks ``launch`` starts on a device of ``sms`` SMs: its grid, or for a persistent stage
    one block per SM in whole clusters, no more than its cap (as :meth:`StageGrid.launched` sized it
    for the device it was rendered for). The C++ launcher (``cpp/tuner_chain.cpp``) does the same."""
    if not launch.grid_cap:
        return launch.grid
    return min(launch.grid_cap, whole_clusters(sms, launch.cluster))


@dataclass(frozen=True)
class TensorMap:
    """A TMA descriptor the kernels need: a row-major fp16 matrix, read (or, for an output ``y<i>``,
    written) in boxes of 64 columns (one 128-byte swizzle atom) by ``box_rows`` rows. ``slot`` is
    its index in the kernels' ``tmaps`` array (128 bytes each; slots are numbered from 0 without
    gaps); ``operand`` names the buffer: ``x``, ``w<i>`` or ``y<i>``."""

    slot: int
    operand: str
    rows: int
    cols: int
    box_rows: int


@dataclass(frozen=True)
class Rendered:
    """A rendered source, its hash, and how to run it."""

    source: str
    hash: str
    launches: tuple[Launch, ...]
    state_words: int  # u32 semaphores/counters, zeroed once at allocation, never reset
    ws_floats: int  # split-K partial sums
    err_word: int
    tensor_maps: tuple[TensorMap, ...] = ()
    device_epoch: bool = False  # the kernels number their runs (graph-replayable), ignoring the epoch argument
    room: int | None = None  # the kernels take the cache's run-time length (``lens``, after tmaps), at most this

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(l.kernel for l in self.launches))

    def launch_problems(self, resources: Mapping[str, Mapping[str, int]], device: DeviceInfo) -> list[str]:
        """Why launches cannot run on ``device`` given the compiler's per-kernel ``resources``; empty if they can."""
        out = []
        for l in self.launches:
            res = resources.get(l.kernel, {})
            regs, smem = res.get("registers", 0), l.smem + res.get("smem", 0)
            if regs * l.threads > device.regs_per_block:
                out.append(f"{l.kernel}: {regs} registers x {l.threads} threads exceed {device.regs_per_block}")
            if smem > device.smem_per_block:
                out.append(f"{l.kernel}: {smem} B of shared memory exceed {device.smem_per_block}")
        return out


# Both caches are per templates folder, so that a process may render from another one
# (TUNER_HOME set between renders: benchmarks/template_ab.py times variants side by side).
def _env() -> jinja2.Environment:
    return _env_of(templates_dir())


@lru_cache(maxsize=None)
def _env_of(root: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _header(name: str) -> str:
    return _header_of(templates_dir(), name)


@lru_cache(maxsize=None)
def _header_of(root: Path, name: str) -> str:
    # Plain CUDA headers, pasted in verbatim (inline PTX braces would confuse Jinja), so the
    # rendered source is self-contained and its hash covers every line the compiler sees.
    text = (root / name).read_text()
    return f"// ---- {name}\n" + text.replace("#pragma once\n", "")


def wgmma_wrapper(n: int) -> str:
    """``wgmma_k16`` for an accumulator of ``n`` columns: one m64nNk16 MMA, both operands from
    shared-memory descriptors, D += A.B. Generated because the instruction spells out all
    ``n / 2`` accumulator registers."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma has no m64n{n}k16 shape")
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    binds = ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs))
    return (f"__device__ __forceinline__ void wgmma_k16(float (&d)[{n // 8}][4], u64 da, u64 db) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;\\n}}\\n"\n'
            f"               : {binds}\n"
            f'               : "l"(da), "l"(db));\n}}\n')


def _headers(wgmma_widths: set[int], kind_headers: Sequence[str] = ()) -> str:
    parts = [_header(name) for name in (*HEADERS, *kind_headers)]
    if wgmma_widths:
        parts.append("// ---- generated wgmma wrappers\n" + "\n".join(wgmma_wrapper(n) for n in sorted(wgmma_widths)))
        parts.append(_header(WGMMA_HEADER))
    return "\n".join(parts)


class _Words:
    """Hands out consecutive slices of the u32 state buffer."""

    def __init__(self) -> None:
        self.n = 0

    def take(self, count: int) -> int:
        base, self.n = self.n, self.n + count
        return base


def _smem(grid: StageGrid) -> int:
    return kind_of(grid.stage).smem_bytes(grid)


# Epilogues go through shared memory where the output tile fits in the free ring (measurement
# scripts switch it off to compare).
STAGED_EPILOGUE = True


def staged_epilogue(tl: StageTiles, out_cols: int) -> bool:
    """Whether a tile's output (``out_cols`` wide, padded rows of 16-byte pieces) goes through
    shared memory: the ring, free after the mainloop, where it fits; for a persistent block, whose
    ring holds the next tile's slabs by then, room of its own beside the ring
    (:meth:`StageTiles.persistent_epilogue_bytes`)."""
    if tl.persistent:
        return tl.persistent_epilogue_bytes(out_cols) > 0
    return STAGED_EPILOGUE and out_cols % 8 == 0 and tl.bm * (out_cols + 8) * 2 <= tl.ring_bytes()


def _after_mainloop(tl: StageTiles) -> dict[str, str]:
    """Who takes part in a tile's work after its mainloop, as the templates spell it: ``BAR`` their
    barrier, ``EPI_THREADS`` their count, ``SPIN`` the wait a thread of theirs spins in, ``MMA_ONLY``
    whether they are the MMA warps alone (``meet_parts`` picks its barrier and wait by it). Where the
    producer warpgroup gave its registers up and left (``realloc``), or goes on to the next tile
    (``persistent``), the MMA warps alone, on a named barrier, and the spin inlined (an out-of-line
    copy would have to fit the producer's count)."""
    if tl.realloc or tl.persistent:
        return dict(BAR="tuner_bar_sync(T::MMA_THREADS)", EPI_THREADS="T::MMA_THREADS", SPIN="tuner_spin_until_inline",
                    MMA_ONLY="true")
    return dict(BAR="__syncthreads()", EPI_THREADS="T::THREADS", SPIN="tuner_spin_until", MMA_ONLY="false")


# Split s's first and last-plus-one K chunks as the kernels compute them (tiling.SPLIT_BEGIN).
_SPLIT_BEGIN_C, _SPLIT_END_C = SPLIT_BEGIN.c, SPLIT_BEGIN.substitute({"s": Expr("s + 1")}).c
# The partial last wave's split as the kernels compute it on their grid (tiling.tail_split).
_TAIL_C = dict(tail=TAIL.c, parts=TAIL_PARTS.c, split=TAIL_SPLIT.c, gains=TAIL_GAINS.c)


def a_rows(m: int, bm: int) -> int:
    """Rows of A a TMA stage requests: the tile's, or M rounded up to whole 8-row swizzle groups
    when the matrix is shorter (a box reaching far past the edge costs time for nothing)."""
    return min(bm, whole_groups(m))


def copy_parts(rows: int, blocks: int) -> int:
    """In how many parts the ``blocks`` of a cluster that share a multicast slab of ``rows`` rows
    fetch it: each block its own part for all of them where the parts are whole 8-row swizzle
    groups (the copies spread over the blocks' copy engines, as their barrier waits are), else
    one block all of it."""
    return blocks if blocks > 1 and rows % (8 * blocks) == 0 else 1


def grid_cap(g: StageGrid, sms: int) -> int:
    """The most blocks a stage may launch on another device (``Launch.grid_cap``): a persistent
    stage's tiles, or where its last wave is split along K the blocks rendered for ``sms`` SMs,
    which its workspace slots and counters are laid out for; 0 for a stage of one block a tile."""
    if not g.tiles.persistent:
        return 0
    return g.launched(sms) if g.tiles.tail_split else g.blocks


def render(chain: Chain, config: Config, fault: str = "none", device_epoch: bool = False,
           sms: int = DeviceInfo.sms) -> Rendered:
    """Render ``config`` for ``chain``; the config is trusted to satisfy the space's constraints,
    but every field is checked for its type and accepted values first (:meth:`Config.check`), so
    no text that is not one of the names the templates know ever reaches the source.

    With ``device_epoch`` the kernels number their runs themselves (a counter per kernel in the
    state) and ignore the epoch argument, so a CUDA graph can replay the chain as captured.
    ``sms``: the device's SMs, which size the grid of a persistent stage."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}")
    config.check(f"{chain.label}: config")
    if len(config.tiles) != len(chain.stages):
        raise ConfigError(f"{chain.label}: config tiles {len(config.tiles)} stages; the chain has {len(chain.stages)}")
    if not isinstance(sms, int) or isinstance(sms, bool) or not 0 < sms < 4096:
        raise ConfigError(f"{chain.label}: {sms!r} SMs: accepted: a positive integer")
    grids = config.grids(chain)
    mem = _Memory()
    err_word = mem.words.take(1)
    stages = [_stage_entry(i, g, config, sms, device_epoch, mem) for i, g in enumerate(grids)]
    if POLICIES[config.policy] is not None:
        _sync_entries(stages, grids, config, device_epoch, mem.words)
    fused_ticket = mem.words.take(1) if config.launch == "fused" else 0
    total_blocks = sum(g.blocks for g in grids)
    threads = max(g.tiles.threads for g in grids)
    source = _env().get_template("chain.cu.j2").render(
        label=chain.label, config_short=config.short(), stages=stages, launch=config.launch, device_epoch=device_epoch,
        prefetch=dict(prefetched_bytes(chain)) if config.prefetch == "l2" else {},
        dispatch=config.dispatch, fault=fault, err_word=err_word, fused_ticket=fused_ticket,
        lens=length.of(chain) is not None,
        total_blocks=total_blocks, threads=threads,
        split_begin=_SPLIT_BEGIN_C, split_end=_SPLIT_END_C,
        headers=_headers({t.wgmma_n for t in config.tiles if t.warpgroup},
                         list(dict.fromkeys(h for st in chain.stages if (h := kind_of(st).HEADER)))
                         + [m.HEADER for m in (norm, rope) if any(map(m.has, chain.stages))]))
    launches = _launches(grids, stages, config, sms, total_blocks, threads)
    digest = hashlib.sha256(source.encode()).hexdigest()
    return Rendered(source, digest, launches, max(mem.words.n, 1), max(mem.ws, 1), err_word, tuple(mem.maps),
                    device_epoch, length.of(chain))


@dataclass
class _Memory:
    """What the stages take of the state words, the float workspace and the TMA descriptors, in order."""

    words: _Words = field(default_factory=_Words)
    ws: int = 0
    maps: list[TensorMap] = field(default_factory=list)


def _stage_entry(i: int, g: StageGrid, config: Config, sms: int, device_epoch: bool, mem: _Memory) -> dict[str, Any]:
    """What the template reads of stage ``i``: its sizes, tiling, epilogue, workspace and descriptors."""
    order = ORDERS[config.order]
    st, tl = g.stage, g.tiles
    entry = dict(index=i, name=st.name, M=st.m, N=st.n, K=st.k, NOUT=st.n_out, epilogue=st.epilogue,
                 **order_env(g), KS=g.ks, KC=g.kc, blocks=g.blocks, threads=tl.threads,
                 BM=tl.bm, BN=tl.bn, BK=tl.bk, WM=tl.wm, WN=tl.wn, STAGES=tl.stages, MMA=tl.mma, CLUSTER=tl.cluster,
                 TMA=tl.tma, TRANSPOSED=tl.transposed, T_PITCH=tl.transposed_pitch, REALLOC=tl.realloc,
                 PERSIST=tl.persistent, SLICE_ROWS=tl.slice_rows if tl.persistent else tl.bm,
                 PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=tl.consumer_regs, **_after_mainloop(tl),
                 A_ROWS=a_rows(st.m, tl.bm), OW=tl.bn // st.fold, epi=get_epilogue(st.epilogue),
                 a_arg=kind_of(st).a_arg(st),
                 # The buffer the stage reads as its A operand: the chain's input, or its producer's output.
                 a_buf="x" if st.a_from is None else f"y{st.a_from}",
                 order_m=order.m.c, order_n=order.n.c, order_s=order.s.c,
                 wait=None, post=None, started=None, guard=None, ticket=None, ws_base=0, arrive_base=0, written_base=0,
                 run_counter=None, guard_counter=None)
    entry["A_PARTS"], entry["B_PARTS"] = copy_parts(entry["A_ROWS"], tl.cn), copy_parts(tl.bn, tl.cm)
    entry["staged"] = staged_epilogue(tl, entry["OW"])
    entry["RESIDUAL"] = residual.has(st)
    # Each stored value's expression with the residual added where the stage has one (else as it is).
    entry["res"] = residual.c_value if entry["RESIDUAL"] else (lambda v, row, col, bound: v)
    entry["res_buf"] = residual.buffer(st) if entry["RESIDUAL"] else None
    # Each accumulator's expression scaled by its row's norm where the stage has one (else as it is).
    entry["NORM"] = norm.has(st)
    entry["NORM_EPS"] = repr(float(norm.of(st).eps)) if entry["NORM"] else None
    entry["NORM_CENTER"] = norm.template_args(norm.of(st)) if entry["NORM"] else None
    entry["acc"] = norm.c_scale if entry["NORM"] else (lambda v, row: v)
    # A stage that reads the cache's run-time length starts its tile with it (tuner.chain.length).
    entry["LENS"] = length.c_prologue(st) if length.room(st) is not None else None
    entry["ROPE"] = rope.has(st)
    entry["rope"] = partial(rope.c_pair, rope.of(st)) if entry["ROPE"] else None
    entry["TMA_STORE"] = entry["staged"] and tl.stores_by_tma(entry["OW"], st.n_out, entry["RESIDUAL"])
    entry["store"] = tl.tma_store_layout(entry["OW"]) if entry["TMA_STORE"] else None
    # Who stores a TMA-stored epilogue's boxes, and the barrier they wait at: in a transposed
    # tile each warpgroup its own 64 columns, synced alone; else thread 0, after the MMA warps.
    entry["STORE_LEAD"], entry["STORE_BAR"] = (("threadIdx.x % 128 == 0", "warpgroup_bar_sync()") if tl.transposed
                                               else ("threadIdx.x == 0", entry["BAR"]))
    # A tile of a ticket (not a block index, which costs nothing to read again) in a block whose
    # warpgroups change register counts (never in a fused launch): kept in shared memory
    # across the mainloop.
    entry["KEEP_TILE"] = tl.tma and tl.realloc and not tl.persistent and config.dispatch == "ticket"
    entry["tile_template"] = kind_of(st).TILE_TEMPLATE
    entry["consts"] = kind_of(st).template_constants(st)
    if tl.split_k > 1:
        entry["ws_base"] = mem.ws
        mem.ws += tl.split_k * g.mt * g.nt * kind_of(st).partial_floats(g)  # a tile's partial result per split
        entry["arrive_base"] = mem.words.take(g.mt * g.nt)  # arrivals of a tile's splits
        entry["written_base"] = mem.words.take(g.mt * g.nt)  # posts of the splits whose partials are stored
    if tl.tma:
        # The kernel addresses descriptors in u64 words: 16 per 128-byte descriptor.
        entry["tma_a"], entry["tma_b"] = 16 * len(mem.maps), 16 * (len(mem.maps) + 1)
        mem.maps += [TensorMap(len(mem.maps), entry["a_buf"], st.m, st.k, entry["A_ROWS"] // entry["A_PARTS"]),
                 TensorMap(len(mem.maps) + 1, f"w{i}", st.n, st.k, tl.bn // entry["B_PARTS"])]
    if entry["TMA_STORE"]:  # the output, stored a box of the layout's rows by 64 columns at a time
        entry["tma_c"] = 16 * len(mem.maps)
        mem.maps.append(TensorMap(len(mem.maps), f"y{i}", st.m, st.n_out, entry["store"].box_rows))
    entry["TAIL_SPLIT"] = tl.tail_split
    if tl.tail_split:
        # Per tile of the split wave (fewer than the grid's blocks): the first part's partial
        # sums, and the counters of its parts' arrivals and of the posts that the sums are there.
        grid_blocks = g.launched(sms)
        entry["tail"] = _TAIL_C
        entry["tail_ws"] = mem.ws
        mem.ws += grid_blocks * kind_of(st).partial_floats(g)
        entry["tail_arrive"] = mem.words.take(grid_blocks)
        entry["tail_written"] = mem.words.take(grid_blocks)
    if config.dispatch == "ticket" and config.launch != "fused":
        entry["ticket"] = mem.words.take(1)
    elif device_epoch and config.launch != "fused":
        entry["run_counter"] = mem.words.take(1)
    return entry


def _sync_entries(stages: list[dict[str, Any]], grids: Sequence[StageGrid], config: Config, device_epoch: bool,
                  words: _Words) -> None:
    """Each boundary's post (in the producer's entry) and waits (in the consumer's), from the sync policy."""
    for p, i in edges([g.stage for g in grids]):
        if stages[p]["post"] is not None:  # one post a producer tile, for one consumer's semaphores
            raise ConfigError(f"{grids[p].stage.name} is read by two stages ({stages[p]['post']['consumer']} and "
                              f"{grids[i].stage.name}); accepted: one consumer per stage")
        regions = policy_for(POLICIES[config.policy], grids[i])
        env = pair_env(grids[p], grids[i])
        base = words.take(regions[0].sems(env))
        stages[p]["post"] = dict(env=env, sem_base=base, sem=regions[0].post_sem.c,
                                 tma_consumer=config.tiles[i].tma, consumer=grids[i].stage.name)
        waits = [dict(when=pol.wait_when.c, lo=pol.wait_row_lo.c, hi=pol.wait_row_hi.c, col_lo=pol.wait_col_lo.c,
                      col_hi=pol.wait_col_hi.c, sem=pol.wait_sem.c, count=pol.wait_count.c) for pol in regions]
        read = {n for pol in regions for e in (pol.wait_when, pol.wait_row_lo, pol.wait_row_hi, pol.wait_col_lo,
                                              pol.wait_col_hi, pol.wait_sem, pol.wait_count) for n in e.names}
        kind_env = {k: v for k, v in kind_of(grids[i].stage).env(grids[i].stage, "2").items() if k in read}
        stages[i]["wait"] = dict(env=env, kind_env=kind_env, sem_base=base, regions=waits,
                                 doc=f"sync policy '{regions[0].name}': {regions[0].doc}",
                                 when=" || ".join(w["when"] for w in waits), reads_n2="n2" in read)
        if config.launch == "two_stream":
            started = words.take(1)
            stages[p]["started"] = started
            stages[i]["guard"] = started
            if device_epoch:
                stages[i]["guard_counter"] = words.take(1)


def _launches(grids: Sequence[StageGrid], stages: list[dict[str, Any]], config: Config, sms: int, total_blocks: int,
              threads: int) -> tuple[Launch, ...]:
    """The launch plan: one fused kernel, or each stage's kernel (and guard) on its stream."""
    if config.launch == "fused":
        return (Launch("fused_kernel", total_blocks, threads, max(map(_smem, grids)), 0),)
    out = []
    for i, g in enumerate(grids):
        stream = 0 if config.launch in STREAM_ORDERED else i % 2
        if stages[i]["guard"] is not None:
            out.append(Launch(f"guard{i}_kernel", 1, 32, 0, stream))
        out.append(Launch(f"stage{i}_kernel", g.launched(sms), g.tiles.threads, _smem(g), stream,
                          pdl=config.launch == "pdl" and i > 0,
                          grid_cap=grid_cap(g, sms), cluster=g.tiles.cluster))
    return tuple(out)
