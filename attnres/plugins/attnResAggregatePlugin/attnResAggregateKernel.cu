/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Fused AttnResAggregate: one pass over the sources with an online softmax over depth.
 *
 * A "team" of threads owns one row. Each thread keeps ITEMS packs of VEC elements of the row: the
 * float32 accumulator and the matching score weights live in registers. For source i the team reads its
 * row once, reduces (sum of squares, dot with sw) over the team, turns that into a logit and folds the
 * raw row into the accumulator with the running max / sum rescaling of an online softmax. G sources are
 * read before each reduction so that enough bytes are in flight and barriers stay few. Source pointers
 * travel by value in a __grid_constant__ kernel parameter (2 KB), so there is no device-side gather.
 *
 * Rows wider than the register budget (more than kMaxRegisterElements) take a two-sweep kernel: logits
 * first, then the weighted sum per element in registers; it reads the sources twice.
 */
#include "attnResAggregateKernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace
{

constexpr int kMaxThreads = 512;           // per block; keeps 128 registers per thread available
constexpr int kWarp = 32;
constexpr int kMaxWarps = kMaxThreads / kWarp;
constexpr int kMaxElementsPerThread = 32;  // register budget of the accumulator (and as many weights)
constexpr int kMaxGroup = 8;               // most sources read before one reduction
constexpr int kRegisterBudget = 64;        // registers for accumulator, weights and raw loads of a group
constexpr int kWarpTeamBlock = 256;        // block size when a team is a warp or part of one
constexpr int kSweepThreads = 512;

struct SourceTable
{
    void const* ptr[ATTNRES_MAX_SOURCES];
};

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

//! VEC consecutive elements moved by one load or store (16 bytes on the vector path).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack
{
    T v[VEC];
};

template <typename T, int VEC, int ITEMS>
struct Shape
{
    static constexpr int kElements = VEC * ITEMS;
    static constexpr int kPackRegisters = VEC * sizeof(T) < 4 ? 1 : VEC * sizeof(T) / 4;
    static constexpr int kRawGroup = (kRegisterBudget - 2 * kElements) / (ITEMS * kPackRegisters);
    static constexpr int kGroup = kRawGroup < 1 ? 1 : (kRawGroup > kMaxGroup ? kMaxGroup : kRawGroup);
    static_assert(kElements <= kMaxElementsPerThread, "accumulator exceeds the register budget");
};

//! Sums each of N values over a power-of-two group of `width` lanes (all 32 lanes take part).
template <int N>
__device__ __forceinline__ void teamReduceWarp(float (&v)[N], int width)
{
    for (int offset = width / 2; offset > 0; offset /= 2)
    {
#pragma unroll
        for (int j = 0; j < N; ++j)
        {
            v[j] += __shfl_xor_sync(0xffffffffu, v[j], offset);
        }
    }
}

//! Sums each of N values over the whole block; `buffer` alternates so one barrier per call suffices.
template <int N>
__device__ __forceinline__ void teamReduceBlock(float (&v)[N], float (*shared)[kMaxWarps][2 * kMaxGroup], int buffer)
{
    teamReduceWarp<N>(v, kWarp);
    int const warp = threadIdx.x / kWarp;
    int const nbWarps = (blockDim.x + kWarp - 1) / kWarp;
    if (threadIdx.x % kWarp == 0)
    {
#pragma unroll
        for (int j = 0; j < N; ++j)
        {
            shared[buffer][warp][j] = v[j];
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j)
    {
        v[j] = 0.F;
    }
    for (int w = 0; w < nbWarps; ++w)
    {
#pragma unroll
        for (int j = 0; j < N; ++j)
        {
            v[j] += shared[buffer][w][j];
        }
    }
}

/*
 * One row per team of `team` threads: team <= 32 (a power of two, several rows per block, shuffles only)
 * or team == blockDim.x (one row per block). Blocks stride over rows so the score weights are loaded
 * into registers once per thread.
 */
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads) aggregateRegisterKernel(__grid_constant__ SourceTable const sources,
    int32_t numSources, float const* __restrict__ scoreWeight, T* __restrict__ out, int64_t rows, int32_t dVec,
    float eps, int32_t team)
{
    using S = Shape<T, VEC, ITEMS>;
    using P = Pack<T, VEC>;
    constexpr int G = S::kGroup;
    __shared__ float reduceBuffer[2][kMaxWarps][2 * kMaxGroup];

    int const lane = threadIdx.x % team;
    int const rowsPerBlock = blockDim.x / team;
    bool const warpTeam = team <= kWarp;
    float const invD = 1.F / static_cast<float>(dVec * VEC);

    float w[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
    {
        int const c = lane + k * team;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
        {
            w[k][j] = c < dVec ? scoreWeight[static_cast<int64_t>(c) * VEC + j] : 0.F;
        }
    }

    int buffer = 0;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * rowsPerBlock; base < rows;
         base += static_cast<int64_t>(gridDim.x) * rowsPerBlock)
    {
        int64_t const row = base + threadIdx.x / team;
        bool const active = row < rows;
        float acc[ITEMS][VEC];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k)
        {
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                acc[k][j] = 0.F;
            }
        }
        float runningMax = -INFINITY;
        float runningSum = 0.F;

        for (int i0 = 0; i0 < numSources; i0 += G)
        {
            P raw[G][ITEMS];
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                bool const present = active && i0 + g < numSources;
                P const* src = present ? static_cast<P const*>(sources.ptr[i0 + g]) + row * dVec : nullptr;
#pragma unroll
                for (int k = 0; k < ITEMS; ++k)
                {
                    int const c = lane + k * team;
                    if (present && c < dVec)
                    {
                        raw[g][k] = src[c];
                    }
                    else
                    {
#pragma unroll
                        for (int j = 0; j < VEC; ++j)
                        {
                            raw[g][k].v[j] = fromFloat<T>(0.F);
                        }
                    }
                }
            }

            float partial[2 * G];
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                float sumSquares = 0.F;
                float dot = 0.F;
#pragma unroll
                for (int k = 0; k < ITEMS; ++k)
                {
#pragma unroll
                    for (int j = 0; j < VEC; ++j)
                    {
                        float const x = toFloat<T>(raw[g][k].v[j]);
                        sumSquares = fmaf(x, x, sumSquares);
                        dot = fmaf(x, w[k][j], dot);
                    }
                }
                partial[2 * g] = sumSquares;
                partial[2 * g + 1] = dot;
            }
            if (warpTeam)
            {
                teamReduceWarp<2 * G>(partial, team);
            }
            else
            {
                teamReduceBlock<2 * G>(partial, reduceBuffer, buffer);
                buffer ^= 1;
            }

            float logit[G];
            float groupMax = runningMax;
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                logit[g] = rsqrtf(partial[2 * g] * invD + eps) * partial[2 * g + 1];
                if (i0 + g < numSources)
                {
                    groupMax = fmaxf(groupMax, logit[g]);
                }
            }
            float const rescale = expf(runningMax - groupMax);
            runningMax = groupMax;
            runningSum *= rescale;
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
            {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                {
                    acc[k][j] *= rescale;
                }
            }
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                if (i0 + g < numSources)
                {
                    float const p = expf(logit[g] - groupMax);
                    runningSum += p;
#pragma unroll
                    for (int k = 0; k < ITEMS; ++k)
                    {
#pragma unroll
                        for (int j = 0; j < VEC; ++j)
                        {
                            acc[k][j] = fmaf(p, toFloat<T>(raw[g][k].v[j]), acc[k][j]);
                        }
                    }
                }
            }
        }

        if (active)
        {
            float const norm = 1.F / runningSum;
            P* dst = reinterpret_cast<P*>(out) + row * dVec;
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
            {
                int const c = lane + k * team;
                if (c < dVec)
                {
                    P result;
#pragma unroll
                    for (int j = 0; j < VEC; ++j)
                    {
                        result.v[j] = fromFloat<T>(acc[k][j] * norm);
                    }
                    dst[c] = result;
                }
            }
        }
    }
}

