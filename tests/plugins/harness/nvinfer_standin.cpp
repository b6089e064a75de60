/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Stand-in libnvinfer (standin.h): built as libnvinfer.so.<TensorRT major of the headers> with that soname and
 * no unversioned link, like pip's tensorrt_libs, so the plugin build must find it the way it finds pip's.
 */
#include "standin.h"

#include "NvInferRuntime.h"

#include <cstring>
#include <dlfcn.h>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace
{

using nvinfer1::AsciiChar;
using nvinfer1::IPluginCreatorInterface;

struct LogEntry
{
    int32_t severity;
    std::string message;
};

struct Registration
{
    IPluginCreatorInterface* creator;
    std::string pluginNamespace;
    bool active;
};

std::mutex gMutex;
std::vector<LogEntry> gLog;
std::vector<Registration> gRegistrations;
int32_t gRefused{0};
int32_t gGetLoggerCalls{0};
int32_t gGetRegistryCalls{0};
int32_t gSetLoggerFinderCalls{0};

class StandinLogger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        std::lock_guard<std::mutex> lock{gMutex};
        gLog.push_back({static_cast<int32_t>(severity), msg != nullptr ? msg : "(null)"});
    }
};

StandinLogger& logger()
{
    static StandinLogger instance{};
    return instance;
}

class StandinLoggerFinder : public nvinfer1::ILoggerFinder
{
public:
    nvinfer1::ILogger* findLogger() noexcept override
    {
        return &logger();
    }
};

void logError(std::string const& message)
{
    logger().log(nvinfer1::ILogger::Severity::kERROR, ("stand-in registry: " + message).c_str());
}

//! name, version and namespace of a V3One creator; false for any other creator kind.
bool creatorKey(IPluginCreatorInterface& creator, std::string& name, std::string& version, std::string& ns)
{
    nvinfer1::InterfaceInfo const info = creator.getInterfaceInfo();
    if (info.kind == nullptr || std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") != 0)
    {
        return false;
    }
    auto& v3 = static_cast<nvinfer1::IPluginCreatorV3One&>(creator);
    name = v3.getPluginName() != nullptr ? v3.getPluginName() : "";
    version = v3.getPluginVersion() != nullptr ? v3.getPluginVersion() : "";
    ns = v3.getPluginNamespace() != nullptr ? v3.getPluginNamespace() : "";
    return true;
}

class StandinRegistry : public nvinfer1::IPluginRegistry
{
public:
    StandinRegistry() = default;
    ~StandinRegistry() noexcept override = default;

#if NV_TENSORRT_MAJOR < 11
    // TensorRT 10's deprecated IPluginV2 creator overloads: attnres never uses them.
    bool registerCreator(nvinfer1::IPluginCreator&, AsciiChar const* const) noexcept override
    {
        logError("registerCreator(IPluginCreator&) (IPluginV2) called");
        return false;
    }
    nvinfer1::IPluginCreator* const* getPluginCreatorList(int32_t* const numCreators) const noexcept override
    {
        *numCreators = 0;
        return nullptr;
    }
    nvinfer1::IPluginCreator* getPluginCreator(
        AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override
    {
        return nullptr;
    }
    bool deregisterCreator(nvinfer1::IPluginCreator const&) noexcept override
    {
        return false;
    }
#endif

    void setErrorRecorder(nvinfer1::IErrorRecorder* const recorder) noexcept override
    {
        mRecorder = recorder;
    }
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return mRecorder;
    }
    bool isParentSearchEnabled() const override
    {
        return mParentSearch;
    }
    void setParentSearchEnabled(bool const enabled) override
    {
        mParentSearch = enabled;
    }

    PluginLibraryHandle loadLibrary(AsciiChar const* pluginPath) noexcept override
    {
        void* handle = dlopen(pluginPath, RTLD_LAZY | RTLD_LOCAL);
        if (handle == nullptr)
        {
            char const* error = dlerror();
            logError(std::string{"dlopen failed: "} + (error != nullptr ? error : "?"));
            return nullptr;
        }
        using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
        using SetLoggerFinder = void (*)(nvinfer1::ILoggerFinder*);
        auto getCreators = reinterpret_cast<GetCreators>(dlsym(handle, "getCreators"));
        auto setLoggerFinder = reinterpret_cast<SetLoggerFinder>(dlsym(handle, "setLoggerFinder"));
        if (getCreators == nullptr)
        {
            logError(std::string{pluginPath} + " exports no getCreators");
            dlclose(handle);
            return nullptr;
        }
        if (setLoggerFinder != nullptr)
        {
            static StandinLoggerFinder finder{};
            setLoggerFinder(&finder);
            std::lock_guard<std::mutex> lock{gMutex};
            ++gSetLoggerFinderCalls;
        }
        int32_t count = 0;
        IPluginCreatorInterface* const* creators = getCreators(count);
        std::vector<IPluginCreatorInterface*> added;
        for (int32_t i = 0; creators != nullptr && i < count; ++i)
        {
            std::string name, version, ns;
            if (creators[i] == nullptr || !creatorKey(*creators[i], name, version, ns)
                || !registerCreator(*creators[i], ns.c_str()))
            {
                logError(std::string{"could not register creator "} + std::to_string(i) + " of " + pluginPath);
                for (IPluginCreatorInterface* creator : added)
                {
                    deregisterCreator(*creator);
                }
                return nullptr; // like TensorRT: the library stays loaded
            }
            added.push_back(creators[i]);
        }
        mLibraries[handle] = added;
        return handle;
    }

    void deregisterLibrary(PluginLibraryHandle handle) noexcept override
    {
        auto found = mLibraries.find(handle);
        if (found == mLibraries.end())
        {
            return;
        }
        for (IPluginCreatorInterface* creator : found->second)
        {
            deregisterCreator(*creator);
        }
        mLibraries.erase(found);
        dlclose(handle);
    }

    bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const pluginNamespace) noexcept override
    {
        std::string name, version, ns;
        if (!creatorKey(creator, name, version, ns))
        {
            logError("registerCreator: not an IPluginCreatorV3One");
            return false;
        }
        std::string const key{pluginNamespace != nullptr ? pluginNamespace : ""};
        std::lock_guard<std::mutex> lock{gMutex};
        for (Registration const& r : gRegistrations)
        {
            std::string n, v, s;
            if (r.active && creatorKey(*r.creator, n, v, s) && n == name && v == version && r.pluginNamespace == key)
            {
                ++gRefused;
                return false;
            }
        }
        gRegistrations.push_back({&creator, key, true});
        return true;
    }

    IPluginCreatorInterface* const* getAllCreators(int32_t* const numCreators) const noexcept override
    {
        std::lock_guard<std::mutex> lock{gMutex};
        mAll.clear();
        for (Registration const& r : gRegistrations)
        {
            if (r.active)
            {
                mAll.push_back(r.creator);
            }
        }
        *numCreators = static_cast<int32_t>(mAll.size());
        return mAll.data();
    }

    // getAllCreatorsRecursive exists from some TensorRT 10.x on: no `override`, so every version compiles.
    virtual IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const numCreators) noexcept
    {
        return getAllCreators(numCreators);
    }

    IPluginCreatorInterface* getCreator(AsciiChar const* const pluginName, AsciiChar const* const pluginVersion,
        AsciiChar const* const pluginNamespace) noexcept override
    {
        std::string const ns{pluginNamespace != nullptr ? pluginNamespace : ""};
        std::lock_guard<std::mutex> lock{gMutex};
        for (Registration const& r : gRegistrations)
        {
            std::string n, v, s;
            if (r.active && creatorKey(*r.creator, n, v, s) && n == pluginName && v == pluginVersion
                && r.pluginNamespace == ns)
            {
                return r.creator;
            }
        }
        return nullptr;
    }

    bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override
    {
        std::lock_guard<std::mutex> lock{gMutex};
        for (Registration& r : gRegistrations)
        {
            if (r.active && r.creator == &creator)
            {
                r.active = false;
                return true;
            }
        }
        return false;
    }

    nvinfer1::IPluginResource* acquirePluginResource(
        AsciiChar const* key, nvinfer1::IPluginResource* resource) noexcept override
    {
        auto found = mResources.find(key);
        if (found != mResources.end())
        {
            return found->second;
        }
        return mResources[key] = resource;
    }

    int32_t releasePluginResource(AsciiChar const* key) noexcept override
    {
        return mResources.erase(key) == 1 ? 0 : -1;
    }

