// Internal to the core: simulate.h's entry points over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include "hyper_ac/graph.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/simulate.h"
#include "node_index.h"
#include "schedule.h"

namespace hyper_ac {
namespace detail {

// simulate.h's simulate_memory with a prebuilt index.
SimulateResult simulate_memory(const Graph& graph, const NodeIndex& index, const RematPlan* plan,
                               const SimulateOptions& options);
// simulate_memory over a schedule already built (flat_schedule of a plan).
SimulateResult simulate_memory(const Graph& graph, const NodeIndex& index, const FlatSchedule& schedule,
                               const SimulateOptions& options);

}  // namespace detail
}  // namespace hyper_ac
