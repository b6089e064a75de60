/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The one list of attnres plugin creators. A new plugin adds its creator here and to
 * registerPlugins.cpp; both libraries then serve it.
 */
#ifndef ATTNRES_PLUGIN_CREATORS_H
#define ATTNRES_PLUGIN_CREATORS_H

#include "NvInferRuntime.h"

#include <cstdint>

namespace attnres
{
namespace plugin
{

//! Every creator of the library, created once and alive until unload.
nvinfer1::IPluginCreatorInterface* const* pluginCreators(int32_t& nbCreators) noexcept;

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_PLUGIN_CREATORS_H