/*
 * Rows too wide for the register accumulator: one block per row computes every logit (first sweep),
 * then each output element as sum_i a_i v_i[d] in registers (second sweep).
 */
template <typename T, int VEC>
__global__ void __launch_bounds__(kSweepThreads) aggregateTwoSweepKernel(__grid_constant__ SourceTable const sources,
    int32_t numSources, float const* __restrict__ scoreWeight, T* __restrict__ out, int64_t rows, int32_t dVec,
    float eps)
{
    using P = Pack<T, VEC>;
    __shared__ float reduceBuffer[2][kMaxWarps][2 * kMaxGroup];
    __shared__ float weights[ATTNRES_MAX_SOURCES];
    float const invD = 1.F / static_cast<float>(dVec * VEC);
    int buffer = 0;

    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    {
        for (int i = 0; i < numSources; ++i)
        {
            P const* src = static_cast<P const*>(sources.ptr[i]) + row * dVec;
            float partial[2] = {0.F, 0.F};
            for (int c = threadIdx.x; c < dVec; c += blockDim.x)
            {
                P const x = src[c];
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                {
                    float const xf = toFloat<T>(x.v[j]);
                    partial[0] = fmaf(xf, xf, partial[0]);
                    partial[1] = fmaf(xf, scoreWeight[static_cast<int64_t>(c) * VEC + j], partial[1]);
                }
            }
            teamReduceBlock<2>(partial, reduceBuffer, buffer);
            buffer ^= 1;
            if (threadIdx.x == 0)
            {
                weights[i] = rsqrtf(partial[0] * invD + eps) * partial[1];
            }
        }
        __syncthreads();
        float maxLogit = -INFINITY;
        for (int i = 0; i < numSources; ++i)
        {
            maxLogit = fmaxf(maxLogit, weights[i]);
        }
        float total = 0.F;
        for (int i = 0; i < numSources; ++i)
        {
            total += expf(weights[i] - maxLogit);
        }
        __syncthreads();
        if (threadIdx.x < numSources)
        {
            weights[threadIdx.x] = expf(weights[threadIdx.x] - maxLogit) / total;
        }
        __syncthreads();

        P* dst = reinterpret_cast<P*>(out) + row * dVec;
        for (int c = threadIdx.x; c < dVec; c += blockDim.x)
        {
            float acc[VEC] = {};
            for (int i = 0; i < numSources; ++i)
            {
                float const a = weights[i];
                P const x = static_cast<P const*>(sources.ptr[i])[row * dVec + c];
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                {
                    acc[j] = fmaf(a, toFloat<T>(x.v[j]), acc[j]);
                }
            }
            P result;
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                result.v[j] = fromFloat<T>(acc[j]);
            }
            dst[c] = result;
        }
        __syncthreads();
    }
}

