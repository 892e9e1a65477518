"""TMA descriptors (CUtensorMap) for the kernels' fp16 operands, encoded by the CUDA driver.

A descriptor is 128 opaque bytes made by ``cuTensorMapEncodeTiled`` (through ``cuda-bindings``)
for one buffer and box shape. The kernels read them from global memory, so the host packs one
run's descriptors into a device array, in the slots the renderer assigned.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping, Sequence

from ..codegen.render import TensorMap

DESCRIPTOR_BYTES = 128
BOX_COLS = 64  # halves: one 128-byte swizzle atom, the widest box the 128B swizzle allows


def encode(ptr: int, rows: int, cols: int, box_rows: int) -> bytes:
    """The descriptor of a row-major ``rows`` x ``cols`` fp16 matrix at device address ``ptr``,
    read in boxes of ``box_rows`` x 64 with the 128-byte swizzle; reads past an edge give zeros."""
    from cuda.bindings import driver as cu

    if cols * 2 % 16 or ptr % 16:
        raise ValueError(f"a TMA row pitch and base must be multiples of 16 bytes (cols={cols}, ptr={ptr:#x})")
    err, desc = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, ptr,
        [cu.cuuint64_t(cols), cu.cuuint64_t(rows)], [cu.cuuint64_t(cols * 2)],
        [cu.cuuint32_t(BOX_COLS), cu.cuuint32_t(box_rows)], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err.name}) for {rows}x{cols}, box {box_rows}x{BOX_COLS}")
    return ctypes.string_at(desc.getPtr(), DESCRIPTOR_BYTES)


def pack(maps: Sequence[TensorMap], buffers: Mapping[str, Any]) -> Any:
    """A device array holding the descriptors of ``maps`` in their slots, from CuPy ``buffers`` by name."""
    import cupy as cp
    import numpy as np

    host = np.zeros(max(1, len(maps)) * DESCRIPTOR_BYTES, dtype=np.uint8)
    for m in maps:
        buf = buffers[m.operand]
        if buf.shape != (m.rows, m.cols):
            raise ValueError(f"tensor map {m.operand}: buffer is {buf.shape}, the kernel reads {m.rows}x{m.cols}")
        raw = encode(buf.data.ptr, m.rows, m.cols, m.box_rows)
        host[m.slot * DESCRIPTOR_BYTES:(m.slot + 1) * DESCRIPTOR_BYTES] = np.frombuffer(raw, dtype=np.uint8)
    return cp.asarray(host)  # CuPy allocations are 256-byte aligned, as the descriptors need (64)
