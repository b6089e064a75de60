/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "attnResAggregatePlugin/attnResAggregatePlugin.h"

#include "attnResAggregatePlugin/attnResAggregateKernel.h"
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
constexpr int32_t kMAX_SOURCES{ATTNRES_MAX_SOURCES};

} // namespace

AttnResAggregatePlugin::AttnResAggregatePlugin(float eps)
    : mEps{eps}
{
}

bool AttnResAggregatePlugin::checkCounts(int32_t nbInputs, int32_t nbOutputs) const
{
    if (nbInputs < 2 || nbInputs - 1 > kMAX_SOURCES || nbOutputs != 1)
    {
        logError(std::string{kAGGREGATE_NAME} + ": expects score_weight and 1.." + std::to_string(kMAX_SOURCES)
            + " sources and one output, got " + std::to_string(nbInputs) + " inputs and "
            + std::to_string(nbOutputs) + " outputs");
        return false;
    }
    return true;
}

int32_t AttnResAggregatePlugin::configureInputs(Dims const* dims, int32_t nbInputs)
{
    char const* const weights[] = {"score_weight"};
    if (!checkAggregateShapes(kAGGREGATE_NAME, dims, nbInputs, weights, 1))
    {
        return -1;
    }
    mNbSources = nbInputs - 1;
    return 0;
}

void AttnResAggregatePlugin::addFieldsToSerialize(std::vector<PluginField>& fields)
{
    fields.emplace_back(kEPS_FIELD, &mEps, PluginFieldType::kFLOAT32, 1);
}

int32_t AttnResAggregatePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs < 2)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[1];
    return 0;
}

int32_t AttnResAggregatePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
{
    if (nbOutputs != 1 || nbInputs < 2)
    {
        return -1;
    }
    outputs[0] = inputs[1];
    return 0;
}

bool AttnResAggregatePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs < 2 || nbInputs - 1 > kMAX_SOURCES || nbOutputs != 1 || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == 0)
    {
        return desc.type == DataType::kFLOAT;
    }
    if (pos == 1)
    {
        return isKernelDataType(desc.type);
    }
    return desc.type == inOut[1].desc.type;
}

int32_t AttnResAggregatePlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t AttnResAggregatePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* /* workspace */, cudaStream_t stream) noexcept
{
    try
    {
        // enqueue is not told the input count: configurePlugin / onShapeChange recorded it.
        if (mNbSources < 1)
        {
            logError(std::string{kAGGREGATE_NAME}
                + ": enqueue before configurePlugin / onShapeChange: the number of sources is unknown");
            return -1;
        }
        int64_t rows = 0;
        int32_t d = 0;
        if (!rowsAndWidth(kAGGREGATE_NAME, inputDesc[1].dims, rows, d))
        {
            return -1;
        }
        cudaError_t const status = attnresAggregateLaunch(static_cast<float const*>(inputs[0]), inputs + 1,
            mNbSources, rows, d, mEps, kernelDtype(inputDesc[1].type), outputs[0], stream);
        return launchResult(kAGGREGATE_NAME, status);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "enqueue");
    }
    return -1;
}

AttnResAggregatePluginCreator::AttnResAggregatePluginCreator()
{
    mFields.emplace_back(kEPS_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldCollection = fieldCollection(mFields);
}

IPluginV3* AttnResAggregatePluginCreator::createPlugin(
    char const* /* name */, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    try
    {
        std::string const node{std::string{kAGGREGATE_NAME} + ": "};
        bool found = false;
        float eps = 0.F;
        forEachNamedField(node, fc, [&](PluginField const& field) {
            if (std::strcmp(field.name, kEPS_FIELD) == 0)
            {
                readFloatField(node, field, eps);
                found = true;
            }
        });
        requireFiniteNonNegative(node, kEPS_FIELD, found, eps);
        // The sources are inputs, not a field: configurePlugin / onShapeChange check their count (1..256).
        return new AttnResAggregatePlugin(eps);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "createPlugin");
    }
    return nullptr;
}

} // namespace plugin
} // namespace attnres
