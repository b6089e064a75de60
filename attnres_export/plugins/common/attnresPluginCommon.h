/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Helpers shared by every attnres TensorRT plugin, in the manner of NVIDIA/TensorRT's plugin/common:
 * logging through TensorRT's logger, the PluginError / ATTNRES_PLUGIN_VALIDATE / caughtError pattern of
 * checkMacrosPlugin.h for the noexcept entry points, plugin-field parsing, shape helpers and the mapping
 * of TensorRT data types to the kernels' C ABI (common/attnresKernelApi.h).
 */
#ifndef ATTNRES_PLUGIN_COMMON_H
#define ATTNRES_PLUGIN_COMMON_H

#include "NvInferRuntime.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

//! Exported entry points. TENSORRTAPI is empty outside TensorRT's own build, and objects are hidden by default.
#define ATTNRES_PLUGIN_API __attribute__((visibility("default")))

//! Throws attnres::plugin::PluginError(message) unless condition holds; message is evaluated only then.
//! Use inside a try block whose catch calls caughtError (NVIDIA's PLUGIN_VALIDATE).
#define ATTNRES_PLUGIN_VALIDATE(condition, message)                                                                    \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(condition))                                                                                              \
        {                                                                                                              \
            ::attnres::plugin::throwPluginError(message);                                                              \
        }                                                                                                              \
    } while (0)

namespace attnres
{
namespace plugin
{

//! Namespace of every attnres plugin (attnres_export.ops.opset.PLUGIN_NAMESPACE).
constexpr char const* kPLUGIN_NAMESPACE{"attnres"};

//! The logger finder every message goes through: handed over by IPluginRegistry::loadLibrary
//! (setLoggerFinder of libattnres_trt_dyn.so), or set at load time by libattnres_trt.so to one that
//! returns TensorRT's getLogger(). Nothing else here imports a TensorRT symbol.
void setPluginLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! Logs through the finder's logger so errors reach the user's ILogger; dropped while there is none.
void logPluginMessage(nvinfer1::ILogger::Severity severity, char const* message) noexcept;

//! logPluginMessage at kERROR.
void logError(std::string const& message) noexcept;

//! A failed check of a plugin's inputs or fields; what() is the complete message for the user.
class PluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Throws PluginError(message) (ATTNRES_PLUGIN_VALIDATE).
[[noreturn]] void throwPluginError(std::string const& message);

//! Logs an exception caught at a noexcept entry point: a PluginError as it is, anything else (bad_alloc,
//! ...) as "<pluginName>: <entryPoint> failed: <what>" (NVIDIA's caughtError).
void caughtError(std::exception const& error, char const* pluginName, char const* entryPoint) noexcept;

//! One float32 value of a plugin field (float64 is narrowed); false for any other type or length.
bool readFloat(nvinfer1::PluginField const& field, float& value) noexcept;

//! One int8, int16, int32 or int64 value of a plugin field that fits int32; false otherwise.
bool readInt(nvinfer1::PluginField const& field, int32_t& value) noexcept;

//! A PluginFieldCollection over fields (getFieldNames, getFieldsToSerialize); valid while fields is unchanged.
nvinfer1::PluginFieldCollection fieldCollection(std::vector<nvinfer1::PluginField> const& fields) noexcept;

//! Throws PluginError "<node>the field collection has <n> fields but no field array" for a collection that lists
//! fields without an array, then calls visit(field) for each field of fc that has a name (none when fc is null):
//! the loop of every createPlugin.
template <typename Visit>
void forEachNamedField(std::string const& node, nvinfer1::PluginFieldCollection const* fc, Visit&& visit)
{
    ATTNRES_PLUGIN_VALIDATE(fc == nullptr || fc->nbFields <= 0 || fc->fields != nullptr,
        node + "the field collection has " + std::to_string(fc->nbFields) + " fields but no field array");
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        nvinfer1::PluginField const& field = fc->fields[i];
        if (field.name != nullptr)
        {
            visit(field);
        }
    }
}

//! Reads the float field `field` (named name) into value, as readFloat; throws PluginError
//! "<node>field <name> must hold one value" / "... must be float32" (node: "<plugin name>: ").
void readFloatField(std::string const& node, nvinfer1::PluginField const& field, float& value);

//! Throws PluginError "<node>required field <name> is missing" unless found, then
//! "<node><name> must be finite and >= 0, got <value>" unless it is.
void requireFiniteNonNegative(std::string const& node, char const* name, bool found, float value);

//! Kernel dtype code (AttnresDtype) of a TensorRT type, or -1 when the kernels do not take it.
int32_t kernelDtype(nvinfer1::DataType type) noexcept;

//! Whether the kernels store tensors of this type (float32, float16, bfloat16).
bool isKernelDataType(nvinfer1::DataType type) noexcept;

//! Bytes of one element of a type the kernels store; 0 for any other type.
size_t kernelElementSize(nvinfer1::DataType type) noexcept;

//! "[d0, d1, ...]".
std::string dimsToString(nvinfer1::Dims const& dims);

//! What enqueue returns after a kernel launch: 0 for cudaSuccess, else -1 after logging
//! "<pluginName>: kernel launch failed: <cudaGetErrorString(status)>".
int32_t launchResult(char const* pluginName, cudaError_t status);

//! Two extents agree when either is unknown (-1 at build time) or both are equal.
bool compatible(int64_t a, int64_t b) noexcept;

//! Same rank, and every extent compatible.
bool compatible(nvinfer1::Dims const& a, nvinfer1::Dims const& b) noexcept;

//! A tensor [..., D] seen as rows x D (rows: the product of the leading extents, 1 for rank 1); logs
//! "<pluginName>: ..." and returns false for rank 0 or a D that does not fit int32.
bool rowsAndWidth(char const* pluginName, nvinfer1::Dims const& dims, int64_t& rows, int32_t& d);

/*
 * The operands of a depth aggregation (AttnResAggregate, AttnResAggregateNorm): dims[0, nbWeights) are
 * float32 weights [D] named weightNames[i], dims[nbWeights, nbInputs) the sources, of one shape [..., D]
 * with rank >= 1 (extents of -1 are unknown and agree with anything). Logs the first problem as
 * "<pluginName>: ..." and returns false; true when the shapes fit.
 */
bool checkAggregateShapes(char const* pluginName, nvinfer1::Dims const* dims, int32_t nbInputs,
    char const* const* weightNames, int32_t nbWeights);

} // namespace plugin
} // namespace attnres

#endif // ATTNRES_PLUGIN_COMMON_H
