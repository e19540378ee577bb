// Internal to the core: tagging.h's entry point over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include "hyper_ac/graph.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/tagging.h"
#include "node_index.h"

namespace hyper_ac {
namespace detail {

// tagging.h's tag_policies over the index.
TagResult tag_policies(const Graph& graph, const NodeIndex& index, const Scope& scope, const TagOptions& options);

}  // namespace detail
}  // namespace hyper_ac
