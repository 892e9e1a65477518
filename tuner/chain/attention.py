"""The attention stage kind: causal multi-head attention of ``tokens`` new queries over a KV cache
of ``cache`` earlier tokens plus the new tokens themselves (prompt: ``cache = 0``; decode: a few
new tokens on a long cache), fp16 in, fp32 softmax and accumulation.

It reads the output of a QKV projection GEMM laid out by KV head (as Megatron-LM lays it out):
group ``g`` of ``G = heads / kv_heads`` query heads owns the columns ``[g*(G+2)*D, (g+1)*(G+2)*D)``,
its ``G`` query heads first, then its key head, then its value head. So a query head's keys and
values are one contiguous run of ``2*D`` columns, and its queries one of ``D``. The cache is an
input of its own, ``[kv_heads, 2, cache, D]`` (keys then values per KV head). The output is
``[tokens, heads*D]``, head after head, what the output projection reads as its A operand.

As a product: ``M`` = queries, ``N`` = ``heads * D``, ``K`` = keys (``cache + tokens``), walked
``BK`` keys per chunk; split-K splits the keys (split-KV), the splits' partial softmaxes combined
by the last to arrive. A tile is ``BM`` tokens of ``P = BN / D`` heads that share one KV head
(``P`` divides ``G``): packing a group's heads reads each key and value once for all of them, and
fills the MMA's 16 rows where decode has a token or two. Its ``BM * P`` query rows are
token-major; a block has ``WM`` rows of warps, 16 query rows each, and ``WN`` warps per row that
split each chunk's keys.

Index map: a tile reads from the producer through two regions: its queries (rows of its own
tokens, the ``P*D`` query columns of its heads) on a split's first chunk, then per chunk the keys
and values of that chunk's new tokens (the ``2*D`` key and value columns of its heads' group).
Both depend on the tile's heads, its column ``n2``: the waits are per tile, not per tile row.
Keys past a tile's last query (the causal mask) are never read.

Run-time length (``dynamic``): the kernel reads the cache's length from a kernel argument (at most
``cache``, the room its buffer has), so one compiled chain serves every step of a decode loop; the
new tokens' rotation (:mod:`tuner.chain.rope`) and the cache append read it too. Its waits hold for
every length: a split waits for its tokens' new keys and values before its first chunk.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from .expr import Expr
from .gemm import producer_cols
from .kind import StageKind, TensorCoreStage, WorkloadError
from .tiling import StageTiles, next_pow2

if TYPE_CHECKING:
    from .tiling import StageGrid

HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class AttentionStage(TensorCoreStage):
    """Causal attention of ``tokens`` queries over ``cache + tokens`` keys, at a concrete size."""

    kind: ClassVar[str] = "attention"
    name: str
    tokens: int
    cache: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    a_from: int | None = None  # the QKV projection
    epilogue: str = "none"  # the softmax's normalization is the kind's own
    append: bool = False  # writes the new tokens' keys and values into the cache after its own
    # The cache's length is a kernel argument, read at run time (at most ``cache``, the buffer's
    # room): one kernel serves a whole decode loop. Its waits cannot depend on which chunk holds the
    # new tokens, so each split waits, before its first chunk, for its rows' new keys and values too.
    dynamic: bool = False
    rows: int | None = None  # rows per KV head and part of the cache buffer, where not cache_rows' own

    def __post_init__(self) -> None:
        if min(self.tokens, self.heads, self.kv_heads) < 1 or self.cache < 0:
            raise WorkloadError(f"stage {self.name}: sizes must be positive (the cache may be 0), got "
                                f"{self.tokens} tokens, cache {self.cache}, {self.heads} heads, {self.kv_heads} KV heads")
        if self.heads % self.kv_heads:
            raise WorkloadError(f"stage {self.name}: {self.heads} query heads do not share {self.kv_heads} KV heads "
                                f"evenly; accepted: a divisor of {self.heads}")
        if self.head_dim not in HEAD_DIMS:
            raise WorkloadError(f"stage {self.name}: head size {self.head_dim}; accepted: "
                                f"{', '.join(map(str, HEAD_DIMS))}")
        if self.dynamic and self.cache < 1:
            raise WorkloadError(f"stage {self.name}: a cache length read at run time needs a cache (its room) "
                                f"of at least 1 token, got {self.cache}")
        self.check_epilogue(self.name)

    @property
    def cache_rows(self) -> int:
        """Rows of the cache buffer per KV head and part: room for the new tokens where it appends them."""
        return self.rows if self.rows is not None else self.cache + (self.tokens if self.append else 0)

    def at_length(self, length: int) -> "AttentionStage":
        """The stage as one run of a dynamic stage computes it: ``length`` cached tokens (at most
        ``cache``), in the same buffer."""
        if not self.dynamic or not 0 <= length <= self.cache:
            raise WorkloadError(f"stage {self.name}: a run-time length needs a dynamic stage and 0..{self.cache} "
                                f"tokens, got {length}" + ("" if self.dynamic else " (the stage is not dynamic)"))
        return replace(self, cache=length, rows=self.cache_rows, dynamic=False)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @property
    def qkv_cols(self) -> int:
        """Columns of the QKV projection's output."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def m(self) -> int:
        return self.tokens

    @property
    def n(self) -> int:
        return self.heads * self.head_dim

    @property
    def k(self) -> int:
        return self.cache + self.tokens

    @property
    def a_shape(self) -> tuple[int, int]:
        return (self.tokens, self.qkv_cols)

    @property
    def keys_read(self) -> int:
        """Query-key pairs the causal mask keeps."""
        return self.tokens * self.cache + self.tokens * (self.tokens + 1) // 2

    @property
    def flops(self) -> int:
        return 4 * self.keys_read * self.head_dim * self.heads  # scores and weighted sum

    @property
    def weight_bytes(self) -> int:
        """The KV cache, read once: attention has no weights, the cache takes their place."""
        return 2 * self.kv_heads * self.cache * self.head_dim * 2

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


