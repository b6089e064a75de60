/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * TensorRT IPluginV3 for ResidualScoreAttention (RealFormer, docs/op-set.md#residualscoreattention): inputs q, k, v of one type T
 * (float32, float16, bfloat16), then optional prev_scores and mask_bias (float32); outputs out (T) and
 * scores (float32); fields scale, logit_divisor and the optional has_prev_scores / has_mask.
 */
#ifndef ATTNRES_RESIDUAL_SCORE_ATTENTION_PLUGIN_H
#define ATTNRES_RESIDUAL_SCORE_ATTENTION_PLUGIN_H

#include "common/attnresPluginBase.h"

#include "NvInferRuntime.h"

#include <cstdint>
#include <vector>

namespace attnres
{
namespace plugin
{

//! Plugin name (= ONNX op type) and version (attnres_export.ops.opset.RESIDUAL_ATTENTION, PLUGIN_VERSION).
constexpr char const* kRESIDUAL_ATTENTION_NAME{"ResidualScoreAttention"};
constexpr char const* kRESIDUAL_ATTENTION_VERSION{"1"};

//! Which of the 3..5 inputs are prev_scores and mask_bias (-1: absent).
struct ResidualAttentionRoles
{
    int32_t prevScores{-1};
    int32_t maskBias{-1};
};

class ResidualScoreAttentionPlugin : public PluginBase<ResidualScoreAttentionPlugin>
{
public:
    static constexpr char const* kNAME{kRESIDUAL_ATTENTION_NAME};
    static constexpr char const* kVERSION{kRESIDUAL_ATTENTION_VERSION};

    //! hasPrevScores / hasMask: 1 present, 0 absent, -1 unknown (inferred from the inputs' count and shapes).
    ResidualScoreAttentionPlugin(float scale, float logitDivisor, int32_t hasPrevScores, int32_t hasMask);

    // IPluginV3OneBuild
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;

    // IPluginV3OneRuntime
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;

private:
    friend class PluginBase<ResidualScoreAttentionPlugin>;

    bool checkCounts(int32_t nbInputs, int32_t nbOutputs) const;
    //! Resolves the roles of inputs 3 and 4, checks every shape and records the count and the roles.
    int32_t configureInputs(nvinfer1::Dims const* dims, int32_t nbInputs);
    void addFieldsToSerialize(std::vector<nvinfer1::PluginField>& fields);

    float mScale;
    float mLogitDivisor;
    int32_t mHasPrevScores;
    int32_t mHasMask;
    int32_t mNbInputs{0};           //!< set by configurePlugin / onShapeChange: enqueue is not told the count
    ResidualAttentionRoles mRoles{}; //!< which inputs are prev_scores / mask_bias, resolved with the count
};

class ResidualScoreAttentionPluginCreator : public CreatorBase<ResidualScoreAttentionPlugin>
{
public:
    ResidualScoreAttentionPluginCreator();

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;
};

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_RESIDUAL_SCORE_ATTENTION_PLUGIN_H
