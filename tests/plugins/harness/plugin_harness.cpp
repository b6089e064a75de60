/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Host-side harness for the attnres TensorRT plugin libraries: no GPU, no TensorRT runtime.
 *
 *   plugin_harness static  libattnres_trt.so       dlopen (RTLD_LAZY | RTLD_LOCAL), as trtexec --staticPlugins
 *   plugin_harness dynamic libattnres_trt_dyn.so   getPluginRegistry()->loadLibrary, as trtexec --dynamicPlugins
 *
 * It links the stand-in libnvinfer (standin.h), so the stand-in is in the global scope as libnvinfer is in
 * trtexec. Then, for every plugin, it does what TensorRT's ONNX parser, builder and runtime do with a creator
 * and its plugins, through the public interfaces of the headers it is compiled with: the field collection
 * built from ONNX attributes as onnx-tensorrt builds it (FLOAT -> kFLOAT32, INT -> kINT32, in the order of
 * getFieldNames), createPlugin(kBUILD), the capability interfaces, output types and shapes (through an
 * IExprBuilder of this file), the whole supportsFormatCombination search over DataType x TensorFormat,
 * configurePlugin, serialization (getFieldsToSerialize -> createPlugin(kRUNTIME)), clone, attachToContext,
 * onShapeChange and enqueue's error paths (without a GPU enqueue must fail and log, not crash).
 *
 * Output: one line per check, "PASS <plugin>: <check>", "FAIL <plugin>: <check>: <detail>" or
 * "SKIP <plugin>: <check>: <why>", then "SUMMARY passed=N failed=N skipped=N". Exit status 0 when nothing
 * failed, 1 otherwise, 2 on bad usage.
 */
#include "standin.h"

#include "NvInferRuntime.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <dlfcn.h>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

using nvinfer1::DataType;
using nvinfer1::Dims;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IDimensionExpr;
using nvinfer1::IPluginCreatorV3One;
using nvinfer1::IPluginV3;
using nvinfer1::IPluginV3OneBuild;
using nvinfer1::IPluginV3OneCore;
using nvinfer1::IPluginV3OneRuntime;
using nvinfer1::PluginCapabilityType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;
using nvinfer1::TensorRTPhase;

namespace
{

// ---------------------------------------------------------------------------------------------------------
// Reporting

int gPassed = 0;
int gFailed = 0;
int gSkipped = 0;

bool check(bool ok, std::string const& scope, std::string const& what, std::string const& detail = "")
{
    if (ok)
    {
        ++gPassed;
        std::cout << "PASS " << scope << ": " << what << (detail.empty() ? "" : " (" + detail + ")") << "\n";
    }
    else
    {
        ++gFailed;
        std::cout << "FAIL " << scope << ": " << what << (detail.empty() ? "" : ": " + detail) << "\n";
    }
    return ok;
}

void skip(std::string const& scope, std::string const& what, std::string const& why)
{
    ++gSkipped;
    std::cout << "SKIP " << scope << ": " << what << ": " << why << "\n";
}

void info(std::string const& scope, std::string const& text)
{
    std::cout << "INFO " << scope << ": " << text << "\n";
}

//! Log messages since the last clear, as one string (for "was an error logged" checks).
std::vector<std::string> takeLog()
{
    std::vector<std::string> messages;
    for (int32_t i = 0; i < attnresStandinLogCount(); ++i)
    {
        messages.emplace_back(attnresStandinLogMessage(i));
    }
    attnresStandinClearLog();
    return messages;
}

//! True when at least one error was logged and one of them contains `needle`.
bool loggedError(std::vector<std::string> const& messages, std::string const& needle, std::string& detail)
{
    for (std::string const& m : messages)
    {
        if (m.find(needle) != std::string::npos)
        {
            detail = m;
            return true;
        }
    }
    detail = messages.empty() ? "nothing was logged" : "logged: " + messages.front();
    return false;
}

// ---------------------------------------------------------------------------------------------------------
// IExprBuilder / IDimensionExpr: the public classes wrap TensorRT's apiv::VDimensionExpr / VExprBuilder.

class DimImpl : public nvinfer1::apiv::VDimensionExpr
{
public:
    DimImpl(std::string name, bool constant, int64_t value)
        : mName{std::move(name)}
        , mConstant{constant}
        , mValue{value}
    {
    }
    bool isConstant() const override
    {
        return mConstant;
    }
    int64_t getConstantValue() const override
    {
        return mConstant ? mValue : -1;
    }
    bool isSizeTensor() const override
    {
        return false;
    }
    std::string const& name() const
    {
        return mName;
    }

private:
    std::string mName;
    bool mConstant;
    int64_t mValue;
};

class DimExpr : public IDimensionExpr
{
public:
    explicit DimExpr(DimImpl* impl)
        : mOwned{impl}
    {
        mImpl = impl;
    }
    ~DimExpr() noexcept override = default;
    std::string const& name() const
    {
        return mOwned->name();
    }

private:
    std::unique_ptr<DimImpl> mOwned;
};

class ExprPool
{
public:
    IDimensionExpr const* symbol(std::string const& name)
    {
        mExprs.push_back(std::make_unique<DimExpr>(new DimImpl{name, false, -1}));
        return mExprs.back().get();
    }
    IDimensionExpr const* constant(int64_t value)
    {
        mExprs.push_back(std::make_unique<DimExpr>(new DimImpl{std::to_string(value), true, value}));
        return mExprs.back().get();
    }

private:
    std::deque<std::unique_ptr<DimExpr>> mExprs;
};

std::string exprName(IDimensionExpr const* expr)
{
    auto const* ours = dynamic_cast<DimExpr const*>(expr);
    return ours != nullptr ? ours->name() : (expr == nullptr ? "null" : "foreign");
}

class BuilderImpl : public nvinfer1::apiv::VExprBuilder
{
public:
    explicit BuilderImpl(ExprPool& pool)
        : mPool{pool}
    {
    }
    IDimensionExpr const* constant(int64_t value) override
    {
        ++mCalls;
        return mPool.constant(value);
    }
    IDimensionExpr const* operation(
        nvinfer1::DimensionOperation op, IDimensionExpr const& first, IDimensionExpr const& second) override
    {
        ++mCalls;
        return mPool.symbol("op" + std::to_string(static_cast<int32_t>(op)) + "(" + exprName(&first) + ","
            + exprName(&second) + ")");
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override
    {
        ++mCalls;
        return mPool.symbol("size_tensor");
    }
    int32_t calls() const
    {
        return mCalls;
    }

private:
    ExprPool& mPool;
    int32_t mCalls{0};
};

class ExprBuilder : public nvinfer1::IExprBuilder
{
public:
    explicit ExprBuilder(BuilderImpl* impl)
    {
        mImpl = impl;
    }
    ~ExprBuilder() noexcept override = default;
};

class ResourceContext : public nvinfer1::IPluginResourceContext
{
public:
    nvinfer1::IGpuAllocator* getGpuAllocator() const noexcept override
    {
        return nullptr;
    }
    nvinfer1::IErrorRecorder* getErrorRecorder() const noexcept override
    {
        return nullptr;
    }
    ~ResourceContext() noexcept override = default;
};

// ---------------------------------------------------------------------------------------------------------
// Shapes, fields

//! Symbolic extent (-1 in Dims) or a number.
struct Extent
{
    std::string symbol; //!< empty: constant
    int64_t value;      //!< the value at run time (and the constant)
};

Extent sym(std::string name, int64_t value)
{
    return Extent{std::move(name), value};
}
Extent num(int64_t value)
{
    return Extent{"", value};
}

using Shape = std::vector<Extent>;

Dims buildDims(Shape const& shape) //!< -1 where symbolic, as TensorRT gives configurePlugin
{
    Dims dims{};
    dims.nbDims = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i)
    {
        dims.d[i] = shape[i].symbol.empty() ? shape[i].value : -1;
    }
    return dims;
}

Dims runDims(Shape const& shape) //!< every extent known, as onShapeChange / enqueue see it
{
    Dims dims{};
    dims.nbDims = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i)
    {
        dims.d[i] = shape[i].value;
    }
    return dims;
}