# Names of the kind's constants (see env): the cache length, query heads per KV head, the head
# size and the query count.
_LAST_KEY = "CACHE2 + min(m2 * BM2 + BM2, M2) - 1"  # the tile's last query sees keys up to here
_HEAD0 = "n2 * BN2 // D2"  # the tile's first head
_GROUP_COL = f"{_HEAD0} // G2 * (G2 + 2) * D2"  # first column of the tile's head group
_IN_MASK = f"kc * BK2 <= {_LAST_KEY}"  # chunk kc holds a key the tile reads
QUERIES: dict[str, Expr] = {
    "A_ANY": Expr(f"first and {_IN_MASK}"), "A_FRESH": Expr("0"),
    "A_ROW_LO": Expr("m2 * BM2"), "A_ROW_HI": Expr("min(m2 * BM2 + BM2, M2) - 1"),
    "A_COL": Expr(f"{_GROUP_COL} + {_HEAD0} % G2 * D2"),
    "A_COL_HI": Expr(f"{_GROUP_COL} + {_HEAD0} % G2 * D2 + BN2 - 1"),
    "A_TILE_LO": Expr("0"), "A_TILE_HI": Expr("min(m2 * BM2 + BM2, M2) - 1"),
}
KEYS_VALUES: dict[str, Expr] = {
    "A_ANY": Expr(f"kc * BK2 + BK2 > CACHE2 and {_IN_MASK}"), "A_FRESH": Expr("1"),
    "A_ROW_LO": Expr("max(kc * BK2, CACHE2) - CACHE2"),
    "A_ROW_HI": Expr(f"max(min(kc * BK2 + BK2 - 1, {_LAST_KEY}), CACHE2) - CACHE2"),
    "A_COL": Expr(f"{_GROUP_COL} + G2 * D2"), "A_COL_HI": Expr(f"{_GROUP_COL} + G2 * D2 + 2 * D2 - 1"),
    "A_TILE_LO": Expr("0"), "A_TILE_HI": Expr("min(m2 * BM2 + BM2, M2) - 1"),
}
# A dynamic stage's (its cache length read at run time): which chunk holds the new tokens is not
# known when the waits are compiled, so a split waits once, before its first chunk, for the new
# keys and values of every token its queries see (tokens 0 to its last), whichever chunk reads them.
KEYS_VALUES_UP_FRONT: dict[str, Expr] = {
    **KEYS_VALUES, "A_ANY": Expr(f"first and {_IN_MASK}"), "A_FRESH": Expr("0"),
    "A_ROW_LO": Expr("0"), "A_ROW_HI": Expr("min(m2 * BM2 + BM2, M2) - 1"),
}


