/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common/attnresPluginCommon.h"

#include "common/attnresKernelApi.h"

#include <atomic>
#include <cmath>
#include <limits>

namespace attnres
{
namespace plugin
{
namespace
{
std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};
} // namespace

void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    gLoggerFinder.store(finder);
}

void logPluginMessage(nvinfer1::ILogger::Severity severity, char const* message) noexcept
{
    // Only the finder: this file links into libattnres_trt_dyn.so, which must import no TensorRT symbol
    // (registerPlugins.cpp hands libattnres_trt.so a finder that returns getLogger()).
    nvinfer1::ILoggerFinder* const finder = gLoggerFinder.load();
    nvinfer1::ILogger* const logger = finder != nullptr ? finder->findLogger() : nullptr;
    if (logger != nullptr)
    {
        logger->log(severity, message);
    }
}

void logError(std::string const& message) noexcept
{
    logPluginMessage(nvinfer1::ILogger::Severity::kERROR, message.c_str());
}

void throwPluginError(std::string const& message)
{
    throw PluginError(message);
}

void caughtError(std::exception const& error, char const* pluginName, char const* entryPoint) noexcept
{
    if (dynamic_cast<PluginError const*>(&error) != nullptr)
    {
        logPluginMessage(nvinfer1::ILogger::Severity::kERROR, error.what());
        return;
    }
    try
    {
        logError(std::string{pluginName} + ": " + entryPoint + " failed: " + error.what());
    }
    catch (std::exception const&)
    {
        logPluginMessage(nvinfer1::ILogger::Severity::kERROR, error.what()); // no memory for the context
    }
}

bool readFloat(nvinfer1::PluginField const& field, float& value) noexcept
{
    if (field.length != 1 || field.data == nullptr)
    {
        return false;
    }
    if (field.type == nvinfer1::PluginFieldType::kFLOAT32)
    {
        value = *static_cast<float const*>(field.data);
        return true;
    }
    if (field.type == nvinfer1::PluginFieldType::kFLOAT64)
    {
        value = static_cast<float>(*static_cast<double const*>(field.data));
        return true;
    }
    return false;
}

bool readInt(nvinfer1::PluginField const& field, int32_t& value) noexcept
{
    if (field.length != 1 || field.data == nullptr)
    {
        return false;
    }
    int64_t raw = 0;
    switch (field.type)
    {
    case nvinfer1::PluginFieldType::kINT32: raw = *static_cast<int32_t const*>(field.data); break;
    case nvinfer1::PluginFieldType::kINT64: raw = *static_cast<int64_t const*>(field.data); break;
    case nvinfer1::PluginFieldType::kINT8: raw = *static_cast<int8_t const*>(field.data); break;
    case nvinfer1::PluginFieldType::kINT16: raw = *static_cast<int16_t const*>(field.data); break;
    default: return false;
    }
    if (raw < std::numeric_limits<int32_t>::min() || raw > std::numeric_limits<int32_t>::max())
    {
        return false;
    }
    value = static_cast<int32_t>(raw);
    return true;
}

nvinfer1::PluginFieldCollection fieldCollection(std::vector<nvinfer1::PluginField> const& fields) noexcept
{
    nvinfer1::PluginFieldCollection collection{};
    collection.nbFields = static_cast<int32_t>(fields.size());
    collection.fields = fields.data();
    return collection;
}

void readFloatField(std::string const& node, nvinfer1::PluginField const& field, float& value)
{
    std::string const name{field.name != nullptr ? field.name : "?"};
    ATTNRES_PLUGIN_VALIDATE(field.length == 1 && field.data != nullptr, node + "field " + name + " must hold one value");
    ATTNRES_PLUGIN_VALIDATE(readFloat(field, value), node + "field " + name + " must be float32");
}

