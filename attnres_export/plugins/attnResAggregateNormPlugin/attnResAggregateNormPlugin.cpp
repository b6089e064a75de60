/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "attnResAggregateNormPlugin/attnResAggregateNormPlugin.h"

#include "attnResAggregateNormPlugin/attnResAggregateNormKernel.h"
#include "common/attnresPluginCommon.h"

#include <cstring>
#include <exception>
#include <string>

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IPluginV3;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

namespace attnres
{
namespace plugin
{
namespace
{

constexpr char const* kEPS_FIELD{"eps"};
constexpr char const* kNORM_EPS_FIELD{"norm_eps"};
constexpr char const* kHAS_AGGREGATE_FIELD{"has_aggregate"};
constexpr int32_t kMAX_SOURCES{ATTNRES_MAX_SOURCES};
constexpr int32_t kNB_WEIGHTS{2}; //!< score_weight, norm_weight; the sources follow

std::string const& nodePrefix()
{
    static std::string const prefix{std::string{kAGGREGATE_NORM_NAME} + ": "};
    return prefix;
}

//! Whether a node of nbInputs inputs and nbOutputs outputs fits: 2 weights, 1..256 sources, 1 + hasAggregate outputs.
bool countsFit(int32_t nbInputs, int32_t nbOutputs, int32_t hasAggregate) noexcept
{
    return nbInputs > kNB_WEIGHTS && nbInputs - kNB_WEIGHTS <= kMAX_SOURCES && nbOutputs == 1 + hasAggregate;
}

//! has_aggregate: one integer, 0 or 1.
bool readPresence(PluginField const& field, int32_t& value) noexcept
{
    int32_t raw = 0;
    if (!readInt(field, raw) || raw < 0 || raw > 1)
    {
        return false;
    }
    value = raw;
    return true;
}

} // namespace

AttnResAggregateNormPlugin::AttnResAggregateNormPlugin(float eps, float normEps, int32_t hasAggregate)
    : mEps{eps}
    , mNormEps{normEps}
    , mHasAggregate{hasAggregate}
{
}

bool AttnResAggregateNormPlugin::checkCounts(int32_t nbInputs, int32_t nbOutputs) const
{
    if (!countsFit(nbInputs, nbOutputs, mHasAggregate))
    {
        logError(nodePrefix() + "expects score_weight, norm_weight and 1.." + std::to_string(kMAX_SOURCES)
            + " sources and " + std::to_string(1 + mHasAggregate) + " output(s) (has_aggregate="
            + std::to_string(mHasAggregate) + "), got " + std::to_string(nbInputs) + " inputs and "
            + std::to_string(nbOutputs) + " outputs");
        return false;
    }
    return true;
}

int32_t AttnResAggregateNormPlugin::configureInputs(Dims const* dims, int32_t nbInputs)
{
    char const* const weights[kNB_WEIGHTS] = {"score_weight", "norm_weight"};
    if (!checkAggregateShapes(kAGGREGATE_NORM_NAME, dims, nbInputs, weights, kNB_WEIGHTS))
    {
        return -1;
    }
    mNbSources = nbInputs - kNB_WEIGHTS;
    return 0;
}

void AttnResAggregateNormPlugin::addFieldsToSerialize(std::vector<PluginField>& fields)
{
    fields.emplace_back(kEPS_FIELD, &mEps, PluginFieldType::kFLOAT32, 1);
    fields.emplace_back(kNORM_EPS_FIELD, &mNormEps, PluginFieldType::kFLOAT32, 1);
    fields.emplace_back(kHAS_AGGREGATE_FIELD, &mHasAggregate, PluginFieldType::kINT32, 1);
}

int32_t AttnResAggregateNormPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (!countsFit(nbInputs, nbOutputs, mHasAggregate))
    {
        return -1;
    }
    for (int32_t o = 0; o < nbOutputs; ++o)
    {
        outputTypes[o] = inputTypes[kNB_WEIGHTS]; // y and h have the sources' type
    }
    return 0;
}

int32_t AttnResAggregateNormPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
{
    if (!countsFit(nbInputs, nbOutputs, mHasAggregate))
    {
        return -1;
    }
    for (int32_t o = 0; o < nbOutputs; ++o)
    {
        outputs[o] = inputs[kNB_WEIGHTS]; // y and h have the sources' shape
    }
    return 0;
}

bool AttnResAggregateNormPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (!countsFit(nbInputs, nbOutputs, mHasAggregate) || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos < kNB_WEIGHTS)
    {
        return desc.type == DataType::kFLOAT; // score_weight, norm_weight
    }
    if (pos == kNB_WEIGHTS)
    {
        return isKernelDataType(desc.type); // source 0 decides T
    }
    return desc.type == inOut[kNB_WEIGHTS].desc.type; // the other sources, y and h
}

