// Internal to the core: cost.h's recompute time over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include <cstdint>

#include "hyper_ac/cost.h"
#include "hyper_ac/graph.h"
#include "node_index.h"

namespace hyper_ac {
namespace detail {

// cost.h's recompute_seconds(graph, node, options) off the index (the node's
// own flops and kind; output bytes of it and its inputs from the index): the
// same value, without touching the inputs' Node structs.
double recompute_seconds(const Graph& graph, const NodeIndex& index, std::int32_t node, const CostOptions& options);

}  // namespace detail
}  // namespace hyper_ac
