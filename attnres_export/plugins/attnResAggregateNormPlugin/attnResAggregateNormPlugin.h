/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * TensorRT IPluginV3 for AttnResAggregateNorm (docs/op-set.md#attnresaggregatenorm): a depth aggregation followed
 * by the RMSNorm that reads it. Inputs score_weight [D] float32, norm_weight [D] float32 and 1..256 sources
 * [..., D] of one type T (float32, float16, bfloat16); outputs y [..., D] of type T and, when the field
 * has_aggregate is 1, the aggregate h [..., D] of type T; fields eps, norm_eps, has_aggregate.
 */
#ifndef ATTNRES_AGGREGATE_NORM_PLUGIN_H
#define ATTNRES_AGGREGATE_NORM_PLUGIN_H

#include "common/attnresPluginBase.h"

#include "NvInferRuntime.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attnres
{
namespace plugin
{

//! Plugin name (= ONNX op type) and version (attnres_export.ops.opset.AGGREGATE_NORM, PLUGIN_VERSION).
constexpr char const* kAGGREGATE_NORM_NAME{"AttnResAggregateNorm"};
constexpr char const* kAGGREGATE_NORM_VERSION{"1"};

class AttnResAggregateNormPlugin : public PluginBase<AttnResAggregateNormPlugin>
{
public:
    static constexpr char const* kNAME{kAGGREGATE_NORM_NAME};
    static constexpr char const* kVERSION{kAGGREGATE_NORM_VERSION};

    //! hasAggregate: 1 when h is the second output, 0 when y is the only one (h goes to the workspace).
    AttnResAggregateNormPlugin(float eps, float normEps, int32_t hasAggregate);

    // IPluginV3OneBuild
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;

private:
    friend class PluginBase<AttnResAggregateNormPlugin>;

    bool checkCounts(int32_t nbInputs, int32_t nbOutputs) const;
    //! Shapes of one node's operands; records the source count (enqueue is not told it).
    int32_t configureInputs(nvinfer1::Dims const* dims, int32_t nbInputs);
    void addFieldsToSerialize(std::vector<nvinfer1::PluginField>& fields);

    float mEps;
    float mNormEps;
    int32_t mHasAggregate;
    int32_t mNbSources{0}; //!< set by configurePlugin / onShapeChange: enqueue is not told the input count
};

class AttnResAggregateNormPluginCreator : public CreatorBase<AttnResAggregateNormPlugin>
{
public:
    AttnResAggregateNormPluginCreator();

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;
};

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_AGGREGATE_NORM_PLUGIN_H