int32_t AttnResAggregateNormPlugin::getNbOutputs() const noexcept
{
    return 1 + mHasAggregate;
}

size_t AttnResAggregateNormPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    // With has_aggregate = 1 the launcher writes h into the output h; else into this workspace: the largest
    // sources' shape (the max of the optimization profile) in their type.
    if (mHasAggregate != 0 || nbInputs <= kNB_WEIGHTS)
    {
        return 0;
    }
    Dims const& max = inputs[kNB_WEIGHTS].max;
    size_t bytes = kernelElementSize(inputs[kNB_WEIGHTS].desc.type);
    for (int32_t i = 0; i < max.nbDims; ++i)
    {
        if (max.d[i] < 0)
        {
            return 0; // no max extent (TensorRT always gives one): no workspace, and enqueue then fails
        }
        bytes *= static_cast<size_t>(max.d[i]);
    }
    return bytes;
}

int32_t AttnResAggregateNormPlugin::enqueue(PluginTensorDesc const* inputDesc,
    PluginTensorDesc const* /* outputDesc */, void const* const* inputs, void* const* outputs, void* workspace,
    cudaStream_t stream) noexcept
{
    try
    {
        // enqueue is not told the input count: configurePlugin / onShapeChange recorded it.
        if (mNbSources < 1)
        {
            logError(nodePrefix() + "enqueue before configurePlugin / onShapeChange: the number of sources is unknown");
            return -1;
        }
        int64_t rows = 0;
        int32_t d = 0;
        if (!rowsAndWidth(kAGGREGATE_NORM_NAME, inputDesc[kNB_WEIGHTS].dims, rows, d))
        {
            return -1;
        }
        // h: the second output when the node has it, else the workspace (getWorkspaceSize).
        void* const h = mHasAggregate != 0 ? outputs[1] : workspace;
        cudaError_t const status = attnresAggregateNormLaunch(static_cast<float const*>(inputs[0]),
            static_cast<float const*>(inputs[1]), inputs + kNB_WEIGHTS, mNbSources, rows, d, mEps, mNormEps,
            kernelDtype(inputDesc[kNB_WEIGHTS].type), outputs[0], h, stream);
        return launchResult(kAGGREGATE_NORM_NAME, status);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NORM_NAME, "enqueue");
    }
    return -1;
}

AttnResAggregateNormPluginCreator::AttnResAggregateNormPluginCreator()
{
    mFields.emplace_back(kEPS_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back(kNORM_EPS_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back(kHAS_AGGREGATE_FIELD, nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection = fieldCollection(mFields);
}

IPluginV3* AttnResAggregateNormPluginCreator::createPlugin(
    char const* /* name */, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    try
    {
        std::string const& node = nodePrefix();
        bool hasEps = false;
        bool hasNormEps = false;
        float eps = 0.F;
        float normEps = 0.F;
        int32_t hasAggregate = 0; // optional: absent means y is the only output
        forEachNamedField(node, fc, [&](PluginField const& field) {
            if (std::strcmp(field.name, kEPS_FIELD) == 0)
            {
                readFloatField(node, field, eps);
                hasEps = true;
            }
            else if (std::strcmp(field.name, kNORM_EPS_FIELD) == 0)
            {
                readFloatField(node, field, normEps);
                hasNormEps = true;
            }
            else if (std::strcmp(field.name, kHAS_AGGREGATE_FIELD) == 0)
            {
                ATTNRES_PLUGIN_VALIDATE(readPresence(field, hasAggregate),
                    node + "field has_aggregate must be one int32 of 0 or 1");
            }
        });
        requireFiniteNonNegative(node, kEPS_FIELD, hasEps, eps);
        requireFiniteNonNegative(node, kNORM_EPS_FIELD, hasNormEps, normEps);
        // The sources are inputs, not a field: configurePlugin / onShapeChange check their count (1..256).
        return new AttnResAggregateNormPlugin(eps, normEps, hasAggregate);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NORM_NAME, "createPlugin");
    }
    return nullptr;
}

} // namespace plugin
} // namespace attnres
