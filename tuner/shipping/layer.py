"""A model's decoder layer weights as the layer chains take them (``llama-layer``, ``gpt3-layer``), once, ahead
of any run.

A model keeps its projections as ``nn.Linear`` weights (``[out, in]``) and its norms' gains apart;
the chain wants them laid out for its kernels:

- the QKV weight by KV head (each KV head's ``G`` query heads, then its key head, then its value
  head: :mod:`tuner.chain.attention`), each query and key head's rows in the rotation's order where
  the layer has rotary embeddings (:func:`tuner.chain.rope.interleave_weight`), and the first norm's
  gain (and LayerNorm's centring) folded in (:func:`tuner.chain.norm.fold_weight`);
- the KV cache ``[kv_heads, 2, cache + tokens, D]`` (keys, then values), the keys in the rotation's
  order, room left after the cache for the step's new tokens, which the chain writes there;
- the output projection as it is;
- the MLP's first weight with the second norm folded in, gate and up rows interleaved for SwiGLU
  (row ``2c`` gate ``c``, row ``2c + 1`` up ``c``: :mod:`tuner.chain.epilogues`);
- the down projection as it is.

The functions take NumPy arrays, CuPy arrays or PyTorch tensors (fp16 or float32) and return the
same kind, in the weights' dtype. The chain's output equals the model layer's (its reference is
checked against a Hugging Face-style layer in tests/test_layer_weights.py).
"""
from __future__ import annotations

from typing import Any

from ..chain import norm as norm_mod
from ..chain import rope as rope_mod
from ..chain.workloads import Chain


def _cat(parts: list[Any], axis: int = 0) -> Any:
    if hasattr(parts[0], "dim"):  # torch
        import torch  # noqa: PLC0415

        return torch.cat(parts, dim=axis)
    return _xp(parts[0]).concatenate(parts, axis=axis)


def _xp(a: Any) -> Any:
    import numpy  # noqa: PLC0415

    return numpy if type(a).__module__.startswith("numpy") else __import__("cupy")


def _room(a: Any, rows: int) -> Any:
    """Zero rows ``[a.shape[0], rows, a.shape[2]]`` of ``a``'s kind and dtype."""
    shape = (a.shape[0], rows, a.shape[2])
    return a.new_zeros(shape) if hasattr(a, "new_zeros") else _xp(a).zeros(shape, dtype=a.dtype)


def _fold(w: Any, gain: Any, stage: Any) -> Any:
    n = norm_mod.of(stage)
    return w if n is None else norm_mod.fold_weight(w, gain, n)


def layer_weights(chain: Chain, wq: Any, wk: Any, wv: Any, wo: Any, w_up: Any, w_down: Any, gain1: Any, gain2: Any,
                  cache_k: Any, cache_v: Any, w_gate: Any = None) -> list[Any]:
    """The five operands of a layer chain's stages, from a model's weights: ``wq [heads*D, hidden]``,
    ``wk``, ``wv [kv_heads*D, hidden]``, ``wo [hidden, heads*D]``, ``w_up`` (and ``w_gate`` for SwiGLU)
    ``[ffn, hidden]``, ``w_down [hidden, ffn]``, the norms' gains ``[hidden]``, and the cache's keys and
    values ``[kv_heads, cache, D]`` (``rotate_half`` order, as the model holds them). A decode layer reads
    the cache's length at run time (:mod:`tuner.chain.length`): ``cache`` is then the room, a static
    cache's rows, of which a run reads those before its ``cache_len``."""
    qkv, attn, out, up, down = chain.stages
    d, g, kvh = attn.head_dim, attn.group, attn.kv_heads
    parts = []
    for j in range(kvh):
        parts += [wq[(j * g) * d:(j * g + g) * d], wk[j * d:(j + 1) * d], wv[j * d:(j + 1) * d]]
    w0 = _cat(parts)
    if qkv.rope is not None:
        w0 = rope_mod.interleave_weight(w0, qkv.rope)
    w0 = _fold(w0, gain1, qkv)
    if tuple(cache_k.shape) != (kvh, attn.cache, d) or tuple(cache_v.shape) != (kvh, attn.cache, d):
        raise ValueError(f"the cache's keys and values must be [{kvh}, {attn.cache}, {d}] (kv_heads, cache, head "
                         f"size), got {list(cache_k.shape)} and {list(cache_v.shape)}")
    keys = rope_mod.interleave_cache(cache_k, d) if qkv.rope is not None else cache_k
    room = _room(cache_k, attn.tokens if attn.append else 0)  # the rows the step writes its new tokens to
    kv = _cat([_cat([keys, room], 1)[:, None], _cat([cache_v, room], 1)[:, None]], 1)  # [kvh, 2, rows, D]
    w1 = kv.reshape(kvh * 2 * attn.cache_rows, d)
    if up.fold == 2:
        if w_gate is None:
            raise ValueError(f"the {up.epilogue} epilogue needs the gate weight beside the up weight")
        w3 = _cat([w_gate[:, None], w_up[:, None]], 1).reshape(2 * w_up.shape[0], w_up.shape[1])
    else:
        w3 = w_up
    w3 = _fold(w3, gain2, up)
    return [w0, w1, wo, w3, w_down]


def cache_after(chain: Chain, w1: Any) -> tuple[Any, Any]:
    """The keys and values ``[kv_heads, cache + tokens, D]`` in the model's order, from the chain's cache
    operand after a step (the new tokens appended)."""
    qkv, attn = chain.stages[:2]
    kv = w1.reshape(attn.kv_heads, 2, attn.cache_rows, attn.head_dim)
    keys, values = kv[:, 0], kv[:, 1]
    if qkv.rope is not None:
        half = attn.head_dim // 2
        back = [i * 2 if i < half else (i - half) * 2 + 1 for i in range(attn.head_dim)]
        keys = keys[..., back]
    return keys, values
