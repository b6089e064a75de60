/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The C ABI every attnres kernel launcher shares: the export macro and the storage-type codes. Each
 * kernel's own header (<plugin folder>/<name>Kernel.h) includes this one and declares its launcher; the
 * TensorRT plugins map nvinfer1::DataType onto these codes (common/attnresPluginCommon.h, kernelDtype).
 *
 * Conventions of every launcher: device pointers unless a parameter says otherwise, work enqueued on the
 * given stream with no synchronisation, cudaErrorInvalidValue for bad arguments, otherwise the launch
 * error (cudaGetLastError).
 */
#ifndef ATTNRES_KERNEL_API_H
#define ATTNRES_KERNEL_API_H

#include <cuda_runtime_api.h>
#include <stdint.h>

/* The launchers are the only symbols the libraries export besides TensorRT's entry points. */
#if defined(_WIN32)
#define ATTNRES_KERNEL_API __declspec(dllexport)
#else
#define ATTNRES_KERNEL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Storage types of a kernel's tensors (the `dtype` argument of every launcher); arithmetic is float32. */
enum AttnresDtype
{
    ATTNRES_DTYPE_FLOAT32 = 0,
    ATTNRES_DTYPE_FLOAT16 = 1,
    ATTNRES_DTYPE_BFLOAT16 = 2
};

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_KERNEL_API_H */
