/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * ResidualScoreAttention (RealFormer): flash-style attention that also writes the running score sum.
 *
 * Two kernels, both flash-style (online softmax over key tiles, probabilities never in global memory,
 * float32 running max, sum and output accumulator), both writing the float32 score tile
 * scale * Q K^T + prev to `scores` as they go (the only [Tq, Tk] traffic, streamed with __ldcs/__stcs so
 * that it does not evict K and V from L2):
 *
 * - float16 / bfloat16 (tensorCoreKernel): 128 threads = 4 warps own one (b, h) and 64 queries (16 per
 *   warp) and walk the keys in tiles of 64. Q, K and V stay in their own type in shared memory (K and V
 *   double-buffered, fetched with cp.async); S = Q K^T and O += P V run on tensor cores
 *   (mma.sync.m16n8k16, float32 accumulate; V fragments via ldmatrix.trans). Products of the stored
 *   16-bit values are exact in float32, so `scores` keeps float32 accuracy; only P is rounded to T for the
 *   second product (standard flash-attention practice). The thread holding an accumulator element reads
 *   prev_scores for it one key tile ahead (latency hidden behind a tile of work), adds it, writes the
 *   pair of scores, turns them into logits and updates the softmax row state shared by its quad.
 * - float32 (simtKernel): float32 FMAs (TF32 would break the float32 bars). One block of 256 threads owns
 *   one (b, h) and 64 queries and walks the keys in tiles of BN (64 for head sizes <= 64, else 32): K and
 *   V tiles in shared memory, the 64 x BN score tile by FMAs. Thread (ty, tx) = (tid / 16, tid % 16) owns
 *   query rows ty + 16 i (i < 4), key columns tx + 16 j (j < BN / 16) and output columns
 *   64 c + 4 tx .. + 3 (c < DVP / 64); a row's reductions stay inside one 16-lane half warp (shuffles).
 *   Its prev_scores elements are fetched one key tile ahead.
 *
 * Head sizes are padded with zeros to the next of 64 / 128 (DHP for q, k; DVP for v), so any dh, dv in
 * 1..128 is exact.
 */
#include "residualScoreAttentionKernel.h"
#include "common/attnresCudaConvert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cmath>
#include <cstdint>

