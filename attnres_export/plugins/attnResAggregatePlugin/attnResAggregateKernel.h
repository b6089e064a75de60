/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * AttnResAggregate (docs/op-set.md#attnresaggregate) as a CUDA kernel with a plain C ABI, so that ctypes, the TensorRT plugin
 * and any other runtime call the same launcher.
 */
#ifndef ATTNRES_AGGREGATE_KERNEL_H
#define ATTNRES_AGGREGATE_KERNEL_H

/* ATTNRES_KERNEL_API and the AttnresDtype codes are shared by every attnres kernel. */
#include "common/attnresKernelApi.h"

/*
 * The launcher attnresAggregateLaunch and ATTNRES_MAX_SOURCES are declared in common/ because the
 * AttnResAggregateNorm launcher calls the same function (attnResAggregateNormPlugin/).
 */
#include "common/attnresAggregateApi.h"

#endif /* ATTNRES_AGGREGATE_KERNEL_H */
