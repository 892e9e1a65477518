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


def _zeros_like(a: Any, shape: tuple[int, ...]) -> Any:
    """Zeros of ``shape`` in ``a``'s kind (NumPy, CuPy, torch), dtype and device."""
    return a.new_zeros(shape) if hasattr(a, "new_zeros") else _xp(a).zeros(shape, dtype=a.dtype)


def _room(a: Any, rows: int) -> Any:
    """Zero rows ``[a.shape[0], rows, a.shape[2]]`` of ``a``'s kind and dtype."""
    return _zeros_like(a, (a.shape[0], rows, a.shape[2]))


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


def kv_view(chain: Chain, w1: Any) -> Any:
    """The chain's cache operand as ``[kv_heads, 2, rows, D]`` (keys, then values, in the chain's order), a view."""
    attn = chain.stages[1]
    return w1.reshape(attn.kv_heads, 2, attn.cache_rows, attn.head_dim)


def cache_after(chain: Chain, w1: Any) -> tuple[Any, Any]:
    """The keys and values ``[kv_heads, cache + tokens, D]`` in the model's order, from the chain's cache
    operand after a step (the new tokens appended)."""
    qkv, attn = chain.stages[:2]
    kv = kv_view(chain, w1)
    keys, values = kv[:, 0], kv[:, 1]
    if qkv.rope is not None:
        half = attn.head_dim // 2
        back = [i * 2 if i < half else (i - half) * 2 + 1 for i in range(attn.head_dim)]
        keys = keys[..., back]
    return keys, values


