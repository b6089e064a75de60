/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "attnresPluginCreators.h"

#include "attnResAggregatePlugin/attnResAggregatePlugin.h"
#include "residualScoreAttentionPlugin/residualScoreAttentionPlugin.h"

namespace attnres
{
namespace plugin
{

nvinfer1::IPluginCreatorInterface* const* pluginCreators(int32_t& nbCreators) noexcept
{
    static AttnResAggregatePluginCreator aggregateCreator;
    static ResidualScoreAttentionPluginCreator residualAttentionCreator;
    static nvinfer1::IPluginCreatorInterface* const creators[] = {&aggregateCreator, &residualAttentionCreator};
    nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
    return creators;
}

} // namespace plugin
} // namespace attnres
