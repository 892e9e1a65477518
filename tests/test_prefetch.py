"""The L2 prefetch of the later stages' inputs: where the space allows it, and what it renders."""
from __future__ import annotations

import math
from dataclasses import replace

from tuner.chain.kinds import kind_of
from tuner.chain.workloads import get_workload
from tuner.codegen.render import render
from tuner.config import Config
from tuner.device import DeviceInfo
from tuner.search.cases import coverage
from tuner.sync.prefetch import prefetch_allowed, prefetched_bytes

H200 = DeviceInfo("H200")
DECODE = get_workload("llama-attn").chain(tokens=1)


def test_the_prefetched_bytes_are_each_later_stage_s_whole_b_buffer():
    for chain in (DECODE, get_workload("gpt3").chain(tokens=64), get_workload("resnet38").chain(batch=1)):
        sizes = dict(prefetched_bytes(chain))
        assert list(sizes) == list(range(1, len(chain.stages)))
        for i, bytes_ in sizes.items():
            st = chain.stages[i]
            assert bytes_ == math.prod(kind_of(st).b_operand(st)[0]) * 2
    # llama decode: the KV cache of one KV head (1024 tokens, keys and values) and the output projection
    assert prefetched_bytes(DECODE) == [(1, 2 * 1024 * 128 * 2), (2, 8192 * 1024 * 2)]


def test_only_inputs_that_fit_half_of_l2_on_hopper_are_prefetched():
    assert prefetch_allowed("l2", DECODE, H200) is None
    big = get_workload("gpt3").chain(tokens=256)  # 151 MB of second-stage weights
    assert "evict itself" in prefetch_allowed("l2", big, H200)
    assert "Hopper" in prefetch_allowed("l2", DECODE, DeviceInfo("A100", arch="sm_80"))
    assert prefetch_allowed("none", big, H200) is None


def test_each_stage_prefetches_the_next_one_s_input_before_any_wait_in_every_launch_mode():
    cfgs = [c for c in coverage(DECODE) if c.prefetch == "l2"]
    assert {c.launch for c in cfgs} == {"serial", "pdl", "two_stream", "fused"}
    for cfg in cfgs:
        src = render(DECODE, cfg).source
        grids = cfg.grids(DECODE)
        part = "t" if cfg.launch == "fused" else "blockIdx.x"
        calls = [line.strip() for line in src.splitlines() if line.strip().startswith("tuner_prefetch_l2(")]
        assert calls == [f"tuner_prefetch_l2(w{i}, {b}ull, {part}, {grids[i - 1].blocks}u);"
                         for i, b in prefetched_bytes(DECODE)]
        for i in (1, 2):
            if cfg.launch == "fused":
                body = src.split("fused_kernel(")[-1].split(f"stage{i - 1}_tile(t,")[0].split("t -= ")[-1]
            else:
                body = src.split(f"stage{i - 1}_kernel(")[-1].split(f"stage{i - 1}_tile(")[0]
            assert f"tuner_prefetch_l2(w{i}," in body.split("griddepcontrol.wait")[0].split("tuner_run(")[0]
        assert "tuner_prefetch_l2" not in render(DECODE, replace(cfg, prefetch="none")).source


def test_a_config_recorded_before_the_prefetch_existed_reads_as_none_and_keeps_its_form():
    cfg = coverage(DECODE)[0]
    old = {k: v for k, v in cfg.to_dict().items() if k != "prefetch"}
    assert Config.from_dict(old) == cfg and cfg.prefetch == "none"
    assert cfg.to_dict() == old  # the storage key of an unprefetched config is what it was
    on = replace(cfg, prefetch="l2")
    assert on.to_dict()["prefetch"] == "l2" and Config.from_dict(on.to_dict()) == on
    assert Config.from_params(on.params(DECODE.stage_names), DECODE.stage_names) == on and "+l2" in on.short()


def test_a_space_searches_the_prefetch_only_where_its_file_names_it():
    from tuner.search.space import parse_space

    base = {"stage": {"bm": [16], "bn": [128], "bk": [64], "wm": [1], "wn": [1], "stages": [2], "split_k": [1]}}
    assert parse_space(base, "a.toml").globals["prefetch"] == ("none",)
    named = parse_space({**base, "global": {"prefetch": ["none", "l2"]}}, "b.toml")
    assert named.globals["prefetch"] == ("none", "l2")
    fs = named.feasible(DECODE, H200)
    assert {c[4] for c in fs.combos} == {"none", "l2"}
    assert fs.contains(replace(next(iter(fs)), prefetch="l2")) is None
