/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Load-time registration for libattnres_trt.so (ctypes.CDLL, Polygraphy --plugins, ONNX Runtime's
 * trt_extra_plugin_lib_paths, trtexec --staticPlugins): a static initializer registers every creator of
 * the one list (pluginCreators) under the namespace it reports, "attnres", which is the key TensorRT's
 * parser looks up with the node's plugin_namespace. REGISTER_TENSORRT_PLUGIN would register under "".
 *
 * This file is the only one that imports TensorRT symbols (getPluginRegistry, getLogger, exported by
 * libnvinfer, which CMake links): libattnres_trt_dyn.so shares every other object and imports none.
 */
#include "api/attnresPluginCreators.h"
#include "common/attnresPluginCommon.h"

#include <cstring>
#include <exception>
#include <string>

namespace attnres
{
namespace plugin
{
namespace
{

//! The namespace a creator reports, or nullptr for a creator interface this library does not know.
char const* creatorNamespace(nvinfer1::IPluginCreatorInterface& creator) noexcept
{
    nvinfer1::InterfaceInfo const info = creator.getInterfaceInfo();
    if (info.kind != nullptr && std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0)
    {
        return static_cast<nvinfer1::IPluginCreatorV3One&>(creator).getPluginNamespace();
    }
    return nullptr;
}

//! Finds TensorRT's global logger: what this library logs through (the _dyn library gets its finder from
//! IPluginRegistry::loadLibrary instead).
class GlobalLoggerFinder : public nvinfer1::ILoggerFinder
{
public:
    nvinfer1::ILogger* findLogger() noexcept override
    {
        return getLogger();
    }
};

//! Registers every creator of pluginCreators(); logs the ones TensorRT refuses (already registered).
void registerPluginCreators() noexcept
{
    static GlobalLoggerFinder loggerFinder{};
    setPluginLoggerFinder(&loggerFinder);
    try
    {
        int32_t nbCreators = 0;
        nvinfer1::IPluginCreatorInterface* const* creators = pluginCreators(nbCreators);
        for (int32_t i = 0; i < nbCreators; ++i)
        {
            nvinfer1::IPluginCreatorInterface& creator = *creators[i];
            char const* const pluginNamespace = creatorNamespace(creator);
            if (pluginNamespace == nullptr)
            {
                logError(std::string{"attnres: plugin creator "} + std::to_string(i)
                    + " is not an IPluginCreatorV3One; it is not registered");
                continue;
            }
            if (!getPluginRegistry()->registerCreator(creator, pluginNamespace))
            {
                auto const& v3 = static_cast<nvinfer1::IPluginCreatorV3One const&>(creator);
                logError(std::string{"attnres: could not register plugin creator "} + pluginNamespace
                    + "::" + v3.getPluginName() + " version " + v3.getPluginVersion()
                    + ": already registered (load one attnres TensorRT library per process)");
            }
        }
    }
    catch (std::exception const& e)
    {
        caughtError(e, "attnres", "plugin registration");
    }
}

//! Registers at load time, like REGISTER_TENSORRT_PLUGIN's PluginRegistrar.
struct PluginCreatorRegistrar
{
    PluginCreatorRegistrar() noexcept
    {
        registerPluginCreators();
    }
};

PluginCreatorRegistrar const gPluginCreatorRegistrar{};

} // namespace
} // namespace plugin
} // namespace attnres
