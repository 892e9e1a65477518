#pragma once
// The A operand of a 3x3 convolution (stride 1, padding 1) over an NHWC fp16 image, as the
// implicit GEMM's loads see it: row r is output pixel (n, h, w) = r in row-major order, column
// k = tap * C + c with tap = 3 * dh + dw. The 8 halves at (r, k) are input pixel
// r + (dh - 1) * W + (dw - 1), channels c..c+7 (C % 8 == 0, so they never straddle two taps),
// and zeros where that pixel falls off the image (or past the last tap).
template <int H, int W, int C>
struct Im2col3x3 {
  const half_t* p;
  __device__ __forceinline__ const half_t* at(int r, int k, bool& ok) const {
    const int tap = k / C, c = k - tap * C;
    const int dh = tap / 3 - 1, dw = tap % 3 - 1;
    const int w = r % W, h = (r / W) % H;
    ok = tap < 9 && h + dh >= 0 && h + dh < H && w + dw >= 0 && w + dw < W;
    return ok ? p + ((size_t)r + dh * W + dw) * C + c : p;
  }
};
