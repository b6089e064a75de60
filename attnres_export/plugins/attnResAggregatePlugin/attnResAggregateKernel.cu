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
 * float16 / bfloat16 rows of a block each (16-byte packs) take the streaming variant instead: sources reach
 * shared memory through cp.async, kStages - 1 source rows ahead (across rows too), so that enough bytes
 * are in flight for their heavier arithmetic per byte without spending registers on them.
 *
 * Rows wider than the register budget (more than kMaxRegisterElements) take a two-sweep kernel: logits
 * first, then the weighted sum per element in registers; it reads the sources twice.
 *
 * A few rows (decode) would leave most multiprocessors idle with a team per row, so on sm_90 and newer a
 * row is split over a cluster of kClusterBlocks blocks: each block loads its slice of every source once
 * into registers, publishes its partial sums in shared memory, and after one cluster barrier every block
 * reads the others' partials through distributed shared memory, forms the softmax weights and writes its
 * slice of the output. There is no global workspace, so concurrent launches need no coordination.
 */
#include "attnResAggregateKernel.h"
#include "common/attnresCudaConvert.cuh"

#include <cooperative_groups.h>
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
constexpr int kStages = 4;                 // sources in flight per block on the streaming path
constexpr int kMaxStageBytes = 64 * 1024;  // their shared memory: fits beside another block on sm_80/90
constexpr int kClusterBlocks = 8;          // blocks sharing one row on the split path (portable size)
constexpr int kSplitMaxSources = 16;       // sources the split path holds in registers
constexpr int kSplitMinSources = 2;        // up to this many, one block reads them in one round trip and
                                           // beats the cluster's exchange (H200, f32 D=7168: 5.9 vs 7.5 us)
constexpr int kSplitMaxThreads = 256;      // leaves 255 registers per thread for the sources

struct SourceTable
{
    void const* ptr[ATTNRES_MAX_SOURCES];
};

using attnres::fromFloat;
using attnres::toFloat;

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
    // A power of two: a budget of 6 groups left ptxas too tight on sm_80..89 (a 4-byte spill).
    static constexpr int kGroup = kRawGroup >= kMaxGroup ? kMaxGroup
        : kRawGroup >= 4                                 ? 4
        : kRawGroup >= 2                                 ? 2
                                                         : 1;
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

