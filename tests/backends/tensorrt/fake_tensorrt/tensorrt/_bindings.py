"""What each TensorRT version binds, for the members the fake implements (read from NVIDIA/TensorRT's pybind11
sources at tags v10.3.0, v10.16 and v11.1; the file of each entry is named in its comment).

``MEMBERS[class][member]`` is the set of versions whose bindings define ``member``; the fake removes every other
member, so using it raises AttributeError. ``ENUMS[enum][value]`` maps version -> the value's integer (from the
public headers of that version). ``tests/backends/tensorrt/test_fake_tensorrt.py`` checks these tables against the
binding
sources when they are available (ATTNRES_TENSORRT_GIT).
"""

from __future__ import annotations

VERSIONS = ("10.3.0", "10.16.0", "11.1.0")
TAGS = {"10.3.0": "v10.3.0", "10.16.0": "v10.16", "11.1.0": "v11.1"}

ALL = frozenset(VERSIONS)
TEN = frozenset({"10.3.0", "10.16.0"})

SOURCES = {
    "ILogger": "python/src/infer/pyCore.cpp",
    "Logger": "python/src/infer/pyCore.cpp",
    "Builder": "python/src/infer/pyCore.cpp",
    "IBuilderConfig": "python/src/infer/pyCore.cpp",
    "IOptimizationProfile": "python/src/infer/pyCore.cpp",
    "ITimingCache": "python/src/infer/pyCore.cpp",
    "Runtime": "python/src/infer/pyCore.cpp",
    "ICudaEngine": "python/src/infer/pyCore.cpp",
    "EngineInspector": "python/src/infer/pyCore.cpp",
    "IHostMemory": "python/src/infer/pyFoundationalTypes.cpp",
    "INetworkDefinition": "python/src/infer/pyGraph.cpp",
    "IPluginRegistry": "python/src/infer/pyPlugin.cpp",
    "IPluginCreatorV3One": "python/src/infer/pyPlugin.cpp",
    "OnnxParser": "python/src/parsers/pyOnnx.cpp",
    "ParserError": "python/src/parsers/pyOnnx.cpp",
}

MEMBERS: dict[str, dict[str, frozenset[str]]] = {
    # ILogger::Severity is bound with export_values() into ILogger; Logger derives from ILogger.
    "ILogger": {"Severity": ALL, "INTERNAL_ERROR": ALL, "ERROR": ALL, "WARNING": ALL, "INFO": ALL, "VERBOSE": ALL,
                "log": ALL},
    "Logger": {"min_severity": ALL, "log": ALL},
    "Builder": {"create_network": ALL, "create_builder_config": ALL, "create_optimization_profile": ALL,
                "build_serialized_network": ALL},
    "IBuilderConfig": {"profiling_verbosity": ALL, "set_memory_pool_limit": ALL, "builder_optimization_level": ALL,
                       "add_optimization_profile": ALL, "create_timing_cache": ALL, "set_timing_cache": ALL,
                       "get_timing_cache": ALL, "plugins_to_serialize": ALL, "set_flag": ALL},
    "IOptimizationProfile": {"set_shape": ALL},
    "ITimingCache": {"serialize": ALL},
    "Runtime": {"deserialize_cuda_engine": ALL, "engine_host_code_allowed": ALL},
    "ICudaEngine": {"num_io_tensors": ALL, "get_tensor_name": ALL, "get_tensor_mode": ALL, "get_tensor_dtype": ALL,
                    "get_tensor_shape": ALL, "get_tensor_profile_shape": ALL, "create_engine_inspector": ALL},
    "EngineInspector": {"get_engine_information": ALL},
    "IHostMemory": {},
    "INetworkDefinition": {},
    # plugin_creator_list: deprecated in 10.x (IPluginV2 creators only), removed in 11.
    "IPluginRegistry": {"all_creators": ALL, "load_library": ALL, "plugin_creator_list": TEN},
    "IPluginCreatorV3One": {"name": ALL, "plugin_version": ALL, "plugin_namespace": ALL},
    "OnnxParser": {"parse_from_file": ALL, "num_errors": ALL, "get_error": ALL},
    "ParserError": {"desc": ALL},
}

ENUMS: dict[str, dict[str, dict[str, int]]] = {
    # NvInfer.h: kEXPLICIT_BATCH = 0, kSTRONGLY_TYPED = 1 in 10.x; 11.x removed EXPLICIT_BATCH and renumbered.
    "NetworkDefinitionCreationFlag": {"EXPLICIT_BATCH": {"10.3.0": 0, "10.16.0": 0},
                                      "STRONGLY_TYPED": {"10.3.0": 1, "10.16.0": 1, "11.1.0": 0}},
    "BuilderFlag": {"VERSION_COMPATIBLE": {"10.3.0": 13, "10.16.0": 13, "11.1.0": 12}},
    "MemoryPoolType": {"WORKSPACE": dict.fromkeys(VERSIONS, 0)},
    "ProfilingVerbosity": {"LAYER_NAMES_ONLY": dict.fromkeys(VERSIONS, 0), "NONE": dict.fromkeys(VERSIONS, 1),
                           "DETAILED": dict.fromkeys(VERSIONS, 2)},
    "LayerInformationFormat": {"ONELINE": dict.fromkeys(VERSIONS, 0), "JSON": dict.fromkeys(VERSIONS, 1)},
    "TensorIOMode": {"NONE": dict.fromkeys(VERSIONS, 0), "INPUT": dict.fromkeys(VERSIONS, 1),
                     "OUTPUT": dict.fromkeys(VERSIONS, 2)},
    "DataType": {name: dict.fromkeys(VERSIONS, value) for name, value in (
        ("FLOAT", 0), ("HALF", 1), ("INT8", 2), ("INT32", 3), ("BOOL", 4), ("UINT8", 5), ("BF16", 7), ("INT64", 8))},
}

FUNCTIONS = {"get_plugin_registry": "python/src/infer/pyPlugin.cpp"}
