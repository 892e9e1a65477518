"""A model's decoder layer, its weights converted once (tuner.shipping.layer), is the layer chain: the chain's
float32 reference over the converted weights equals a Hugging Face-style layer over the model's, and the
cache after the step holds the model's keys and values with the new tokens'."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.backends.gpu import reference_outputs
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


@pytest.mark.parametrize("llama", [True, False], ids=["llama", "gpt3"])
def test_the_chain_over_converted_weights_is_the_model_layer(llama):
    if llama:
        chain = get_workload("llama-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=4, kv_heads=2)
    else:
        chain = get_workload("gpt3-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=2, kv_heads=2)
    attn = chain.stages[1]
    d, heads, kvh, hidden, ffn = attn.head_dim, attn.heads, attn.kv_heads, 64, 48
    rng = np.random.default_rng(3)

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[-1])

    m = dict(wq=w(heads * d, hidden), wk=w(kvh * d, hidden), wv=w(kvh * d, hidden), wo=w(hidden, heads * d),
             wg=w(ffn, hidden), wu=w(ffn, hidden), wd=w(hidden, ffn), g1=1 + 0.1 * rng.standard_normal(hidden),
             g2=1 + 0.1 * rng.standard_normal(hidden), ck=rng.standard_normal((kvh, 5, d)),
             cv=rng.standard_normal((kvh, 5, d)))
    x = rng.standard_normal((3, hidden)) + 0.5  # rows off zero mean: LayerNorm's centring matters
    want, keys, values = model_layer(x, m, chain, llama)
    ws = layer_weights(chain, m["wq"], m["wk"], m["wv"], m["wo"], m["wu"], m["wd"], m["g1"], m["g2"], m["ck"],
                       m["cv"], w_gate=m["wg"] if llama else None)
    outs = reference_outputs(chain, x, ws, xp=np)
    assert np.allclose(outs[-1], want, atol=1e-6)
    # The step's cache: the model's, then the new tokens' keys and values (what the append writes).
    kind_w1 = ws[1].copy()
    from tuner.chain.kinds import kind_of
    kind_of(attn).b_written(np, kind_w1, attn)[...] = kind_of(attn).b_expected(np, outs[0], attn)
    got_k, got_v = cache_after(chain, kind_w1)
    assert np.allclose(got_k, keys, atol=1e-6) and np.allclose(got_v, values, atol=1e-6)


def test_a_cache_of_the_wrong_shape_is_refused_in_one_line():
    chain = get_workload("llama-layer").chain(tokens=3, cache=5, hidden=64, ffn=48, heads=4, kv_heads=2)
    z = np.zeros
    with pytest.raises(ValueError, match=r"^the cache's keys and values must be \[2, 5, 128\]"):
        layer_weights(chain, z((512, 64)), z((256, 64)), z((256, 64)), z((64, 512)), z((48, 64)), z((64, 48)),
                      z(64), z(64), z((2, 4, 128)), z((2, 4, 128)), w_gate=z((48, 64)))
