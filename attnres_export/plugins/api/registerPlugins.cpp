/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Load-time registration for libattnres_trt.so (ctypes.CDLL, Polygraphy --plugins, ONNX Runtime's
 * trt_extra_plugin_lib_paths, trtexec --staticPlugins). Each creator reports namespace "attnres", which
 * is the key TensorRT's parser looks up with the node's plugin_namespace.
 */
#include "attnResAggregatePlugin/attnResAggregatePlugin.h"
#include "residualScoreAttentionPlugin/residualScoreAttentionPlugin.h"

namespace attnres
{
namespace plugin
{

REGISTER_TENSORRT_PLUGIN(AttnResAggregatePluginCreator);
REGISTER_TENSORRT_PLUGIN(ResidualScoreAttentionPluginCreator);

} // namespace plugin
} // namespace attnres
