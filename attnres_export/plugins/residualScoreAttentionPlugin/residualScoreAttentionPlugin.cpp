/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "residualScoreAttentionPlugin/residualScoreAttentionPlugin.h"

#include "common/attnresPluginCommon.h"
#include "residualScoreAttentionPlugin/residualScoreAttentionKernel.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IPluginV3;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

namespace attnres
{
namespace plugin
{
namespace
{

constexpr char const* kSCALE_FIELD{"scale"};
constexpr char const* kDIVISOR_FIELD{"logit_divisor"};
constexpr char const* kHAS_PREV_FIELD{"has_prev_scores"};
constexpr char const* kHAS_MASK_FIELD{"has_mask"};
constexpr int32_t kMAX_HEAD_DIM{ATTNRES_RSA_MAX_HEAD_DIM};
constexpr int32_t kUNKNOWN{-1};

std::string const& nodePrefix()
{
    static std::string const prefix{std::string{kRESIDUAL_ATTENTION_NAME} + ": "};
    return prefix;
}

//! [B, H, Tq, Tk] of q and k, with -1 where unknown.
Dims scoreShape(Dims const& q, Dims const& k)
{
    Dims shape{};
    shape.nbDims = 4;
    shape.d[0] = q.d[0];
    shape.d[1] = q.d[1];
    shape.d[2] = q.d[2];
    shape.d[3] = k.d[2];
    return shape;
}

bool isFullScoreShape(Dims const& dims, Dims const& target)
{
    if (dims.nbDims != 4)
    {
        return false;
    }
    for (int32_t i = 0; i < 4; ++i)
    {
        if (!compatible(dims.d[i], target.d[i]))
        {
            return false;
        }
    }
    return true;
}

/*
 * Which inputs are prev_scores and mask_bias. TensorRT's ONNX parser hands a plugin every named input in
 * node order, so input 3 is prev_scores or mask_bias. The fields has_prev_scores / has_mask say which;
 * without them: 5 inputs are both, 3 are neither, and a 4th input is prev_scores when its shape is the
 * full [B, H, Tq, Tk], else mask_bias (README, Known issues). Logs and returns false on a contradiction.
 */
bool resolveRoles(Dims const* dims, int32_t nbInputs, int32_t hasPrev, int32_t hasMask,
    ResidualAttentionRoles& roles, bool log)
{
    int32_t const extra = nbInputs - 3;
    int32_t prev = hasPrev;
    int32_t mask = hasMask;
    if (prev == kUNKNOWN && mask != kUNKNOWN)
    {
        prev = extra - mask;
    }
    else if (mask == kUNKNOWN && prev != kUNKNOWN)
    {
        mask = extra - prev;
    }
    else if (prev == kUNKNOWN && mask == kUNKNOWN)
    {
        if (extra == 1)
        {
            prev = isFullScoreShape(dims[3], scoreShape(dims[0], dims[1])) ? 1 : 0;
            mask = 1 - prev;
        }
        else
        {
            prev = extra == 2 ? 1 : 0;
            mask = prev;
        }
    }
    if (prev < 0 || prev > 1 || mask < 0 || mask > 1 || prev + mask != extra)
    {
        if (log)
        {
            logError(nodePrefix() + "has_prev_scores=" + std::to_string(hasPrev) + " and has_mask="
                + std::to_string(hasMask) + " do not fit " + std::to_string(nbInputs)
                + " inputs (q, k, v, then the present optional inputs in order)");
        }
        return false;
    }
    roles.prevScores = prev == 1 ? 3 : -1;
    roles.maskBias = mask == 1 ? 3 + prev : -1;
    return true;
}

//! Checks every operand shape; logs the first problem and returns false.
bool checkShapes(Dims const* dims, int32_t nbInputs, ResidualAttentionRoles const& roles)
{
    std::string const& node = nodePrefix();
    Dims const& q = dims[0];
    Dims const& k = dims[1];
    Dims const& v = dims[2];
    if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4)
    {
        logError(node + "q, k, v must be 4-D [B, H, T, d], got " + dimsToString(q) + ", " + dimsToString(k)
            + ", " + dimsToString(v));
        return false;
    }
    bool const fits = compatible(q.d[0], k.d[0]) && compatible(q.d[0], v.d[0]) && compatible(q.d[1], k.d[1])
        && compatible(q.d[1], v.d[1]) && compatible(k.d[2], v.d[2]) && compatible(q.d[3], k.d[3]);
    if (!fits)
    {
        logError(node + "shapes do not fit q [B,H,Tq,dh], k [B,H,Tk,dh], v [B,H,Tk,dv]: q " + dimsToString(q)
            + ", k " + dimsToString(k) + ", v " + dimsToString(v));
        return false;
    }
    if (q.d[3] > kMAX_HEAD_DIM || v.d[3] > kMAX_HEAD_DIM || q.d[3] == 0 || v.d[3] == 0)
    {
        logError(node + "head sizes dh = " + std::to_string(q.d[3]) + ", dv = " + std::to_string(v.d[3])
            + " are outside 1.." + std::to_string(kMAX_HEAD_DIM));
        return false;
    }
    Dims const target = scoreShape(q, k);
    if (roles.prevScores >= 0 && !isFullScoreShape(dims[roles.prevScores], target))
    {
        logError(node + "prev_scores is " + dimsToString(dims[roles.prevScores]) + " but must be [B, H, Tq, Tk] = "
            + dimsToString(target));
        return false;
    }
    if (roles.maskBias >= 0)
    {
        Dims const& mask = dims[roles.maskBias];
        bool ok = mask.nbDims <= 4;
        for (int32_t i = 0; ok && i < mask.nbDims; ++i)
        {
            int64_t const extent = mask.d[i];
            int64_t const wanted = target.d[4 - mask.nbDims + i];
            ok = extent == 1 || compatible(extent, wanted);
        }
        if (!ok)
        {
            logError(node + "mask_bias is " + dimsToString(mask) + ", not broadcastable to [B, H, Tq, Tk] = "
                + dimsToString(target));
            return false;
        }
    }
    (void) nbInputs;
    return true;
}

//! Element strides of a mask broadcast to [B, H, Tq, Tk] (0 along broadcast axes).
void maskStrides(Dims const& mask, int64_t strides[4])
{
    int64_t extents[4] = {1, 1, 1, 1};
    for (int32_t i = 0; i < mask.nbDims && i < 4; ++i)
    {
        extents[4 - mask.nbDims + i] = mask.d[i];
    }
    int64_t stride = 1;
    for (int32_t i = 3; i >= 0; --i)
    {
        strides[i] = extents[i] == 1 ? 0 : stride;
        stride *= extents[i];
    }
}

//! has_prev_scores / has_mask: one integer of -1 (infer), 0 or 1.
bool readPresence(PluginField const& field, int32_t& value) noexcept
{
    int32_t raw = 0;
    if (!readInt(field, raw) || raw < -1 || raw > 1)
    {
        return false;
    }
    value = raw;
    return true;
}

} // namespace

ResidualScoreAttentionPlugin::ResidualScoreAttentionPlugin(
    float scale, float logitDivisor, int32_t hasPrevScores, int32_t hasMask)
    : mScale{scale}
    , mLogitDivisor{logitDivisor}
    , mHasPrevScores{hasPrevScores}
    , mHasMask{hasMask}
{
}

bool ResidualScoreAttentionPlugin::checkCounts(int32_t nbInputs, int32_t nbOutputs) const
{
    if (nbInputs < 3 || nbInputs > 5 || nbOutputs != 2)
    {
        logError(nodePrefix() + "expects q, k, v, optional prev_scores and mask_bias (3 to 5 inputs) and two "
            "outputs (out, scores), got " + std::to_string(nbInputs) + " inputs and " + std::to_string(nbOutputs)
            + " outputs");
        return false;
    }
    return true;
}

int32_t ResidualScoreAttentionPlugin::configureInputs(Dims const* dims, int32_t nbInputs)
{
    ResidualAttentionRoles roles;
    if (!resolveRoles(dims, nbInputs, mHasPrevScores, mHasMask, roles, true) || !checkShapes(dims, nbInputs, roles))
    {
        return -1;
    }
    mNbInputs = nbInputs;
    mRoles = roles;
    return 0;
}

void ResidualScoreAttentionPlugin::addFieldsToSerialize(std::vector<PluginField>& fields)
{
    fields.emplace_back(kSCALE_FIELD, &mScale, PluginFieldType::kFLOAT32, 1);
    fields.emplace_back(kDIVISOR_FIELD, &mLogitDivisor, PluginFieldType::kFLOAT32, 1);
    fields.emplace_back(kHAS_PREV_FIELD, &mHasPrevScores, PluginFieldType::kINT32, 1);
    fields.emplace_back(kHAS_MASK_FIELD, &mHasMask, PluginFieldType::kINT32, 1);
}

int32_t ResidualScoreAttentionPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 2 || nbInputs < 3)
    {
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    outputTypes[1] = DataType::kFLOAT;
    return 0;
}

