// The forward/backward split of a planned joint graph: which nodes the
// forward module runs, which the backward module runs (originals and the
// plan's duplicates), and what the forward hands the backward, in order.
// Python builds the two modules from it in one pass (hyper_ac/partition.py);
// no partition decision is made there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/remat.h"

namespace hyper_ac {

struct SplitOptions {
  // Check that every node of the backward module reads only backward
  // members, saved values or backward placeholders (tangents), and that every
  // saved value is read by the backward; throws PlanError naming the node.
  bool validate = true;
};

// One value the forward returns for the backward.
struct SavedValue {
  std::int32_t node = -1;  // the forward node whose value is saved
  // true: the generator state of random op `node` (RematPlan::rng_replays),
  // which the forward keeps under run_and_save_rng_state, not its output.
  bool rng_state = false;
};

struct SplitStats {
  std::size_t forward_nodes = 0;        // call_function / get_attr nodes the forward module runs
  std::size_t backward_nodes = 0;       // ... the backward module runs, duplicates included
  std::size_t backward_duplicates = 0;  // of which duplicates
  std::size_t saved_tensors = 0;        // saved.size()
  std::size_t saved_symints = 0;        // saved_symints.size()
  std::size_t saved_opaque = 0;         // saved_opaque.size()
};

struct Split {
  // Graph nodes (call_function / get_attr, never placeholders or the output)
  // the forward module runs, graph order; erased originals are left out.
  std::vector<std::int32_t> forward;
  // Original backward nodes the backward module runs, graph order.
  std::vector<std::int32_t> backward;
  // Indices into RematPlan::duplicates the backward module runs (every one),
  // schedule order.
  std::vector<std::int32_t> backward_duplicates;
  // Tensors the forward returns after its own outputs (the backward's first
  // inputs after the symints), in the order of the rewritten graph: a replay
  // state stands where its random op was, a getitem right after its producer
  // (what hyper_ac.apply leaves); RematPlan::saved without the symints and
  // opaque values, plus
  // the replay states.
  std::vector<SavedValue> saved;
  // SymInt-valued forward nodes the backward reads (RematPlan::saved with
  // Node::symint), graph order.
  std::vector<std::int32_t> saved_symints;
  // Opaque forward values the backward reads or returns (RematPlan::saved
  // with Node::opaque: a DTensor's DeviceMesh), graph order. The forward
  // returns them after the saved tensors, the backward takes them after its
  // saved tensors (aot_autograd's convention for opaque objects).
  std::vector<std::int32_t> saved_opaque;
  SplitStats stats;
};

// The split of `graph` rewritten by `plan` (plan_remat's result for it).
// Membership is the phase: forward nodes not erased run in the forward,
// backward nodes and every duplicate in the backward. Throws PlanError.
Split split_joint(const Graph& graph, const RematPlan& plan, const SplitOptions& options = {});

// {"forward": [names], "backward": [names], "backward_duplicates": [indices],
//  "saved": [names], "saved_symints": [names], "saved_opaque": [names], "stats": {...}}; a replay
// state is named "<R>_rng_state", as in the plan (docs/graph-format.md).
std::string split_to_json(const Graph& graph, const Split& split);

}  // namespace hyper_ac
