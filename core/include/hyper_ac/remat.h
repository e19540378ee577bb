// Remat planning: turn per-node policies into graph edits (duplicates of
// recomputed forward nodes, scheduled per unit just before that unit's
// backward reads them; redirects; erasures) and check that a plan is valid.
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

// One duplicate: a recomputed forward node inserted into the backward. A node
// may be duplicated more than once (once per replay segment, see plan_remat);
// a duplicate's inputs read the latest duplicate of each recomputed input
// emitted before it (duplicates are in schedule order), or
// the original when the input is not recomputed.
struct Duplicate {
  std::int32_t of = -1;      // forward node duplicated
  std::int32_t before = -1;  // backward node the duplicate is inserted in front of
};

struct Redirect {
  std::int32_t node = -1;   // backward consumer
  std::int32_t input = -1;  // recomputed original it now reads through a duplicate
  std::int32_t duplicate = -1;  // index into RematPlan::duplicates; -1 = the latest duplicate of `input` before `node`
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
  std::size_t replay_segments = 0;      // backward runs that replay one unit's values (plan_remat)
  std::size_t kept_outputs = 0;         // chained unit outputs kept from an earlier replay instead of replayed again
  std::size_t schedules_tried = 0;      // keep/replay choices simulated (chained replays only)
};

struct RematPlan {
  // The policies the plan applies: the requested ones with tuple projections
  // pinned (pin_tuple_projections), sized like graph.nodes.
  std::vector<Policy> policies;
  std::vector<Duplicate> duplicates;  // schedule order: by insertion point, then forward order
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
  // Per graph node (sized like graph.nodes, scope.h's Scope::node_unit), the
  // unit it belongs to, -1 = none; backward nodes carry their forward's unit.
  // Empty = no unit structure: the whole backward is one replay segment.
  std::vector<std::int32_t> node_unit;
  // Chained replays: exact keep/replay search up to this many units owning a
  // chained output (2^n simulated schedules); beyond it, "keep every p-th
  // unit's output" for p = 1..n and "keep none".
  std::size_t exact_keep_units = 10;
};

// Policies are per node (sized like graph.nodes); plan_remat first pins tuple
// projections (pin_tuple_projections) on its own copy, kept in
// RematPlan::policies. Forward nodes whose policy is_recompute() are
// duplicated when some backward node reads them (directly or through other
// recomputed nodes). Duplicates of an earlier pass are never duplicated again.
//
// Replay schedule. Backward consumers of recomputed values are cut into
// segments: maximal runs whose unit (options.node_unit; a consumer without
// one takes the unit of the first recomputed value it reads) stays the same.
// Each segment replays what it reads, and the recomputed inputs of that,
// transitively: every copy is inserted before the segment's earliest consumer
// that needs it (directly or through another copy), never earlier, and a
// segment's copies are not reused by later segments, so one unit's replay is
// dead before the next unit's replay begins. The exception are chained unit
// outputs (recomputed values read in forward by another unit, which only
// exist with regions.output_recompute): a later segment either reuses the
// copy an earlier segment made (keep) or replays it again from the nearest
// kept output or saved boundary. The choice is per unit owning such outputs,
// and the plan takes the choice with the least simulated activation peak
// (ties: least recompute FLOPs, then the fewest kept units).
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