struct LaunchArgs
{
    SourceTable table;
    int32_t numSources;
    float const* scoreWeight;
    void* out;
    int64_t rows;
    int32_t dVec;
    float eps;
    int numSMs;
    cudaStream_t stream;
};

int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

//! Enough blocks to fill the GPU (occupancy-limited), never more than there is work for.
template <typename Kernel>
cudaError_t gridSize(Kernel kernel, int threads, int64_t blocksOfWork, int numSMs, int* grid)
{
    int perSM = 1;
    if (blocksOfWork > numSMs)
    {
        cudaError_t const status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSM, kernel, threads, 0);
        if (status != cudaSuccess)
        {
            return status;
        }
        perSM = perSM < 1 ? 1 : perSM;
    }
    int64_t const full = static_cast<int64_t>(numSMs) * perSM;
    *grid = static_cast<int>(blocksOfWork < full ? blocksOfWork : full);
    return cudaSuccess;
}

template <typename T, int VEC, int ITEMS>
cudaError_t launchRegister(LaunchArgs const& a, int team, int threads)
{
    auto kernel = aggregateRegisterKernel<T, VEC, ITEMS>;
    int const rowsPerBlock = threads / team;
    int grid = 0;
    cudaError_t const status = gridSize(kernel, threads, ceilDiv(a.rows, rowsPerBlock), a.numSMs, &grid);
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<grid, threads, 0, a.stream>>>(
        a.table, a.numSources, a.scoreWeight, static_cast<T*>(a.out), a.rows, a.dVec, a.eps, team);
    return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launchTwoSweep(LaunchArgs const& a)
{
    auto kernel = aggregateTwoSweepKernel<T, VEC>;
    int grid = 0;
    cudaError_t const status = gridSize(kernel, kSweepThreads, a.rows, a.numSMs, &grid);
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<grid, kSweepThreads, 0, a.stream>>>(
        a.table, a.numSources, a.scoreWeight, static_cast<T*>(a.out), a.rows, a.dVec, a.eps);
    return cudaGetLastError();
}

int nextPowerOfTwo(int x)
{
    int p = 1;
    while (p < x)
    {
        p *= 2;
    }
    return p;
}

//! Packs per thread allowed on each path, smallest first: each count is one compiled kernel.
constexpr int kScalarItems[] = {1, 4, 16};
constexpr int kVectorItems[] = {1, 2, 4, 8};

template <typename T, int VEC>
struct ItemChoices
{
    static constexpr int const* kItems = VEC == 1 ? kScalarItems : kVectorItems;
    static constexpr int kCount = VEC == 1 ? 3 : (VEC * 8 <= kMaxElementsPerThread ? 4 : 3);
};

template <typename T, int VEC>
cudaError_t launchRegisterItems(LaunchArgs const& a, int items, int team, int threads)
{
    switch (items)
    {
    case 1: return launchRegister<T, VEC, 1>(a, team, threads);
    case 2:
        if constexpr (VEC > 1)
        {
            return launchRegister<T, VEC, 2>(a, team, threads);
        }
        break;
    case 4: return launchRegister<T, VEC, 4>(a, team, threads);
    case 8:
        if constexpr (VEC > 1 && VEC * 8 <= kMaxElementsPerThread)
        {
            return launchRegister<T, VEC, 8>(a, team, threads);
        }
        break;
    case 16:
        if constexpr (VEC == 1)
        {
            return launchRegister<T, VEC, 16>(a, team, threads);
        }
        break;
    default: break;
    }
    return cudaErrorInvalidValue;
}

/*
 * Picks the team and packs per thread: a warp (or part of one) per row when the row fits in 32 threads'
 * registers, otherwise a block per row with at most 256 threads when there are many rows (cheaper
 * reductions) or 512 for few rows (more loads in flight for decode); wider rows take the two-sweep path.
 */
template <typename T, int VEC>
cudaError_t launchTyped(LaunchArgs const& a)
{
    using Choices = ItemChoices<T, VEC>;
    int const maxItems = Choices::kItems[Choices::kCount - 1];
    if (a.dVec <= kWarp * maxItems)
    {
        if (a.dVec <= kWarp)
        {
            int const team = nextPowerOfTwo(a.dVec);
            return launchRegisterItems<T, VEC>(a, 1, team, kWarpTeamBlock);
        }
        for (int c = 0; c < Choices::kCount; ++c)
        {
            if (static_cast<int64_t>(kWarp) * Choices::kItems[c] >= a.dVec)
            {
                return launchRegisterItems<T, VEC>(a, Choices::kItems[c], kWarp, kWarpTeamBlock);
            }
        }
    }
    int const preferredCap = a.rows >= 2 * static_cast<int64_t>(a.numSMs) ? 256 : kMaxThreads;
    for (int cap : {preferredCap, kMaxThreads})
    {
        for (int c = 0; c < Choices::kCount; ++c)
        {
            int64_t const threads = ceilDiv(a.dVec, Choices::kItems[c]);
            if (threads <= cap)
            {
                int const rounded = static_cast<int>(ceilDiv(threads, kWarp) * kWarp);
                return launchRegisterItems<T, VEC>(a, Choices::kItems[c], rounded, rounded);
            }
        }
    }
    return launchTwoSweep<T, VEC>(a);
}

bool aligned16(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
cudaError_t dispatchVector(LaunchArgs& a, void const* const* sources, int32_t d)
{
    constexpr int kVec = 16 / sizeof(T);
    bool vectorizable = d % kVec == 0 && aligned16(a.out);
    for (int32_t i = 0; i < a.numSources && vectorizable; ++i)
    {
        vectorizable = aligned16(sources[i]);
    }
    if (vectorizable)
    {
        a.dVec = d / kVec;
        return launchTyped<T, kVec>(a);
    }
    a.dVec = d;
    return launchTyped<T, 1>(a);
}

} // namespace

extern "C" cudaError_t attnresAggregateLaunch(float const* scoreWeight, void const* const* sources, int32_t numSources,
    int64_t rows, int32_t d, float eps, int32_t dtype, void* out, cudaStream_t stream)
{
    if (scoreWeight == nullptr || sources == nullptr || out == nullptr || numSources < 1
        || numSources > ATTNRES_MAX_SOURCES || rows < 0 || d < 1 || !std::isfinite(eps) || eps < 0.F)
    {
        return cudaErrorInvalidValue;
    }
    if (dtype != ATTNRES_DTYPE_FLOAT32 && dtype != ATTNRES_DTYPE_FLOAT16 && dtype != ATTNRES_DTYPE_BFLOAT16)
    {
        return cudaErrorInvalidValue;
    }
    LaunchArgs args{};
    for (int32_t i = 0; i < numSources; ++i)
    {
        if (sources[i] == nullptr)
        {
            return cudaErrorInvalidValue;
        }
        args.table.ptr[i] = sources[i];
    }
    if (rows == 0)
    {
        return cudaSuccess;
    }
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess)
    {
        return status;
    }
    status = cudaDeviceGetAttribute(&args.numSMs, cudaDevAttrMultiProcessorCount, device);
    if (status != cudaSuccess)
    {
        return status;
    }
    args.numSources = numSources;
    args.scoreWeight = scoreWeight;
    args.out = out;
    args.rows = rows;
    args.eps = eps;
    args.stream = stream;
    switch (dtype)
    {
    case ATTNRES_DTYPE_FLOAT32: return dispatchVector<float>(args, sources, d);
    case ATTNRES_DTYPE_FLOAT16: return dispatchVector<__half>(args, sources, d);
    default: return dispatchVector<__nv_bfloat16>(args, sources, d);
    }
}