private:
    nvinfer1::IErrorRecorder* mRecorder{nullptr};
    bool mParentSearch{true};
    std::map<void*, std::vector<IPluginCreatorInterface*>> mLibraries;
    std::map<std::string, nvinfer1::IPluginResource*> mResources;
    mutable std::vector<IPluginCreatorInterface*> mAll;
};

StandinRegistry& registry()
{
    static StandinRegistry* const instance = new StandinRegistry{}; // never destroyed: plugins may outlive main
    return *instance;
}

} // namespace

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginRegistry* getPluginRegistry() noexcept
{
    {
        std::lock_guard<std::mutex> lock{gMutex};
        ++gGetRegistryCalls;
    }
    return &registry();
}

extern "C" __attribute__((visibility("default"))) nvinfer1::ILogger* getLogger() noexcept
{
    {
        std::lock_guard<std::mutex> lock{gMutex};
        ++gGetLoggerCalls;
    }
    return &logger();
}

int32_t attnresStandinRegistrations()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return static_cast<int32_t>(gRegistrations.size());
}

char const* attnresStandinRegistrationNamespace(int32_t i)
{
    std::lock_guard<std::mutex> lock{gMutex};
    return i >= 0 && i < static_cast<int32_t>(gRegistrations.size()) ? gRegistrations[i].pluginNamespace.c_str()
                                                                      : nullptr;
}

void* attnresStandinRegistrationCreator(int32_t i)
{
    std::lock_guard<std::mutex> lock{gMutex};
    return i >= 0 && i < static_cast<int32_t>(gRegistrations.size()) ? gRegistrations[i].creator : nullptr;
}

int32_t attnresStandinRefusedRegistrations()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return gRefused;
}

int32_t attnresStandinLogCount()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return static_cast<int32_t>(gLog.size());
}

char const* attnresStandinLogMessage(int32_t i)
{
    std::lock_guard<std::mutex> lock{gMutex};
    return i >= 0 && i < static_cast<int32_t>(gLog.size()) ? gLog[i].message.c_str() : nullptr;
}

int32_t attnresStandinLogSeverity(int32_t i)
{
    std::lock_guard<std::mutex> lock{gMutex};
    return i >= 0 && i < static_cast<int32_t>(gLog.size()) ? gLog[i].severity : -1;
}

void attnresStandinClearLog()
{
    std::lock_guard<std::mutex> lock{gMutex};
    gLog.clear();
}

int32_t attnresStandinGetLoggerCalls()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return gGetLoggerCalls;
}

int32_t attnresStandinGetPluginRegistryCalls()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return gGetRegistryCalls;
}

int32_t attnresStandinSetLoggerFinderCalls()
{
    std::lock_guard<std::mutex> lock{gMutex};
    return gSetLoggerFinderCalls;
}

void* attnresStandinLoadLibrary(char const* path)
{
    return registry().loadLibrary(path);
}