void requireFiniteNonNegative(std::string const& node, char const* name, bool found, float value)
{
    ATTNRES_PLUGIN_VALIDATE(found, node + "required field " + name + " is missing");
    ATTNRES_PLUGIN_VALIDATE(std::isfinite(value) && value >= 0.F,
        node + name + " must be finite and >= 0, got " + std::to_string(value));
}

int32_t kernelDtype(nvinfer1::DataType type) noexcept
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return ATTNRES_DTYPE_FLOAT32;
    case nvinfer1::DataType::kHALF: return ATTNRES_DTYPE_FLOAT16;
    case nvinfer1::DataType::kBF16: return ATTNRES_DTYPE_BFLOAT16;
    default: return -1;
    }
}

bool isKernelDataType(nvinfer1::DataType type) noexcept
{
    return kernelDtype(type) >= 0;
}

size_t kernelElementSize(nvinfer1::DataType type) noexcept
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return 4;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16: return 2;
    default: return 0;
    }
}

std::string dimsToString(nvinfer1::Dims const& dims)
{
    std::string text{"["};
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        text += (i > 0 ? ", " : "") + std::to_string(dims.d[i]);
    }
    return text + "]";
}

int32_t launchResult(char const* pluginName, cudaError_t status)
{
    if (status != cudaSuccess)
    {
        logError(std::string{pluginName} + ": kernel launch failed: " + cudaGetErrorString(status));
        return -1;
    }
    return 0;
}

bool compatible(int64_t a, int64_t b) noexcept
{
    return a < 0 || b < 0 || a == b;
}

bool compatible(nvinfer1::Dims const& a, nvinfer1::Dims const& b) noexcept
{
    if (a.nbDims != b.nbDims)
    {
        return false;
    }
    for (int32_t i = 0; i < a.nbDims; ++i)
    {
        if (!compatible(a.d[i], b.d[i]))
        {
            return false;
        }
    }
    return true;
}

bool rowsAndWidth(char const* pluginName, nvinfer1::Dims const& dims, int64_t& rows, int32_t& d)
{
    if (dims.nbDims < 1)
    {
        logError(std::string{pluginName} + ": the sources have no dimension");
        return false;
    }
    int64_t const last = dims.d[dims.nbDims - 1];
    if (last > std::numeric_limits<int32_t>::max())
    {
        logError(std::string{pluginName} + ": last dimension " + std::to_string(last) + " exceeds int32");
        return false;
    }
    rows = 1;
    for (int32_t i = 0; i + 1 < dims.nbDims; ++i)
    {
        rows *= dims.d[i];
    }
    d = static_cast<int32_t>(last);
    return true;
}

bool checkAggregateShapes(char const* pluginName, nvinfer1::Dims const* dims, int32_t nbInputs,
    char const* const* weightNames, int32_t nbWeights)
{
    std::string const node{std::string{pluginName} + ": "};
    nvinfer1::Dims const& first = dims[nbWeights];
    if (first.nbDims < 1)
    {
        logError(node + "source 0 must have at least one dimension, got " + dimsToString(first));
        return false;
    }
    for (int32_t i = nbWeights + 1; i < nbInputs; ++i)
    {
        if (!compatible(dims[i], first))
        {
            logError(node + "source " + std::to_string(i - nbWeights) + " has shape " + dimsToString(dims[i])
                + " but source 0 has " + dimsToString(first) + ": all sources must have the same shape");
            return false;
        }
    }
    int64_t const last = first.d[first.nbDims - 1];
    for (int32_t w = 0; w < nbWeights; ++w)
    {
        nvinfer1::Dims const& weight = dims[w];
        if (weight.nbDims != 1 || !compatible(weight.d[0], last))
        {
            logError(node + weightNames[w] + " has shape " + dimsToString(weight)
                + " but the sources' last dimension is " + std::to_string(last) + ": " + weightNames[w]
                + " must be [D]");
            return false;
        }
    }
    return true;
}

} // namespace plugin
} // namespace attnres
