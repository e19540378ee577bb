// Remat planning: turn per-node policies into graph edits (duplicates of
// recomputed forward nodes in front of their earliest backward consumer,
// redirects, erasures) and check that a plan is valid.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "hyper_ac/graph.h"

namespace hyper_ac {

// A plan that would read a value before it exists, or otherwise break the graph.
class PlanError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

struct Duplicate {
  std::int32_t of = -1;      // forward node copied
  std::int32_t before = -1;  // backward node the copy is inserted in front of
};

struct Redirect {
  std::int32_t node = -1;   // backward consumer
  std::int32_t input = -1;  // recomputed original it now reads through its duplicate
};

struct RematStats {
  std::size_t nodes_duplicated = 0;
  std::size_t nodes_erased = 0;
  // Activation storage the backward reads (each storage once, views count
  // their base), before and after the rewrite.
  std::int64_t saved_bytes_before = 0;
  std::int64_t saved_bytes_after = 0;
  std::size_t saved_values_before = 0;
  std::size_t saved_values_after = 0;  // (after: including the replay states)
  std::size_t rng_replayed = 0;         // random ops replayed from a saved generator state
  std::int64_t rng_state_bytes = 0;     // their states' bytes (part of saved_bytes_after)
  double recompute_flops = 0.0;         // FLOPs of all duplicates
  std::size_t pinned_projections = 0;   // getitems pin_tuple_projections turned to MUST_SAVE
};

struct RematPlan {
  // The policies the plan applies: the requested ones with tuple projections
  // pinned (pin_tuple_projections), sized like graph.nodes.
  std::vector<Policy> policies;
  std::vector<Duplicate> duplicates;  // emission order = forward order
  std::vector<Redirect> redirects;
  std::vector<std::int32_t> erase;    // reverse topological order
  std::vector<std::int32_t> saved;    // forward values the rewritten backward reads, graph order
  // Duplicated random ops (Node::rng_state_bytes > 0), graph order: the
  // forward saves each one's generator state, its duplicate replays from it.
  // Their originals are never erased (the forward still draws).
  std::vector<std::int32_t> rng_replays;
  RematStats stats;
};

struct RematOptions {
  // Check the plan with validate_plan before returning it.
  bool validate = true;
};

// Policies are per node (sized like graph.nodes); plan_remat first pins tuple
// projections (pin_tuple_projections) on its own copy, kept in
// RematPlan::policies. Forward nodes whose policy is_recompute() are duplicated when some backward node reads them (directly
// or through other recomputed nodes). Duplicates of an earlier pass are never
// duplicated again.
RematPlan plan_remat(const Graph& graph, const std::vector<Policy>& policies,
                     const RematOptions& options = {});

// A tuple never crosses from forward to backward on its own, only its getitem
// projections do: a projection whose producer is not recomputed is therefore
// saved (MUST_SAVE), never recomputed from the tuple. Returns how many changed.
// plan_remat applies it itself; callers need not.
std::size_t pin_tuple_projections(const Graph& graph, std::vector<Policy>& policies);

// Throws PlanError when a duplicate or redirected consumer would read a value
// not yet computed at its position, an insertion point is not a backward node
// that follows the original, a node is erased while still read, or a duplicate
// is planned twice.
void validate_plan(const Graph& graph, const RematPlan& plan);

// The rewritten step as a flat schedule, for simulation and checks: each step
// runs one node (original or duplicate) and reads earlier steps.
struct ScheduleStep {
  std::int32_t node = -1;        // index into graph.nodes of the node (or of the original it copies)
  bool duplicate = false;
  std::vector<std::int32_t> inputs;  // indices into the schedule
};

std::vector<ScheduleStep> rewritten_schedule(const Graph& graph, const RematPlan& plan);

}  // namespace hyper_ac