int32_t ResidualScoreAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    nvinfer1::IExprBuilder& /* exprBuilder */) noexcept
{
    if (nbOutputs != 2 || nbInputs < 3 || inputs[0].nbDims != 4 || inputs[1].nbDims != 4 || inputs[2].nbDims != 4)
    {
        return -1;
    }
    outputs[0] = inputs[0];
    outputs[0].d[3] = inputs[2].d[3];
    outputs[1] = inputs[0];
    outputs[1].d[3] = inputs[1].d[2];
    return 0;
}

bool ResidualScoreAttentionPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs < 3 || nbInputs > 5 || nbOutputs != 2 || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == 0)
    {
        return isKernelDataType(desc.type);
    }
    if (pos == 1 || pos == 2 || pos == nbInputs)
    {
        return desc.type == inOut[0].desc.type; // k, v and out have q's type
    }
    return desc.type == DataType::kFLOAT; // prev_scores, mask_bias, scores
}

int32_t ResidualScoreAttentionPlugin::getNbOutputs() const noexcept
{
    return 2;
}

int32_t ResidualScoreAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc,
    PluginTensorDesc const* /* outputDesc */, void const* const* inputs, void* const* outputs, void* /* workspace */,
    cudaStream_t stream) noexcept
{
    try
    {
        // enqueue is not told the input count: onShapeChange recorded it and the roles of inputs 3 and 4.
        if (mNbInputs < 3)
        {
            logError(nodePrefix() + "enqueue before onShapeChange: the inputs' roles are unknown");
            return -1;
        }
        ResidualAttentionRoles const roles = mRoles;
        Dims const& q = inputDesc[0].dims;
        Dims const& k = inputDesc[1].dims;
        Dims const& v = inputDesc[2].dims;
        int64_t const sizes[6] = {q.d[0], q.d[1], q.d[2], k.d[2], q.d[3], v.d[3]};
        for (int64_t size : sizes)
        {
            if (size < 0 || size > std::numeric_limits<int32_t>::max())
            {
                logError(nodePrefix() + "dimension " + std::to_string(size) + " is outside 0..INT32_MAX");
                return -1;
            }
        }
        int64_t strides[4] = {0, 0, 0, 0};
        float const* mask = nullptr;
        if (roles.maskBias >= 0)
        {
            maskStrides(inputDesc[roles.maskBias].dims, strides);
            mask = static_cast<float const*>(inputs[roles.maskBias]);
        }
        float const* prev = roles.prevScores >= 0 ? static_cast<float const*>(inputs[roles.prevScores]) : nullptr;
        cudaError_t const status = residualScoreAttentionLaunch(inputs[0], inputs[1], inputs[2], prev, mask,
            strides[0], strides[1], strides[2], strides[3], static_cast<int32_t>(sizes[0]),
            static_cast<int32_t>(sizes[1]), static_cast<int32_t>(sizes[2]), static_cast<int32_t>(sizes[3]),
            static_cast<int32_t>(sizes[4]), static_cast<int32_t>(sizes[5]), mScale, mLogitDivisor,
            kernelDtype(inputDesc[0].type), outputs[0], static_cast<float*>(outputs[1]), stream);
        return launchResult(kRESIDUAL_ATTENTION_NAME, status);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kRESIDUAL_ATTENTION_NAME, "enqueue");
    }
    return -1;
}