def heads_per_tile(grid: "StageGrid") -> int:
    """``P``: the query heads a tile packs, which share one KV head."""
    return grid.tiles.bn // grid.stage.head_dim


def _split(xp, qkv, cache, stage: AttentionStage):
    """Queries ``[kv_heads, G, tokens, D]``, keys and values ``[kv_heads, cache + tokens, D]``."""
    b, d, g = stage.tokens, stage.head_dim, stage.group
    parts = qkv.reshape(b, stage.kv_heads, g + 2, d)
    kv = cache.reshape(stage.kv_heads, 2, stage.cache_rows, d)[:, :, :stage.cache]
    q = parts[:, :, :g].transpose(1, 2, 0, 3)
    k = xp.concatenate([kv[:, 0], parts[:, :, g].transpose(1, 0, 2)], axis=1)
    v = xp.concatenate([kv[:, 1], parts[:, :, g + 1].transpose(1, 0, 2)], axis=1)
    return q, k, v


def _attend(xp, qkv, cache, stage: AttentionStage, weights):
    """Batched products per KV head, the causal mask, a float32 softmax whose weights are cast to
    ``weights`` before they meet the values."""
    q, k, v = _split(xp, qkv, cache, stage)
    s = xp.matmul(q, k.transpose(0, 2, 1)[:, None]).astype(xp.float32) * stage.scale  # [kvh, G, tokens, keys]
    keys = xp.arange(stage.k)[None, :]
    s = xp.where(keys <= stage.cache + xp.arange(stage.tokens)[:, None], s, -xp.inf)
    p = xp.exp(s - s.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True)).astype(weights)
    o = xp.matmul(p, v[:, None])  # [kvh, G, tokens, D]
    return o.transpose(2, 0, 1, 3).reshape(stage.tokens, stage.n)