class TunedLayer:
    """A model's decoder layer run by a tuned layer chain: its weights converted once (:func:`layer_weights`),
    its KV cache held in the chain's layout, a chain of its own (its output lives until its next call, so
    the layers of one model feed each other). ``layer(x, cache_len)`` runs one step of ``x [tokens, hidden]``
    (fp16) after ``cache_len`` cached tokens (an int32 [1] on the GPU, which the caller advances, or an
    int), appends the step's keys and values and returns the layer's output.

        bundle = tuner.shipping.runtime.load("tuned/llama-layer-bundle")
        layers = [TunedLayer.from_llama(bundle, block, tokens=1) for block in model.model.layers]

    where a Hugging Face ``LlamaDecoderLayer`` holds ``self_attn.{q,k,v,o}_proj``,
    ``mlp.{gate,up,down}_proj``, ``input_layernorm`` and ``post_attention_layernorm``."""

    def __init__(self, bundle: Any, chain: Chain, weights: list[Any]):
        from .runtime import check_length  # noqa: PLC0415

        self.bundle, self.chain, self.weights = bundle, chain, weights
        self.tuned, self.entry, self.pad = bundle.instance(_zeros_like(weights[0], (chain.stages[0].m, chain.stages[0].k)),
                                                           *weights)
        self._check_length = check_length
        self._prompts: dict[int, TunedLayer] = {}  # prefill's layers, one per prompt length

    @classmethod
    def from_llama(cls, bundle: Any, block: Any, tokens: int, cache_k: Any = None, cache_v: Any = None) -> "TunedLayer":
        """From a Hugging Face-style LLaMA decoder layer, for steps of ``tokens`` tokens, with the largest
        room the bundle has for its shape (the cache zeros, or ``cache_k``/``cache_v [kv_heads, room, D]``
        in the model's order)."""
        from ..chain.workloads import get_workload  # noqa: PLC0415

        size = llama_block_size(block)
        rooms = sorted({e["size"]["cache"] for e in bundle.manifests if e.get("room") is not None
                        and {**e["size"], "cache": 0} == {**size, "tokens": tokens, "cache": 0}})
        if not rooms:
            raise ValueError(f"the bundle has no decode entry of {tokens} tokens for a layer of "
                             + ", ".join(f"{k} {v}" for k, v in size.items()))
        chain = get_workload("llama-layer").chain(**size, tokens=tokens, cache=rooms[-1])
        weights = llama_block_weights(chain, block, cache_k, cache_v)
        if hasattr(weights[0], "detach"):  # torch: plain fp16 memory, row-major
            weights = [w.detach().to(block.self_attn.q_proj.weight.dtype).contiguous() for w in weights]
        return cls(bundle, chain, weights)

    def __call__(self, x: Any, cache_len: Any) -> Any:
        from .runtime import run_on_caller_stream  # noqa: PLC0415

        self._check_length(self.entry, cache_len)
        return run_on_caller_stream(self.tuned, self.entry, self.pad, x, self.weights, cache_len)

    def set_cache(self, keys: Any, values: Any) -> None:
        """The first ``n`` cached tokens' keys and values ``[kv_heads, n, D]`` (the model's order; a prompt's),
        written into the chain's cache in place."""
        qkv, attn = self.chain.stages[:2]
        n = keys.shape[1]
        if tuple(keys.shape) != tuple(values.shape) or keys.shape[0] != attn.kv_heads or keys.shape[2] != attn.head_dim \
                or n > attn.cache:
            raise ValueError(f"keys and values [{attn.kv_heads}, n, {attn.head_dim}] with n at most the room, "
                             f"{attn.cache}, are expected; got {list(keys.shape)} and {list(values.shape)}")
        kv = kv_view(self.chain, self.weights[1])
        kv[:, 0, :n] = rope_mod.interleave_cache(keys, attn.head_dim) if qkv.rope is not None else keys
        kv[:, 1, :n] = values

    def prefill(self, x: Any) -> Any:
        """A prompt ``x [P, hidden]`` on an empty cache, through the bundle's prompt entry of ``P`` tokens
        with this layer's weights; the prompt's keys and values land in this layer's cache (rows
        ``0..P-1``, where the next step at ``cache_len`` P reads them) and its output is returned.

        A prompt entry compiles its length in and writes its keys and values into a cache of the
        prompt's size: that cache is the prompt layer's own, kept per ``P`` with its chain, and copied
        here in the chain's layout (the rotation's order both sides; a device copy of
        ``2 * kv_heads * P * D`` values, no round trip through the model's order)."""
        attn = self.chain.stages[1]
        p = int(x.shape[0])
        if not 1 <= p <= attn.cache:
            raise ValueError(f"a prompt of {p} tokens; accepted: 1..{attn.cache} (this layer's room)")
        prompt = self._prompts.get(p)
        if prompt is None:
            from ..chain.workloads import get_workload  # noqa: PLC0415

            size = {**self.chain.size_dict, "tokens": p, "cache": 0}
            have = [m for m in getattr(self.bundle, "manifests", ()) if m.get("room") is None and m.get("size") == size]
            if not have:
                raise ValueError(f"the bundle has no prompt entry of {p} tokens for this layer's shape; tune one "
                                 f"(tuner study {self.chain.workload} --tokens {p} --cache 0) and export it")
            chain = get_workload(self.chain.workload).chain(**size)
            rows = chain.stages[1].cache_rows
            kv = _zeros_like(self.weights[1], (attn.kv_heads * 2 * rows, attn.head_dim))
            prompt = self._prompts[p] = TunedLayer(self.bundle, chain, [self.weights[0], kv, *self.weights[2:]])
        out = prompt(x, None)
        kv_view(self.chain, self.weights[1])[:, :, :p] = kv_view(prompt.chain, prompt.weights[1])[:, :, :p]
        return out

    def cache(self) -> tuple[Any, Any]:
        """The keys and values ``[kv_heads, room + tokens, D]`` in the model's order (see :func:`cache_after`)."""
        return cache_after(self.chain, self.weights[1])


def llama_block_size(block: Any) -> dict[str, int]:
    """The layer chain's sizes but tokens and cache, read from a Hugging Face-style LLaMA decoder layer's weights."""
    a, m = block.self_attn, block.mlp
    d = int(a.head_dim)
    return {"hidden": int(a.q_proj.weight.shape[1]), "ffn": int(m.up_proj.weight.shape[0]),
            "heads": int(a.q_proj.weight.shape[0]) // d, "kv_heads": int(a.k_proj.weight.shape[0]) // d, "head_dim": d}


def llama_block_weights(chain: Chain, block: Any, cache_k: Any = None, cache_v: Any = None) -> list[Any]:
    """:func:`layer_weights` of a Hugging Face-style LLaMA decoder layer (``self_attn.{q,k,v,o}_proj``,
    ``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``); an empty cache where
    none is given."""
    a, m = block.self_attn, block.mlp
    attn = chain.stages[1]
    if cache_k is None or cache_v is None:
        w, shape = a.k_proj.weight, (attn.kv_heads, attn.cache, attn.head_dim)
        cache_k = cache_v = _zeros_like(w, shape)
    return layer_weights(chain, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, m.up_proj.weight,
                         m.down_proj.weight, block.input_layernorm.weight, block.post_attention_layernorm.weight,
                         cache_k, cache_v, w_gate=m.gate_proj.weight)