DimsExprs buildExprs(Shape const& shape, ExprPool& pool)
{
    DimsExprs exprs{};
    exprs.nbDims = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i)
    {
        exprs.d[i] = shape[i].symbol.empty() ? pool.constant(shape[i].value) : pool.symbol(shape[i].symbol);
    }
    return exprs;
}

std::string exprsText(DimsExprs const& exprs)
{
    std::string text{"["};
    for (int32_t i = 0; i < exprs.nbDims; ++i)
    {
        text += (i > 0 ? "," : "") + exprName(exprs.d[i]);
    }
    return text + "]";
}

std::string shapeText(Shape const& shape)
{
    std::string text{"["};
    for (size_t i = 0; i < shape.size(); ++i)
    {
        text += (i > 0 ? "," : "") + (shape[i].symbol.empty() ? std::to_string(shape[i].value) : shape[i].symbol);
    }
    return text + "]";
}

//! An ONNX node attribute: FLOAT or INT (the only kinds attnres nodes carry besides plugin_* strings).
struct Attribute
{
    std::string name;
    bool isFloat;
    double value;
};

//! A field collection that owns its names and bytes.
struct OwnedFields
{
    std::deque<std::string> names;
    std::deque<std::vector<uint8_t>> bytes;
    std::vector<PluginField> fields;
    PluginFieldCollection collection{};

    void add(std::string const& name, PluginFieldType type, void const* data, int32_t length, size_t size)
    {
        names.push_back(name);
        auto const* raw = static_cast<uint8_t const*>(data);
        bytes.emplace_back(raw, raw + size);
        fields.emplace_back(names.back().c_str(), bytes.back().data(), type, length);
    }
    PluginFieldCollection const* get()
    {
        collection.nbFields = static_cast<int32_t>(fields.size());
        collection.fields = fields.data();
        return &collection;
    }
};

size_t elementSize(PluginFieldType type)
{
    switch (type)
    {
    case PluginFieldType::kFLOAT16: return 2;
    case PluginFieldType::kFLOAT32: return 4;
    case PluginFieldType::kFLOAT64: return 8;
    case PluginFieldType::kINT8: return 1;
    case PluginFieldType::kINT16: return 2;
    case PluginFieldType::kINT32: return 4;
    case PluginFieldType::kCHAR: return 1;
    case PluginFieldType::kDIMS: return sizeof(Dims);
    case PluginFieldType::kBF16: return 2;
    case PluginFieldType::kINT64: return 8;
    case PluginFieldType::kFP8: return 1;
    default: return 0;
    }
}

/*
 * What onnx-tensorrt's loadFields does with a plugin node: for each field the creator lists
 * (getFieldNames, in order), the node attribute of that name if present, typed by the attribute: FLOAT ->
 * kFLOAT32, INT -> kINT32 (narrowed from int64). Attributes the creator does not list (plugin_version,
 * plugin_namespace) are not passed.
 */
void fieldsFromAttributes(IPluginCreatorV3One& creator, std::vector<Attribute> const& attributes, OwnedFields& out)
{
    PluginFieldCollection const* names = creator.getFieldNames();
    for (int32_t i = 0; names != nullptr && i < names->nbFields; ++i)
    {
        std::string const name{names->fields[i].name};
        auto found = std::find_if(attributes.begin(), attributes.end(), [&](Attribute const& a) { return a.name == name; });
        if (found == attributes.end())
        {
            continue;
        }
        if (found->isFloat)
        {
            float const value = static_cast<float>(found->value);
            out.add(name, PluginFieldType::kFLOAT32, &value, 1, sizeof(value));
        }
        else
        {
            int32_t const value = static_cast<int32_t>(static_cast<int64_t>(found->value));
            out.add(name, PluginFieldType::kINT32, &value, 1, sizeof(value));
        }
    }
}

//! Deep copy, as TensorRT serializes the fields into the engine and hands them back at deserialization.
bool copyFields(PluginFieldCollection const* source, OwnedFields& out, std::string& detail)
{
    if (source == nullptr)
    {
        detail = "getFieldsToSerialize returned null";
        return false;
    }
    for (int32_t i = 0; i < source->nbFields; ++i)
    {
        PluginField const& f = source->fields[i];
        size_t const size = elementSize(f.type);
        if (f.name == nullptr || f.length < 0 || (f.length > 0 && (f.data == nullptr || size == 0)))
        {
            detail = "field " + std::to_string(i) + " is malformed";
            return false;
        }
        out.add(f.name, f.type, f.data, f.length, size * static_cast<size_t>(f.length));
    }
    return true;
}

std::string fieldsText(PluginFieldCollection const* fc)
{
    if (fc == nullptr)
    {
        return "null";
    }
    std::ostringstream text;
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        text << (i > 0 ? ", " : "") << f.name << ":" << static_cast<int32_t>(f.type) << "x" << f.length << "=";
        if (f.type == PluginFieldType::kFLOAT32 && f.length == 1 && f.data != nullptr)
        {
            text << *static_cast<float const*>(f.data);
        }
        else if (f.type == PluginFieldType::kINT32 && f.length == 1 && f.data != nullptr)
        {
            text << *static_cast<int32_t const*>(f.data);
        }
        else
        {
            text << "?";
        }
    }
    return text.str();
}

