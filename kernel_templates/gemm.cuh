// One output tile of C[M,N] = epilogue(A[M,K] . B[N,K]^T) on tensor cores.
//
// fp16 operands, fp32 accumulation: mma.sync m16n8k16, fragments read from shared
// memory with ldmatrix, global->shared copies with cp.async in a ring of STAGES
// buffers. Shared rows are padded by 16 bytes, which puts the eight rows an
// ldmatrix phase reads in eight distinct bank groups (no conflicts, no swizzle).
// Any M and N (rows and columns past the edge are zero-filled and not stored);
// K must be a multiple of 8 so that a 16-byte chunk is either inside or outside.
#pragma once

typedef unsigned short half_t;  // fp16 bits; no cuda_fp16.h so NVRTC needs no include path

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  // src-size 0 zero-fills the 16 bytes: the edge of the matrix reads as zeros.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ half_t f2h(float x) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ u32 pack2(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }
__device__ __forceinline__ float h2f(half_t h) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
  return x;
}
// A half of global memory, read through L2 (ld.cg: never a stale L1 line of data another block wrote).
__device__ __forceinline__ float ldcg_h2f(const half_t* p) {
  half_t h;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(h) : "l"(p));
  return h2f(h);
}

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// GeLU, tanh approximation (as in GPT-3).
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanh_approx(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }

template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int THREADS = WM * WN * 32;
  static constexpr int MMA_THREADS = THREADS;  // threads that hold accumulators
  static constexpr int LDS = BK + 8;  // halves per shared row: 16 bytes of padding
  static constexpr int A_ELEMS = BM * LDS, B_ELEMS = BN * LDS;
  static constexpr int SMEM_BYTES = STAGES * (A_ELEMS + B_ELEMS) * 2;
  static constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  static constexpr int MI = WTM / 16, NI = WTN / 8;
  static constexpr int CPR = BK / 8;  // 16-byte chunks per row
  static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0, "warp tile must be a multiple of 16x16");
  static_assert(BK % 16 == 0, "BK must be a multiple of 16");
  static_assert(STAGES >= 2, "at least two pipeline stages");
  // Where this thread's warp tile starts inside the block tile.
  __device__ static int warp_row0() { return (threadIdx.x / 32 / WN) * WTM; }
  __device__ static int warp_col0() { return (threadIdx.x / 32 % WN) * WTN; }
};

// An operand as the loads see it. A copy of the 8 halves at (row, k..k+7) is cut in three parts,
// each computed where it changes: `row(r, live)` once per tile for each row a thread copies (a row
// past the matrix's, `live` false, only feeds outputs that are never stored: it reads as zeros),
// `slab(k0)` once per K chunk, and `at(row, slab, c, ok)` per copy of the columns k0 + c.. (ok
// false where the 8 halves read as zeros). A K-contiguous matrix is the GEMM's view; a stage kind
// with another index map (an implicit-GEMM convolution) brings its own.
struct RowMajor {
  const half_t* p;
  int K;
  struct Row { const half_t* p; };  // nullptr past the matrix's rows
  struct Slab { int k0; };
  __device__ __forceinline__ Row row(int r, bool live) const { return {live ? p + (size_t)r * K : nullptr}; }
  __device__ __forceinline__ Slab slab(int k0) const { return {k0}; }
  // A chunk past K must read as zeros because it meets valid rows of the other operand.
  __device__ __forceinline__ const half_t* at(const Row& row, const Slab& sl, int c, bool& ok) const {
    ok = row.p && sl.k0 + c < K;
    return ok ? row.p + sl.k0 + c : p;
  }
};
__device__ __forceinline__ RowMajor operand(const half_t* p, int K) { return RowMajor{p, K}; }
template <class V>
__device__ __forceinline__ const V& operand(const V& v, int) { return v; }

// The rows of a BROWS x BK slab whose 16-byte pieces this thread copies, the same for every K
// chunk: the thread always copies column (tid % CPR) * 8, of rows tid / CPR + j * STEP, so the
// view's state of those rows is computed once per tile and kept in registers (KEEP). A thread
// that copies many rows (few threads, a tall slab) works them out per slot instead: kept, they
// would spill (a one-warp tile of 16x192 reached 255 registers keeping 8).
template <class T, int BROWS, class V>
struct SlabRows {
  static constexpr int CPR = T::BK / 8, STEP = T::THREADS / CPR, N = (BROWS + STEP - 1) / STEP;
  static constexpr bool KEEP = N <= 8 && T::THREADS >= 128;
  static_assert(T::THREADS % CPR == 0, "every thread copies one column of 16 bytes");
  typename V::Row row[KEEP ? N : 1];
  int rows, r0;
  __device__ __forceinline__ SlabRows(const V& v, int rows_, int r0_) : rows(rows_), r0(r0_) {
    if constexpr (KEEP) {
#pragma unroll
      for (int j = 0; j < N; ++j) row[j] = make(v, j);
    }
  }
  __device__ __forceinline__ typename V::Row make(const V& v, int j) const {
    const int r = first() + j * STEP;
    return v.row(r0 + r, r < BROWS && r0 + r < rows);
  }
  // Piece j's row state.
  __device__ __forceinline__ typename V::Row get(const V& v, int j) const {
    if constexpr (KEEP) return row[j];
    else return make(v, j);
  }
  __device__ static int first() { return threadIdx.x / CPR; }
  __device__ static int column() { return (threadIdx.x % CPR) * 8; }
  // Whether piece j lies inside the slab (the last rows of a thread may not).
  __device__ static bool inside(int j) { return BROWS % STEP == 0 || first() + j * STEP < BROWS; }
};
template <class T, int BROWS, class V>
__device__ __forceinline__ SlabRows<T, BROWS, V> slab_rows(const V& v, int rows, int r0) {
  return SlabRows<T, BROWS, V>(v, rows, r0);
}

