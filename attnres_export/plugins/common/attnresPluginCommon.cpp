/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "common/attnresPluginCommon.h"

#include "common/attnresKernelApi.h"

#include <atomic>
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

std::string dimsToString(nvinfer1::Dims const& dims)
{
    std::string text{"["};
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        text += (i > 0 ? ", " : "") + std::to_string(dims.d[i]);
    }
    return text + "]";
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

} // namespace plugin
} // namespace attnres
