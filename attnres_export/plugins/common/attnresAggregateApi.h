/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The C ABI of the AttnResAggregate launcher (docs/op-set.md#attnresaggregate), shared by the plugins that
 * call it: AttnResAggregate (attnResAggregatePlugin/, which defines it in attnResAggregateKernel.cu) and
 * AttnResAggregateNorm (attnResAggregateNormPlugin/, whose launcher composes it with an RMSNorm). It lives
 * in common/ because a plugin folder includes only its own headers and common/.
 */
#ifndef ATTNRES_AGGREGATE_API_H
#define ATTNRES_AGGREGATE_API_H

/* ATTNRES_KERNEL_API and the AttnresDtype codes are shared by every attnres kernel. */
#include "common/attnresKernelApi.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most sources one call takes (attnres_export.ops.opset.MAX_SOURCES). */
#define ATTNRES_MAX_SOURCES 256

/*
 * out[r, :] = sum_i softmax_i(rsqrt(mean(v_i[r]^2) + eps) * dot(v_i[r], scoreWeight)) * v_i[r]
 *
 * scoreWeight: device float32 [d]. sources: HOST array of numSources device pointers, each [rows, d] of
 * dtype (AttnresDtype). out: device [rows, d] of dtype. Enqueued on stream with no synchronisation; returns
 * cudaErrorInvalidValue for bad arguments, otherwise the launch error (cudaGetLastError).
 */
ATTNRES_KERNEL_API cudaError_t attnresAggregateLaunch(float const* scoreWeight, void const* const* sources, int32_t numSources,
    int64_t rows, int32_t d, float eps, int32_t dtype, void* out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_AGGREGATE_API_H */
