// Internal to the core: compact per-node facts of a graph (one pass over the
// nodes, flat arrays) and the rewritten step as flat arrays, shared by the
// remat planner, its validation and the memory simulator. plan() builds the
// index once and every evaluation (each frontier point) reads it, instead of
// walking the scattered Node structs again. remat.h's rewritten_schedule is
// the public form of the schedule.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "hyper_ac/cost.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/simulate.h"
#include "hyper_ac/tagging.h"

namespace hyper_ac {
namespace detail {

struct NodeIndex {
  explicit NodeIndex(const Graph& graph);

  enum Flag : std::uint16_t {
    kForward = 1,         // Node::is_forward()
    kCallFunction = 2,    // NodeKind::CallFunction
    kOutput = 4,          // NodeKind::Output
    kResident = 8,        // a placeholder or get_attr (simulate.h: resident)
    kProjects = 16,       // a getitem taking one element of an allocating multi-output producer
    kMultiAlias = 32,     // more than one alias position (alias.h): read them off the node
    kRng = 64,            // Node::rng
    kRecomputedFrom = 128, // a duplicate made by an earlier pass (Node::recomputed_from non-empty)
    kGetitem = 256,        // operator.getitem (alias.h is_getitem)
    kMutated = 512,        // Node::mutated
    kMutatesInputs = 1024, // Node::mutated_inputs non-empty
    kSymint = 2048,        // Node::symint
    kView = 4096,          // Node::view
    kNoOutputs = 8192      // Node::outputs empty
  };

  std::size_t size() const { return flags.size(); }
  bool has(std::size_t i, Flag flag) const { return (flags[i] & flag) != 0; }
  bool forward(std::size_t i) const { return has(i, kForward); }
  // A backward node other than the output (remat.cc: backward_consumer).
  bool backward_consumer(std::size_t i) const { return !has(i, kForward) && !has(i, kOutput); }

  std::vector<std::uint16_t> flags;
  std::vector<std::int32_t> input_start;  // per node + 1: offsets into `inputs`
  std::vector<std::int32_t> inputs;       // Node::inputs, concatenated
  std::vector<std::int64_t> output_bytes; // Node::output_bytes()
  std::vector<std::int32_t> alias_first;  // alias.h first_alias_position; -1 = allocates its own storage
  std::vector<std::int32_t> storage_root; // alias.h storage_roots
  std::vector<std::int32_t> stack;        // Node::stack
  std::vector<Policy> policy;             // Node::policy (the model's own tag)
  std::vector<std::int32_t> target;       // per node: index into `targets`
  std::vector<std::string_view> targets;  // distinct Node::target values, first use order (views into the graph)
};

struct FlatSchedule {
  std::vector<std::int32_t> node;       // per step: the graph node it runs (a duplicate: its original)
  std::vector<char> duplicate;          // per step
  std::vector<std::int32_t> start;      // per step + 1: offsets into `inputs`
  std::vector<std::int32_t> inputs;     // schedule indices read, node.inputs order; -1 = not available
  std::size_t size() const { return node.size(); }
};

// As rewritten_schedule (same steps, same inputs, same PlanError messages).
FlatSchedule flat_schedule(const Graph& graph, const NodeIndex& index, const RematPlan& plan);


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