namespace
{

constexpr int kBM = 64; // query rows per block (both kernels)

using attnres::fromFloat;

struct Params
{
    void const* q;
    void const* k;
    void const* v;
    float const* prev;  // may alias scores
    float const* mask;
    int64_t maskStrideB;
    int64_t maskStrideH;
    int64_t maskStrideQ;
    int64_t maskStrideK;
    int32_t B;
    int32_t H;
    int32_t Tq;
    int32_t Tk;
    int32_t dh;
    int32_t dv;
    int32_t mTiles;
    float scale;
    float divisor;
    void* out;
    float* scores;
    bool qVec;     // q rows can be fetched in 16-byte chunks (dh * size % 16 == 0, aligned base)
    bool kVec;     // likewise k
    bool vVec;     // likewise v
    bool pairVec;  // Tk even and scores / prev 8-byte aligned: score pairs move as float2
};

// ---------------------------------------------------------------------------------------------------------
// float32: SIMT kernel.
// ---------------------------------------------------------------------------------------------------------

constexpr int kSimtThreads = 256;
constexpr int kRows = kBM / 16; // query rows per thread
constexpr int kPad = 4;         // floats of padding per shared row of Q and K (keeps float4 alignment)

template <int DHP, int DVP>
struct SimtTiling
{
    static constexpr int BN = (DHP <= 64 && DVP <= 64) ? 64 : 32;
    static constexpr int QS = DHP + kPad; // row stride of Qs and Ks
    static constexpr int PS = BN + 1;     // row stride of Ps
    static constexpr size_t kSharedFloats
        = static_cast<size_t>(kBM) * QS + static_cast<size_t>(BN) * QS + static_cast<size_t>(BN) * DVP
        + static_cast<size_t>(kBM) * PS;
    static constexpr size_t kSharedBytes = kSharedFloats * sizeof(float);
};

//! Loads a [rows, cols] tile of a row-major [*, ld] float32 matrix, zero outside (validRows, ld).
template <int COLS>
__device__ __forceinline__ void loadTileF32(
    float* dst, int dstStride, float const* src, int rows, int validRows, int ld, int tid)
{
    for (int idx = tid; idx < rows * COLS; idx += kSimtThreads)
    {
        int const r = idx / COLS;
        int const c = idx - r * COLS;
        float x = 0.F;
        if (r < validRows && c < ld)
        {
            x = src[static_cast<int64_t>(r) * ld + c];
        }
        dst[r * dstStride + c] = x;
    }
}

//! This thread's prev_scores of the key tile at n0: rows row0 + 16 i, columns n0 + tx + 16 j (zeros outside).
template <int J>
__device__ __forceinline__ void loadPrevTileSimt(float (&prev)[kRows][J], float const* prevScores, int64_t scoreBase,
    int row0, int Tq, int Tk, int n0, int tx)
{
#pragma unroll
    for (int i = 0; i < kRows; ++i)
    {
        int const row = row0 + 16 * i;
        int64_t const rowOffset = scoreBase + static_cast<int64_t>(row) * Tk;
#pragma unroll
        for (int j = 0; j < J; ++j)
        {
            int const col = n0 + tx + 16 * j;
            prev[i][j] = (prevScores != nullptr && row < Tq && col < Tk) ? __ldcs(prevScores + rowOffset + col) : 0.F;
        }
    }
}

template <int DHP, int DVP>
__global__ void __launch_bounds__(kSimtThreads, 1) simtKernel(Params const p)
{
    using Tile = SimtTiling<DHP, DVP>;
    constexpr int BN = Tile::BN;
    constexpr int J = BN / 16;   // key columns per thread
    constexpr int CV = DVP / 64; // float4 groups of output columns per thread
    constexpr int QS = Tile::QS;
    constexpr int PS = Tile::PS;
    float const kNegInf = -CUDART_INF_F;

    extern __shared__ float4 sharedRaw[];
    float* const Qs = reinterpret_cast<float*>(sharedRaw); // [kBM][QS]
    float* const Ks = Qs + kBM * QS;                       // [BN][QS]
    float* const Vs = Ks + BN * QS;                        // [BN][DVP]
    float* const Ps = Vs + BN * DVP;                       // [kBM][PS]

    int const tid = static_cast<int>(threadIdx.x);
    int const tx = tid & 15;
    int const ty = tid >> 4;
    int64_t const block = blockIdx.x;
    int const mTile = static_cast<int>(block % p.mTiles);
    int64_t const bh = block / p.mTiles;
    int64_t const h = bh % p.H;
    int64_t const b = bh / p.H;
    int const m0 = mTile * kBM;
    int const Tq = p.Tq;
    int const Tk = p.Tk;

    float const* const q = static_cast<float const*>(p.q) + (bh * Tq + m0) * p.dh;
    float const* const k = static_cast<float const*>(p.k) + bh * Tk * p.dh;
    float const* const v = static_cast<float const*>(p.v) + bh * Tk * p.dv;
    int64_t const scoreBase = bh * Tq * Tk;
    float const* const mask
        = p.mask != nullptr ? p.mask + b * p.maskStrideB + h * p.maskStrideH : nullptr;

    loadTileF32<DHP>(Qs, QS, q, kBM, Tq - m0, p.dh, tid);

    float rowMax[kRows];
    float rowSum[kRows];
    float acc[kRows][CV][4];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
    {
        rowMax[i] = kNegInf;
        rowSum[i] = 0.F;
#pragma unroll
        for (int c = 0; c < CV; ++c)
        {
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                acc[i][c][e] = 0.F;
            }
        }
    }
    int const dhRounded = (p.dh + 3) & ~3;

    // prev_scores of a tile is fetched one tile ahead, right after the previous one was used: its DRAM
    // latency hides behind a whole tile of FMAs and softmax, in the same registers.
    float prev[kRows][J];
    loadPrevTileSimt<J>(prev, p.prev, scoreBase, m0 + ty, Tq, Tk, 0, tx);

