/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The one list of attnres plugin creators (attnresPluginCreators.cpp). A new plugin adds its creator
 * there and nowhere else: libattnres_trt.so registers every entry at load time (registerPlugins.cpp) and
 * libattnres_trt_dyn.so hands the same list to IPluginRegistry::loadLibrary (dynamicPlugins.cpp).
 */
#ifndef ATTNRES_PLUGIN_CREATORS_H
#define ATTNRES_PLUGIN_CREATORS_H

#include "NvInferRuntime.h"

#include <cstdint>

namespace attnres
{
namespace plugin
{

//! Every creator of the library, created once and alive until unload; nbCreators receives the count.
nvinfer1::IPluginCreatorInterface* const* pluginCreators(int32_t& nbCreators) noexcept;

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_PLUGIN_CREATORS_H
