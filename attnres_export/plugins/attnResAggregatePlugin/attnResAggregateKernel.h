/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * AttnResAggregate (SPEC 1.2) as a CUDA kernel with a plain C ABI, so that ctypes, the TensorRT plugin
 * and any other runtime call the same launcher.
 */
#ifndef ATTNRES_AGGREGATE_KERNEL_H
#define ATTNRES_AGGREGATE_KERNEL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

/* The launcher is the only symbol the libraries export besides TensorRT's entry points. */
#if defined(_WIN32)
#define ATTNRES_KERNEL_API __declspec(dllexport)
#else
#define ATTNRES_KERNEL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Storage types of the sources and the output; arithmetic is always float32. */
enum AttnresDtype
{
    ATTNRES_DTYPE_FLOAT32 = 0,
    ATTNRES_DTYPE_FLOAT16 = 1,
    ATTNRES_DTYPE_BFLOAT16 = 2
};

/* Most sources one call takes (attnres_export.ops.identity.MAX_SOURCES). */
#define ATTNRES_MAX_SOURCES 256

/*
 * out[r, :] = sum_i softmax_i(rsqrt(mean(v_i[r]^2) + eps) * dot(v_i[r], scoreWeight)) * v_i[r]
 *
 * scoreWeight: device float32 [d]. sources: HOST array of numSources device pointers, each [rows, d] of
 * dtype. out: device [rows, d] of dtype. Enqueued on stream with no synchronisation; returns
 * cudaErrorInvalidValue for bad arguments, otherwise the launch error (cudaGetLastError).
 */
ATTNRES_KERNEL_API cudaError_t attnresAggregateLaunch(float const* scoreWeight, void const* const* sources, int32_t numSources,
    int64_t rows, int32_t d, float eps, int32_t dtype, void* out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_AGGREGATE_KERNEL_H */