    for (int n0 = 0; n0 < Tk; n0 += BN)
    {
        __syncthreads(); // the previous tile's readers of Ks, Vs and Ps are done
        int const validKeys = Tk - n0;
        loadTileF32<DHP>(Ks, QS, k + static_cast<int64_t>(n0) * p.dh, BN, validKeys, p.dh, tid);
        loadTileF32<DVP>(Vs, DVP, v + static_cast<int64_t>(n0) * p.dv, BN, validKeys, p.dv, tid);
        __syncthreads();

        // S = Q K^T for this thread's kRows x J elements.
        float s[kRows][J];
#pragma unroll
        for (int i = 0; i < kRows; ++i)
        {
#pragma unroll
            for (int j = 0; j < J; ++j)
            {
                s[i][j] = 0.F;
            }
        }
#pragma unroll 2
        for (int d = 0; d < dhRounded; d += 4)
        {
            float4 qv[kRows];
            float4 kv[J];
#pragma unroll
            for (int i = 0; i < kRows; ++i)
            {
                qv[i] = *reinterpret_cast<float4 const*>(&Qs[(ty + 16 * i) * QS + d]);
            }
#pragma unroll
            for (int j = 0; j < J; ++j)
            {
                kv[j] = *reinterpret_cast<float4 const*>(&Ks[(tx + 16 * j) * QS + d]);
            }
#pragma unroll
            for (int i = 0; i < kRows; ++i)
            {
#pragma unroll
                for (int j = 0; j < J; ++j)
                {
                    s[i][j] = fmaf(qv[i].x, kv[j].x, s[i][j]);
                    s[i][j] = fmaf(qv[i].y, kv[j].y, s[i][j]);
                    s[i][j] = fmaf(qv[i].z, kv[j].z, s[i][j]);
                    s[i][j] = fmaf(qv[i].w, kv[j].w, s[i][j]);
                }
            }
        }

        // Running score sum out, logits in registers, online softmax, probabilities to shared memory.
#pragma unroll
        for (int i = 0; i < kRows; ++i)
        {
            int const row = m0 + ty + 16 * i;
            bool const rowValid = row < Tq;
            int64_t const rowOffset = scoreBase + static_cast<int64_t>(row) * Tk;
            float tileMax = kNegInf;
#pragma unroll
            for (int j = 0; j < J; ++j)
            {
                int const col = n0 + tx + 16 * j;
                float logit = kNegInf;
                if (col < Tk)
                {
                    float const score = s[i][j] * p.scale + prev[i][j];
                    if (rowValid)
                    {
                        __stcs(p.scores + rowOffset + col, score);
                    }
                    logit = score / p.divisor;
                    if (mask != nullptr && rowValid)
                    {
                        logit += mask[row * p.maskStrideQ + col * p.maskStrideK];
                    }
                }
                s[i][j] = logit;
                tileMax = fmaxf(tileMax, logit);
            }
#pragma unroll
            for (int offset = 8; offset > 0; offset >>= 1)
            {
                tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffU, tileMax, offset));
            }
            float const newMax = fmaxf(rowMax[i], tileMax);
            float const base = newMax == kNegInf ? 0.F : newMax; // an all -inf row so far stays at 0 weight
            float const correction = expf(rowMax[i] - base);
            float tileSum = 0.F;
#pragma unroll
            for (int j = 0; j < J; ++j)
            {
                float const prob = expf(s[i][j] - base);
                Ps[(ty + 16 * i) * PS + tx + 16 * j] = prob;
                tileSum += prob;
            }
#pragma unroll
            for (int offset = 8; offset > 0; offset >>= 1)
            {
                tileSum += __shfl_xor_sync(0xffffffffU, tileSum, offset);
            }
            rowSum[i] = rowSum[i] * correction + tileSum;
            rowMax[i] = newMax;
#pragma unroll
            for (int c = 0; c < CV; ++c)
            {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                {
                    acc[i][c][e] *= correction;
                }
            }
        }
        if (n0 + BN < Tk)
        {
            loadPrevTileSimt<J>(prev, p.prev, scoreBase, m0 + ty, Tq, Tk, n0 + BN, tx);
        }
        __syncthreads();

        // O += P V over this key tile (keys past Tk have P = 0 and V = 0).
        int const keys = validKeys < BN ? validKeys : BN;