// Each piece j < N of a thread's share of a slab, in straight code where its rows are kept, in a
// loop of 4 pieces a pass where they are worked out per slot (unrolled, many would spill, as the
// copy loops before these views did not).
template <class R, class F>
__device__ __forceinline__ void for_each_piece(F f) {
  if constexpr (R::KEEP) {
#pragma unroll
    for (int j = 0; j < R::N; ++j) f(j);
  } else {
#pragma unroll 4
    for (int j = 0; j < R::N; ++j) f(j);
  }
}

// Copy a BROWS x BK slab of an operand (rows r0.., columns k0..) into shared memory.
template <class T, int BROWS, class V>
__device__ __forceinline__ void load_slab(half_t* s, const V& v, const SlabRows<T, BROWS, V>& rows, int k0) {
  using R = SlabRows<T, BROWS, V>;
  const auto sl = v.slab(k0);
  const int c = R::column();
  for_each_piece<R>([&](int j) {
    if (!R::inside(j)) return;
    bool ok;
    const half_t* src = v.at(rows.get(v, j), sl, c, ok);
    cp_async16(s + (R::first() + j * R::STEP) * T::LDS + c, src, ok);
  });
}

// Accumulate chunks [kc_begin, kc_end) of the reduction into acc. Before the A operand of
// chunk kc is copied, `wait(kc, first)` runs in every thread (it may block on producer tiles);
// the B operand (weights) of that chunk is already in flight by then.
template <class T, class AOp, class Wait>
__device__ __forceinline__ void mainloop(float (&acc)[T::MI][T::NI][4], const AOp& A_,
                                         const half_t* __restrict__ B, int M, int N, int K, int m0, int n0,
                                         int kc_begin, int kc_end, half_t* smem, Wait wait) {
  const auto A = operand(A_, K);
  const RowMajor Bv{B, K};
  const auto rowsA = slab_rows<T, T::BM>(A, M, m0);
  const auto rowsB = slab_rows<T, T::BN>(Bv, N, n0);
  half_t* sA = smem;
  half_t* sB = smem + T::STAGES * T::A_ELEMS;
  const int lane = threadIdx.x % 32;
  const int wm0 = T::warp_row0(), wn0 = T::warp_col0();

#pragma unroll
  for (int i = 0; i < T::MI; ++i)
#pragma unroll
    for (int j = 0; j < T::NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

  const int nk = kc_end - kc_begin;
  auto issue = [&](int it) {
    if (it < nk) {
      const int kc = kc_begin + it, slot = it % T::STAGES;
      load_slab<T, T::BN>(sB + slot * T::B_ELEMS, Bv, rowsB, kc * T::BK);
      wait(kc, it == 0);
      load_slab<T, T::BM>(sA + slot * T::A_ELEMS, A, rowsA, kc * T::BK);
    }
    cp_async_commit();  // an empty group past the end keeps the wait_group count uniform
  };

#pragma unroll
  for (int it = 0; it < T::STAGES - 1; ++it) issue(it);

  for (int it = 0; it < nk; ++it) {
    cp_async_wait<T::STAGES - 2>();
    __syncthreads();
    // The slot refilled next was last read in iteration it-1, which every thread has left.
    issue(it + T::STAGES - 1);
    const half_t* a = sA + (it % T::STAGES) * T::A_ELEMS;
    const half_t* b = sB + (it % T::STAGES) * T::B_ELEMS;
#pragma unroll
    for (int kk = 0; kk < T::BK; kk += 16) {
      u32 af[T::MI][4];
      u32 bf[T::NI][2];
#pragma unroll
      for (int i = 0; i < T::MI; ++i)
        ldmatrix_x4(af[i], a + (wm0 + i * 16 + lane % 16) * T::LDS + kk + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < T::NI; j += 2) {
        u32 r[4];
        ldmatrix_x4(r, b + (wn0 + j * 8 + (lane / 16) * 8 + lane % 8) * T::LDS + kk + ((lane / 8) % 2) * 8);
        bf[j][0] = r[0]; bf[j][1] = r[1]; bf[j + 1][0] = r[2]; bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < T::MI; ++i)
#pragma unroll
        for (int j = 0; j < T::NI; ++j) mma16816(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the shared ring may be reused by the caller (next tile, fused launch)
}

// Visit every accumulator pair owned by this thread: f(i, j, e, row, col) with e in {0, 2}
// naming acc[i][j][e], acc[i][j][e+1] at (row, col), (row, col+1).
template <class T, class F>
__device__ __forceinline__ void for_each_pair(int m0, int n0, F f) {
  if (threadIdx.x >= T::MMA_THREADS) return;  // a producer warp holds no accumulators
  const int lane = threadIdx.x % 32;
  const int wm0 = T::warp_row0(), wn0 = T::warp_col0();
#pragma unroll
  for (int i = 0; i < T::MI; ++i)
#pragma unroll
    for (int j = 0; j < T::NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        f(i, j, e, m0 + wm0 + i * 16 + lane / 4 + (e ? 8 : 0), n0 + wn0 + j * 8 + (lane % 4) * 2);
}

// A tile's partial sums (a split of split-K, a part of a tile of a persistent stage's split last wave) leave for slot `s`
// of the workspace `part` in their own threads' fragment order: whole float4s consecutive across
// threads, so every store (and split_reduce's every load) is coalesced.
template <class T>
__device__ __forceinline__ void store_partial(const float (&acc)[T::MI][T::NI][4], float4* part, size_t s) {
  constexpr int FR = T::MI * T::NI;  // float4 fragments per thread
  const int tid = threadIdx.x;
  if (tid >= T::MMA_THREADS) return;  // a producer warp holds no accumulators
#pragma unroll
  for (int i = 0; i < T::MI; ++i)
#pragma unroll
    for (int j = 0; j < T::NI; ++j)
      __stcg(part + (s * FR + i * T::NI + j) * T::MMA_THREADS + tid,
             make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
}

// The part of a tile that arrives last (meet_parts): add the partial sums of every slot but `s` into
// acc. Each slot's partials are contiguous, in fragment order (store_partial), so these loads are
// coalesced.
template <class T, int S>
__device__ __forceinline__ void split_reduce(float (&acc)[T::MI][T::NI][4], const float4* part, int s) {
  constexpr int FR = T::MI * T::NI;
  const int tid = threadIdx.x;
  if (tid >= T::MMA_THREADS) return;
#pragma unroll 1
  for (int s2 = 0; s2 < S; ++s2) {
    if (s2 == s) continue;
#pragma unroll
    for (int i = 0; i < T::MI; ++i) {
#pragma unroll
      for (int j = 0; j < T::NI; ++j) {
        const float4 v = __ldcg(part + ((size_t)s2 * FR + i * T::NI + j) * T::MMA_THREADS + tid);
        acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
        if (j % 4 == 3) __syncwarp();  // 4 loads in flight at a time (ptxas keeps loads behind it): no spills
      }
    }
  }
}

// The S parts of one tile (split-K's splits; the two parts of a tile of a split last wave) meet
// after their MMAs. Each takes an arrival number; every part but the last stores its partial sums
// in slot `slot` of `part` (store_partial: coalesced, the tail ran ~4x faster than by output
// element) and posts on `written`; the last waits for those posts and adds every slot but `own`
// into its own sums, which nobody would read and so never leave its registers. A split-K split
// stores in its own slot (slot = own = s); a tile of two parts needs one slot, which the first to
// arrive fills (slot 0, own 1). It waits only on parts that have arrived, so are running: no
// deadlock. Returns whether this part stores the tile. MMA_ONLY: the MMA warps alone take part
// (their named barrier, the wait inlined), where the producer has left or moved on
// (render._after_mainloop). `arrive`, `written`: the tile's counters, raised S and S - 1 times a run.
template <class T, int S, bool MMA_ONLY>
__device__ __forceinline__ bool meet_parts(float (&acc)[T::MI][T::NI][4], float4* part, int slot, int own,
                                           u32* arrive, u32* written, u32 epoch, u32* err) {
  auto bar = [] {
    if constexpr (MMA_ONLY) tuner_bar_sync(T::MMA_THREADS);
    else __syncthreads();
  };
  __shared__ u32 arrival;
  if (threadIdx.x == 0) arrival = atomicAdd(arrive, 1u) - (epoch - 1u) * (u32)S;
  bar();
  if (arrival + 1u < (u32)S) {  // every thread reads it before the barrier below, so before it changes
    store_partial<T>(acc, part, slot);
    bar();
    tuner_signal(written);
    return false;
  }
  if (threadIdx.x == 0) {
    if constexpr (MMA_ONLY) tuner_spin_until_inline(written, epoch * (u32)(S - 1), err);
    else tuner_spin_until(written, epoch * (u32)(S - 1), err);
  }
  bar();
  split_reduce<T, S>(acc, part, own);
  return true;
}

