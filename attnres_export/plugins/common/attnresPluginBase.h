/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The IPluginV3 glue every attnres plugin shares, as one CRTP base: the four interfaces (IPluginV3 and the
 * IPluginV3One core, build and runtime capabilities), name / version / namespace, clone and attachToContext,
 * configurePlugin / onShapeChange (count check, then the inputs' shapes) and getFieldsToSerialize. A plugin
 * derives from PluginBase<itself> and keeps only what is its own: fields, shape and type rules, enqueue; its
 * creator derives from CreatorBase<plugin> and keeps createPlugin.
 */
#ifndef ATTNRES_PLUGIN_BASE_H
#define ATTNRES_PLUGIN_BASE_H

#include "common/attnresPluginCommon.h"

#include "NvInferRuntime.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <vector>

namespace attnres
{
namespace plugin
{

/*
 * Derived provides, besides the rest of IPluginV3OneBuild / IPluginV3OneRuntime (getOutputDataTypes,
 * getOutputShapes, supportsFormatCombination, getNbOutputs, enqueue; getWorkspaceSize when it needs one,
 * else TensorRT's default of 0):
 *   static constexpr char const* kNAME, kVERSION    plugin name and version, as its creator reports them
 *   bool checkCounts(int32_t nbInputs, int32_t nbOutputs) const
 *       whether a node of that many inputs and outputs fits; logs why not
 *   int32_t configureInputs(nvinfer1::Dims const* dims, int32_t nbInputs)
 *       checks the inputs' shapes (logs the first problem, -1) and records what enqueue is not told (0)
 *   void addFieldsToSerialize(std::vector<nvinfer1::PluginField>& fields)
 *       appends its fields, pointing at its members
 * (befriend PluginBase<Derived> to keep the three hooks private). clone copies Derived: its copy constructor
 * copies the fields and what configureInputs recorded.
 */
template <typename Derived>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime
{
public:
    PluginBase& operator=(PluginBase const&) = delete;
    ~PluginBase() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override
    {
        switch (type)
        {
        case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
        case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
        case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
        }
        return nullptr;
    }

    nvinfer1::IPluginV3* clone() noexcept override
    {
        try
        {
            return new Derived(static_cast<Derived const&>(*this));
        }
        catch (std::exception const& e)
        {
            caughtError(e, Derived::kNAME, "clone");
        }
        return nullptr;
    }

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override
    {
        return Derived::kNAME;
    }

    char const* getPluginVersion() const noexcept override
    {
        return Derived::kVERSION;
    }

    char const* getPluginNamespace() const noexcept override
    {
        return kPLUGIN_NAMESPACE;
    }

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept override
    {
        return configure(in, nbInputs, nbOutputs, "configurePlugin");
    }

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept override
    {
        return configure(in, nbInputs, nbOutputs, "onShapeChange");
    }

    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept override
    {
        return clone();
    }

    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override
    {
        try
        {
            mFieldsToSerialize.clear();
            derived().addFieldsToSerialize(mFieldsToSerialize);
            mFieldCollection = fieldCollection(mFieldsToSerialize);
            return &mFieldCollection;
        }
        catch (std::exception const& e)
        {
            caughtError(e, Derived::kNAME, "getFieldsToSerialize");
        }
        return nullptr;
    }

protected:
    PluginBase() = default;

    //! Copies nothing: the fields to serialize point into the original and are rebuilt on request.
    PluginBase(PluginBase const& /* other */)
        : IPluginV3{}
        , IPluginV3OneCore{}
        , IPluginV3OneBuild{}
        , IPluginV3OneRuntime{}
    {
    }

private:
    Derived& derived() noexcept
    {
        return static_cast<Derived&>(*this);
    }

    static nvinfer1::Dims const& dimsOf(nvinfer1::DynamicPluginTensorDesc const& desc) noexcept
    {
        return desc.desc.dims;
    }

    static nvinfer1::Dims const& dimsOf(nvinfer1::PluginTensorDesc const& desc) noexcept
    {
        return desc.dims;
    }

    //! configurePlugin (build time, Desc = DynamicPluginTensorDesc) and onShapeChange (run time, PluginTensorDesc):
    //! Derived's count check, then its shape check of the inputs' dims.
    template <typename Desc>
    int32_t configure(Desc const* in, int32_t nbInputs, int32_t nbOutputs, char const* entryPoint) noexcept
    {
        try
        {
            if (!derived().checkCounts(nbInputs, nbOutputs))
            {
                return -1;
            }
            std::vector<nvinfer1::Dims> dims(static_cast<size_t>(nbInputs));
            for (int32_t i = 0; i < nbInputs; ++i)
            {
                dims[static_cast<size_t>(i)] = dimsOf(in[i]);
            }
            return derived().configureInputs(dims.data(), nbInputs);
        }
        catch (std::exception const& e)
        {
            caughtError(e, Derived::kNAME, entryPoint);
        }
        return -1;
    }

    std::vector<nvinfer1::PluginField> mFieldsToSerialize;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

/*
 * The IPluginCreatorV3One glue every attnres creator shares: Plugin's name and version (kNAME, kVERSION), the
 * namespace, and getFieldNames. The derived creator lists its fields and keeps createPlugin: reading them and
 * constructing Plugin.
 */
template <typename Plugin>
class CreatorBase : public nvinfer1::IPluginCreatorV3One
{
public:
    char const* getPluginName() const noexcept override
    {
        return Plugin::kNAME;
    }

    char const* getPluginVersion() const noexcept override
    {
        return Plugin::kVERSION;
    }

    char const* getPluginNamespace() const noexcept override
    {
        return kPLUGIN_NAMESPACE;
    }

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override
    {
        return &mFieldCollection;
    }

protected:
    //! The derived constructor lists the fields createPlugin reads in mFields, then sets mFieldCollection to
    //! fieldCollection(mFields).
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_PLUGIN_BASE_H
