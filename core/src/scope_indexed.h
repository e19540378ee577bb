// Internal to the core: scope.h's entry points over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/scope.h"
#include "node_index.h"

namespace hyper_ac {
namespace detail {

// scope.h's resolve_scope / units_from_stacks over the index (the node loops
// read its stack and phase arrays).
std::vector<ModuleFrame> units_from_stacks(const Graph& graph, const NodeIndex& index);
Scope resolve_scope(const Graph& graph, const NodeIndex& index, const ScopeOptions& options);

}  // namespace detail
}  // namespace hyper_ac
