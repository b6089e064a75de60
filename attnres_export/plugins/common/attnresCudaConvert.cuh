/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Conversions between the storage types (float, __half, __nv_bfloat16) and the float32 the kernels compute
 * in; shared by every kernel so that each rounds the same way (round to nearest even).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace attnres
{

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

} // namespace attnres
