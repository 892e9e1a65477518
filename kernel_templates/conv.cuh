#pragma once
// The A operand of a 3x3 convolution (stride 1, padding 1) over an NHWC fp16 image, as the
// implicit GEMM's loads see it: row r is output pixel (n, h, w) = r in row-major order, column
// k = tap * C + c with tap = 3 * dh + dw. The 8 halves at (r, k) are input pixel
// r + (dh - 1) * W + (dw - 1), channels c..c+7 (C % 8 == 0, so they never straddle two taps),
// and zeros where that pixel falls off the image (or past the last tap).
//
// Cut as gemm.cuh's loads want it: a row keeps its pixel's channels and which of the 9 taps read
// inside the image (bit tap; none for a row past the last pixel), a K chunk its tap (C % BK == 0:
// one tap a chunk) and the offset of that tap's pixel and first channel.
template <int H, int W, int C>
struct Im2col3x3 {
  const half_t* p;
  struct Row {
    const half_t* p;  // channel 0 of the output pixel's own input pixel
    u32 taps;         // bit 3 * dh + dw: input pixel (h + dh - 1, w + dw - 1) lies inside the image
  };
  struct Slab {
    int tap;  // 0..8: K = 9 * C is a whole number of chunks
    int off;  // halves from a row's p to the chunk's first: its tap's pixel, then its first channel
  };
  __device__ __forceinline__ Row row(int r, bool live) const {
    const int w = r % W, h = (r / W) % H;
    u32 taps = 0;
#pragma unroll
    for (int t = 0; t < 9; ++t) {
      const int dh = t / 3 - 1, dw = t % 3 - 1;
      if (h + dh >= 0 && h + dh < H && w + dw >= 0 && w + dw < W) taps |= 1u << t;
    }
    return {p + (size_t)r * C, live ? taps : 0u};
  }
  __device__ __forceinline__ Slab slab(int k0) const {
    const int tap = k0 / C;
    return {tap, ((tap / 3 - 1) * W + tap % 3 - 1) * C + (k0 - tap * C)};
  }
  __device__ __forceinline__ const half_t* at(const Row& row, const Slab& sl, int c, bool& ok) const {
    ok = (row.taps >> sl.tap) & 1u;
    return ok ? row.p + sl.off + c : p;
  }
};