bool sameFields(PluginFieldCollection const* a, PluginFieldCollection const* b)
{
    if (a == nullptr || b == nullptr || a->nbFields != b->nbFields)
    {
        return false;
    }
    for (int32_t i = 0; i < a->nbFields; ++i)
    {
        PluginField const& x = a->fields[i];
        PluginField const& y = b->fields[i];
        size_t const size = elementSize(x.type) * static_cast<size_t>(std::max(x.length, 0));
        if (std::strcmp(x.name, y.name) != 0 || x.type != y.type || x.length != y.length
            || (size > 0 && std::memcmp(x.data, y.data, size) != 0))
        {
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------------------------
// One plugin's node description

struct NodeCase
{
    std::string label;                 //!< e.g. "3 sources"
    std::vector<Attribute> attributes; //!< ONNX attributes
    std::vector<Shape> inputs;
    std::vector<std::vector<DataType>> expectedCombos; //!< every (inputs..., outputs...) type tuple accepted
    std::vector<std::string> expectedOutputShapes;     //!< exprsText of each output
    int32_t nbOutputs{-1};                             //!< -1: the spec's nbOutputs
    size_t workspace{0};                               //!< getWorkspaceSize for the first combination
};

struct BadConfig
{
    std::string label;
    std::vector<Shape> inputs;
    std::string logged;   //!< a substring of the logged error
    int32_t nbOutputs{-1}; //!< -1: the spec's nbOutputs
};

struct BadFields
{
    std::string label;
    std::vector<Attribute> attributes;
    bool useNullCollection;
    std::string logged;
};

struct PluginSpec
{
    std::string name;
    std::vector<std::pair<std::string, PluginFieldType>> fieldNames; //!< what getFieldNames must list
    int32_t nbOutputs; //!< of every case that does not say, and of the bad configurations
    std::vector<NodeCase> cases;
    std::vector<BadConfig> badConfigs;
    std::vector<BadFields> badFields;
    std::string enqueueBeforeShapes; //!< substring of the error enqueue logs before onShapeChange
};

std::vector<DataType> const kKernelTypes{DataType::kFLOAT, DataType::kHALF, DataType::kBF16};

std::string typeName(DataType t)
{
    switch (t)
    {
    case DataType::kFLOAT: return "f32";
    case DataType::kHALF: return "f16";
    case DataType::kBF16: return "bf16";
    case DataType::kINT32: return "i32";
    case DataType::kINT64: return "i64";
    case DataType::kINT8: return "i8";
    case DataType::kUINT8: return "u8";
    case DataType::kBOOL: return "bool";
    case DataType::kFP8: return "fp8";
    default: return "t" + std::to_string(static_cast<int32_t>(t));
    }
}

//! "(f32,f16x3,f16)": runs of one type are counted.
std::string comboText(std::vector<DataType> const& combo)
{
    std::string text{"("};
    for (size_t i = 0; i < combo.size();)
    {
        size_t run = 1;
        while (i + run < combo.size() && combo[i + run] == combo[i])
        {
            ++run;
        }
        text += (i > 0 ? "," : "") + typeName(combo[i]) + (run > 2 ? "x" + std::to_string(run) : "");
        if (run == 2)
        {
            text += "," + typeName(combo[i]);
        }
        i += run;
    }
    return text + ")";
}

PluginSpec aggregateSpec()
{
    PluginSpec spec;
    spec.name = "AttnResAggregate";
    spec.fieldNames = {{"eps", PluginFieldType::kFLOAT32}};
    spec.nbOutputs = 1;
    std::vector<Attribute> const attrs{{"eps", true, 1e-6}};
    for (int32_t sources : {1, 3, 256})
    {
        NodeCase c;
        c.label = std::to_string(sources) + " sources";
        c.attributes = attrs;
        c.inputs.push_back({num(64)});
        for (int32_t i = 0; i < sources; ++i)
        {
            c.inputs.push_back({sym("B", 2), sym("T", 5), num(64)});
        }
        for (DataType t : kKernelTypes)
        {
            std::vector<DataType> combo{DataType::kFLOAT};
            combo.insert(combo.end(), static_cast<size_t>(sources), t);
            combo.push_back(t);
            c.expectedCombos.push_back(combo);
        }
        c.expectedOutputShapes = {"[B,T,64]"};
        spec.cases.push_back(c);
    }
    spec.badConfigs = {
        {"sources of different shapes", {{num(64)}, {sym("B", 2), sym("T", 5), num(64)}, {sym("B", 2), num(7), num(32)}},
            "all sources must have the same shape"},
        {"score_weight not [D]", {{num(32)}, {sym("B", 2), sym("T", 5), num(64)}}, "score_weight must be [D]"},
        {"no source", {{num(64)}}, "expects score_weight and 1..256 sources"},
    };
    spec.badFields = {
        {"eps missing", {}, false, "required field eps is missing"},
        {"eps as INT", {{"eps", false, 1}}, false, "field eps must be float32"},
        {"eps negative", {{"eps", true, -1.0}}, false, "eps must be finite and >= 0"},
        {"null field collection", {}, true, "required field eps is missing"},
    };
    spec.enqueueBeforeShapes = "number of sources is unknown";
    return spec;
}

PluginSpec aggregateNormSpec()
{
    PluginSpec spec;
    spec.name = "AttnResAggregateNorm";
    spec.fieldNames = {{"eps", PluginFieldType::kFLOAT32}, {"norm_eps", PluginFieldType::kFLOAT32},
        {"has_aggregate", PluginFieldType::kINT32}};
    spec.nbOutputs = 1;
    for (int32_t sources : {1, 3, 256})
    {
        for (int32_t hasAggregate : {0, 1})
        {
            NodeCase c;
            c.label = std::to_string(sources) + " sources, has_aggregate=" + std::to_string(hasAggregate);
            c.attributes = {{"eps", true, 1e-6}, {"norm_eps", true, 1e-5}, {"has_aggregate", false, 1.0 * hasAggregate}};
            c.inputs.push_back({num(64)});
            c.inputs.push_back({num(64)});
            for (int32_t i = 0; i < sources; ++i)
            {
                c.inputs.push_back({sym("B", 2), sym("T", 5), num(64)});
            }
            for (DataType t : kKernelTypes)
            {
                std::vector<DataType> combo{DataType::kFLOAT, DataType::kFLOAT};
                combo.insert(combo.end(), static_cast<size_t>(sources), t);
                combo.insert(combo.end(), static_cast<size_t>(1 + hasAggregate), t);
                c.expectedCombos.push_back(combo);
            }
            c.expectedOutputShapes.assign(static_cast<size_t>(1 + hasAggregate), "[B,T,64]");
            c.nbOutputs = 1 + hasAggregate;
            // h in a workspace when it is no output: B * T * 64 float32 (the first combination) at the max shape.
            c.workspace = hasAggregate != 0 ? 0 : size_t{2} * 5 * 64 * sizeof(float);
            spec.cases.push_back(c);
        }
    }
    Shape const source{sym("B", 2), sym("T", 5), num(64)};
    spec.badConfigs = {
        {"sources of different shapes", {{num(64)}, {num(64)}, source, {sym("B", 2), num(7), num(32)}},
            "all sources must have the same shape"},
        {"score_weight not [D]", {{num(32)}, {num(64)}, source}, "score_weight must be [D]"},
        {"norm_weight not [D]", {{num(64)}, {num(63)}, source}, "norm_weight must be [D]"},
        {"norm_weight of rank 2", {{num(64)}, {num(1), num(64)}, source}, "norm_weight must be [D]"},
        {"no source", {{num(64)}, {num(64)}}, "expects score_weight, norm_weight and 1..256 sources"},
        {"h listed without has_aggregate", {{num(64)}, {num(64)}, source}, "1 output(s) (has_aggregate=0), got 3 inputs and 2",
            2},
    };
    std::vector<Attribute> const good{{"eps", true, 1e-6}, {"norm_eps", true, 1e-5}};
    spec.badFields = {
        {"eps missing", {{"norm_eps", true, 1e-5}}, false, "required field eps is missing"},
        {"norm_eps missing", {{"eps", true, 1e-6}}, false, "required field norm_eps is missing"},
        {"eps negative", {{"eps", true, -1.0}, {"norm_eps", true, 1e-5}}, false, "eps must be finite and >= 0"},
        {"norm_eps negative", {{"eps", true, 1e-6}, {"norm_eps", true, -1e-5}}, false,
            "norm_eps must be finite and >= 0"},
        {"norm_eps infinite", {{"eps", true, 1e-6}, {"norm_eps", true, 1e300}}, false,
            "norm_eps must be finite and >= 0"},
        {"norm_eps as INT", {{"eps", true, 1e-6}, {"norm_eps", false, 1.0}}, false, "field norm_eps must be float32"},
        {"has_aggregate = 2", {good[0], good[1], {"has_aggregate", false, 2.0}}, false,
            "field has_aggregate must be one int32 of 0 or 1"},
        {"has_aggregate = -1", {good[0], good[1], {"has_aggregate", false, -1.0}}, false,
            "field has_aggregate must be one int32 of 0 or 1"},
        {"null field collection", {}, true, "required field eps is missing"},
    };
    spec.enqueueBeforeShapes = "number of sources is unknown";
    return spec;
}

PluginSpec rsaSpec()
{
    PluginSpec spec;
    spec.name = "ResidualScoreAttention";
    spec.fieldNames = {{"scale", PluginFieldType::kFLOAT32}, {"logit_divisor", PluginFieldType::kFLOAT32},
        {"has_prev_scores", PluginFieldType::kINT32}, {"has_mask", PluginFieldType::kINT32}};
    spec.nbOutputs = 2;
    Shape const q{sym("B", 2), num(4), sym("Tq", 3), num(64)};
    Shape const k{sym("B", 2), num(4), sym("Tk", 5), num(64)};
    Shape const v{sym("B", 2), num(4), sym("Tk", 5), num(32)};
    Shape const scores{sym("B", 2), num(4), sym("Tq", 3), sym("Tk", 5)};
    Shape const mask{sym("B", 2), num(1), num(1), sym("Tk", 5)};
    struct Variant
    {
        std::string label;
        int32_t hasPrev;
        int32_t hasMask;
    };
    for (Variant const& variant : {Variant{"q,k,v", 0, 0}, Variant{"q,k,v,prev_scores", 1, 0},
             Variant{"q,k,v,mask_bias", 0, 1}, Variant{"q,k,v,prev_scores,mask_bias", 1, 1}})
    {
        NodeCase c;
        c.label = variant.label;
        c.attributes = {{"scale", true, 0.125}, {"logit_divisor", true, 1.0}, {"has_prev_scores", false, 1.0 * variant.hasPrev},
            {"has_mask", false, 1.0 * variant.hasMask}};
        c.inputs = {q, k, v};
        if (variant.hasPrev != 0)
        {
            c.inputs.push_back(scores);
        }
        if (variant.hasMask != 0)
        {
            c.inputs.push_back(mask);
        }
        for (DataType t : kKernelTypes)
        {
            std::vector<DataType> combo{t, t, t};
            combo.insert(combo.end(), c.inputs.size() - 3, DataType::kFLOAT);
            combo.push_back(t);
            combo.push_back(DataType::kFLOAT);
            c.expectedCombos.push_back(combo);
        }
        c.expectedOutputShapes = {"[B,4,Tq,32]", "[B,4,Tq,Tk]"};
        spec.cases.push_back(c);
    }
    Shape const bigQ{sym("B", 2), num(4), sym("Tq", 3), num(256)};
    Shape const bigK{sym("B", 2), num(4), sym("Tk", 5), num(256)};
    spec.badConfigs = {
        {"head size 256", {bigQ, bigK, v}, "are outside 1..128"},
        {"q of rank 3", {{sym("B", 2), sym("Tq", 3), num(64)}, k, v}, "must be 4-D"},
        {"mask not broadcastable", {q, k, v, {sym("B", 2), num(3), num(1), sym("Tk", 5)}}, "not broadcastable"},
        {"six inputs", {q, k, v, scores, mask, mask}, "3 to 5 inputs"},
    };
    spec.badFields = {
        {"scale missing", {{"logit_divisor", true, 1.0}}, false, "required field scale is missing"},
        {"logit_divisor zero", {{"scale", true, 0.125}, {"logit_divisor", true, 0.0}}, false,
            "logit_divisor must be finite and non-zero"},
        {"has_mask = 2", {{"scale", true, 0.125}, {"logit_divisor", true, 1.0}, {"has_mask", false, 2.0}}, false,
            "must be one int32 of -1 (infer), 0 or 1"},
        {"scale as INT", {{"scale", false, 1.0}, {"logit_divisor", true, 1.0}}, false, "field scale must be one float32"},
    };
    spec.enqueueBeforeShapes = "enqueue before onShapeChange";
    return spec;
}

// ---------------------------------------------------------------------------------------------------------
// The checks

struct Interfaces
{
    IPluginV3OneCore* core{nullptr};
    IPluginV3OneBuild* build{nullptr};
    IPluginV3OneRuntime* runtime{nullptr};
};

Interfaces interfacesOf(IPluginV3* plugin)
{
    Interfaces result;
    if (plugin == nullptr)
    {
        return result;
    }
    result.core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    result.build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    result.runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    return result;
}

bool interfaceIs(nvinfer1::IVersionedInterface const* object, char const* kind, int32_t major, std::string& detail)
{
    if (object == nullptr)
    {
        detail = "null";
        return false;
    }
    nvinfer1::InterfaceInfo const info = object->getInterfaceInfo();
    detail = std::string{info.kind != nullptr ? info.kind : "null"} + " " + std::to_string(info.major) + "."
        + std::to_string(info.minor);
    return info.kind != nullptr && std::strcmp(info.kind, kind) == 0 && info.major == major;
}

std::vector<DynamicPluginTensorDesc> describe(std::vector<Shape> const& shapes, std::vector<DataType> const& types)
{
    std::vector<DynamicPluginTensorDesc> io(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i)
    {
        io[i].desc.dims = buildDims(shapes[i]);
        io[i].desc.type = i < types.size() ? types[i] : DataType::kFLOAT;
        io[i].desc.format = TensorFormat::kLINEAR;
        io[i].desc.scale = 1.F;
        io[i].min = runDims(shapes[i]);
        io[i].opt = runDims(shapes[i]);
        io[i].max = runDims(shapes[i]);
    }
    return io;
}

/*
 * TensorRT's format search: position by position, each (type, format) candidate is offered with the
 * earlier positions fixed to accepted choices and the later ones holding whatever was there. A plugin may
 * read only positions <= pos; two different fills of the later positions must give the same result.
 */
void formatSearch(IPluginV3OneBuild* build, std::vector<DynamicPluginTensorDesc>& io, int32_t nbInputs,
    int32_t nbOutputs, int32_t pos, DataType poisonType, TensorFormat poisonFormat,
    std::set<std::vector<DataType>>& accepted, int64_t& queries)
{
    int32_t const total = nbInputs + nbOutputs;
    if (pos == total)
    {
        std::vector<DataType> combo;
        for (auto const& d : io)
        {
            combo.push_back(d.desc.type);
        }
        accepted.insert(combo);
        return;
    }
    for (int32_t t = 0; t < nvinfer1::EnumMax<DataType>(); ++t)
    {
        for (int32_t f = 0; f < nvinfer1::EnumMax<TensorFormat>(); ++f)
        {
            io[pos].desc.type = static_cast<DataType>(t);
            io[pos].desc.format = static_cast<TensorFormat>(f);
            for (int32_t later = pos + 1; later < total; ++later)
            {
                io[later].desc.type = poisonType;
                io[later].desc.format = poisonFormat;
            }
            ++queries;
            if (build->supportsFormatCombination(pos, io.data(), nbInputs, nbOutputs))
            {
                if (f != static_cast<int32_t>(TensorFormat::kLINEAR))
                {
                    // Recorded as a type tuple with a marker so that a non-linear acceptance fails the check.
                    io[pos].desc.type = static_cast<DataType>(1000 + t);
                }
                formatSearch(build, io, nbInputs, nbOutputs, pos + 1, poisonType, poisonFormat, accepted, queries);
            }
        }
    }
}

class Harness
{
public:
    explicit Harness(bool gpuPresent)
        : mGpuPresent{gpuPresent}
    {
    }

    void run(PluginSpec const& spec)
    {
        std::string const scope = spec.name;
        auto* creatorInterface = getPluginRegistry()->getCreator(spec.name.c_str(), "1", "attnres");
        if (!check(creatorInterface != nullptr, scope, "registry getCreator(name, \"1\", \"attnres\") finds the creator"))
        {
            return;
        }
        std::string detail;
        if (!check(interfaceIs(creatorInterface, "PLUGIN CREATOR_V3ONE", 1, detail), scope,
                "creator interface is PLUGIN CREATOR_V3ONE 1.x", detail))
        {
            return;
        }
        auto& creator = static_cast<IPluginCreatorV3One&>(*creatorInterface);
        check(spec.name == creator.getPluginName() && std::string{"1"} == creator.getPluginVersion()
                && std::string{"attnres"} == creator.getPluginNamespace(),
            scope, "creator name, version \"1\", namespace \"attnres\"",
            std::string{creator.getPluginName()} + " " + creator.getPluginVersion() + " " + creator.getPluginNamespace());

        PluginFieldCollection const* names = creator.getFieldNames();
        bool namesOk = names != nullptr && names->nbFields == static_cast<int32_t>(spec.fieldNames.size());
        std::string listed;
        for (int32_t i = 0; names != nullptr && i < names->nbFields; ++i)
        {
            listed += std::string{i > 0 ? ", " : ""} + names->fields[i].name + ":"
                + std::to_string(static_cast<int32_t>(names->fields[i].type));
            namesOk = namesOk && i < static_cast<int32_t>(spec.fieldNames.size())
                && spec.fieldNames[i].first == names->fields[i].name && spec.fieldNames[i].second == names->fields[i].type;
        }
        check(namesOk, scope, "getFieldNames lists the documented fields and types", listed);

        for (BadFields const& bad : spec.badFields)
        {
            OwnedFields fields;
            fieldsFromAttributes(creator, bad.attributes, fields);
            takeLog();
            IPluginV3* plugin = creator.createPlugin("bad", bad.useNullCollection ? nullptr : fields.get(), TensorRTPhase::kBUILD);
            std::string logged;
            bool const refused = plugin == nullptr;
            bool const says = loggedError(takeLog(), bad.logged, logged);
            check(refused && says, scope, "createPlugin refuses " + bad.label + " with a logged error",
                refused ? logged : "returned a plugin");
            delete plugin;
        }

        for (NodeCase const& node : spec.cases)
        {
            runCase(spec, creator, node);
        }
        runBadConfigs(spec, creator);
    }

private:
    void runCase(PluginSpec const& spec, IPluginCreatorV3One& creator, NodeCase const& node)
    {
        std::string const scope = spec.name + " [" + node.label + "]";
        OwnedFields fields;
        fieldsFromAttributes(creator, node.attributes, fields);
        info(scope, "fields from ONNX attributes: " + fieldsText(fields.get()));
        takeLog();
        std::unique_ptr<IPluginV3> plugin{creator.createPlugin("node", fields.get(), TensorRTPhase::kBUILD)};
        if (!check(plugin != nullptr, scope, "createPlugin(kBUILD) from the node's attributes", logText()))
        {
            return;
        }
        std::string detail;
        check(interfaceIs(plugin.get(), "PLUGIN", 1, detail), scope, "plugin interface is PLUGIN 1.x", detail);
        Interfaces const in = interfacesOf(plugin.get());
        bool const distinct = in.core != nullptr && in.build != nullptr && in.runtime != nullptr
            && static_cast<void*>(in.core) != static_cast<void*>(in.build)
            && static_cast<void*>(in.build) != static_cast<void*>(in.runtime);
        if (!check(distinct, scope, "getCapabilityInterface(kCORE, kBUILD, kRUNTIME): three distinct interfaces"))
        {
            return;
        }
        std::string coreKind, buildKind, runtimeKind;
        bool const kinds = interfaceIs(in.core, "PLUGIN_V3ONE_CORE", 1, coreKind)
            && interfaceIs(in.build, "PLUGIN_V3ONE_BUILD", 1, buildKind)
            && interfaceIs(in.runtime, "PLUGIN_V3ONE_RUNTIME", 1, runtimeKind);
        check(kinds, scope, "interface kinds PLUGIN_V3ONE_CORE / BUILD (v1) / RUNTIME",
            coreKind + ", " + buildKind + ", " + runtimeKind);
        check(spec.name == in.core->getPluginName() && std::string{"1"} == in.core->getPluginVersion()
                && std::string{"attnres"} == in.core->getPluginNamespace(),
            scope, "plugin name, version and namespace equal the creator's");

        int32_t const nbInputs = static_cast<int32_t>(node.inputs.size());
        int32_t const nbOutputs = in.build->getNbOutputs();
        int32_t const expectedOutputs = node.nbOutputs >= 0 ? node.nbOutputs : spec.nbOutputs;
        check(nbOutputs == expectedOutputs, scope, "getNbOutputs = " + std::to_string(expectedOutputs),
            std::to_string(nbOutputs));

        // Output types for every type the kernels take (the first accepted combination of each).
        for (auto const& combo : node.expectedCombos)
        {
            std::vector<DataType> inputTypes(combo.begin(), combo.begin() + nbInputs);
            std::vector<DataType> outputTypes(static_cast<size_t>(nbOutputs), DataType::kINT8);
            int32_t const status = in.build->getOutputDataTypes(outputTypes.data(), nbOutputs, inputTypes.data(), nbInputs);
            std::vector<DataType> expected(combo.begin() + nbInputs, combo.end());
            check(status == 0 && outputTypes == expected, scope,
                "getOutputDataTypes for inputs " + comboText(inputTypes) + " = " + comboText(expected),
                "status " + std::to_string(status) + ", got " + comboText(outputTypes));
        }

        // Output shapes through the harness's IExprBuilder.
        {
            ExprPool pool;
            BuilderImpl builderImpl{pool};
            ExprBuilder builder{&builderImpl};
            std::vector<DimsExprs> inputs;
            for (Shape const& s : node.inputs)
            {
                inputs.push_back(buildExprs(s, pool));
            }
            std::vector<DimsExprs> outputs(static_cast<size_t>(nbOutputs));
            int32_t const status
                = in.build->getOutputShapes(inputs.data(), nbInputs, nullptr, 0, outputs.data(), nbOutputs, builder);
            std::string got;
            bool ok = status == 0;
            for (int32_t o = 0; o < nbOutputs; ++o)
            {
                got += (o > 0 ? " " : "") + exprsText(outputs[o]);
                ok = ok && exprsText(outputs[o]) == node.expectedOutputShapes[o];
            }
            check(ok, scope, "getOutputShapes = " + [&] {
                std::string e;
                for (auto const& s : node.expectedOutputShapes)
                {
                    e += (e.empty() ? "" : " ") + s;
                }
                return e;
            }(), "status " + std::to_string(status) + ", got " + got);
            info(scope, "getOutputShapes called the IExprBuilder " + std::to_string(builderImpl.calls()) + " times");
        }

        // The whole format search, twice with different fills of the positions not yet decided.
        {
            std::vector<DataType> types(node.inputs.size() + static_cast<size_t>(nbOutputs), DataType::kFLOAT);
            std::vector<Shape> shapes = node.inputs;
            shapes.resize(types.size(), Shape{num(1)});
            std::set<std::vector<DataType>> acceptedA, acceptedB;
            int64_t queries = 0;
            auto ioA = describe(shapes, types);
            formatSearch(in.build, ioA, nbInputs, nbOutputs, 0, DataType::kFLOAT, TensorFormat::kLINEAR, acceptedA, queries);
            auto ioB = describe(shapes, types);
            formatSearch(in.build, ioB, nbInputs, nbOutputs, 0, DataType::kINT8, TensorFormat::kCHW32, acceptedB, queries);
            std::set<std::vector<DataType>> const expected(node.expectedCombos.begin(), node.expectedCombos.end());
            std::string got;
            for (auto const& combo : acceptedA)
            {
                got += comboText(combo);
            }
            check(acceptedA == expected, scope,
                "supportsFormatCombination over " + std::to_string(nvinfer1::EnumMax<DataType>()) + " types x "
                    + std::to_string(nvinfer1::EnumMax<TensorFormat>()) + " formats accepts exactly "
                    + std::to_string(expected.size()) + " linear combinations",
                "accepted " + std::to_string(acceptedA.size()) + ": " + got);
            check(acceptedA == acceptedB, scope, "supportsFormatCombination reads no position after pos",
                acceptedA == acceptedB ? "" : "results differ with another fill of the later positions");
            info(scope, std::to_string(queries) + " supportsFormatCombination queries");
        }

        // configurePlugin with dynamic extents, then serialize and deserialize as TensorRT does.
        {
            std::vector<DataType> types(node.expectedCombos.front().begin(), node.expectedCombos.front().end());
            std::vector<Shape> outputShapes(static_cast<size_t>(nbOutputs), Shape{num(1)});
            auto inDesc = describe(node.inputs, types);
            auto outDesc = describe(outputShapes, std::vector<DataType>(types.begin() + nbInputs, types.end()));
            takeLog();
            int32_t const status = in.build->configurePlugin(inDesc.data(), nbInputs, outDesc.data(), nbOutputs);
            check(status == 0, scope, "configurePlugin with dynamic extents " + shapeText(node.inputs.back()),
                "status " + std::to_string(status) + "; " + logText());
            size_t const workspace = in.build->getWorkspaceSize(inDesc.data(), nbInputs, outDesc.data(), nbOutputs);
            check(workspace == node.workspace, scope, "getWorkspaceSize = " + std::to_string(node.workspace),
                std::to_string(workspace));
        }

        OwnedFields serialized;
        std::string copyDetail;
        PluginFieldCollection const* toSerialize = in.runtime->getFieldsToSerialize();
        if (!check(copyFields(toSerialize, serialized, copyDetail), scope, "getFieldsToSerialize", copyDetail))
        {
            return;
        }
        info(scope, "serialized fields: " + fieldsText(serialized.get()));
        std::unique_ptr<IPluginV3> restored{creator.createPlugin("node", serialized.get(), TensorRTPhase::kRUNTIME)};
        if (!check(restored != nullptr, scope, "createPlugin(kRUNTIME) from the serialized fields", logText()))
        {
            return;
        }
        Interfaces const back = interfacesOf(restored.get());
        check(back.runtime != nullptr && sameFields(back.runtime->getFieldsToSerialize(), serialized.get()), scope,
            "deserialized plugin serializes the same fields",
            back.runtime != nullptr ? fieldsText(back.runtime->getFieldsToSerialize()) : "no runtime interface");

        // clone: a new object with the same fields, independent of the original.
        {
            std::unique_ptr<IPluginV3> copy{restored->clone()};
            check(copy != nullptr && copy.get() != restored.get(), scope, "clone returns a new plugin");
            if (copy != nullptr)
            {
                Interfaces const c = interfacesOf(copy.get());
                OwnedFields before;
                std::string ignored;
                copyFields(back.runtime->getFieldsToSerialize(), before, ignored);
                restored.reset(copy.release()); // the original is deleted, the clone lives on
                Interfaces const now = interfacesOf(restored.get());
                check(c.runtime != nullptr && now.runtime == c.runtime
                        && sameFields(now.runtime->getFieldsToSerialize(), before.get()),
                    scope, "clone keeps the fields after the original is deleted");
            }
        }

        runRuntime(spec, scope, restored.get(), node, nbInputs, nbOutputs);
    }

    void runRuntime(PluginSpec const& spec, std::string const& scope, IPluginV3* deserialized, NodeCase const& node,
        int32_t nbInputs, int32_t nbOutputs)
    {
        Interfaces const in = interfacesOf(deserialized);
        std::vector<DataType> const types = node.expectedCombos.front();
        std::vector<PluginTensorDesc> inDesc(static_cast<size_t>(nbInputs));
        std::vector<PluginTensorDesc> outDesc(static_cast<size_t>(nbOutputs));
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            inDesc[i].dims = runDims(node.inputs[i]);
            inDesc[i].type = types[i];
            inDesc[i].format = TensorFormat::kLINEAR;
            inDesc[i].scale = 1.F;
        }
        for (int32_t o = 0; o < nbOutputs; ++o)
        {
            outDesc[o].dims = runDims(node.inputs.front());
            outDesc[o].type = types[nbInputs + o];
            outDesc[o].format = TensorFormat::kLINEAR;
            outDesc[o].scale = 1.F;
        }
        std::vector<void const*> nullInputs(static_cast<size_t>(nbInputs), nullptr);
        std::vector<void*> nullOutputs(static_cast<size_t>(nbOutputs), nullptr);

        // enqueue on a plugin that never saw onShapeChange (a fresh deserialized plugin).
        takeLog();
        int32_t status = in.runtime->enqueue(inDesc.data(), outDesc.data(), nullInputs.data(), nullOutputs.data(),
            nullptr, nullptr);
        std::string logged;
        bool says = loggedError(takeLog(), spec.enqueueBeforeShapes, logged);
        check(status != 0 && says, scope, "enqueue before onShapeChange fails with a logged error",
            "status " + std::to_string(status) + "; " + logged);

        ResourceContext context;
        std::unique_ptr<IPluginV3> attached{in.runtime->attachToContext(&context)};
        if (!check(attached != nullptr && attached.get() != deserialized, scope,
                "attachToContext returns a new plugin"))
        {
            return;
        }
        Interfaces const run = interfacesOf(attached.get());
        takeLog();
        status = run.runtime->onShapeChange(inDesc.data(), nbInputs, outDesc.data(), nbOutputs);
        check(status == 0, scope, "onShapeChange with the run-time shapes", "status " + std::to_string(status) + "; " + logText());

        // Null buffers: the launcher refuses them before touching CUDA.
        takeLog();
        status = run.runtime->enqueue(inDesc.data(), outDesc.data(), nullInputs.data(), nullOutputs.data(), nullptr,
            nullptr);
        says = loggedError(takeLog(), spec.name + ": kernel launch failed", logged);
        check(status != 0 && says, scope, "enqueue with null buffers fails with a logged error",
            "status " + std::to_string(status) + "; " + logged);

        // Non-null buffers: without a GPU the CUDA runtime fails; the plugin must report it, not crash.
        if (mGpuPresent)
        {
            skip(scope, "enqueue without a GPU", "a GPU is present (the launch would run on made-up pointers)");
            return;
        }
        // Distinct host buffers for every input, output and the workspace, so that the launcher's argument
        // checks (non-null, outputs that must not alias) pass and the failure is the CUDA runtime's.
        std::vector<std::vector<float>> scratch(static_cast<size_t>(nbInputs + nbOutputs + 1), std::vector<float>(64));
        std::vector<void const*> fakeInputs;
        std::vector<void*> fakeOutputs;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            fakeInputs.push_back(scratch[static_cast<size_t>(i)].data());
        }
        for (int32_t o = 0; o < nbOutputs; ++o)
        {
            fakeOutputs.push_back(scratch[static_cast<size_t>(nbInputs + o)].data());
        }
        takeLog();
        status = run.runtime->enqueue(inDesc.data(), outDesc.data(), fakeInputs.data(), fakeOutputs.data(),
            scratch.back().data(), nullptr);
        says = loggedError(takeLog(), spec.name + ": kernel launch failed", logged);
        bool const refusedArguments = logged.find("invalid argument") != std::string::npos;
        check(status != 0 && says && !refusedArguments, scope, "enqueue without a GPU fails with the CUDA error logged",
            "status " + std::to_string(status) + "; " + logged);
    }

    void runBadConfigs(PluginSpec const& spec, IPluginCreatorV3One& creator)
    {
        NodeCase const& node = spec.cases.front();
        for (BadConfig const& bad : spec.badConfigs)
        {
            std::string const scope = spec.name + " [" + bad.label + "]";
            OwnedFields fields;
            // Without the has_* fields, so that only the shapes are wrong: ResidualScoreAttention infers the
            // roles, AttnResAggregateNorm takes has_aggregate = 0 (one output).
            std::vector<Attribute> attributes;
            for (Attribute const& a : node.attributes)
            {
                if (a.name.rfind("has_", 0) != 0)
                {
                    attributes.push_back(a);
                }
            }
            fieldsFromAttributes(creator, attributes, fields);
            std::unique_ptr<IPluginV3> plugin{creator.createPlugin("bad", fields.get(), TensorRTPhase::kBUILD)};
            if (!check(plugin != nullptr, scope, "createPlugin"))
            {
                continue;
            }
            Interfaces const in = interfacesOf(plugin.get());
            int32_t const nbInputs = static_cast<int32_t>(bad.inputs.size());
            int32_t const nbOutputs = bad.nbOutputs >= 0 ? bad.nbOutputs : spec.nbOutputs;
            std::vector<DataType> types(bad.inputs.size() + static_cast<size_t>(nbOutputs), DataType::kFLOAT);
            std::vector<Shape> outputs(static_cast<size_t>(nbOutputs), Shape{num(1)});
            auto inDesc = describe(bad.inputs, types);
            auto outDesc = describe(outputs, types);
            takeLog();
            int32_t const status = in.build->configurePlugin(inDesc.data(), nbInputs, outDesc.data(), nbOutputs);
            std::string logged;
            bool const says = loggedError(takeLog(), bad.logged, logged);
            check(status != 0 && says, scope, "configurePlugin refuses it with a logged error",
                "status " + std::to_string(status) + "; " + logged);
            check(!in.build->supportsFormatCombination(0, inDesc.data(), nbInputs, nbOutputs + 5), scope,
                "supportsFormatCombination refuses a wrong output count");
        }
    }

    static std::string logText()
    {
        auto const messages = takeLog();
        return messages.empty() ? "nothing logged" : "logged: " + messages.front();
    }

    bool mGpuPresent;
};

bool fileExists(char const* path)
{
    struct stat st{};
    return stat(path, &st) == 0;
}

} // namespace

