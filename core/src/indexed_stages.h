// Internal to the core: each stage's entry point over a prebuilt node index
// (node_index.h), what plan() calls so the index is built once per plan. Each
// gives the same result as the public function it names.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_ac/cost.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/simulate.h"
#include "hyper_ac/tagging.h"
#include "node_index.h"
#include "schedule.h"

namespace hyper_ac {
namespace detail {

// scope.h's resolve_scope / units_from_stacks over the index (the node loops
// read its stack and phase arrays).
std::vector<ModuleFrame> units_from_stacks(const Graph& graph, const NodeIndex& index);
Scope resolve_scope(const Graph& graph, const NodeIndex& index, const ScopeOptions& options);

// tagging.h's tag_policies over the index.
TagResult tag_policies(const Graph& graph, const NodeIndex& index, const Scope& scope, const TagOptions& options);

// remat.h's pin_tuple_projections over the index.
std::size_t pin_tuple_projections(const NodeIndex& index, std::vector<Policy>& policies);

// cost.h's recompute_seconds(graph, node, options) off the index (the node's
// own flops and kind; output bytes of it and its inputs from the index): the
// same value, without touching the inputs' Node structs.
double recompute_seconds(const Graph& graph, const NodeIndex& index, std::int32_t node, const CostOptions& options);

// mincut.h's solve_min_cut and pareto with a prebuilt index.
MinCutResult solve_min_cut(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                           const MinCutOptions& options);
ParetoResult pareto(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                    const MinCutOptions& options, const ParetoOptions& sweep = {});

// The public entry points with a prebuilt index (remat.h, simulate.h).
// `validated` (optional): where plan_remat's validation leaves the rewritten
// schedule it checked (only when options.validate), so the simulation of the
// same plan need not build it again.
RematPlan plan_remat(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& policies,
                     const RematOptions& options, FlatSchedule* validated = nullptr);
void validate_plan(const Graph& graph, const NodeIndex& index, const RematPlan& plan,
                   FlatSchedule* schedule_out = nullptr);
SimulateResult simulate_memory(const Graph& graph, const NodeIndex& index, const RematPlan* plan,
                               const SimulateOptions& options);
// simulate_memory over a schedule already built (flat_schedule of a plan).
SimulateResult simulate_memory(const Graph& graph, const NodeIndex& index, const FlatSchedule& schedule,
                               const SimulateOptions& options);

}  // namespace detail
}  // namespace hyper_ac
