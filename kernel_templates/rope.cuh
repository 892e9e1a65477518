// Rotary position embeddings (tuner/chain/rope.py): included only where a stage rotates.
#pragma once

// The pair (a, b) of output columns (col, col + 1) of stored row `row` (col even), rotated where col
// lies in a query or key head (groups of G query heads, a key head and a value head, D columns each)
// by the angle (offset + row) * 2^(-(col % D) / D * log2_base); a value head's pair as it is.
// `offset`: the cache's length, a constant or read at run time (tuner/chain/length.py).
template <int D, int G>
__device__ __forceinline__ void rope_pair(float a, float b, int row, int col, int offset, float log2_base, float& r0,
                                          float& r1) {
  if ((col / D) % (G + 2) == G + 1) {
    r0 = a;
    r1 = b;
    return;
  }
  // sin and cos of pi * (angle / pi): sincospif's range reduction is exact, where sincosf's slow path
  // for large angles (far positions) keeps a stack frame in local memory in every rotating kernel.
  float s, c;
  sincospif((float)(offset + row) * (exp2f(-(float)(col % D) / (float)D * log2_base) * 0.318309886f), &s, &c);
  r0 = a * c - b * s;
  r1 = a * s + b * c;
}
