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

#include "NvInferRuntime.h"

#include <cstdint>
#include <vector>

namespace attnres
{
namespace plugin
{

//! Plugin name (= ONNX op type) and version (attnres_export.ops.opset.AGGREGATE_NORM, PLUGIN_VERSION).
constexpr char const* kAGGREGATE_NORM_NAME{"AttnResAggregateNorm"};
constexpr char const* kAGGREGATE_NORM_VERSION{"1"};

class AttnResAggregateNormPlugin : public nvinfer1::IPluginV3,
                                   public nvinfer1::IPluginV3OneCore,
                                   public nvinfer1::IPluginV3OneBuild,
                                   public nvinfer1::IPluginV3OneRuntime
{
public:
    //! hasAggregate: 1 when h is the second output, 0 when y is the only one (h goes to the workspace).
    AttnResAggregateNormPlugin(float eps, float normEps, int32_t hasAggregate);
    AttnResAggregateNormPlugin(AttnResAggregateNormPlugin const& other);
    AttnResAggregateNormPlugin& operator=(AttnResAggregateNormPlugin const&) = delete;
    ~AttnResAggregateNormPlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
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
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    //! Counts, then shapes, of one node's operands; records the source count (enqueue is not told it).
    int32_t validate(nvinfer1::Dims const* dims, int32_t nbInputs, int32_t nbOutputs);

    float mEps;
    float mNormEps;
    int32_t mHasAggregate;
    int32_t mNbSources{0}; //!< set by configurePlugin / onShapeChange: enqueue is not told the input count
    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class AttnResAggregateNormPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    AttnResAggregateNormPluginCreator();
    ~AttnResAggregateNormPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_AGGREGATE_NORM_PLUGIN_H
