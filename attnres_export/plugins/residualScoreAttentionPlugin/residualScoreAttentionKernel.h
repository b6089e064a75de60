/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * ResidualScoreAttention (RealFormer, docs/op-set.md#residualscoreattention) as a CUDA kernel with a plain C ABI, so that ctypes,
 * the TensorRT plugin and any other runtime call the same launcher.
 */
#ifndef ATTNRES_RESIDUAL_SCORE_ATTENTION_KERNEL_H
#define ATTNRES_RESIDUAL_SCORE_ATTENTION_KERNEL_H

/* ATTNRES_KERNEL_API and the AttnresDtype codes are shared by every attnres kernel. */
#include "common/attnresKernelApi.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head size (dh of q and k, dv of v) the kernel takes. */
#define ATTNRES_RSA_MAX_HEAD_DIM 128

/*
 * One RealFormer attention with residual scores, per (b, h):
 *
 *   scores = scale * q @ k^T + prevScores            float32 [Tq, Tk], written to `scores`
 *   logits = scores / logitDivisor + maskBias
 *   out    = softmax(logits, over Tk) @ v            dtype   [Tq, dv], written to `out`
 *
 * q [B,H,Tq,dh], k [B,H,Tk,dh], v [B,H,Tk,dv], out [B,H,Tq,dv]: device, contiguous, of `dtype`
 * (AttnresDtype: float32, float16 or bfloat16). prevScores: device float32 [B,H,Tq,Tk] contiguous, or
 * NULL (first layer: taken as zeros). maskBias: device float32 or NULL; element (b,h,i,j) is read at
 * maskBias[b*maskStrideB + h*maskStrideH + i*maskStrideQ + j*maskStrideK] (strides in elements, >= 0;
 * 0 broadcasts that axis, e.g. a [B,1,1,Tk] mask has strides (Tk, 0, 0, 1)). scores: device float32
 * [B,H,Tq,Tk] contiguous; it may alias prevScores exactly (in-place update), no other overlap.
 * 1 <= dh, dv <= ATTNRES_RSA_MAX_HEAD_DIM. All accumulation is float32 (scores exactly so; float16 and
 * bfloat16 round the probabilities to dtype for the tensor-core P @ v); the [Tq,Tk] probabilities are never
 * written to memory.
 *
 * Enqueued on `stream` with no synchronisation. Returns cudaErrorInvalidValue for bad arguments (NULL
 * pointers, sizes out of range, non-finite scale, zero or non-finite logitDivisor, negative strides),
 * otherwise the launch error (cudaGetLastError). B, H or Tq of 0 is a no-op; Tk = 0 writes zeros to out.
 */
ATTNRES_KERNEL_API cudaError_t residualScoreAttentionLaunch(void const* q, void const* k, void const* v,
    float const* prevScores, float const* maskBias, int64_t maskStrideB, int64_t maskStrideH, int64_t maskStrideQ,
    int64_t maskStrideK, int32_t B, int32_t H, int32_t Tq, int32_t Tk, int32_t dh, int32_t dv, float scale,
    float logitDivisor, int32_t dtype, void* out, float* scores, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_RESIDUAL_SCORE_ATTENTION_KERNEL_H */
