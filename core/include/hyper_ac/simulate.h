// Memory simulation: walk the (original or rewritten) step in schedule order
// and track the bytes alive after every node, with aliases (views, in-place
// results, getitem of a view) sharing their base's storage and each element of
// an allocating multi-output producer freed on its own.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/remat.h"

namespace hyper_ac {

struct SimulateOptions {
  // Fill SimulateResult::timeline (one int64 per schedule step); off by
  // default, since planning needs only the peaks.
  bool record_timeline = false;
  // Free a value a backward op reads from outside its autograd node only
  // after the node's last op (a run of consecutive backward steps with one
  // Node::autograd_node), as eager autograd releases a node's saved tensors
  // and incoming gradients when the node returns. Models the uncompiled,
  // uncheckpointed step; compiled code frees per op (the default).
  bool autograd_lifetimes = false;
  // Count what a fusing compiler (Inductor) allocates: a fusible op (not a
  // view, getitem, random, symint or mutating op) every reader of which is a
  // fusible op in the same graph (the forward, or the backward with its
  // replays) is inlined into its readers' kernels and holds no buffer; what it
  // reads stays alive until those readers run. A forward value the backward
  // reads (saved) or the output reads keeps its buffer. plan() sets it under
  // `compiler: inductor`.
  bool fuse_pointwise = false;
};

struct SimulateStats {
  std::size_t steps = 0;             // schedule length (original nodes + duplicates)
  std::size_t duplicate_steps = 0;   // steps that run a recomputed copy
  std::size_t storages = 0;          // distinct storages allocated by steps
  std::size_t aliasing_steps = 0;    // steps that allocate nothing and share an input's storage
  std::size_t resident_values = 0;   // placeholders and get_attr nodes
};

// Byte figures are summed in 128 bits and reported saturated to
// [0, kMaxBytes] (saturate.h): sizes near 2^62 give INT64_MAX, never a
// negative or wrapped peak.
struct SimulateResult {
  // Bytes of resident values: placeholders of every role (parameters,
  // buffers, inputs, tangents) and get_attr constants, alive from the start
  // to the end and not part of the activation figures below.
  std::int64_t resident_bytes = 0;
  // Highest activation bytes alive while one step runs (its inputs and its
  // outputs together), without / with the resident bytes.
  std::int64_t peak_bytes = 0;
  std::int64_t peak_bytes_with_resident = 0;
  std::int32_t peak_step = -1;   // schedule index of the first step at the peak; -1 for an empty graph
  std::int32_t peak_node = -1;   // graph node that step runs
  // Activation bytes alive after the last forward step (original, not a
  // duplicate) once its dead inputs are freed: what the forward hands the
  // backward (saved activations and forward outputs). -1 steps when the graph
  // has no forward step.
  std::int64_t boundary_bytes = 0;
  std::int32_t boundary_step = -1;
  // Activation bytes alive at the end (the output node's inputs).
  std::int64_t final_bytes = 0;
  // Per step: activation bytes alive while it runs (as for the peak). Empty
  // unless SimulateOptions::record_timeline.
  std::vector<std::int64_t> timeline;
  // Per timeline step: the graph node it runs (a duplicate: its original).
  std::vector<std::int32_t> timeline_nodes;
  SimulateStats stats;
};

// plan == nullptr simulates the original graph in node order; otherwise the
// schedule rewritten_schedule(graph, *plan) gives. Each step allocates its
// node's output bytes, except aliasing nodes (non-empty aliased_inputs or
// view; a view without positions aliases input 0), which share the storage
// of the inputs they alias (storage = union-find over alias edges), and
// getitems of a producer that allocates several outputs, which take their
// element's bytes over from it and are freed on their own. A storage
// is freed after the last step that reads any alias of it; the output node's
// inputs live to the end; a value nobody reads is freed right after its
// step. O(steps + edges). Throws std::invalid_argument when a step reads a
// step that does not come before it.
SimulateResult simulate_memory(const Graph& graph, const RematPlan* plan, const SimulateOptions& options = {});

}  // namespace hyper_ac