#pragma unroll 2
        for (int n = 0; n < keys; ++n)
        {
            float prob[kRows];
#pragma unroll
            for (int i = 0; i < kRows; ++i)
            {
                prob[i] = Ps[(ty + 16 * i) * PS + n];
            }
#pragma unroll
            for (int c = 0; c < CV; ++c)
            {
                float4 const vv = *reinterpret_cast<float4 const*>(&Vs[n * DVP + 64 * c + 4 * tx]);
#pragma unroll
                for (int i = 0; i < kRows; ++i)
                {
                    acc[i][c][0] = fmaf(prob[i], vv.x, acc[i][c][0]);
                    acc[i][c][1] = fmaf(prob[i], vv.y, acc[i][c][1]);
                    acc[i][c][2] = fmaf(prob[i], vv.z, acc[i][c][2]);
                    acc[i][c][3] = fmaf(prob[i], vv.w, acc[i][c][3]);
                }
            }
        }
    }

    float* const out = static_cast<float*>(p.out) + (bh * Tq + m0) * p.dv;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
    {
        int const r = ty + 16 * i;
        if (m0 + r >= Tq)
        {
            continue;
        }
        float const inv = 1.F / rowSum[i];
#pragma unroll
        for (int c = 0; c < CV; ++c)
        {
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                int const col = 64 * c + 4 * tx + e;
                if (col < p.dv)
                {
                    out[static_cast<int64_t>(r) * p.dv + col] = acc[i][c][e] * inv;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// float16 / bfloat16: tensor-core kernel.
// ---------------------------------------------------------------------------------------------------------

constexpr int kTcThreads = 128; // 4 warps, 16 query rows each
constexpr int kTcBN = 64;       // keys per tile
constexpr int kTcNT = kTcBN / 8; // 8-key accumulator tiles per warp and key tile
constexpr int kTcPad = 8;       // 16-bit elements of padding per shared row (16 bytes: conflict-free fragments)

template <int DHP, int DVP>
struct TcTiling
{
    static constexpr int QS = DHP + kTcPad; // row stride of Qs and Ks, 16-bit elements
    static constexpr int VS = DVP + kTcPad; // row stride of Vs
    static constexpr size_t kSharedElements = static_cast<size_t>(kBM) * QS + 2 * static_cast<size_t>(kTcBN) * QS
        + 2 * static_cast<size_t>(kTcBN) * VS;
    static constexpr size_t kSharedBytes = kSharedElements * sizeof(uint16_t);
};

//! D += A B for one m16n8k16 tile, float32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(
    float (&d)[4], uint32_t const (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

//! Two floats rounded to T, the first in the low half (the lower column of an MMA operand pair).
template <typename T>
__device__ __forceinline__ uint32_t packPair(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t packPair<__half>(float lo, float hi)
{
    __half2 const h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t const*>(&h);
}
template <>
__device__ __forceinline__ uint32_t packPair<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 const h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t const*>(&h);
}

__device__ __forceinline__ uint32_t sharedAddress(void const* ptr)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

__device__ __forceinline__ uint32_t loadShared32(uint16_t const* ptr)
{
    return *reinterpret_cast<uint32_t const*>(ptr);
}

/*!
 * Loads a [ROWS, COLS] tile of a row-major [*, ld] matrix of 16-bit values (raw bits) into shared memory
 * (row stride `stride`), zero outside (validRows, ld). With `vec` (ld % 8 == 0, 16-byte aligned rows)
 * in-range chunks of 8 go through cp.async; the rest is stored directly. Either way the tile is complete
 * after cp.async.wait_group and a barrier.
 */
template <int ROWS, int COLS>
__device__ __forceinline__ void loadTile16(
    uint16_t* dst, int stride, uint16_t const* src, int validRows, int ld, bool vec, int tid)
{
    constexpr int kChunks = COLS / 8;
    for (int idx = tid; idx < ROWS * kChunks; idx += kTcThreads)
    {
        int const r = idx / kChunks;
        int const c = (idx - r * kChunks) * 8;
        uint16_t* const d = dst + r * stride + c;
        uint16_t const* const s = src + static_cast<int64_t>(r) * ld + c;
        bool const rowValid = r < validRows;
        if (vec && rowValid && c < ld)
        {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sharedAddress(d)), "l"(s) : "memory");
        }
        else
        {
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                uint32_t const lo = (rowValid && c + 2 * e < ld) ? s[2 * e] : 0U;
                uint32_t const hi = (rowValid && c + 2 * e + 1 < ld) ? s[2 * e + 1] : 0U;
                w[e] = lo | (hi << 16);
            }
            *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cpAsyncWaitAll()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

//! Reads prev_scores (row base `rowPtr`) at columns col, col + 1 (zero past Tk).
__device__ __forceinline__ float2 loadScorePair(float const* rowPtr, int col, int Tk, bool pairVec)
{
    float2 r = make_float2(0.F, 0.F);
    if (pairVec && col < Tk) // Tk even and col even: col + 1 < Tk too
    {
        r = __ldcs(reinterpret_cast<float2 const*>(rowPtr + col));
    }
    else
    {
        if (col < Tk)
        {
            r.x = __ldcs(rowPtr + col);
        }
        if (col + 1 < Tk)
        {
            r.y = __ldcs(rowPtr + col + 1);
        }
    }
    return r;
}

//! Writes scores (row base `rowPtr`) at columns col, col + 1 (nothing past Tk).
__device__ __forceinline__ void storeScorePair(float* rowPtr, int col, int Tk, bool pairVec, float x, float y)
{
    if (pairVec && col < Tk)
    {
        __stcs(reinterpret_cast<float2*>(rowPtr + col), make_float2(x, y));
    }
    else
    {
        if (col < Tk)
        {
            __stcs(rowPtr + col, x);
        }
        if (col + 1 < Tk)
        {
            __stcs(rowPtr + col + 1, y);
        }
    }
}

//! This thread's prev_scores pairs of the key tile at n0 (zeros without prev_scores, past Tq or past Tk).
__device__ __forceinline__ void loadPrevTile(float2 (&prev)[kTcNT][2], float const* const (&prevRow)[2],
    bool const (&rowValid)[2], int n0, int t, int Tk, bool pairVec)
{
#pragma unroll
    for (int nt = 0; nt < kTcNT; ++nt)
    {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
        {
            prev[nt][hr] = (prevRow[hr] != nullptr && rowValid[hr])
                ? loadScorePair(prevRow[hr], n0 + nt * 8 + 2 * t, Tk, pairVec)
                : make_float2(0.F, 0.F);
        }
    }
}

/*
 * MMA fragment layout (m16n8k16, lane = 4 g + t): accumulator element e of an 8-column tile is row
 * g + 8 (e / 2), column 2 t + e % 2. A register a[i] holds row g + 8 (i % 2), columns 2 t + 8 (i / 2) + {0, 1};
 * B register b[i] holds k rows 2 t + 8 i + {0, 1}, column g. So the two accumulator tiles of 16 keys are
 * exactly the A operand of P V for those keys.
 */
template <typename T, int DHP, int DVP>
__global__ void __launch_bounds__(kTcThreads, 2) tensorCoreKernel(Params const p)
{
    using Tile = TcTiling<DHP, DVP>;
    constexpr int QS = Tile::QS;
    constexpr int VS = Tile::VS;
    constexpr int OT = DVP / 8; // 8-column output tiles per warp
    float const kNegInf = -CUDART_INF_F;

    extern __shared__ uint4 sharedTc[];
    uint16_t* const Qs = reinterpret_cast<uint16_t*>(sharedTc); // [kBM][QS]
    uint16_t* const Ks = Qs + kBM * QS;                          // [2][kTcBN][QS]
    uint16_t* const Vs = Ks + 2 * kTcBN * QS;                    // [2][kTcBN][VS]

    int const tid = static_cast<int>(threadIdx.x);
    int const warp = tid >> 5;
    int const lane = tid & 31;
    int const g = lane >> 2;
    int const t = lane & 3;
    int64_t const block = blockIdx.x;
    int const mTile = static_cast<int>(block % p.mTiles);
    int64_t const bh = block / p.mTiles;
    int64_t const h = bh % p.H;
    int64_t const b = bh / p.H;
    int const m0 = mTile * kBM;
    int const Tq = p.Tq;
    int const Tk = p.Tk;
    int const dh = p.dh;
    int const dv = p.dv;

    uint16_t const* const q = static_cast<uint16_t const*>(p.q) + (bh * Tq + m0) * dh;
    uint16_t const* const k = static_cast<uint16_t const*>(p.k) + bh * Tk * dh;
    uint16_t const* const v = static_cast<uint16_t const*>(p.v) + bh * Tk * dv;
    float const* const mask
        = p.mask != nullptr ? p.mask + b * p.maskStrideB + h * p.maskStrideH : nullptr;

    // This thread's two query rows (g and g + 8 of the warp's 16).
    int rows[2];
    bool rowValid[2];
    float const* prevRow[2];
    float* scoreRow[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
    {
        rows[hr] = m0 + warp * 16 + g + 8 * hr;
        rowValid[hr] = rows[hr] < Tq;
        int64_t const offset = (bh * Tq + rows[hr]) * Tk;
        prevRow[hr] = p.prev != nullptr ? p.prev + offset : nullptr;
        scoreRow[hr] = p.scores + offset;
    }

    loadTile16<kBM, DHP>(Qs, QS, q, Tq - m0, dh, p.qVec, tid);
    loadTile16<kTcBN, DHP>(Ks, QS, k, Tk, dh, p.kVec, tid);
    loadTile16<kTcBN, DVP>(Vs, VS, v, Tk, dv, p.vVec, tid);
    cpAsyncCommit();

    float rowMax[2] = {kNegInf, kNegInf};
    float rowSum[2] = {0.F, 0.F}; // this thread's part; the quad's four parts are added at the end
    float o[OT][4];
#pragma unroll
    for (int nt = 0; nt < OT; ++nt)
    {
#pragma unroll
        for (int e = 0; e < 4; ++e)
        {
            o[nt][e] = 0.F;
        }
    }
    int const kChunks = (dh + 15) / 16; // 16-wide slices of dh that hold data
    int const vTiles = (dv + 15) / 16;  // 16-wide slices of dv that hold data
    int const nTiles = (Tk + kTcBN - 1) / kTcBN;

    // prev_scores of a tile is fetched one tile ahead, right after the previous one was used: its DRAM
    // latency hides behind a whole tile of MMAs and softmax, in the same registers.
    float2 prev[kTcNT][2];
    loadPrevTile(prev, prevRow, rowValid, 0, t, Tk, p.pairVec);

    for (int it = 0; it < nTiles; ++it)
    {
        int const n0 = it * kTcBN;
        int const buf = it & 1;

        cpAsyncWaitAll();
        __syncthreads(); // tile `it` is in shared memory; everyone is done with tile it - 1 (buffer buf ^ 1)
        if (it + 1 < nTiles)
        {
            int const next = n0 + kTcBN;
            loadTile16<kTcBN, DHP>(Ks + (buf ^ 1) * kTcBN * QS, QS, k + static_cast<int64_t>(next) * dh, Tk - next,
                dh, p.kVec, tid);
            loadTile16<kTcBN, DVP>(Vs + (buf ^ 1) * kTcBN * VS, VS, v + static_cast<int64_t>(next) * dv, Tk - next,
                dv, p.vVec, tid);
        }
        cpAsyncCommit();

        // S = Q K^T: 16 rows x 64 keys per warp.
        uint16_t const* const Kb = Ks + buf * kTcBN * QS;
        float s[kTcNT][4];
#pragma unroll
        for (int nt = 0; nt < kTcNT; ++nt)
        {
#pragma unroll
            for (int e = 0; e < 4; ++e)
            {
                s[nt][e] = 0.F;
            }
        }
#pragma unroll
        for (int kk = 0; kk < DHP / 16; ++kk)
        {
            if (kk < kChunks)
            {
                uint16_t const* const qa = Qs + (warp * 16 + g) * QS + kk * 16 + 2 * t;
                uint32_t const a[4] = {loadShared32(qa), loadShared32(qa + 8 * QS), loadShared32(qa + 8),
                    loadShared32(qa + 8 * QS + 8)};
#pragma unroll
                for (int nt = 0; nt < kTcNT; ++nt)
                {
                    uint16_t const* const kb = Kb + (nt * 8 + g) * QS + kk * 16 + 2 * t;
                    mma16816<T>(s[nt], a, loadShared32(kb), loadShared32(kb + 8));
                }
            }
        }

        // Scores out, logits, online softmax; the probabilities stay in s.
        float tileMax[2] = {kNegInf, kNegInf};
#pragma unroll
        for (int nt = 0; nt < kTcNT; ++nt)
        {
            int const col = n0 + nt * 8 + 2 * t;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
            {
                float const x = s[nt][2 * hr] * p.scale + prev[nt][hr].x;
                float const y = s[nt][2 * hr + 1] * p.scale + prev[nt][hr].y;
                if (rowValid[hr])
                {
                    storeScorePair(scoreRow[hr], col, Tk, p.pairVec, x, y);
                }
                float lx = kNegInf;
                float ly = kNegInf;
                if (col < Tk)
                {
                    lx = x / p.divisor;
                    if (mask != nullptr && rowValid[hr])
                    {
                        lx += mask[rows[hr] * p.maskStrideQ + col * p.maskStrideK];
                    }
                }
                if (col + 1 < Tk)
                {
                    ly = y / p.divisor;
                    if (mask != nullptr && rowValid[hr])
                    {
                        ly += mask[rows[hr] * p.maskStrideQ + (col + 1) * p.maskStrideK];
                    }
                }
                s[nt][2 * hr] = lx;
                s[nt][2 * hr + 1] = ly;
                tileMax[hr] = fmaxf(tileMax[hr], fmaxf(lx, ly));
            }
        }
        if (it + 1 < nTiles)
        {
            loadPrevTile(prev, prevRow, rowValid, n0 + kTcBN, t, Tk, p.pairVec);
        }
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
        {
            tileMax[hr] = fmaxf(tileMax[hr], __shfl_xor_sync(0xffffffffU, tileMax[hr], 1));
            tileMax[hr] = fmaxf(tileMax[hr], __shfl_xor_sync(0xffffffffU, tileMax[hr], 2));
            float const newMax = fmaxf(rowMax[hr], tileMax[hr]);
            float const base = newMax == kNegInf ? 0.F : newMax; // an all -inf row so far stays at 0 weight
            float const correction = expf(rowMax[hr] - base);
            float tileSum = 0.F;
#pragma unroll
            for (int nt = 0; nt < kTcNT; ++nt)
            {
                s[nt][2 * hr] = expf(s[nt][2 * hr] - base);
                s[nt][2 * hr + 1] = expf(s[nt][2 * hr + 1] - base);
                tileSum += s[nt][2 * hr] + s[nt][2 * hr + 1];
            }
            rowSum[hr] = rowSum[hr] * correction + tileSum;
            rowMax[hr] = newMax;
#pragma unroll
            for (int nt = 0; nt < OT; ++nt)
            {
                o[nt][2 * hr] *= correction;
                o[nt][2 * hr + 1] *= correction;
            }
        }

        // O += P V (keys past Tk have P = 0 and V = 0). V fragments: ldmatrix.x4.trans gives the B registers
        // of two 8-column tiles; lane l addresses key row l % 16, column half l / 16.
        uint16_t const* const Vb = Vs + buf * kTcBN * VS;
#pragma unroll
        for (int kc = 0; kc < kTcBN / 16; ++kc)
        {
            uint32_t const a[4] = {packPair<T>(s[2 * kc][0], s[2 * kc][1]), packPair<T>(s[2 * kc][2], s[2 * kc][3]),
                packPair<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]), packPair<T>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
            uint16_t const* const vRow = Vb + (kc * 16 + (lane & 15)) * VS + (lane >> 4) * 8;
#pragma unroll
            for (int vt = 0; vt < DVP / 16; ++vt)
            {
                if (vt < vTiles)
                {
                    uint32_t r0;
                    uint32_t r1;
                    uint32_t r2;
                    uint32_t r3;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                                 : "r"(sharedAddress(vRow + vt * 16)));
                    mma16816<T>(o[2 * vt], a, r0, r1);
                    mma16816<T>(o[2 * vt + 1], a, r2, r3);
                }
            }
        }
    }

    T* const out = static_cast<T*>(p.out) + bh * Tq * dv;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
    {
        float sum = rowSum[hr];
        sum += __shfl_xor_sync(0xffffffffU, sum, 1);
        sum += __shfl_xor_sync(0xffffffffU, sum, 2);
        if (!rowValid[hr])
        {
            continue;
        }
        float const inv = 1.F / sum;
        T* const outRow = out + static_cast<int64_t>(rows[hr]) * dv;
#pragma unroll
        for (int nt = 0; nt < OT; ++nt)
        {
            int const col = nt * 8 + 2 * t;
            if (col < dv)
            {
                outRow[col] = fromFloat<T>(o[nt][2 * hr] * inv);
            }
            if (col + 1 < dv)
            {
                outRow[col + 1] = fromFloat<T>(o[nt][2 * hr + 1] * inv);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Launch.
// ---------------------------------------------------------------------------------------------------------

template <typename Kernel>
cudaError_t launchKernel(Kernel kernel, Params const& p, int threads, size_t sharedBytes, cudaStream_t stream)
{
    int64_t const blocks = static_cast<int64_t>(p.mTiles) * p.B * p.H;
    if (blocks > 2147483647LL)
    {
        return cudaErrorInvalidValue;
    }
    // Above 48 KB of dynamic shared memory a kernel must opt in; a host-side attribute, no stream work.
    cudaError_t status
        = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sharedBytes));
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<static_cast<unsigned int>(blocks), threads, sharedBytes, stream>>>(p);
    return cudaGetLastError();
}

template <int DHP, int DVP>
cudaError_t launchSimt(Params const& p, cudaStream_t stream)
{
    return launchKernel(simtKernel<DHP, DVP>, p, kSimtThreads, SimtTiling<DHP, DVP>::kSharedBytes, stream);
}

template <typename T, int DHP, int DVP>
cudaError_t launchTensorCore(Params const& p, cudaStream_t stream)
{
    return launchKernel(tensorCoreKernel<T, DHP, DVP>, p, kTcThreads, TcTiling<DHP, DVP>::kSharedBytes, stream);
}

cudaError_t launchFloat32(Params const& p, cudaStream_t stream)
{
    if (p.dh > 64)
    {
        return p.dv > 64 ? launchSimt<128, 128>(p, stream) : launchSimt<128, 64>(p, stream);
    }
    return p.dv > 64 ? launchSimt<64, 128>(p, stream) : launchSimt<64, 64>(p, stream);
}

template <typename T>
cudaError_t launchHalf(Params const& p, cudaStream_t stream)
{
    if (p.dh > 64)
    {
        return p.dv > 64 ? launchTensorCore<T, 128, 128>(p, stream) : launchTensorCore<T, 128, 64>(p, stream);
    }
    return p.dv > 64 ? launchTensorCore<T, 64, 128>(p, stream) : launchTensorCore<T, 64, 64>(p, stream);
}

size_t dtypeSize(int32_t dtype)
{
    switch (dtype)
    {
    case ATTNRES_DTYPE_FLOAT32: return 4;
    case ATTNRES_DTYPE_FLOAT16:
    case ATTNRES_DTYPE_BFLOAT16: return 2;
    default: return 0;
    }
}

//! Whether rows of `cols` elements of `elementSize` bytes from `ptr` start on 16-byte boundaries.
bool rowsAligned16(void const* ptr, int32_t cols, size_t elementSize)
{
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (static_cast<size_t>(cols) * elementSize) % 16 == 0;
}

} // namespace

extern "C" cudaError_t residualScoreAttentionLaunch(void const* q, void const* k, void const* v,
    float const* prevScores, float const* maskBias, int64_t maskStrideB, int64_t maskStrideH, int64_t maskStrideQ,
    int64_t maskStrideK, int32_t B, int32_t H, int32_t Tq, int32_t Tk, int32_t dh, int32_t dv, float scale,
    float logitDivisor, int32_t dtype, void* out, float* scores, cudaStream_t stream)
{
    size_t const elementSize = dtypeSize(dtype);
    if (elementSize == 0 || B < 0 || H < 0 || Tq < 0 || Tk < 0 || dh < 1 || dv < 1
        || dh > ATTNRES_RSA_MAX_HEAD_DIM || dv > ATTNRES_RSA_MAX_HEAD_DIM || !std::isfinite(scale)
        || !std::isfinite(logitDivisor) || logitDivisor == 0.F)
    {
        return cudaErrorInvalidValue;
    }
    if (maskBias != nullptr && (maskStrideB < 0 || maskStrideH < 0 || maskStrideQ < 0 || maskStrideK < 0))
    {
        return cudaErrorInvalidValue;
    }
    if (B == 0 || H == 0 || Tq == 0)
    {
        return cudaSuccess; // nothing to write
    }
    if (out == nullptr)
    {
        return cudaErrorInvalidValue;
    }
    if (Tk == 0)
    {
        // Softmax over no keys times an empty V: torch's P @ V gives zeros; scores is empty.
        size_t const bytes = static_cast<size_t>(B) * H * Tq * dv * elementSize;
        return cudaMemsetAsync(out, 0, bytes, stream);
    }
    if (q == nullptr || k == nullptr || v == nullptr || scores == nullptr)
    {
        return cudaErrorInvalidValue;
    }

    Params p{};
    p.q = q;
    p.k = k;
    p.v = v;
    p.prev = prevScores;
    p.mask = maskBias;
    p.maskStrideB = maskStrideB;
    p.maskStrideH = maskStrideH;
    p.maskStrideQ = maskStrideQ;
    p.maskStrideK = maskStrideK;
    p.B = B;
    p.H = H;
    p.Tq = Tq;
    p.Tk = Tk;
    p.dh = dh;
    p.dv = dv;
    p.mTiles = (Tq + kBM - 1) / kBM;
    p.scale = scale;
    p.divisor = logitDivisor;
    p.out = out;
    p.scores = scores;
    p.qVec = rowsAligned16(q, dh, elementSize);
    p.kVec = rowsAligned16(k, dh, elementSize);
    p.vVec = rowsAligned16(v, dv, elementSize);
    p.pairVec = Tk % 2 == 0 && reinterpret_cast<uintptr_t>(scores) % 8 == 0
        && reinterpret_cast<uintptr_t>(prevScores) % 8 == 0;

    switch (dtype)
    {
    case ATTNRES_DTYPE_FLOAT32: return launchFloat32(p, stream);
    case ATTNRES_DTYPE_FLOAT16: return launchHalf<__half>(p, stream);
    case ATTNRES_DTYPE_BFLOAT16: return launchHalf<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
    }
}
