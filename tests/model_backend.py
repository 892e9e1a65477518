"""A backend that answers with the cost model's estimate (no device; not a measurement) and asserts that
every config of the whole chain it is asked to time passed the space and the checker: the study loop
end to end on a CPU."""
from __future__ import annotations

from tuner.backends.base import Backend, DeviceInfo, Measurement
from tuner.checker.checks import check

H200 = DeviceInfo("test H200")


class ModelBackend(Backend):
    name = "cost-model"

    def __init__(self, chain, fs):
        self.chain, self.fs, self.calls = chain, fs, []

    def device_info(self):
        return H200

    def measure(self, chain, cfg):
        from tuner.search.cost_model import stage_seconds

        if len(chain.stages) == len(self.chain.stages):
            assert self.fs.contains(cfg) is None and check(chain, cfg) is None, cfg.short()
        self.calls.append((chain.label, cfg))
        us = 1e6 * sum(stage_seconds(g, H200) for g in cfg.grids(chain))
        return Measurement(ok=True, median_us=us, times_us=[us], error=1e-4)
