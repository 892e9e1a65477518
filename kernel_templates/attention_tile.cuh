// One attention tile: the queries of BM tokens in P heads that share one KV head, against keys
// [kc_begin*BK, kc_end*BK) (a split of the keys), causal, with an online softmax (see
// tuner/chain/attention.py for the layouts). Its ROWS = BM * P query rows are token-major: row r
// is token m0 + r / P in head head0 + r % P. Packing the heads of a group (P > 1) reads each key
// and value once for all of them, and fills the MMA's 16 rows where few tokens would not.
//
// The block's WM x WN warps: WM rows of 16 query rows, each row's WN warps splitting every chunk's
// keys between them (WN > 1 gives a few queries more warps, so more loads in flight, and lets a
// tile match the thread count of the GEMMs of a fused launch); at the end the WN partial results
// of a row are merged through shared memory into its first warp. A warp's query fragments stay in
// registers for the whole tile; keys and values stream through a ring of STAGES chunks in shared
// memory (cp.async, rows padded by 16 bytes as in gemm.cuh). Scores S = Q K^T and the weighted
// sum O += P V run on mma.sync m16n8k16; P goes from the score accumulators to the A operand in
// registers, never through shared memory. Softmax in base 2: scores are scaled by
// scale_log2 = log2(e) / sqrt(D).
#pragma once

// The running softmax of a thread's two query rows (lane / 4 and lane / 4 + 8 of its warp): the
// largest scaled score seen, and the sum of exp2(score - max) over the thread's columns.
struct SoftmaxRows {
  float max[2], sum[2];
};

template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_, int D_>
struct AttnTile {
  static constexpr int BM = BM_, D = D_, BN = BN_, P = BN_ / D_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int ROWS = BM * P;     // query rows: BM tokens x P heads
  static constexpr int THREADS = WM * WN * 32, MMA_THREADS = THREADS;
  static constexpr int HOLDERS = WM * 32;  // threads of the warps that hold a row's merged result
  static constexpr int LDS = D + 8;        // halves per shared row
  static constexpr int Q_ELEMS = ROWS * LDS, KV_ELEMS = BK * LDS;
  static constexpr int KW = BK / WN;  // keys of a chunk per warp
  static constexpr int DI = D / 8;    // output fragments (8 columns each) per warp
  static constexpr int SJ = KW / 8;   // score fragments per chunk
  static constexpr int DK = D / 16;   // k-steps of the scores
  static_assert(BN % D == 0 && ROWS == 16 * WM, "a row of warps owns 16 query rows of whole heads");
  static_assert(KW % 16 == 0 && D % 16 == 0, "a warp's keys and the head in steps of 16");
  static_assert(STAGES >= 2, "at least two chunks in flight");
  // This thread's warp row, the keys of a chunk it takes, and its slot among the holders.
  __device__ static int row() { return threadIdx.x / 32 / WN; }
  __device__ static int part() { return threadIdx.x / 32 % WN; }
  __device__ static int slot() { return row() * 32 + threadIdx.x % 32; }
};

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// A float4 to and from global memory (at L2: another block reads it) or shared memory.
template <bool GLOBAL>
__device__ __forceinline__ void put4(float4* p, float4 v) {
  if constexpr (GLOBAL) __stcg(p, v); else *p = v;
}
template <bool GLOBAL>
__device__ __forceinline__ float4 get4(const float4* p) {
  if constexpr (GLOBAL) return __ldcg(p); else return *p;
}

