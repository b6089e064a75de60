/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "api/attnresPluginCreators.h"

#include "attnResAggregateNormPlugin/attnResAggregateNormPlugin.h"
#include "attnResAggregatePlugin/attnResAggregatePlugin.h"
#include "residualScoreAttentionPlugin/residualScoreAttentionPlugin.h"

namespace attnres
{
namespace plugin
{
namespace
{

//! The creator of type T: one instance, built on first use and alive until the library unloads.
template <typename T>
nvinfer1::IPluginCreatorInterface* creatorInstance()
{
    static T creator{};
    return &creator;
}

} // namespace

nvinfer1::IPluginCreatorInterface* const* pluginCreators(int32_t& nbCreators) noexcept
{
    // The one list of creators: one entry per plugin folder.
    static nvinfer1::IPluginCreatorInterface* const creators[] = {
        creatorInstance<AttnResAggregatePluginCreator>(),
        creatorInstance<AttnResAggregateNormPluginCreator>(),
        creatorInstance<ResidualScoreAttentionPluginCreator>(),
    };
    nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}

} // namespace plugin
} // namespace attnres
