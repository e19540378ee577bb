// Internal to the core: mincut.h's entry points over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "node_index.h"

namespace hyper_ac {
namespace detail {

// mincut.h's solve_min_cut and frontier_cuts with a prebuilt index.
MinCutResult solve_min_cut(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                           const MinCutOptions& options);
FrontierResult frontier_cuts(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                    const MinCutOptions& options, const FrontierOptions& sweep = {});

}  // namespace detail
}  // namespace hyper_ac
