/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * AttnResAggregateNorm, composed: the verified AttnResAggregate launcher (attnresAggregateLaunch) writes the
 * aggregate h, rounded to the storage type, into outH; then a row-wise RMSNorm kernel reads h as stored and
 * writes y. This is the correctness path. A single fused kernel that normalizes the aggregate while it is
 * still in registers (no second read of h, no h written when the op does not output it) is later GPU work;
 * it must round h to the storage type before the norm, as here, to give the same y.
 *
 * The RMSNorm kernel: one block per row (grid-stride over rows), each thread sums the squares of its
 * elements in float32, a block reduction (warp shuffles, then the warps' partial sums in shared memory,
 * added in a fixed order) gives the row's sum; a second sweep over the row (an L1/L2 hit for rows of a
 * few tens of KB) writes round_T(hf * rsqrt(sum / d + normEps) * normWeight). Rows whose width is a
 * multiple of the 16-byte pack and whose buffers are 16-byte aligned take 16-byte loads and stores; any
 * other width (odd D such as 1001, D = 7) takes the one-element path.
 */
#include "attnResAggregateNormKernel.h"
#include "common/attnresCudaConvert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace
{

constexpr int kWarp = 32;
constexpr int kNormMaxThreads = 256;               // per block: one row per block
constexpr int kNormMaxWarps = kNormMaxThreads / kWarp;
constexpr int64_t kNormMaxBlocks = int64_t{1} << 20; // more rows are taken by the grid-stride loop
constexpr int kPackBytes = 16;

using attnres::fromFloat;
using attnres::toFloat;

//! VEC consecutive elements moved by one load or store (16 bytes on the vector path).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) NormPack
{
    T v[VEC];
};

//! Sum of value over the block, returned to every thread. blockDim.x is a multiple of kWarp. The warps'
//! partial sums are added in warp order, so the result does not depend on scheduling.
__device__ __forceinline__ float blockSum(float value, float* partial)
{
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    {
        value += __shfl_xor_sync(0xffffffffU, value, offset);
    }
    int const warp = static_cast<int>(threadIdx.x) / kWarp;
    if (static_cast<int>(threadIdx.x) % kWarp == 0)
    {
        partial[warp] = value;
    }
    __syncthreads();
    float total = 0.F;
    int const warps = static_cast<int>(blockDim.x) / kWarp;
    for (int w = 0; w < warps; ++w)
    {
        total += partial[w];
    }
    __syncthreads(); // partial is written again for the next row
    return total;
}

//! y[r, :] = round_T(hf * rsqrt(mean(hf^2) + normEps) * weight), hf = float32(h[r, :]); VEC divides d.
template <typename T, int VEC>
__global__ void __launch_bounds__(kNormMaxThreads) rmsNormRowsKernel(T const* __restrict__ h,
    float const* __restrict__ weight, T* __restrict__ y, int64_t rows, int32_t d, float normEps)
{
    __shared__ float partial[kNormMaxWarps];
    int32_t const packs = d / VEC;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    {
        auto const* in = reinterpret_cast<NormPack<T, VEC> const*>(h + row * d);
        auto* out = reinterpret_cast<NormPack<T, VEC>*>(y + row * d);
        float sum = 0.F;
        for (int32_t p = static_cast<int32_t>(threadIdx.x); p < packs; p += static_cast<int32_t>(blockDim.x))
        {
            NormPack<T, VEC> const pack = in[p];
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                float const x = toFloat(pack.v[j]);
                sum += x * x;
            }
        }
        float const scale = rsqrtf(blockSum(sum, partial) / static_cast<float>(d) + normEps);
        for (int32_t p = static_cast<int32_t>(threadIdx.x); p < packs; p += static_cast<int32_t>(blockDim.x))
        {
            NormPack<T, VEC> const pack = in[p];
            NormPack<T, VEC> result;
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                float const normed = toFloat(pack.v[j]) * scale;
                result.v[j] = fromFloat<T>(normed * __ldg(weight + static_cast<int64_t>(p) * VEC + j));
            }
            out[p] = result;
        }
    }
}

bool aligned(void const* pointer, uintptr_t bytes)
{
    return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

//! Enqueues the RMSNorm of rows >= 1 rows of h into y; returns the launch error.
template <typename T>
cudaError_t launchRmsNorm(
    void const* h, float const* weight, void* y, int64_t rows, int32_t d, float normEps, cudaStream_t stream)
{
    constexpr int kVec = kPackBytes / static_cast<int>(sizeof(T));
    bool const vector = d % kVec == 0 && aligned(h, kPackBytes) && aligned(y, kPackBytes);
    int32_t const packs = vector ? d / kVec : d;
    int32_t const warps = std::min<int32_t>(kNormMaxWarps, (packs + kWarp - 1) / kWarp);
    dim3 const block(static_cast<unsigned>(warps * kWarp));
    dim3 const grid(static_cast<unsigned>(std::min<int64_t>(rows, kNormMaxBlocks)));
    auto const* in = static_cast<T const*>(h);
    auto* out = static_cast<T*>(y);
    if (vector)
    {
        rmsNormRowsKernel<T, kVec><<<grid, block, 0, stream>>>(in, weight, out, rows, d, normEps);
    }
    else
    {
        rmsNormRowsKernel<T, 1><<<grid, block, 0, stream>>>(in, weight, out, rows, d, normEps);
    }
    return cudaGetLastError();
}

bool validArguments(float const* scoreWeight, float const* normWeight, void const* const* sources, int32_t numSources,
    int64_t rows, int32_t d, float eps, float normEps, int32_t dtype, void const* outY, void const* outH)
{
    if (scoreWeight == nullptr || normWeight == nullptr || sources == nullptr || outY == nullptr || outH == nullptr
        || outY == outH || numSources < 1 || numSources > ATTNRES_MAX_SOURCES || rows < 0 || d < 1)
    {
        return false;
    }
    if (!std::isfinite(eps) || eps < 0.F || !std::isfinite(normEps) || normEps < 0.F)
    {
        return false;
    }
    if (dtype != ATTNRES_DTYPE_FLOAT32 && dtype != ATTNRES_DTYPE_FLOAT16 && dtype != ATTNRES_DTYPE_BFLOAT16)
    {
        return false;
    }
    for (int32_t i = 0; i < numSources; ++i)
    {
        if (sources[i] == nullptr)
        {
            return false;
        }
    }
    return true;
}

} // namespace

extern "C" cudaError_t attnresAggregateNormLaunch(float const* scoreWeight, float const* normWeight,
    void const* const* sources, int32_t numSources, int64_t rows, int32_t d, float eps, float normEps, int32_t dtype,
    void* outY, void* outH, cudaStream_t stream)
{
    // Every argument is checked before anything is enqueued: a bad one launches neither kernel.
    if (!validArguments(scoreWeight, normWeight, sources, numSources, rows, d, eps, normEps, dtype, outY, outH))
    {
        return cudaErrorInvalidValue;
    }
    cudaError_t const status = attnresAggregateLaunch(scoreWeight, sources, numSources, rows, d, eps, dtype, outH, stream);
    if (status != cudaSuccess || rows == 0)
    {
        return status;
    }
    switch (dtype)
    {
    case ATTNRES_DTYPE_FLOAT32: return launchRmsNorm<float>(outH, normWeight, outY, rows, d, normEps, stream);
    case ATTNRES_DTYPE_FLOAT16: return launchRmsNorm<__half>(outH, normWeight, outY, rows, d, normEps, stream);
    default: return launchRmsNorm<__nv_bfloat16>(outH, normWeight, outY, rows, d, normEps, stream);
    }
}