ResidualScoreAttentionPluginCreator::ResidualScoreAttentionPluginCreator()
{
    mFields.emplace_back(kSCALE_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back(kDIVISOR_FIELD, nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back(kHAS_PREV_FIELD, nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back(kHAS_MASK_FIELD, nullptr, PluginFieldType::kINT32, 1);
    mFieldCollection = fieldCollection(mFields);
}

IPluginV3* ResidualScoreAttentionPluginCreator::createPlugin(
    char const* /* name */, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /* phase */) noexcept
{
    try
    {
        std::string const& node = nodePrefix();
        bool hasScale = false;
        bool hasDivisor = false;
        float scale = 0.F;
        float divisor = 0.F;
        int32_t hasPrev = kUNKNOWN;
        int32_t hasMask = kUNKNOWN;
        forEachNamedField(node, fc, [&](PluginField const& field) {
            if (std::strcmp(field.name, kSCALE_FIELD) == 0)
            {
                ATTNRES_PLUGIN_VALIDATE(readFloat(field, scale), node + "field scale must be one float32");
                hasScale = true;
            }
            else if (std::strcmp(field.name, kDIVISOR_FIELD) == 0)
            {
                ATTNRES_PLUGIN_VALIDATE(readFloat(field, divisor), node + "field logit_divisor must be one float32");
                hasDivisor = true;
            }
            else if (std::strcmp(field.name, kHAS_PREV_FIELD) == 0 || std::strcmp(field.name, kHAS_MASK_FIELD) == 0)
            {
                bool const isPrev = std::strcmp(field.name, kHAS_PREV_FIELD) == 0;
                ATTNRES_PLUGIN_VALIDATE(readPresence(field, isPrev ? hasPrev : hasMask),
                    node + "field " + field.name + " must be one int32 of -1 (infer), 0 or 1");
            }
        });
        ATTNRES_PLUGIN_VALIDATE(
            hasScale && hasDivisor, node + "required field " + (hasScale ? "logit_divisor" : "scale") + " is missing");
        ATTNRES_PLUGIN_VALIDATE(std::isfinite(scale), node + "scale must be finite, got " + std::to_string(scale));
        ATTNRES_PLUGIN_VALIDATE(std::isfinite(divisor) && divisor != 0.F,
            node + "logit_divisor must be finite and non-zero, got " + std::to_string(divisor));
        return new ResidualScoreAttentionPlugin(scale, divisor, hasPrev, hasMask);
    }
    catch (std::exception const& e)
    {
        caughtError(e, kRESIDUAL_ATTENTION_NAME, "createPlugin");
    }
    return nullptr;
}

} // namespace plugin
} // namespace attnres
