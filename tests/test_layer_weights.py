"""A model's decoder layer, its weights converted once (tuner.shipping.layer), is the layer chain: the chain's
float32 reference over the converted weights equals a Hugging Face-style layer over the model's, and the
cache after the step holds the model's keys and values with the new tokens'."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.backends.gpu import reference_outputs
from tuner.chain.kinds import kind_of
from tuner.chain.workloads import get_workload
from tuner.shipping.layer import cache_after, layer_weights

EPS = 1e-5


def rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g


def layer_norm(x, g):
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + EPS) * g


def rotate_half(x, pos, d):
    inv = 10000.0 ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([pos[:, None] * inv] * 2, axis=1)  # [tokens, d]
    half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(ang) + half * np.sin(ang)


def model_layer(x, m, chain, llama):
    """The layer as a Hugging Face-style model computes it: ``x [tokens, hidden]``; returns the output and
    the cache's keys and values with the new tokens'."""
    attn = chain.stages[1]
    t, d, heads, kvh, c = attn.tokens, attn.head_dim, attn.heads, attn.kv_heads, attn.cache
    norm = rms if llama else layer_norm
    n1 = norm(x, m["g1"])
    q = (n1 @ m["wq"].T).reshape(t, heads, d).transpose(1, 0, 2)
    k = (n1 @ m["wk"].T).reshape(t, kvh, d).transpose(1, 0, 2)
    v = (n1 @ m["wv"].T).reshape(t, kvh, d).transpose(1, 0, 2)
    if llama:
        pos = np.arange(c, c + t, dtype=np.float64)
        q, k = rotate_half(q, pos, d), rotate_half(k, pos, d)
    keys, values = np.concatenate([m["ck"], k], 1), np.concatenate([m["cv"], v], 1)
    g = heads // kvh
    s = np.einsum("htd,hkd->htk", q, np.repeat(keys, g, 0)) / np.sqrt(d)
    s = np.where(np.arange(c + t)[None, None, :] <= c + np.arange(t)[None, :, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("htk,hkd->htd", p / p.sum(-1, keepdims=True), np.repeat(values, g, 0))
    h = x + o.transpose(1, 0, 2).reshape(t, heads * d) @ m["wo"].T
    n2 = norm(h, m["g2"])
    if llama:
        gate = n2 @ m["wg"].T
        mid = gate / (1 + np.exp(-gate)) * (n2 @ m["wu"].T)
    else:
        u = n2 @ m["wu"].T
        mid = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    return h + mid @ m["wd"].T, keys, values


def model_weights(chain, rng, hidden: int, ffn: int) -> dict:
    """A model layer's random weights, norm gains and cache (``chain``'s cache length) as the model holds them."""
    attn = chain.stages[1]
    d, heads, kvh, c = attn.head_dim, attn.heads, attn.kv_heads, attn.cache

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[-1])

    return dict(wq=w(heads * d, hidden), wk=w(kvh * d, hidden), wv=w(kvh * d, hidden), wo=w(hidden, heads * d),
                wg=w(ffn, hidden), wu=w(ffn, hidden), wd=w(hidden, ffn), g1=1 + 0.1 * rng.standard_normal(hidden),
                g2=1 + 0.1 * rng.standard_normal(hidden), ck=rng.standard_normal((kvh, c, d)),
                cv=rng.standard_normal((kvh, c, d)))


@pytest.mark.parametrize("llama", [True, False], ids=["llama", "gpt3"])
def test_the_chain_over_converted_weights_is_the_model_layer(llama):
    if llama:
        chain = get_workload("llama-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=4, kv_heads=2)
    else:
        chain = get_workload("gpt3-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=2, kv_heads=2)
    rng = np.random.default_rng(3)
    m = model_weights(chain, rng, hidden=64, ffn=48)
    x = rng.standard_normal((3, 64)) + 0.5  # rows off zero mean: LayerNorm's centring matters
    want, keys, values = model_layer(x, m, chain, llama)
    ws = layer_weights(chain, m["wq"], m["wk"], m["wv"], m["wo"], m["wu"], m["wd"], m["g1"], m["g2"], m["ck"],
                       m["cv"], w_gate=m["wg"] if llama else None)
    outs = reference_outputs(chain, x, ws, xp=np)
    assert np.allclose(outs[-1], want, atol=1e-6)
    # The step's cache: the model's, then the new tokens' keys and values (what the append writes).
    kind_w1, attn = ws[1].copy(), chain.stages[1]
    kind_of(attn).b_written(np, kind_w1, attn)[...] = kind_of(attn).b_expected(np, outs[0], attn)
    got_k, got_v = cache_after(chain, kind_w1)
    assert np.allclose(got_k, keys, atol=1e-6) and np.allclose(got_v, values, atol=1e-6)


def test_a_cache_of_the_wrong_shape_is_refused_in_one_line():
    chain = get_workload("llama-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=4, kv_heads=2)
    z = np.zeros
    with pytest.raises(ValueError, match=r"^the cache's keys and values must be \[2, 5, 128\]"):
        layer_weights(chain, z((512, 64)), z((256, 64)), z((256, 64)), z((64, 512)), z((48, 64)), z((64, 48)),
                      z(64), z(64), z((2, 4, 128)), z((2, 4, 128)), w_gate=z((48, 64)))


def test_a_run_below_the_room_is_the_model_layer_over_that_many_cached_tokens():
    # A decode layer compiled for a room of 9 tokens, run at 5: the model with a cache of 5.
    chain = get_workload("llama-layer").chain(tokens=3, cache=9, hidden=64, ffn=48, heads=4, kv_heads=2)
    rng = np.random.default_rng(5)
    m = model_weights(chain, rng, hidden=64, ffn=48)
    x = rng.standard_normal((3, 64))
    ws = layer_weights(chain, m["wq"], m["wk"], m["wv"], m["wo"], m["wu"], m["wd"], m["g1"], m["g2"], m["ck"],
                       m["cv"], w_gate=m["wg"])
    five = get_workload("llama-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=4, kv_heads=2)
    want, _, _ = model_layer(x, {**m, "ck": m["ck"][:, :5], "cv": m["cv"][:, :5]}, five, True)
    assert np.allclose(reference_outputs(chain, x, ws, xp=np, cache_len=5)[-1], want, atol=1e-6)


def test_a_hugging_face_llama_blocks_weights_are_read_by_their_names():
    from tuner.shipping.layer import llama_block_size, llama_block_weights

    block = hf_llama_block(np.random.default_rng(1))
    size = llama_block_size(block)
    assert size == {"hidden": 64, "ffn": 48, "heads": 4, "kv_heads": 2, "head_dim": 128}
    chain = get_workload("llama-layer").chain(**size, tokens=3, cache=5)
    a, mlp = block.self_attn, block.mlp
    zeros = np.zeros((2, 5, 128))
    want = layer_weights(chain, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, mlp.up_proj.weight,
                         mlp.down_proj.weight, block.input_layernorm.weight, block.post_attention_layernorm.weight,
                         zeros, zeros, w_gate=mlp.gate_proj.weight)
    for got, expected in zip(llama_block_weights(chain, block), want):
        assert np.array_equal(got, expected)


def test_a_prompts_cache_set_into_a_tuned_layer_reads_back_in_the_models_order():
    from tuner.shipping.layer import TunedLayer

    class Bundle:  # what TunedLayer asks of a loaded bundle, without a GPU
        def instance(self, x, *weights):
            return None, {"label": "llama-layer", "room": 9}, False

    chain = get_workload("llama-layer").chain(tokens=3, cache=9, hidden=64, ffn=48, heads=4, kv_heads=2)
    ws = [np.zeros(kind_of(st).b_operand(st)[0]) for st in chain.stages]
    layer = TunedLayer(Bundle(), chain, ws)
    rng = np.random.default_rng(2)
    keys, values = rng.standard_normal((2, 5, 128)), rng.standard_normal((2, 5, 128))
    layer.set_cache(keys, values)
    got_k, got_v = layer.cache()
    assert np.array_equal(got_k[:, :5], keys) and np.array_equal(got_v[:, :5], values)
    assert not got_k[:, 5:].any() and not got_v[:, 5:].any()
    with pytest.raises(ValueError, match=r"^keys and values \[2, n, 128\] with n at most the room, 9"):
        layer.set_cache(np.zeros((2, 10, 128)), np.zeros((2, 10, 128)))


def test_a_tuned_layer_from_a_llama_block_takes_the_largest_room_the_bundle_has_for_its_shape():
    from tuner.shipping.layer import TunedLayer

    block = hf_llama_block(np.random.default_rng(4))
    shape = {"hidden": 64, "ffn": 48, "heads": 4, "kv_heads": 2, "head_dim": 128}

    class Bundle:
        manifests = [{"size": {**shape, "tokens": 1, "cache": c}, "room": c} for c in (256, 1024)] + [
            {"size": {**shape, "tokens": 4, "cache": 4096}, "room": 4096},  # another token count
            {"size": {**shape, "hidden": 128, "tokens": 1, "cache": 8192}, "room": 8192},  # another shape
            {"size": {**shape, "tokens": 64, "cache": 0}, "room": None}]  # a prompt

        def instance(self, x, *weights):
            return None, {"label": "llama-layer", "room": 1024}, False

    layer = TunedLayer.from_llama(Bundle(), block, tokens=1)
    assert layer.chain.stages[1].cache == 1024 and layer.chain.size_dict["tokens"] == 1
    with pytest.raises(ValueError, match=r"^the bundle has no decode entry of 16 tokens for a layer of hidden 64"):
        TunedLayer.from_llama(Bundle(), block, tokens=16)


def hf_llama_block(rng):
    """What the weight readers ask of a Hugging Face LlamaDecoderLayer, without torch: 4 query heads
    and 2 KV heads of 128, hidden 64, FFN 48, random weights."""
    from types import SimpleNamespace as NS

    lin = lambda o, i: NS(weight=rng.standard_normal((o, i)))  # noqa: E731
    return NS(self_attn=NS(head_dim=128, q_proj=lin(512, 64), k_proj=lin(256, 64), v_proj=lin(256, 64),
                           o_proj=lin(64, 512)),
              mlp=NS(gate_proj=lin(48, 64), up_proj=lin(48, 64), down_proj=lin(64, 48)),
              input_layernorm=NS(weight=rng.standard_normal(64)),
              post_attention_layernorm=NS(weight=rng.standard_normal(64)))


def test_a_prefill_runs_the_prompt_entry_on_the_layers_weights_and_its_keys_and_values_land_in_the_cache(monkeypatch):
    from tuner.shipping import runtime
    from tuner.shipping.layer import TunedLayer

    decode = get_workload("llama-layer").chain(tokens=1, cache=9, hidden=64, ffn=48, heads=4, kv_heads=2)
    size = {**decode.size_dict, "tokens": 5, "cache": 0}

    class Bundle:  # a decode entry of room 9 and a prompt entry of 5 tokens, without a GPU
        manifests = [{"size": decode.size_dict, "room": 9}, {"size": size, "room": None}]
        made = []

        def instance(self, x, *weights):
            self.made.append(x.shape[0])
            return None, {"label": "llama-layer", "room": None if x.shape[0] == 5 else 9}, False

    runs = []

    def run(tuned, entry, pad, x, weights, cache_len):  # the prompt chain's append: rows 0..4 of its own cache
        runs.append((weights, cache_len))
        weights[1][:] = np.arange(weights[1].size).reshape(weights[1].shape)
        return x + 1

    monkeypatch.setattr(runtime, "run_on_caller_stream", run)
    ws = [np.full(kind_of(st).b_operand(st)[0], float(i)) for i, st in enumerate(decode.stages)]
    layer = TunedLayer(Bundle(), decode, ws)
    x = np.zeros((5, 64))
    assert np.array_equal(layer.prefill(x), x + 1)
    (got, cache_len), = runs
    assert cache_len is None and all(a is b for i, (a, b) in enumerate(zip(got, ws)) if i != 1)
    written = got[1].reshape(2, 2, 5, 128)
    kv = ws[1].reshape(2, 2, 10, 128)
    assert np.array_equal(kv[:, :, :5], written) and (kv[:, :, 5:] == 1.0).all()
    layer.prefill(x)
    assert Bundle.made == [1, 5], "one prompt chain per prompt length, kept"
    with pytest.raises(ValueError, match=r"^the bundle has no prompt entry of 4 tokens for this layer's shape"):
        layer.prefill(np.zeros((4, 64)))
    with pytest.raises(ValueError, match=r"^a prompt of 10 tokens; accepted: 1\.\.9 \(this layer's room\)$"):
        layer.prefill(np.zeros((10, 64)))
