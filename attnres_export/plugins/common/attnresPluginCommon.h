/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Helpers shared by every attnres TensorRT plugin: logging through TensorRT's logger and the
 * mapping of TensorRT data types to the kernels' C ABI.
 */
#ifndef ATTNRES_PLUGIN_COMMON_H
#define ATTNRES_PLUGIN_COMMON_H

#include "NvInferRuntime.h"

#include <cstdint>

//! Exported entry points. TENSORRTAPI is empty outside TensorRT's own build, and objects are hidden by default.
#define ATTNRES_PLUGIN_API __attribute__((visibility("default")))

namespace attnres
{
namespace plugin
{

//! Namespace of every attnres plugin (attnres_export.ops.identity.PLUGIN_NAMESPACE).
constexpr char const* kPLUGIN_NAMESPACE{"attnres"};

//! Logger finder handed over by IPluginRegistry::loadLibrary (dynamic library only).
void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! Logs through the finder's logger, else TensorRT's global logger, so errors reach the user's ILogger.
void logPluginMessage(nvinfer1::ILogger::Severity severity, char const* message) noexcept;

//! Kernel dtype code (AttnresDtype) of a TensorRT type, or -1 when the kernels do not take it.
int32_t kernelDtype(nvinfer1::DataType type) noexcept;

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_PLUGIN_COMMON_H
