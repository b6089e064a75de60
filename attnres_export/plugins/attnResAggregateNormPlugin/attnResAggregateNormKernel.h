/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * AttnResAggregateNorm (docs/op-set.md#attnresaggregatenorm): a depth aggregation followed by the RMSNorm that
 * reads it, as a CUDA launcher with a plain C ABI, so that ctypes, the TensorRT plugin and any other runtime
 * call the same function.
 */
#ifndef ATTNRES_AGGREGATE_NORM_KERNEL_H
#define ATTNRES_AGGREGATE_NORM_KERNEL_H

/* ATTNRES_KERNEL_API and the AttnresDtype codes are shared by every attnres kernel. */
#include "common/attnresKernelApi.h"
/* attnresAggregateLaunch (composed here) and ATTNRES_MAX_SOURCES. */
#include "common/attnresAggregateApi.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * h[r, :] = round_T(AttnResAggregate(scoreWeight, sources, eps)[r, :])        (attnresAggregateLaunch)
 * y[r, :] = round_T(hf * rsqrt(mean(hf^2) + normEps) * normWeight), hf = float32(h[r, :] as stored)
 *
 * scoreWeight, normWeight: device float32 [d]. sources: HOST array of numSources (1..ATTNRES_MAX_SOURCES)
 * device pointers, each [rows, d] of dtype (AttnresDtype). outY: device [rows, d] of dtype. outH: device
 * [rows, d] of dtype that receives h (the op's optional second output, or scratch the caller provides); it
 * must not be outY. eps, normEps: finite and >= 0. All arithmetic is float32.
 *
 * Two kernels on stream, in order: the AttnResAggregate kernel writes outH, then a row-wise RMSNorm kernel
 * reads it and writes outY. No synchronisation; returns cudaErrorInvalidValue for bad arguments, otherwise
 * the first launch error (cudaGetLastError).
 */
ATTNRES_KERNEL_API cudaError_t attnresAggregateNormLaunch(float const* scoreWeight, float const* normWeight,
    void const* const* sources, int32_t numSources, int64_t rows, int32_t d, float eps, float normEps, int32_t dtype,
    void* outY, void* outH, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_AGGREGATE_NORM_KERNEL_H */
