"""The host side of launching, without a GPU: the dependent launch's shared parameter block."""
from __future__ import annotations

import ctypes
import sys
import threading
import time
import types

from tuner.backends import gpu
from tuner.codegen.render import Launch


def fake_driver(seen: list[tuple[int, int]]):
    """A stand-in for cuda-bindings' driver module: its launch reads the two argument slots the
    block points to, a moment apart, as a driver copying them would."""
    class Attr:
        def __init__(self):
            self.value = types.SimpleNamespace()

    def launch(cfg, function, block_address, extra):
        block = (ctypes.c_void_p * 2).from_address(block_address)
        first = ctypes.c_uint64.from_address(block[0]).value
        time.sleep(0.0005)  # another thread may run here
        second = ctypes.c_uint32.from_address(block[1]).value
        seen.append((first, second))
        return (0,)

    return types.SimpleNamespace(
        CUlaunchConfig=types.SimpleNamespace, CUlaunchAttribute=Attr, CUstream=int, CUfunction=int,
        CUlaunchAttributeID=types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=1),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0), cuLaunchKernelEx=launch)


def test_threads_sharing_a_dependent_launch_never_mix_their_arguments(monkeypatch):
    seen: list[tuple[int, int]] = []
    driver = fake_driver(seen)
    monkeypatch.setitem(sys.modules, "cuda", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.SimpleNamespace(driver=driver))
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    launch = gpu._DependentLaunch(1, Launch("stage1_kernel", 4, 128, 0, 0, pdl=True), 0, (True, False))

    def caller(k: int) -> None:
        for i in range(40):
            launch([1000 * k + i, 1000 * k + i])  # a pointer and an epoch that belong together

    threads = [threading.Thread(target=caller, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 120 and all(a == b for a, b in seen)
