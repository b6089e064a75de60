/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Entry points of libattnres_trt_dyn.so for IPluginRegistry::loadLibrary, trtexec --dynamicPlugins and
 * setPluginsToSerialize. This library must not register itself: loadLibrary fails when the creators
 * are already registered.
 */
#include "api/attnresPluginCreators.h"
#include "common/attnresPluginCommon.h"

extern "C" ATTNRES_PLUGIN_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    attnres::plugin::setPluginLoggerFinder(finder);
}

extern "C" ATTNRES_PLUGIN_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    return attnres::plugin::pluginCreators(nbCreators);
}