def _producer_tiles(producer: "StageGrid", rows: tuple[int, int], cols: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Producer tiles ``(m1, n1)`` holding output rows ``[rows)`` and stored columns ``[cols)``."""
    lo, hi = producer_cols(producer)
    n1 = np.flatnonzero((lo < cols[1]) & (hi > cols[0]))
    bm = producer.tiles.bm
    m1 = np.arange(rows[0] // bm, (rows[1] - 1) // bm + 1, dtype=np.int64) if rows[1] > rows[0] else np.zeros(0, np.int64)
    return np.repeat(m1, n1.size), np.tile(n1, m1.size)


class AttentionKind(StageKind):
    """Causal multi-head attention over a KV cache."""

    name = "attention"
    HEADER = "attention_tile.cuh"
    TILE_TEMPLATE = "tile_attention.j2"  # the tile's type and body in the kernel template
    REGIONS = (QUERIES, KEYS_VALUES)
    PER_COLUMN = True  # a tile's reads depend on its heads
    OWN_WARP_TILE = True  # a warp's tile is 16 query rows by a whole head, whatever BN and WN: judged here
    PADS_ROWS = True  # rows appended after the last token are never attended by it (causal), so
    # fewer tokens can run zero-padded to a tuned count

    def heads_per_tile(self, grid: "StageGrid") -> int:
        return heads_per_tile(grid)

    def regions(self, stage: AttentionStage) -> tuple[dict[str, Expr], ...]:
        """Queries, then keys and values chunk by chunk; a dynamic stage's keys and values up front."""
        return (QUERIES, KEYS_VALUES_UP_FRONT) if stage.dynamic else self.REGIONS

    def case_tiles(self, stage: AttentionStage, shared: "StageTiles", pack: bool) -> "StageTiles":
        """16 query rows per row of warps (four rows past 64 tokens), a whole head per tile, or as
        many heads of one KV group as divide it when packed; the shared tiling's split."""
        p = max(h for h in (1, 2, 4, 8) if stage.group % h == 0) if pack else 1
        wm = 1 if stage.m <= 64 else 4
        return StageTiles(16 * wm // p, stage.head_dim * p, 64, wm, 1, 2, shared.split_k)

    def env(self, stage: AttentionStage, idx: str) -> dict[str, int]:
        """Constants the index map reads: the cache length, query heads per KV head, the head size and
        the query count; ``CSTEP`` 0: the columns a tile reads stay put from chunk to chunk."""
        return {f"CACHE{idx}": stage.cache, f"G{idx}": stage.group, f"D{idx}": stage.head_dim, f"M{idx}": stage.m,
                f"CSTEP{idx}": 0}

    def pads_rows(self, stage: AttentionStage) -> bool:
        """Not where it appends: padded tokens would be written into the cache, whose rows are sized by
        the tokens."""
        return not stage.append

    def tiling_problem(self, grid: "StageGrid") -> str | None:
        """Why this tiling cannot compute the attention stage, or None."""
        t, st = grid.tiles, grid.stage
        if t.bn % st.head_dim or st.group % (t.bn // st.head_dim):
            return (f"a tile is whole heads sharing one KV head: BN must be {st.head_dim} times a divisor of "
                    f"{st.group}, got BN={t.bn}")
        if t.mma != "sync" or t.cluster != 1:
            return "attention tiles compute with mma.sync, one block per cluster"
        p = heads_per_tile(grid)
        if t.bm * p != 16 * t.wm:
            return f"each row of warps owns 16 query rows: BM tokens x {p} heads must be 16 x WM, got BM={t.bm} WM={t.wm}"
        cap = max(16 // p, next_pow2(st.m))  # one row of warps, or M's power of two
        if t.bm > cap:
            return f"BM={t.bm} tokens of {p} heads is taller than needed for {st.m} tokens (at most {cap})"
        if t.bk > 128 or t.bk % (16 * t.wn):
            return (f"a chunk of BK={t.bk} keys, split between WN={t.wn} warps in steps of 16: accepted a multiple "
                    f"of {16 * t.wn} up to 128")
        return None

    def smem_bytes(self, grid: "StageGrid") -> int:
        """The queries and a ring of ``stages`` chunks of keys and values, rows padded by 16 bytes; at
        the end, where ``wn`` warps split the keys, the partial results they merge (float4s: ``D / 8``
        fragments and the softmax state per thread) in the same memory."""
        t, d = grid.tiles, grid.stage.head_dim
        ring = (t.bm * heads_per_tile(grid) + t.stages * 2 * t.bk) * (d + 8) * 2
        merge = t.wm * (t.wn - 1) * 32 * (d // 8 + 1) * 16
        return max(ring, merge)

    def partial_floats(self, grid: "StageGrid") -> int:
        """Workspace floats of one split's partial result of one tile (split-KV): the output fragments
        of the threads that hold the merged result (the whole tile) and their rows' softmax state
        (4 floats each)."""
        return grid.tiles.bm * grid.tiles.bn + grid.tiles.wm * 32 * 4

    def template_constants(self, stage: AttentionStage) -> dict[str, object]:
        """What the kernel template reads of the stage besides the tiling."""
        return {"tokens": stage.tokens, "cache": stage.cache, "heads": stage.heads, "group": stage.group,
                "head_dim": stage.head_dim, "scale_log2": repr(stage.scale * math.log2(math.e)),
                "cache_rows": stage.cache_rows, "append": stage.append, "dynamic": stage.dynamic}

    def reference(self, xp, qkv, cache, stage: AttentionStage):
        """float32 attention output ``[tokens, heads*D]`` from the QKV output and the cache, for arrays
        of module ``xp`` (numpy or cupy)."""
        return _attend(xp, qkv.astype(xp.float32), cache.astype(xp.float32), stage, xp.float32)

    def b_operand(self, stage: AttentionStage) -> tuple[tuple[int, int], float]:
        """The KV cache in the weights' place: ``[kv_heads * 2 * cache_rows, D]`` (keys then values per KV
        head; where the stage appends, room for the new tokens after the cache), and the scale of random
        test entries (like the projection's outputs)."""
        return (stage.kv_heads * 2 * stage.cache_rows, stage.head_dim), 1.0

    def b_written(self, xp, w, stage: AttentionStage):
        """The rows of the cache the stage writes, ``[kv_heads, 2, tokens, D]``: the new tokens' keys and
        values after the cache (None where it does not append)."""
        if not stage.append:
            return None
        return w.reshape(stage.kv_heads, 2, stage.cache_rows, stage.head_dim)[:, :, stage.cache:stage.k]

    def b_expected(self, xp, qkv, stage: AttentionStage):
        """What :meth:`b_written` must hold after a run, from the QKV output (float32)."""
        parts = qkv.reshape(stage.tokens, stage.kv_heads, stage.group + 2, stage.head_dim)
        return parts[:, :, stage.group:].transpose(1, 2, 0, 3)

    def block_work(self, grid: "StageGrid") -> tuple[int, int, int]:
        """For the cost model: bytes one block reads (its queries, the keys and values of its split), FLOPs
        it computes, and the bytes of one ring slot (a chunk's keys and values)."""
        t, d, p = grid.tiles, grid.stage.head_dim, heads_per_tile(grid)
        keys = grid.ks * t.bk
        return (min(t.bm, grid.stage.m) * p + 2 * keys) * d * 2, 4 * t.bm * p * d * keys, 2 * t.bk * d * 2

    def cupy_stage(self, cp, qkv, cache, stage: AttentionStage):
        """Attention as a CuPy user writes it: batched cuBLAS products per KV head, the causal mask,
        a float32 softmax, fp16 weights times the values; the new keys and values copied into the cache
        first where the stage appends."""
        if stage.append:
            self.b_written(cp, cache, stage)[...] = self.b_expected(cp, qkv, stage)
        return _attend(cp, qkv, cache, stage, cp.float16)

    def torch_weight(self, torch, w, stage: AttentionStage):
        """The cache as a PyTorch model holds it: ``[kv_heads, 2, cache_rows, D]``."""
        return w.view(stage.kv_heads, 2, stage.cache_rows, stage.head_dim)

    def torch_stage(self, F, h, w, stage: AttentionStage):
        """Attention in PyTorch: ``scaled_dot_product_attention`` over the cache and the new tokens,
        its causal mask aligned to the last key (``causal_lower_right``) where there is a cache, and
        the KV heads shared by their query heads (``enable_gqa``, else repeated)."""
        import torch  # noqa: PLC0415 - only called where PyTorch runs the baseline

        b, d, g, kvh = stage.tokens, stage.head_dim, stage.group, stage.kv_heads
        parts = h.view(b, kvh, g + 2, d)
        q = parts[:, :, :g].reshape(b, stage.heads, d).transpose(0, 1)[None]  # [1, heads, tokens, D]
        if stage.append:  # as a static cache takes the new tokens, then attention reads it whole
            w[:, :, stage.cache:stage.k] = parts[:, :, g:].permute(1, 2, 0, 3)
            k, v = w[None, :, 0, :stage.k], w[None, :, 1, :stage.k]
        else:
            k = torch.cat([w[:, 0], parts[:, :, g].transpose(0, 1)], dim=1)[None]  # [1, kv_heads, keys, D]
            v = torch.cat([w[:, 1], parts[:, :, g + 1].transpose(0, 1)], dim=1)[None]
        if stage.cache == 0:
            mask, causal = None, True
        elif b == 1:
            mask, causal = None, False  # one query sees every key
        else:
            try:
                from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415
                mask = causal_lower_right(b, stage.k)
            except ImportError:
                mask = torch.ones(b, stage.k, dtype=torch.bool, device=h.device).tril(stage.cache)
            causal = False
        if g > 1:
            try:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
            except TypeError:  # a PyTorch before enable_gqa
                o = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                   attn_mask=mask, is_causal=causal)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return o[0].transpose(0, 1).reshape(b, stage.n)

    def check_shapes(self, producer: "StageGrid", consumer: "StageGrid") -> str | None:
        """Why the consumer cannot read the producer's output as its queries, keys and values, or None."""
        p, c = producer.stage, consumer.stage
        if p.m != c.tokens or p.n_out != c.qkv_cols:
            return (f"{c.name} reads {p.name}'s {p.m}x{p.n_out} output as the queries, keys and values of "
                    f"{c.tokens} tokens ({c.tokens}x{c.qkv_cols}): the shapes must agree")
        return None

    def reads(self, producer: "StageGrid", consumer: "StageGrid") -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The true dependencies: per consumer tile ``(m2, n2)`` (wait row ``m2 * NT + n2``), arrays
        ``(s, m1, n1, kc)``: split ``s`` first reads producer tile ``(m1, n1)`` at chunk ``kc``. A
        dynamic stage's are those of every length up to its cache at once: any run reads the new keys
        and values of tokens before its last query, at its first chunk or later, so they are read here
        at the first."""
        return reads_at(producer, consumer, consumer.stage.cache, consumer.stage.dynamic)

    def chunk_columns(self, consumer: "StageGrid", kc: int) -> str:
        """Which part of the reduction chunk ``kc`` loads, for messages."""
        st, bk = consumer.stage, consumer.tiles.bk
        return f"keys {kc * bk}..{min(kc * bk + bk, st.k) - 1}"


def reads_at(producer: "StageGrid", consumer: "StageGrid", cache: int, up_front: bool
             ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """:meth:`AttentionKind.reads` of the consumer's tiling run at ``cache`` cached tokens (a dynamic
    stage's run below its room keeps the room's chunks and splits); ``up_front``: each split reads
    its tokens' new keys and values at its first chunk, as a dynamic stage's waits assume."""
    st, t = consumer.stage, consumer.tiles
    c, d, g, p = cache, st.head_dim, st.group, heads_per_tile(consumer)
    out = []
    for m2 in range(consumer.mt):
        q0, q1 = m2 * t.bm, min(m2 * t.bm + t.bm, st.m)
        last_key = c + q1 - 1
        for n2 in range(consumer.nt):
            h0 = n2 * p
            base = h0 // g * (g + 2) * d
            q_cols, kv_cols = (base + h0 % g * d, base + h0 % g * d + p * d), (base + g * d, base + g * d + 2 * d)
            seen: dict[tuple[int, int, int], int] = {}
            for s in range(t.split_k):
                for kc in consumer.split_chunks(s):
                    k0 = kc * t.bk
                    if k0 > last_key:
                        break
                    first = kc == consumer.split_chunks(s).start
                    regions = [((q0, q1), q_cols)] if first else []
                    if up_front:  # the new keys and values of every token it sees
                        regions += [((0, q1), kv_cols)] if first else []
                    elif k0 + t.bk > c:
                        regions.append(((max(k0, c) - c, min(k0 + t.bk - 1, last_key) - c + 1), kv_cols))
                    for rows, cols in regions:
                        for m1, n1 in zip(*_producer_tiles(producer, rows, cols)):
                            seen.setdefault((s, int(m1), int(n1)), kc)
            keys = list(seen)
            out.append(tuple(np.array([k[j] for k in keys] if keys else [], dtype=np.int64) for j in range(3))
                       + (np.array(list(seen.values()), dtype=np.int64),))
    return out
