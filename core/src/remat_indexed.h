// Internal to the core: remat.h's entry points over a prebuilt node index (node_index.h), what
// plan() calls so the index is built once per plan. Each gives the same result
// as the public function it names.
#pragma once

#include <cstddef>
#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/remat.h"
#include "node_index.h"
#include "schedule.h"

namespace hyper_ac {
namespace detail {

// remat.h's pin_tuple_projections over the index.
std::size_t pin_tuple_projections(const NodeIndex& index, std::vector<Policy>& policies);

// remat.h's plan_remat / validate_plan with a prebuilt index. `validated`
// (optional): where plan_remat's validation leaves the rewritten schedule it
// checked (only when options.validate), so the simulation of the same plan
// need not build it again.
RematPlan plan_remat(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& policies,
                     const RematOptions& options, FlatSchedule* validated = nullptr);
void validate_plan(const Graph& graph, const NodeIndex& index, const RematPlan& plan,
                   FlatSchedule* schedule_out = nullptr);

}  // namespace detail
}  // namespace hyper_ac
