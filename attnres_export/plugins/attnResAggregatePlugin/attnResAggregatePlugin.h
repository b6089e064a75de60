/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * TensorRT IPluginV3 for AttnResAggregate (docs/op-set.md#attnresaggregate): inputs score_weight [D] float32 and 1..256
 * sources [..., D] of one type T (float32, float16, bfloat16); output [..., D] of type T; field eps.
 */
#ifndef ATTNRES_AGGREGATE_PLUGIN_H
#define ATTNRES_AGGREGATE_PLUGIN_H

#include "common/attnresPluginBase.h"

#include "NvInferRuntime.h"

#include <cstdint>
#include <vector>

namespace attnres
{
namespace plugin
{

//! Plugin name (= ONNX op type) and version (attnres_export.ops.opset.AGGREGATE, PLUGIN_VERSION).
constexpr char const* kAGGREGATE_NAME{"AttnResAggregate"};
constexpr char const* kAGGREGATE_VERSION{"1"};

class AttnResAggregatePlugin : public PluginBase<AttnResAggregatePlugin>
{
public:
    static constexpr char const* kNAME{kAGGREGATE_NAME};
    static constexpr char const* kVERSION{kAGGREGATE_VERSION};

    explicit AttnResAggregatePlugin(float eps);

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
    friend class PluginBase<AttnResAggregatePlugin>;

    bool checkCounts(int32_t nbInputs, int32_t nbOutputs) const;
    int32_t configureInputs(nvinfer1::Dims const* dims, int32_t nbInputs);
    void addFieldsToSerialize(std::vector<nvinfer1::PluginField>& fields);

    float mEps;
    int32_t mNbSources{0}; //!< set by configurePlugin / onShapeChange: enqueue is not told the input count
};

class AttnResAggregatePluginCreator : public CreatorBase<AttnResAggregatePlugin>
{
public:
    AttnResAggregatePluginCreator();

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;
};

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_AGGREGATE_PLUGIN_H