//! Adds warp w's N partials (16-byte aligned in shared memory) to v with vector loads.
template <int N>
__device__ __forceinline__ void addWarpPartials(float (&v)[N], float const* partials)
{
    static_assert(N % 2 == 0, "partials come in (sum of squares, dot) pairs");
    if constexpr (N % 4 == 0)
    {
#pragma unroll
        for (int q = 0; q < N / 4; ++q)
        {
            float4 const x = reinterpret_cast<float4 const*>(partials)[q];
            v[4 * q] += x.x;
            v[4 * q + 1] += x.y;
            v[4 * q + 2] += x.z;
            v[4 * q + 3] += x.w;
        }
    }
    else
    {
#pragma unroll
        for (int q = 0; q < N / 2; ++q)
        {
            float2 const x = reinterpret_cast<float2 const*>(partials)[q];
            v[2 * q] += x.x;
            v[2 * q + 1] += x.y;
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
        addWarpPartials<N>(v, shared[buffer][w]);
    }
}

//! Sum of squares and dot with the score weights of one source's packs. SPLIT keeps one chain per pack,
//! for instruction-level parallelism when few sources are reduced at once.
template <typename T, int VEC, int ITEMS, bool SPLIT>
__device__ __forceinline__ void sourcePartials(
    Pack<T, VEC> const (&raw)[ITEMS], float const (&w)[ITEMS][VEC], float& sumSquares, float& dot)
{
    constexpr int kChains = SPLIT ? ITEMS : 1;
    float squares[kChains];
    float dots[kChains];
#pragma unroll
    for (int k = 0; k < kChains; ++k)
    {
        squares[k] = 0.F;
        dots[k] = 0.F;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
    {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
        {
            float const x = toFloat<T>(raw[k].v[j]);
            squares[k % kChains] = fmaf(x, x, squares[k % kChains]);
            dots[k % kChains] = fmaf(x, w[k][j], dots[k % kChains]);
        }
    }
    sumSquares = 0.F;
    dot = 0.F;
#pragma unroll
    for (int k = 0; k < kChains; ++k)
    {
        sumSquares += squares[k];
        dot += dots[k];
    }
}

//! Raw packs of sources i0 .. i0+G-1 of one row; absent sources and columns read as zeros.
template <typename T, int VEC, int ITEMS, int G>
__device__ __forceinline__ void loadGroup(Pack<T, VEC> (&raw)[G][ITEMS], SourceTable const& sources, int32_t numSources,
    int i0, bool active, int64_t row, int32_t dVec, int lane, int team)
{
    using P = Pack<T, VEC>;
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
    __shared__ __align__(16) float reduceBuffer[2][kMaxWarps][2 * kMaxGroup];

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
            loadGroup<T, VEC, ITEMS, G>(raw, sources, numSources, i0, active, row, dVec, lane, team);

            float partial[2 * G];
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                sourcePartials<T, VEC, ITEMS, (G <= 2)>(raw[g], w, partial[2 * g], partial[2 * g + 1]);
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
            // The same for the whole team, so the branch never splits a team; most groups skip it.
            if (groupMax > runningMax)
            {
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
            }
#pragma unroll
            for (int g = 0; g < G; ++g)
            {
                if (i0 + g < numSources)
                {
                    float const p = expf(logit[g] - runningMax);
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

//! Starts a 16-byte copy from global to shared memory (cp.async, sm_80+); it lands without registers.
__device__ __forceinline__ void copyAsync16(void* shared, void const* global)
{
    unsigned const address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(global) : "memory");
}

/*
 * One row per block for 16-byte packs of 16-bit types: the sources stream through kStages shared-memory
 * slots with cp.async, so kStages - 1 source rows (of this row or the block's next) are in flight while
 * the current one is reduced and folded, without spending registers on them. Each thread copies and
 * later reads only its own packs, so the slots need no barrier; the one per source is the reduction's.
 */
template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads) aggregateStreamKernel(__grid_constant__ SourceTable const sources,
    int32_t numSources, float const* __restrict__ scoreWeight, T* __restrict__ out, int64_t rows, int32_t dVec,
    float eps)
{
    using P = Pack<T, VEC>;
    static_assert(sizeof(P) == 16, "cp.async.cg moves 16 bytes");
    extern __shared__ __align__(16) unsigned char stageBytes[];
    P* const stages = reinterpret_cast<P*>(stageBytes); // [kStages][ITEMS][blockDim.x]
    __shared__ __align__(16) float reduceBuffer[2][kMaxWarps][2 * kMaxGroup];

    int const t = threadIdx.x;
    int const threads = blockDim.x;
    float const invD = 1.F / static_cast<float>(dVec * VEC);

    float w[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
    {
        int const c = t + k * threads;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
        {
            w[k][j] = c < dVec ? scoreWeight[static_cast<int64_t>(c) * VEC + j] : 0.F;
        }
    }

    // The (row, source) pairs of this block form one stream, so the copies run ahead across rows too:
    // the next one to issue, the slot it goes to, and the slot the next step reads.
    int64_t issueRow = blockIdx.x;
    int issueSource = 0;
    int issueSlot = 0;
    int readSlot = 0;
    auto issueNext = [&]() {
        if (issueRow < rows)
        {
            P const* src = static_cast<P const*>(sources.ptr[issueSource]) + issueRow * dVec;
            P* slot = stages + issueSlot * ITEMS * threads;
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
            {
                int const c = t + k * threads;
                if (c < dVec)
                {
                    copyAsync16(slot + k * threads + t, src + c);
                }
            }
        }
        // One group per step, empty past the block's last row, so the wait below always counts right.
        asm volatile("cp.async.commit_group;" ::: "memory");
        issueSlot = issueSlot + 1 == kStages ? 0 : issueSlot + 1;
        if (++issueSource == numSources)
        {
            issueSource = 0;
            issueRow += gridDim.x;
        }
    };
    for (int i = 0; i < kStages - 1; ++i)
    {
        issueNext();
    }

    int buffer = 0;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    {
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

        for (int i = 0; i < numSources; ++i)
        {
            // Refills the slot this thread read in the previous step, whose values it has already used.
            issueNext();
            asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
            P const* slot = stages + readSlot * ITEMS * threads;
            readSlot = readSlot + 1 == kStages ? 0 : readSlot + 1;
            P raw[ITEMS];
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
            {
                if (t + k * threads < dVec)
                {
                    raw[k] = slot[k * threads + t];
                }
                else
                {
#pragma unroll
                    for (int j = 0; j < VEC; ++j)
                    {
                        raw[k].v[j] = fromFloat<T>(0.F);
                    }
                }
            }

            float partial[2];
            sourcePartials<T, VEC, ITEMS, true>(raw, w, partial[0], partial[1]);
            teamReduceBlock<2>(partial, reduceBuffer, buffer);
            buffer ^= 1;

            float const logit = rsqrtf(partial[0] * invD + eps) * partial[1];
            if (logit > runningMax)
            {
                float const rescale = expf(runningMax - logit);
                runningMax = logit;
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
            }
            float const p = expf(logit - runningMax);
            runningSum += p;
#pragma unroll
            for (int k = 0; k < ITEMS; ++k)
            {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                {
                    acc[k][j] = fmaf(p, toFloat<T>(raw[k].v[j]), acc[k][j]);
                }
            }
        }

        float const norm = 1.F / runningSum;
        P* dst = reinterpret_cast<P*>(out) + row * dVec;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k)
        {
            int const c = t + k * threads;
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
    __shared__ __align__(16) float reduceBuffer[2][kMaxWarps][2 * kMaxGroup];
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
//! Sums 32 values over a warp in 31 shuffles: afterwards lane l returns the total of value l.
__device__ __forceinline__ float warpReduceScatter(float (&v)[kWarp])
{
    int const lane = threadIdx.x % kWarp;
#pragma unroll
    for (int half = kWarp / 2; half >= 1; half /= 2)
    {
        bool const upper = (lane & half) != 0;
#pragma unroll
        for (int j = 0; j < half; ++j)
        {
            float const keep = upper ? v[j + half] : v[j];
            float const give = upper ? v[j] : v[j + half];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, give, half);
        }
    }
    return v[0];
}
#endif

/*
 * Few rows: row blockIdx.y is cut into kClusterBlocks slices of blockDim.x packs, one per block of a
 * cluster. Each thread holds its pack of every source (at most kSplitMaxSources) in registers, so the
 * sources are read once; partial sums meet in distributed shared memory after one cluster barrier.
 * Every block sums the partials in rank order, so all slices use bit-identical weights.
 */
template <typename T, int VEC>
__global__ void __launch_bounds__(kSplitMaxThreads) aggregateSplitKernel(__grid_constant__ SourceTable const sources,
    int32_t numSources, float const* __restrict__ scoreWeight, T* __restrict__ out, int32_t dVec, float eps)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using P = Pack<T, VEC>;
    constexpr int N = 2 * kSplitMaxSources;
    static_assert(N == kWarp, "one partial per lane after the reduce-scatter");
    __shared__ __align__(16) float warpPartials[kSplitMaxThreads / kWarp][N];
    __shared__ float blockPartials[N];
    __shared__ float logits[kSplitMaxSources];
    namespace cg = cooperative_groups;
    cg::cluster_group const cluster = cg::this_cluster();

    int64_t const row = blockIdx.y;
    int const c = static_cast<int>(cluster.block_rank()) * blockDim.x + threadIdx.x;
    bool const inside = c < dVec;
    float const invD = 1.F / static_cast<float>(dVec * VEC);

    P raw[kSplitMaxSources];
#pragma unroll
    for (int i = 0; i < kSplitMaxSources; ++i)
    {
        if (inside && i < numSources)
        {
            raw[i] = static_cast<P const*>(sources.ptr[i])[row * dVec + c];
        }
        else
        {
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                raw[i].v[j] = fromFloat<T>(0.F);
            }
        }
    }
    float w[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j)
    {
        w[j] = inside ? scoreWeight[static_cast<int64_t>(c) * VEC + j] : 0.F;
    }

    float partial[N];
#pragma unroll
    for (int i = 0; i < kSplitMaxSources; ++i)
    {
        float sumSquares = 0.F;
        float dot = 0.F;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
        {
            float const x = toFloat<T>(raw[i].v[j]);
            sumSquares = fmaf(x, x, sumSquares);
            dot = fmaf(x, w[j], dot);
        }
        partial[2 * i] = sumSquares;
        partial[2 * i + 1] = dot;
    }
    warpPartials[threadIdx.x / kWarp][threadIdx.x % kWarp] = warpReduceScatter(partial);
    __syncthreads();
    int const nbWarps = blockDim.x / kWarp;
    if (threadIdx.x < 2 * numSources)
    {
        float total = 0.F;
        for (int v = 0; v < nbWarps; ++v)
        {
            total += warpPartials[v][threadIdx.x];
        }
        blockPartials[threadIdx.x] = total;
    }
    cluster.sync();
    if (threadIdx.x < numSources)
    {
        float sumSquares = 0.F;
        float dot = 0.F;
        for (int r = 0; r < kClusterBlocks; ++r)
        {
            float const* remote = cluster.map_shared_rank(blockPartials, r);
            sumSquares += remote[2 * threadIdx.x];
            dot += remote[2 * threadIdx.x + 1];
        }
        logits[threadIdx.x] = rsqrtf(sumSquares * invD + eps) * dot;
    }
    // Done with the other blocks' shared memory; the matching wait keeps this block's alive until then.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    __syncthreads();

    float maxLogit = -INFINITY;
    for (int i = 0; i < numSources; ++i)
    {
        maxLogit = fmaxf(maxLogit, logits[i]);
    }
    float acc[VEC] = {};
    float total = 0.F;
#pragma unroll
    for (int i = 0; i < kSplitMaxSources; ++i)
    {
        if (i < numSources)
        {
            float const p = expf(logits[i] - maxLogit);
            total += p;
#pragma unroll
            for (int j = 0; j < VEC; ++j)
            {
                acc[j] = fmaf(p, toFloat<T>(raw[i].v[j]), acc[j]);
            }
        }
    }
    if (inside)
    {
        float const norm = 1.F / total;
        P result;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
        {
            result.v[j] = fromFloat<T>(acc[j] * norm);
        }
        reinterpret_cast<P*>(out)[row * dVec + c] = result;
    }
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
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
    int computeMajor;
    cudaStream_t stream;
};

int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

//! Enough blocks to fill the GPU (occupancy-limited), never more than there is work for.
template <typename Kernel>
cudaError_t gridSize(Kernel kernel, int threads, size_t sharedBytes, int64_t blocksOfWork, int numSMs, int* grid)
{
    int perSM = 1;
    if (blocksOfWork > numSMs)
    {
        cudaError_t const status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSM, kernel, threads, sharedBytes);
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
    cudaError_t const status = gridSize(kernel, threads, 0, ceilDiv(a.rows, rowsPerBlock), a.numSMs, &grid);
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<grid, threads, 0, a.stream>>>(
        a.table, a.numSources, a.scoreWeight, static_cast<T*>(a.out), a.rows, a.dVec, a.eps, team);
    return cudaGetLastError();
}

template <typename T, int VEC, int ITEMS>
cudaError_t launchStream(LaunchArgs const& a, int threads)
{
    auto kernel = aggregateStreamKernel<T, VEC, ITEMS>;
    size_t const sharedBytes = static_cast<size_t>(kStages) * ITEMS * threads * sizeof(Pack<T, VEC>);
    // Always the same (largest) limit, so that launches from several host threads cannot disagree.
    cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxStageBytes);
    if (status != cudaSuccess)
    {
        return status;
    }
    int grid = 0;
    status = gridSize(kernel, threads, sharedBytes, a.rows, a.numSMs, &grid);
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<grid, threads, sharedBytes, a.stream>>>(
        a.table, a.numSources, a.scoreWeight, static_cast<T*>(a.out), a.rows, a.dVec, a.eps);
    return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launchTwoSweep(LaunchArgs const& a)
{
    auto kernel = aggregateTwoSweepKernel<T, VEC>;
    int grid = 0;
    cudaError_t const status = gridSize(kernel, kSweepThreads, 0, a.rows, a.numSMs, &grid);
    if (status != cudaSuccess)
    {
        return status;
    }
    kernel<<<grid, kSweepThreads, 0, a.stream>>>(
        a.table, a.numSources, a.scoreWeight, static_cast<T*>(a.out), a.rows, a.dVec, a.eps);
    return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launchSplit(LaunchArgs const& a, int threads)
{
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kClusterBlocks;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kClusterBlocks, static_cast<unsigned>(a.rows), 1);
    config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
    config.dynamicSmemBytes = 0;
    config.stream = a.stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    cudaError_t const status = cudaLaunchKernelEx(&config, aggregateSplitKernel<T, VEC>, a.table, a.numSources,
        a.scoreWeight, static_cast<T*>(a.out), a.dVec, a.eps);
    return status != cudaSuccess ? status : cudaGetLastError();
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

//! A block of `threads` per row: 16-bit vector packs stream through shared memory when the stages fit
//! (their arithmetic per byte is twice float32's, so they need more bytes in flight); otherwise the
//! sources go straight into registers, which float32 turns into full bandwidth already.
template <typename T, int VEC>
cudaError_t launchRowBlock(LaunchArgs const& a, int items, int threads)
{
    if constexpr (sizeof(T) == 2 && VEC == 8)
    {
        if (static_cast<int64_t>(kStages) * items * threads * sizeof(Pack<T, VEC>) <= kMaxStageBytes)
        {
            switch (items)
            {
            case 1: return launchStream<T, VEC, 1>(a, threads);
            case 2: return launchStream<T, VEC, 2>(a, threads);
            case 4: return launchStream<T, VEC, 4>(a, threads);
            case 8:
                if constexpr (VEC * 8 <= kMaxElementsPerThread)
                {
                    return launchStream<T, VEC, 8>(a, threads);
                }
                break;
            default: break;
            }
            return cudaErrorInvalidValue;
        }
    }
    return launchRegisterItems<T, VEC>(a, items, threads, threads);
}

/*
 * Picks the path: a cluster per row for a few rows (sm_90+); a warp (or part of one) per row when the row
 * fits in 32 threads' registers; otherwise a block per row, with the most packs per thread (fewest
 * threads, cheapest reductions) and at most 256 threads when there are many rows, or the fewest packs
 * (more loads in flight) and up to 512 threads for few rows; wider rows take the two-sweep path.
 */
template <typename T, int VEC>
cudaError_t launchTyped(LaunchArgs const& a)
{
    int64_t const splitThreads = ceilDiv(ceilDiv(a.dVec, kClusterBlocks), kWarp) * kWarp;
    if (a.computeMajor >= 9 && a.numSources > kSplitMinSources && a.numSources <= kSplitMaxSources
        && a.rows * kClusterBlocks <= a.numSMs
        && a.dVec >= kClusterBlocks * kWarp && splitThreads <= kSplitMaxThreads)
    {
        return launchSplit<T, VEC>(a, static_cast<int>(splitThreads));
    }
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
    bool const manyRows = a.rows >= 2 * static_cast<int64_t>(a.numSMs);
    int const preferredCap = manyRows ? 256 : kMaxThreads;
    for (int cap : {preferredCap, kMaxThreads})
    {
        for (int step = 0; step < Choices::kCount; ++step)
        {
            int const c = manyRows ? Choices::kCount - 1 - step : step;
            int64_t const threads = ceilDiv(a.dVec, Choices::kItems[c]);
            if (threads <= cap)
            {
                int const rounded = static_cast<int>(ceilDiv(threads, kWarp) * kWarp);
                return launchRowBlock<T, VEC>(a, Choices::kItems[c], rounded);
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
    status = cudaDeviceGetAttribute(&args.computeMajor, cudaDevAttrComputeCapabilityMajor, device);
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
