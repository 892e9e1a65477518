"""The convolution's A operand as the kernels' loads address it (conv.cuh), checked on the host:
compiled with a C++ compiler around the same header, against the implicit GEMM's definition."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tuner.paths import home

HARNESS = r"""
#include <cstdio>
#define __device__
#define __forceinline__ inline
typedef unsigned short half_t;
typedef unsigned int u32;
#include "conv.cuh"
// For every row r of M and every 16-byte piece of every K chunk: the offset of its first half
// from the image, or -1 where the piece reads as zeros; the loads' three steps, as gemm.cuh runs them.
int main() {
  static half_t img[1];
  const Im2col3x3<IMG_H, IMG_W, IMG_C> v{img};
  for (int r = 0; r < ROWS + 2; ++r) {
    const auto row = v.row(r, r < ROWS);
    for (int k0 = 0; k0 < 9 * IMG_C; k0 += CHUNK) {
      const auto sl = v.slab(k0);
      for (int c = 0; c < CHUNK; c += 8) {
        bool ok;
        const half_t* src = v.at(row, sl, c, ok);
        std::printf("%ld ", ok ? (long)(src - img) : -1L);
      }
    }
    std::printf("\n");
  }
}
"""


def expected(batch: int, h: int, w: int, c: int, bk: int) -> np.ndarray:
    """The implicit GEMM's A: row r = output pixel (n, y, x), column k = tap * C + channel with
    tap = 3 * dy + dx, reading input pixel (n, y + dy - 1, x + dx - 1) where it lies inside the
    image; rows past the last pixel read zeros (they feed outputs never stored)."""
    m = batch * h * w
    out = np.full((m + 2, 9 * c // 8), -1, dtype=np.int64)
    for r in range(m):
        n, y, x = r // (h * w), r // w % h, r % w
        for k in range(0, 9 * c, 8):
            tap, ch = divmod(k, c)
            yy, xx = y + tap // 3 - 1, x + tap % 3 - 1
            if 0 <= yy < h and 0 <= xx < w:
                out[r, k // 8] = ((n * h + yy) * w + xx) * c + ch
    return out


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("batch,h,w,c,bk", [(2, 5, 7, 64, 64), (1, 4, 4, 128, 64), (2, 3, 6, 256, 128)])
def test_the_im2col_view_reads_each_tap_of_each_pixel_and_zeros_off_the_image(tmp_path, batch, h, w, c, bk):
    src = tmp_path / "harness.cpp"
    src.write_text(HARNESS)
    exe = tmp_path / "harness"
    defs = [f"-DROWS={batch * h * w}", f"-DIMG_H={h}", f"-DIMG_W={w}", f"-DIMG_C={c}", f"-DCHUNK={bk}"]
    subprocess.run(["g++", "-std=c++17", "-O1", *defs, f"-I{home() / 'kernel_templates'}", str(src), "-o", str(exe)],
                   check=True)
    got = np.array([line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                             text=True).stdout.splitlines()], dtype=np.int64)
    assert np.array_equal(got, expected(batch, h, w, c, bk))
