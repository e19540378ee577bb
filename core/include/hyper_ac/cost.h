// Recompute cost: the roofline seconds of replaying forward nodes in the
// backward. The one owner of that figure: the min-cut's capacities, the plan's
// recompute_seconds and every evaluation read it from here.
//
// Two fusion assumptions (CostOptions::compiler, config key `compiler`):
// - eager: every FX node is its own kernel; a replay costs the node's roofline
//   max(flops / peak_flops, (output + input bytes) / memory_bandwidth).
// - inductor: connected fusible forward nodes (Node::fusible: pointwise,
//   broadcasts, reductions, views, factories, converts) form one fusion group,
//   replayed as one kernel. Replaying a subset R of a group costs
//     sum over v in R of flops(v) / peak_flops
//   + sum over v in R whose output leaves the kernel (a user outside the group:
//     a non-fusible op, the backward, the graph output; or a user that is a
//     view or getitem of v in the group whose own output leaves) of
//     bytes(v) / bandwidth; views and getitems write nothing
//   + sum over the distinct inputs u read by R and not themselves in R of
//     bytes(u) / bandwidth (each read once per group), where a view is no
//     kernel: a replayed view reads nothing, and its replayed reader reads
//     through it (group_member_reads).
//   Non-fusible nodes keep the roofline. docs/mincut.md shows how this enters
//   the min-cut network exactly.
//
// Measured times (`hardware: measured`, HardwareProfile::measured): the
// serialiser runs each op standalone on the planning machine and records the
// seconds as Node::measured_seconds. A node with a measured time is priced by
// it instead of its roofline, except under inductor for a fusible node: its
// standalone time is that of its own kernel (a launch, a read and a write of
// every operand), which fusion removes, so a fusion group keeps the formula
// above (the profile's roofline, fallback speeds cpu's). Measured time thus
// prices what fusion leaves alone: matmuls, attention, custom ops, index and
// sort ops. Nodes without a time (random ops, collectives, in-place ops, ones
// that could not run standalone) keep the roofline, as do views and getitems
// (0: a replay of an alias costs nothing).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"

namespace hyper_ac {

struct CostOptions {
  // Roofline: max(flops / peak_flops, bytes_moved / memory_bandwidth), with
  // bytes_moved = the node's output bytes + the bytes of every input it reads.
  HardwareProfile hardware;
  // The compiler that runs the graph; inductor prices fusion groups (above).
  Compiler compiler = Compiler::Eager;
};

// A node's recompute time never exceeds this (seconds): flops near the
// double range over a slow profile stay finite, and so do lambda * seconds
// (lambda <= kMaxLambda, config.h) and sums over any graph.
constexpr double kMaxRecomputeSeconds = 1.0e30;

// The fusion groups of a graph under a compiler (all empty under eager).
struct FusionGroups {
  // Per node: its group (0, 1, ... in graph order of the group's first
  // member), or -1 outside every group (non-fusible, backward, not a
  // call_function, eager compiler).
  std::vector<std::int32_t> group;
  // Per node: a replay writes its output to memory (some user is outside the
  // node's group, directly or through views/getitems of it in the group).
  // Meaningful for group members only.
  std::vector<char> materialized;
  std::size_t count = 0;  // number of groups
};

// Groups = connected components of fusible forward call_function nodes over
// their producer -> user edges. Deterministic.
FusionGroups fusion_groups(const Graph& graph, const CostOptions& options);

// Roofline seconds of one replay of `node` (index into graph.nodes) as its own
// kernel; 0 for views, getitem, SymInt nodes and anything that is not a
// call_function. Clamped to [0, kMaxRecomputeSeconds]; never NaN.
// Throws std::out_of_range for an index outside the graph.
double recompute_seconds(const Graph& graph, std::int32_t node, const CostOptions& options);

// Seconds a group member's replay costs apart from its reads: its FLOPs plus
// its write when materialized (0 write for views). Throws std::out_of_range.
double member_seconds(const Graph& graph, const FusionGroups& groups, std::int32_t node, const CostOptions& options);

// The values a replay of group member `node` reads from memory, sorted and
// unique: its inputs, where an input that is a view (is_view_like) of the same
// group for which `replayed_view` holds is looked through to its own inputs,
// recursively (the view is replayed too, as an alias: the reader reads its
// base). A view member reads nothing itself (empty). Inputs the same kernel
// produces are the caller's to skip. Throws std::out_of_range.
std::vector<std::int32_t> group_member_reads(const Graph& graph, const FusionGroups& groups, std::int32_t node,
                                             const std::function<bool(std::int32_t)>& replayed_view);

// Seconds of reading value `node` once from memory (its output bytes /
// bandwidth); 0 for SymInt nodes.
double read_seconds(const Graph& graph, std::int32_t node, const CostOptions& options);

// A node whose compute the graph cannot tell: a call_function of a custom op
// (target namespace other than aten / prims, e.g. `transformers::...`), not a
// view, projection, collective, SymInt or fusible op, with no FLOP count (the
// serialiser found no formula in torch.utils.flop_counter). Its recompute cost
// is priced from the bytes it moves only, a lower bound: a custom matmul looks
// as cheap to replay as a copy. aten / prims ops without a formula are the
// memory-bound ones (index, gather, sort, cumsum, ...), priced correctly so.
bool compute_unknown(const Node& node);

// The node's measured time prices it (see above): the profile is measured,
// the node carries a time, and it is not fusible under inductor.
bool uses_measured_time(const Node& node, const CostOptions& options);

// Seconds of one training step as this cost model prices it: the whole
// forward as one replay set (recompute_seconds of every forward
// call_function: fusion groups under inductor) plus every backward
// call_function node at its own time (measured where uses_measured_time,
// else its roofline). The base `auto`'s knee rule takes its kKneeSlowdown of
// (plan.h).
double step_seconds(const Graph& graph, const CostOptions& options);

// Cost of replaying the set `nodes`. Eager: the sum of recompute_seconds (each
// counted as often as listed). Inductor: the group formula above over the
// distinct nodes (non-members at their roofline).
double recompute_seconds(const Graph& graph, const std::vector<std::int32_t>& nodes, const CostOptions& options);

}  // namespace hyper_ac