// A partial result that has seen no key: O = 0, max = -inf, sum = 0 (what a merge leaves as is).
template <class T>
__device__ __forceinline__ void softmax_clear(float (&acc)[T::DI][4], SoftmaxRows& sm) {
#pragma unroll
  for (int j = 0; j < T::DI; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  sm.max[0] = sm.max[1] = neg_inf();
  sm.sum[0] = sm.sum[1] = 0.f;
}

// A partial result as one thread stores it: its DI output fragments, then its rows' softmax
// state, each a float4 `stride` apart (consecutive threads consecutive: coalesced).
template <class T, bool GLOBAL>
__device__ __forceinline__ void softmax_store(const float (&acc)[T::DI][4], const SoftmaxRows& sm, float4* p,
                                              int stride) {
#pragma unroll
  for (int j = 0; j < T::DI; ++j) put4<GLOBAL>(p + j * stride, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
  put4<GLOBAL>(p + T::DI * stride, make_float4(sm.max[0], sm.max[1], sm.sum[0], sm.sum[1]));
}

// Fold another partial result of the same query rows (as softmax_store left it) into this one:
// both rescaled to the larger maximum, then added.
template <class T, bool GLOBAL>
__device__ __forceinline__ void softmax_merge(float (&acc)[T::DI][4], SoftmaxRows& sm, const float4* p, int stride) {
  const float4 st = get4<GLOBAL>(p + T::DI * stride);
  const float other_max[2] = {st.x, st.y}, other_sum[2] = {st.z, st.w};
  float mine[2], theirs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx = fmaxf(sm.max[h], other_max[h]);
    const float b = mx == neg_inf() ? 0.f : mx;  // both saw no key yet: stay at zero
    mine[h] = fast_exp2(sm.max[h] - b);
    theirs[h] = fast_exp2(other_max[h] - b);
    sm.max[h] = mx;
    sm.sum[h] = sm.sum[h] * mine[h] + other_sum[h] * theirs[h];
  }
#pragma unroll
  for (int j = 0; j < T::DI; ++j) {
    const float4 v = get4<GLOBAL>(p + j * stride);
    acc[j][0] = acc[j][0] * mine[0] + v.x * theirs[0];
    acc[j][1] = acc[j][1] * mine[0] + v.y * theirs[0];
    acc[j][2] = acc[j][2] * mine[1] + v.z * theirs[1];
    acc[j][3] = acc[j][3] * mine[1] + v.w * theirs[1];
  }
}

// The warps of a row hand their partial results to its first warp through shared memory (free
// by then: the ring is no longer read); on return the first warp holds the row's merged result
// and the memory may be reused.
template <class T>
__device__ __forceinline__ void merge_row_warps(float (&acc)[T::DI][4], SoftmaxRows& sm, half_t* smem) {
  float4* buf = reinterpret_cast<float4*>(smem);
  constexpr int PER = (T::DI + 1) * 32;  // float4s per warp
  const int wrow = T::row(), lane = threadIdx.x % 32;
  if (T::part() > 0) softmax_store<T, false>(acc, sm, buf + (wrow * (T::WN - 1) + T::part() - 1) * PER + lane, 32);
  __syncthreads();
  if (T::part() == 0)
    for (int w = 1; w < T::WN; ++w) softmax_merge<T, false>(acc, sm, buf + (wrow * (T::WN - 1) + w - 1) * PER + lane, 32);
  __syncthreads();
}

// Where key `key` of KV head `kvh` lives: the cache (CROWS rows per KV head and part) for keys
// before cache_len, the QKV projection's output for the new tokens after it; `part` 0 = keys, 1 =
// values. ok is false past `last_key`, the tile's last query's own: those rows read as zeros,
// since under tile synchronization the producer may not have written them (and a masked score's
// zero weight times NaN is NaN).
template <int CROWS, int QKVW, int D>
__device__ __forceinline__ const half_t* kv_row(const half_t* qkv, const half_t* cache, int kvh, int kv_col,
                                                int part, int key, int last_key, int cache_len, bool& ok) {
  ok = key <= last_key;
  if (!ok) return qkv;
  if (key < cache_len) return cache + ((size_t)(kvh * 2 + part) * CROWS + key) * D;
  return qkv + (size_t)(key - cache_len) * QKVW + kv_col + part * D;
}

// The token of query row r of a tile whose first token is m0.
template <class T>
__device__ __forceinline__ int row_token(int m0, int r) { return m0 + r / T::P; }

// The tile's partial result: O unnormalized (acc) and its rows' softmax state, held by the first
// warp of each warp row (T::part() == 0) on return. Chunks past the tile's last query are skipped
// (causal), so a split may compute nothing: max = -inf, sum = 0. `wait(kc, first)` runs in every
// thread before chunk kc's keys and values (and, on the first, the queries) are copied.
// `cache_len`: the cached tokens of this run, CACHE where it is compiled in, else read at run time
// (at most CACHE, the room the kernel was compiled for).
template <class T, int TOKENS, int CACHE, int CROWS, int HEADS, int G, class Wait>
__device__ __forceinline__ void attention_mainloop(float (&acc)[T::DI][4], SoftmaxRows& sm,
                                                   const half_t* __restrict__ qkv, const half_t* __restrict__ cache,
                                                   int m0, int n, int kc_begin, int kc_end, half_t* smem,
                                                   Wait wait, float scale_log2, int cache_len) {
  constexpr int D = T::D, QKVW = (HEADS + 2 * (HEADS / G)) * D, GROUP_W = (G + 2) * D;
  constexpr int CPR = D / 8;  // 16-byte pieces per row
  static_assert(G % T::P == 0, "a tile's heads share one KV head");
  const int head0 = n * T::P, kvh = head0 / G;
  const int q_col = kvh * GROUP_W + (head0 % G) * D, kv_col = kvh * GROUP_W + G * D;
  const int lane = threadIdx.x % 32, wrow = T::row(), wkeys = T::part() * T::KW;
  const int last_key = cache_len + min(m0 + T::BM, TOKENS) - 1;
  kc_end = min(kc_end, last_key / T::BK + 1);
  const int nk = kc_end - kc_begin;

  softmax_clear<T>(acc, sm);
  if (nk <= 0) return;

  half_t* sQ = smem;
  half_t* sK = smem + T::Q_ELEMS;
  half_t* sV = sK + T::STAGES * T::KV_ELEMS;

  // Chunk it's keys and values: all its rows, or those from the cache, or those of the new
  // tokens (the producer's).
  enum Rows { ALL_ROWS, CACHE_ROWS, NEW_ROWS };
  auto copy_kv = [&](int it, Rows rows) {
    const int kc = kc_begin + it, slot = it % T::STAGES;
    for (int i = threadIdx.x; i < 2 * T::BK * CPR; i += T::THREADS) {
      const int part = i / (T::BK * CPR), r = i / CPR % T::BK, c = (i % CPR) * 8, key = kc * T::BK + r;
      if (rows != ALL_ROWS && (key < cache_len) != (rows == CACHE_ROWS)) continue;
      bool ok;
      const half_t* src = kv_row<CROWS, QKVW, D>(qkv, cache, kvh, kv_col, part, key, last_key, cache_len, ok);
      cp_async16((part ? sV : sK) + slot * T::KV_ELEMS + r * T::LDS + c, ok ? src + c : src, ok);
    }
  };
  // The cache depends on no stage: the prologue's chunks copy their cache rows before any wait
  // (into the first group, which the first chunk waits for anyway), so under tile-level sync or a
  // dependent launch they stream in while the QKV projection still runs.
  constexpr int PRO = T::STAGES - 1;
  if constexpr (CACHE > 0)
    for (int it = 0; it < PRO && it < nk; ++it) copy_kv(it, CACHE_ROWS);
  auto issue = [&](int it) {
    if (it < nk) {
      const int kc = kc_begin + it;
      wait(kc, it == 0);
      if (it == 0) {
        for (int i = threadIdx.x; i < T::ROWS * CPR; i += T::THREADS) {
          const int r = i / CPR, c = (r % T::P) * D + (i % CPR) * 8, tok = row_token<T>(m0, r);
          // Rows past the last token read as zeros: their scores stay finite and are never stored.
          cp_async16(sQ + r * T::LDS + (i % CPR) * 8, qkv + (size_t)min(tok, TOKENS - 1) * QKVW + q_col + c,
                     tok < TOKENS);
        }
      }
      copy_kv(it, CACHE > 0 && it < PRO ? NEW_ROWS : ALL_ROWS);  // one pass where nothing was copied ahead
    }
    cp_async_commit();  // an empty group past the end keeps the wait_group count uniform
  };

#pragma unroll
  for (int it = 0; it < PRO; ++it) issue(it);

  u32 qf[T::DK][4];
  // The tokens of this thread's two query rows (lane / 4 and 8 further): what the mask compares.
  const int q_tok[2] = {row_token<T>(m0, wrow * 16 + lane / 4), row_token<T>(m0, wrow * 16 + lane / 4 + 8)};
  for (int it = 0; it < nk; ++it) {
    cp_async_wait<T::STAGES - 2>();
    __syncthreads();
    // The slot refilled next was last read in iteration it-1, which every thread has left.
    issue(it + T::STAGES - 1);
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < T::DK; ++kk)
        ldmatrix_x4(qf[kk], sQ + (wrow * 16 + lane % 16) * T::LDS + kk * 16 + (lane / 16) * 8);
    }
    const half_t* k_s = sK + (it % T::STAGES) * T::KV_ELEMS + wkeys * T::LDS;
    const half_t* v_s = sV + (it % T::STAGES) * T::KV_ELEMS + wkeys * T::LDS;
    const int key0 = (kc_begin + it) * T::BK + wkeys;

    float s[T::SJ][4];
#pragma unroll
    for (int j = 0; j < T::SJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < T::DK; ++kk) {
#pragma unroll
      for (int j = 0; j < T::SJ; j += 2) {
        u32 r[4];
        ldmatrix_x4(r, k_s + (j * 8 + (lane / 16) * 8 + lane % 8) * T::LDS + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816(s[j], qf[kk], r[0], r[1]);
        mma16816(s[j + 1], qf[kk], r[2], r[3]);
      }
    }

    // Scale, mask (a query sees keys up to its own position), and the rows' new maxima.
    float mx[2] = {sm.max[0], sm.max[1]};
#pragma unroll
    for (int j = 0; j < T::SJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + j * 8 + (lane % 4) * 2 + (e & 1);
        s[j][e] = key <= cache_len + q_tok[e >= 2] ? s[j][e] * scale_log2 : neg_inf();
        mx[e >= 2] = fmaxf(mx[e >= 2], s[j][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the four lanes of a quad share a row
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    float base[2], corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      base[h] = mx[h] == neg_inf() ? 0.f : mx[h];  // a row with every key masked so far stays at zero
      corr[h] = fast_exp2(sm.max[h] - base[h]);    // exp2(-inf) = 0 on the first chunk
      sm.max[h] = mx[h];
      sm.sum[h] *= corr[h];
    }
#pragma unroll
    for (int j = 0; j < T::DI; ++j) {
      acc[j][0] *= corr[0]; acc[j][1] *= corr[0];
      acc[j][2] *= corr[1]; acc[j][3] *= corr[1];
    }
#pragma unroll
    for (int j = 0; j < T::SJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - base[e >= 2]);
        sm.sum[e >= 2] += s[j][e];
      }

    // O += P V: two score fragments (16 keys) make one A operand; V through ldmatrix.trans.
#pragma unroll
    for (int t = 0; t < T::KW / 16; ++t) {
      const u32 pa[4] = {pack2(s[2 * t][0], s[2 * t][1]), pack2(s[2 * t][2], s[2 * t][3]),
                         pack2(s[2 * t + 1][0], s[2 * t + 1][1]), pack2(s[2 * t + 1][2], s[2 * t + 1][3])};
#pragma unroll
      for (int j = 0; j < T::DI; j += 2) {
        u32 r[4];
        ldmatrix_x4_trans(r, v_s + (t * 16 + ((lane / 8) % 2) * 8 + lane % 8) * T::LDS + (j + lane / 16) * 8);
        mma16816(acc[j], pa, r[0], r[1]);
        mma16816(acc[j + 1], pa, r[2], r[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free from here
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the row sums over the quad
    sm.sum[h] += __shfl_xor_sync(0xffffffffu, sm.sum[h], 1);
    sm.sum[h] += __shfl_xor_sync(0xffffffffu, sm.sum[h], 2);
  }
  if constexpr (T::WN > 1) merge_row_warps<T>(acc, sm, smem);
}

// Split-KV, the split that arrives last: fold the other splits' partial results into its own.
// A split's partials are its holders' fragments, then their softmax state (coalesced). The WN
// warps of a row share the splits (each merge waits on a round trip to L2, so one warp merging
// them all would wait S - 1 times), then merge their results through shared memory.
template <class T, int S>
__device__ __forceinline__ void attention_combine(float (&acc)[T::DI][4], SoftmaxRows& sm, const float4* part, int s,
                                                  half_t* smem) {
  // A warp past the row's first starts from nothing: its share of this split's keys is in the first already.
  if (T::part() != 0) softmax_clear<T>(acc, sm);
#pragma unroll 1
  for (int s2 = T::part(); s2 < S; s2 += T::WN)
    if (s2 != s) softmax_merge<T, true>(acc, sm, part + (size_t)s2 * (T::DI + 1) * T::HOLDERS + T::slot(), T::HOLDERS);
  if constexpr (T::WN > 1) merge_row_warps<T>(acc, sm, smem);
}

template <class T>
__device__ __forceinline__ void attention_store_partial(const float (&acc)[T::DI][4], const SoftmaxRows& sm,
                                                        float4* part, int s) {
  if (T::part() == 0) softmax_store<T, true>(acc, sm, part + (size_t)s * (T::DI + 1) * T::HOLDERS + T::slot(), T::HOLDERS);
}

// O / sum, stored as fp16 into out[token, head * D + col] for the tile's tokens.
template <class T, int TOKENS, int HEADS>
__device__ __forceinline__ void attention_store(const float (&acc)[T::DI][4], const SoftmaxRows& sm,
                                                half_t* __restrict__ out, int m0, int n) {
  if (T::part() != 0) return;
  const int lane = threadIdx.x % 32;
  const float inv[2] = {sm.sum[0] > 0.f ? 1.f / sm.sum[0] : 0.f, sm.sum[1] > 0.f ? 1.f / sm.sum[1] : 0.f};
#pragma unroll
  for (int j = 0; j < T::DI; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = T::row() * 16 + lane / 4 + h * 8, tok = row_token<T>(m0, r);
      const int col = (n * T::P + r % T::P) * T::D + j * 8 + (lane % 4) * 2;
      if (tok < TOKENS)
        *reinterpret_cast<u32*>(out + (size_t)tok * HEADS * T::D + col) =
            pack2(acc[j][2 * h] * inv[h], acc[j][2 * h + 1] * inv[h]);
    }
}

// The cache append (AttentionStage.append): the first tile of each KV head's group writes its
// tokens' new keys and values from the QKV projection's output into the cache's rows cache_len on,
// once the tile has read them (its waits, every split's, cover them), 16 bytes a thread a step,
// read through L2 (another block of this launch wrote them). Attention reads only the rows before
// cache_len, so no tile of this run reads what it writes (the next run, after it, reads them).
template <class T, int TOKENS, int CROWS, int HEADS, int G>
__device__ __forceinline__ void append_kv(const half_t* __restrict__ qkv, half_t* cache, int m0, int n, int cache_len) {
  constexpr int D = T::D, QKVW = (HEADS + 2 * (HEADS / G)) * D, CPR = D / 8;
  const int head0 = n * T::P, kvh = head0 / G, kv_col = kvh * (G + 2) * D + G * D;
  if (head0 % G) return;
  const int rows = min(m0 + T::BM, TOKENS) - m0;
  for (int i = threadIdx.x; i < rows * 2 * CPR; i += T::THREADS) {
    const int r = i / (2 * CPR), part = i / CPR % 2, c = (i % CPR) * 8, tok = m0 + r;
    u32 v[4];
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(qkv + (size_t)tok * QKVW + kv_col + part * D + c));
    *reinterpret_cast<uint4*>(cache + ((size_t)(kvh * 2 + part) * CROWS + cache_len + tok) * D + c) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}
