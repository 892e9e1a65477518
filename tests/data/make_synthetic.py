"""Write tests/data/synthetic_measurements.json: SYNTHETIC figures from a toy cost model, not measurements.

The file lets the tuning loop, the samplers and the exports be exercised on a
machine without a GPU. Every figure in it comes from the small analytic model
below (a roofline per stage, wave quantization, a guessed overlap per sync
policy, and hash-derived jitter); none was measured on any device. The file says
``"synthetic": true`` and its device is named accordingly, so replayed studies
label every figure as synthetic.

For each GPT-3 size it records every feasible config of a narrowed search
space (a few hundred per size), so a sampler working over the recorded values
has a meaningful space to search. A few configs fail, with every failure reason.

Run from the repository root:  python tests/data/make_synthetic.py
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tuner.backends.base import FAIL_REASONS, DeviceInfo, Measurement  # noqa: E402
from tuner.backends.replay import Record, write_recording  # noqa: E402
from tuner.chain.workloads import Chain, get_workload  # noqa: E402
from tuner.config import Config, StageGrid  # noqa: E402
from tuner.search.space import load_space, parse_space  # noqa: E402

OUT = Path(__file__).resolve().parent / "synthetic_measurements.json"
COMMAND = "python tests/data/make_synthetic.py"
DEVICE = DeviceInfo(name="Synthetic H200 model (not a device)", arch="sm_90", sms=132, smem_per_block=227 * 1024,
                    regs_per_block=65536, l2_bytes=50 * 1024 * 1024, driver="synthetic", toolkit="synthetic")
TOKENS = (1, 64, 1000, 2048)

# Model constants: round numbers of the right order for an H200, not calibrated.
PEAK_FLOPS = 700e12
HBM_BYTES_PER_S = 4.0e12
KERNEL_US = 2.0
LAUNCH_GAP_US = 3.0
GUARD_US = 1.5
OVERLAP = {"tile": 0.6, "row": 0.4}

# Narrowed per-size spaces: small enough that their feasible sets are a few hundred configs.
NARROW = {
    1: {"bm": [16], "bn": [128, 256], "wm": [1], "wn": [2, 4], "gemm2": {"split_k": [1, 4]}},
    64: {"bm": [64], "bn": [128], "wm": [1, 2], "wn": [2, 4], "gemm2": {"split_k": [1, 4]}},
    1000: {"bm": [64, 128], "bn": [128], "wm": [2], "wn": [2, 4]},
    2048: {"bm": [128], "bn": [128, 256], "wm": [2, 4], "wn": [2, 4]},
}
COMMON = {"bk": [64], "stages": [4], "split_k": [1]}
FAIL_EVERY = 23  # one non-stream config in this many fails, until every reason has appeared once


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by ``parts``: jitter that is the same on every run."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") / 2 ** 64


def _key(c: Config) -> str:
    """A config as the jitter sees it: its recorded form, which a new field at its default leaves as it was."""
    return json.dumps(c.to_dict(), sort_keys=True)


def stage_us(g: StageGrid, sms: int) -> float:
    t = g.tiles
    waves = math.ceil(g.blocks / sms)
    fill = g.blocks / (waves * sms)
    mma_eff = min(1.0, (t.bm * t.bn) / (128 * 256)) ** 0.25
    compute = g.stage.flops / (PEAK_FLOPS * mma_eff * fill)
    traffic = 2 * (g.stage.n * g.stage.k + 0.25 * g.stage.m * g.stage.k * g.nt + g.stage.m * g.stage.n * t.split_k)
    reduce_s = (t.split_k - 1) * g.stage.m * g.stage.n * 4 / HBM_BYTES_PER_S
    return 1e6 * (max(compute, traffic / HBM_BYTES_PER_S) + reduce_s) + KERNEL_US


def chain_us(chain: Chain, c: Config, sms: int) -> float:
    parts = [stage_us(g, sms) for g in c.grids(chain)]
    if c.policy == "stream":
        total = sum(parts) + LAUNCH_GAP_US * (len(parts) - 1)
    else:
        overlap = OVERLAP[c.policy] * (1.0 if c.order == "row" else 0.7) + (0.1 if c.launch == "fused" else 0.0)
        total = max(parts) + (sum(parts) - max(parts)) * (1 - overlap)
        total += GUARD_US if c.launch == "two_stream" else 0.0
    if c.dispatch == "ticket":
        total *= 0.98
    return total * (1 + 0.04 * (_unit("config", chain.label, _key(c)) - 0.5))


def measurement(chain: Chain, c: Config, sms: int) -> Measurement:
    median = chain_us(chain, c, sms)
    key = _key(c)
    times = sorted(round(median * (1 + 0.01 * (_unit("sample", i, chain.label, key) - 0.5)), 3) for i in range(5))
    return Measurement(ok=True, median_us=times[2], times_us=times, error=round(1e-3 * _unit("err", key), 6))


def failure(reason: str) -> Measurement:
    return Measurement.failed(reason, f"synthetic {reason} failure (modelled, not observed)")


def records_for(chain: Chain) -> list[Record]:
    full = load_space(ROOT / "search_spaces" / "gpt3.toml")
    narrow = {**COMMON, **NARROW[chain.size_dict["tokens"]]}
    # The launch modes this toy model has figures for (it predates pdl, which it would only guess).
    space = parse_space({"stage": narrow, "global": {"launch": ["serial", "two_stream", "fused"]},
                         "limits": {"max_threads": full.limits.max_threads, "max_tile_regs": full.limits.max_tile_regs}},
                        "synthetic narrowed space")
    inside = full.feasible(chain, DEVICE)
    configs = [c for c in space.feasible(chain, DEVICE).grid(seed=7) if inside.contains(c) is None]
    out = []
    reasons = iter(FAIL_REASONS)
    others = 0
    for c in configs:
        # Stream configs always succeed, so every replayed study has its baseline.
        if c.policy != "stream":
            others += 1
            reason = next(reasons, None) if others % FAIL_EVERY == 5 else None
            if reason is not None:
                out.append(Record(chain.label, c, failure(reason)))
                continue
        out.append(Record(chain.label, c, measurement(chain, c, DEVICE.sms)))
    return out


def main() -> None:
    wl = get_workload("gpt3")
    records = [r for tokens in TOKENS for r in records_for(wl.chain(tokens=tokens))]
    write_recording(OUT, DEVICE, records, COMMAND, synthetic=True)
    counts = {t: sum(r.label.startswith(f"gpt3/tokens={t},") for r in records) for t in TOKENS}
    print(f"wrote {OUT.name}: {json.dumps(counts)} records per tokens (synthetic)")


if __name__ == "__main__":
    main()
