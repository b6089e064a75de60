/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * ResidualScoreAttention (RealFormer): flash-style attention that also writes the running score sum.
 *
 * One block of 256 threads owns one (b, h) and a tile of kBM = 64 queries. It walks the keys in tiles of
 * BN (64 for head sizes <= 64, else 32): the K and V tiles are converted to float32 in shared memory, the
 * 64 x BN score tile is computed with float32 FMAs (SIMT; no tensor cores), prev_scores is added and the
 * result is written to `scores` (the only [Tq, Tk] traffic), then divisor and mask turn it into logits
 * that update an online softmax (running max and sum per query row) and the float32 output accumulator
 * held in registers. The probabilities go through shared memory only, never to global memory.
 *
 * Thread (ty, tx) = (tid / 16, tid % 16) owns query rows ty + 16 i (i < 4) of the tile, key columns
 * tx + 16 j (j < BN / 16) of a score tile, and output columns 64 c + 4 tx .. + 3 (c < DVP / 64). A row's
 * reductions stay inside one 16-lane half warp (shuffles). Head sizes are padded with zeros to the next of
 * 64 / 128 (DHP for q, k; DVP for v), so any dh, dv in 1..128 is exact.
 */
#include "residualScoreAttentionKernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cmath>
#include <cstdint>

namespace
{

constexpr int kThreads = 256;
constexpr int kBM = 64;           // query rows per block
constexpr int kRows = kBM / 16;   // query rows per thread
constexpr int kPad = 4;           // floats of padding per shared row of Q and K (keeps float4 alignment)

template <typename T>
__device__ __forceinline__ float toFloat(T v);
template <>
__device__ __forceinline__ float toFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half v)
{
    return __half2float(v);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v)
{
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

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
};

template <int DHP, int DVP>
struct Tiling
{
    static constexpr int BN = (DHP <= 64 && DVP <= 64) ? 64 : 32;
    static constexpr int QS = DHP + kPad; // row stride of Qs and Ks
    static constexpr int PS = BN + 1;     // row stride of Ps
    static constexpr size_t kSharedFloats
        = static_cast<size_t>(kBM) * QS + static_cast<size_t>(BN) * QS + static_cast<size_t>(BN) * DVP
        + static_cast<size_t>(kBM) * PS;
    static constexpr size_t kSharedBytes = kSharedFloats * sizeof(float);
};

//! Loads a [rows, cols] tile of a row-major [*, ld] matrix as float32, zero outside (validRows, ld).
template <typename T, int COLS>
__device__ __forceinline__ void loadTile(
    float* dst, int dstStride, T const* src, int rows, int validRows, int ld, int tid)
{
    for (int idx = tid; idx < rows * COLS; idx += kThreads)
    {
        int const r = idx / COLS;
        int const c = idx - r * COLS;
        float x = 0.F;
        if (r < validRows && c < ld)
        {
            x = toFloat(src[static_cast<int64_t>(r) * ld + c]);
        }
        dst[r * dstStride + c] = x;
    }
}

template <typename T, int DHP, int DVP>
__global__ void __launch_bounds__(kThreads, 1) residualScoreAttentionKernel(Params const p)
{
    using Tile = Tiling<DHP, DVP>;
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

    T const* const q = static_cast<T const*>(p.q) + (bh * Tq + m0) * p.dh;
    T const* const k = static_cast<T const*>(p.k) + bh * Tk * p.dh;
    T const* const v = static_cast<T const*>(p.v) + bh * Tk * p.dv;
    int64_t const scoreBase = bh * Tq * Tk;
    float const* const mask
        = p.mask != nullptr ? p.mask + b * p.maskStrideB + h * p.maskStrideH : nullptr;

    loadTile<T, DHP>(Qs, QS, q, kBM, Tq - m0, p.dh, tid);

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

    for (int n0 = 0; n0 < Tk; n0 += BN)
    {
        __syncthreads(); // the previous tile's readers of Ks, Vs and Ps are done
        int const validKeys = Tk - n0;
        loadTile<T, DHP>(Ks, QS, k + static_cast<int64_t>(n0) * p.dh, BN, validKeys, p.dh, tid);
        loadTile<T, DVP>(Vs, DVP, v + static_cast<int64_t>(n0) * p.dv, BN, validKeys, p.dv, tid);
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
                    float score = s[i][j] * p.scale;
                    if (rowValid)
                    {
                        if (p.prev != nullptr)
                        {
                            score += p.prev[rowOffset + col];
                        }
                        p.scores[rowOffset + col] = score;
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

    T* const out = static_cast<T*>(p.out) + (bh * Tq + m0) * p.dv;
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
                    out[static_cast<int64_t>(r) * p.dv + col] = fromFloat<T>(acc[i][c][e] * inv);
                }
            }
        }
    }
}

template <typename T, int DHP, int DVP>
cudaError_t launchTiled(Params const& p, cudaStream_t stream)
{
    using Tile = Tiling<DHP, DVP>;
    int64_t const blocks = static_cast<int64_t>(p.mTiles) * p.B * p.H;
    if (blocks > 2147483647LL)
    {
        return cudaErrorInvalidValue;
    }
    auto kernel = residualScoreAttentionKernel<T, DHP, DVP>;
    // Above 48 KB of dynamic shared memory a kernel must opt in; a host-side attribute, no stream work.
    cudaError_t status = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tile::kSharedBytes));
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<static_cast<unsigned int>(blocks), kThreads, Tile::kSharedBytes, stream>>>(p);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launchTyped(Params const& p, cudaStream_t stream)
{
    bool const wideQk = p.dh > 64;
    bool const wideV = p.dv > 64;
    if (wideQk)
    {
        return wideV ? launchTiled<T, 128, 128>(p, stream) : launchTiled<T, 128, 64>(p, stream);
    }
    return wideV ? launchTiled<T, 64, 128>(p, stream) : launchTiled<T, 64, 64>(p, stream);
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

    switch (dtype)
    {
    case ATTNRES_DTYPE_FLOAT32: return launchTyped<float>(p, stream);
    case ATTNRES_DTYPE_FLOAT16: return launchTyped<__half>(p, stream);
    case ATTNRES_DTYPE_BFLOAT16: return launchTyped<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
    }
}
