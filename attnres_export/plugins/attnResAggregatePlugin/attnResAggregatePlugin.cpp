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
using nvinfer1::IPluginCapability;
using nvinfer1::IPluginV3;
using nvinfer1::PluginCapabilityType;
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

bool checkCounts(int32_t nbInputs, int32_t nbOutputs)
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

//! Checks the operand shapes of one node; logs what is wrong and returns false on the first problem.
bool checkShapes(Dims const* dims, int32_t nbInputs)
{
    char const* const weights[] = {"score_weight"};
    return checkAggregateShapes(kAGGREGATE_NAME, dims, nbInputs, weights, 1);
}

} // namespace

AttnResAggregatePlugin::AttnResAggregatePlugin(float eps)
    : mEps{eps}
{
}

AttnResAggregatePlugin::AttnResAggregatePlugin(AttnResAggregatePlugin const& other)
    : IPluginV3{}
    , IPluginV3OneCore{}
    , IPluginV3OneBuild{}
    , IPluginV3OneRuntime{}
    , mEps{other.mEps}
    , mNbSources{other.mNbSources}
{
}

IPluginCapability* AttnResAggregatePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    case PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    }
    return nullptr;
}

IPluginV3* AttnResAggregatePlugin::clone() noexcept
{
    try
    {
        return new AttnResAggregatePlugin(*this);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "clone");
    }
    return nullptr;
}

char const* AttnResAggregatePlugin::getPluginName() const noexcept
{
    return kAGGREGATE_NAME;
}

char const* AttnResAggregatePlugin::getPluginVersion() const noexcept
{
    return kAGGREGATE_VERSION;
}

char const* AttnResAggregatePlugin::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

int32_t AttnResAggregatePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /* out */,
    int32_t nbOutputs) noexcept
{
    try
    {
        if (!checkCounts(nbInputs, nbOutputs))
        {
            return -1;
        }
        std::vector<Dims> dims(static_cast<size_t>(nbInputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[static_cast<size_t>(i)] = in[i].desc.dims;
        }
        if (!checkShapes(dims.data(), nbInputs))
        {
            return -1;
        }
        mNbSources = nbInputs - 1;
        return 0;
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "configurePlugin");
    }
    return -1;
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

size_t AttnResAggregatePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /* inputs */, int32_t /* nbInputs */,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    return 0;
}

int32_t AttnResAggregatePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept
{
    try
    {
        if (!checkCounts(nbInputs, nbOutputs))
        {
            return -1;
        }
        std::vector<Dims> dims(static_cast<size_t>(nbInputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims[static_cast<size_t>(i)] = in[i].dims;
        }
        if (!checkShapes(dims.data(), nbInputs))
        {
            return -1;
        }
        mNbSources = nbInputs - 1;
        return 0;
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "onShapeChange");
    }
    return -1;
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
        if (status != cudaSuccess)
        {
            logError(std::string{kAGGREGATE_NAME} + ": kernel launch failed: " + cudaGetErrorString(status));
            return -1;
        }
        return 0;
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "enqueue");
    }
    return -1;
}

nvinfer1::IPluginV3* AttnResAggregatePlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    return clone();
}

PluginFieldCollection const* AttnResAggregatePlugin::getFieldsToSerialize() noexcept
{
    try
    {
        mFieldsToSerialize.clear();
        mFieldsToSerialize.emplace_back(kEPS_FIELD, &mEps, PluginFieldType::kFLOAT32, 1);
        mFieldCollection.nbFields = static_cast<int32_t>(mFieldsToSerialize.size());
        mFieldCollection.fields = mFieldsToSerialize.data();
        return &mFieldCollection;
    }
    catch (std::exception const& e)
    {
        caughtError(e, kAGGREGATE_NAME, "getFieldsToSerialize");
    }
    return nullptr;
}

AttnResAggregatePluginCreator::AttnResAggregatePluginCreator()
{
    mFields.emplace_back(kEPS_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

char const* AttnResAggregatePluginCreator::getPluginName() const noexcept
{
    return kAGGREGATE_NAME;
}

char const* AttnResAggregatePluginCreator::getPluginVersion() const noexcept
{
    return kAGGREGATE_VERSION;
}

char const* AttnResAggregatePluginCreator::getPluginNamespace() const noexcept
{
    return kPLUGIN_NAMESPACE;
}

PluginFieldCollection const* AttnResAggregatePluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* AttnResAggregatePluginCreator::createPlugin(
    char const* /* name */, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    try
    {
        std::string const node{std::string{kAGGREGATE_NAME} + ": "};
        ATTNRES_PLUGIN_VALIDATE(fc == nullptr || fc->nbFields <= 0 || fc->fields != nullptr,
            node + "the field collection has " + std::to_string(fc->nbFields) + " fields but no field array");
        bool found = false;
        float eps = 0.F;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& field = fc->fields[i];
            if (field.name != nullptr && std::strcmp(field.name, kEPS_FIELD) == 0)
            {
                readFloatField(node, field, eps);
                found = true;
            }
        }
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
