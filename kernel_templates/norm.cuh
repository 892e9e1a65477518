// The row norm a GEMM stage folds into its product (tuner/chain/norm.py): included only where a
// stage has one.
#pragma once

// The row scales of a normed stage (tuner.chain.norm): rs[r] = 1 / sqrt(mean of A[m0 + r]^2 + eps) for
// the tile's BM rows (0 past M), less the square of the row's mean where CENTER (LayerNorm: the
// centring itself is in the weights), by threads 0 .. THREADS - 1, a warp a row at a time, 16 bytes a lane
// a step, read through L2 (ld.cg: another block of this launch may have written A). K is a multiple
// of 8 (GemmStage), so a row is whole 16-byte pieces.
template <int BM, int THREADS, bool CENTER>
__device__ __forceinline__ void row_scale(const half_t* __restrict__ A, int M, int K, int m0, float eps, float* rs) {
  const int lane = threadIdx.x % 32;
  for (int r = threadIdx.x / 32; r < BM; r += THREADS / 32) {
    const int row = m0 + r;
    float s = 0.f, t = 0.f;  // sums of squares and of values
    if (row < M) {
      const half_t* p = A + (size_t)row * K;
#pragma unroll 4
      for (int c = lane * 8; c < K; c += 256) {
        u32 v[4];
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p + c));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float lo = h2f((half_t)(v[q] & 0xffffu)), hi = h2f((half_t)(v[q] >> 16));
          s += lo * lo + hi * hi;
          if constexpr (CENTER) t += lo + hi;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, o);
      if constexpr (CENTER) t += __shfl_xor_sync(0xffffffffu, t, o);
    }
    const float mean = t / (float)K, var = fmaxf(s / (float)K - mean * mean, 0.f);
    if (lane == 0) rs[r] = row < M ? rsqrtf(var + eps) : 0.f;
  }
}
