/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "attnresPluginCommon.h"

#include "attnResAggregatePlugin/attnResAggregateKernel.h"

#include <atomic>

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
    nvinfer1::ILoggerFinder* finder = gLoggerFinder.load();
    nvinfer1::ILogger* logger = finder != nullptr ? finder->findLogger() : getLogger();
    if (logger != nullptr)
    {
        logger->log(severity, message);
    }
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

} // namespace plugin
} // namespace attnres