int main(int argc, char** argv)
{
    if (argc != 3 || (std::string{argv[1]} != "static" && std::string{argv[1]} != "dynamic"))
    {
        std::cerr << "usage: plugin_harness static|dynamic LIBRARY\n";
        return 2;
    }
    std::string const mode{argv[1]};
    char const* const library = argv[2];
    std::string const scope = "library (" + mode + ")";
    std::cout << "INFO harness: TensorRT headers " << NV_TENSORRT_MAJOR << "." << NV_TENSORRT_MINOR << "."
              << NV_TENSORRT_PATCH << ", " << nvinfer1::EnumMax<DataType>() << " data types, "
              << nvinfer1::EnumMax<TensorFormat>() << " formats\n";

    int32_t const before = attnresStandinRegistrations();
    if (mode == "static")
    {
        void* handle = dlopen(library, RTLD_LAZY | RTLD_LOCAL);
        char const* error = handle == nullptr ? dlerror() : nullptr;
        if (!check(handle != nullptr, scope, "dlopen(RTLD_LAZY | RTLD_LOCAL) loads it", error != nullptr ? error : ""))
        {
            std::cout << "SUMMARY passed=" << gPassed << " failed=" << gFailed << " skipped=" << gSkipped << "\n";
            return 1;
        }
        check(dlsym(handle, "getCreators") == nullptr, scope, "exports no getCreators (it registers itself)");
    }
    else
    {
        void* handle = attnresStandinLoadLibrary(library);
        if (!check(handle != nullptr, scope, "IPluginRegistry::loadLibrary loads it", "logged: " + [] {
                auto const m = takeLog();
                return m.empty() ? std::string{"nothing"} : m.front();
            }()))
        {
            std::cout << "SUMMARY passed=" << gPassed << " failed=" << gFailed << " skipped=" << gSkipped << "\n";
            return 1;
        }
        check(attnresStandinSetLoggerFinderCalls() == 1, scope, "loadLibrary handed setLoggerFinder a logger finder");
        check(attnresStandinGetLoggerCalls() == 0 && attnresStandinGetPluginRegistryCalls() == 0, scope,
            "the library called neither getLogger nor getPluginRegistry while loading",
            "getLogger " + std::to_string(attnresStandinGetLoggerCalls()) + ", getPluginRegistry "
                + std::to_string(attnresStandinGetPluginRegistryCalls()));
    }

    int32_t const registered = attnresStandinRegistrations() - before;
    check(registered == 3 && attnresStandinRefusedRegistrations() == 0, scope, "3 creators registered",
        std::to_string(registered) + " registered, " + std::to_string(attnresStandinRefusedRegistrations()) + " refused");
    for (int32_t i = before; i < attnresStandinRegistrations(); ++i)
    {
        auto* creator = static_cast<nvinfer1::IPluginCreatorInterface*>(attnresStandinRegistrationCreator(i));
        std::string detail;
        bool const v3 = interfaceIs(creator, "PLUGIN CREATOR_V3ONE", 1, detail);
        std::string const argument{attnresStandinRegistrationNamespace(i)};
        std::string const reported = v3 ? static_cast<IPluginCreatorV3One*>(creator)->getPluginNamespace() : "?";
        std::string const name = v3 ? static_cast<IPluginCreatorV3One*>(creator)->getPluginName() : "?";
        check(v3 && argument == reported && argument == "attnres", scope,
            "registration " + std::to_string(i - before) + " (" + name + "): namespace argument \"" + argument
                + "\" equals the creator's namespace",
            "creator reports \"" + reported + "\"");
    }
    auto startup = takeLog();
    check(startup.empty(), scope, "nothing logged while loading", startup.empty() ? "" : startup.front());

    Harness harness{fileExists("/dev/nvidiactl")};
    harness.run(aggregateSpec());
    harness.run(aggregateNormSpec());
    harness.run(rsaSpec());

    if (mode == "static")
    {
        // libattnres_trt.so logs through getLogger (the errors above reached the stand-in's logger that way).
        check(attnresStandinGetLoggerCalls() > 0, scope, "errors were logged through getLogger()");
    }
    else
    {
        // libattnres_trt_dyn.so logs only through the finder loadLibrary handed it.
        check(attnresStandinGetLoggerCalls() == 0, scope, "errors were logged through the logger finder only",
            "getLogger called " + std::to_string(attnresStandinGetLoggerCalls()) + " times");
    }
    std::cout << "SUMMARY passed=" << gPassed << " failed=" << gFailed << " skipped=" << gSkipped << "\n";
    return gFailed == 0 ? 0 : 1;
}
