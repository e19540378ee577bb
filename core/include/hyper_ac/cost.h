// Recompute cost: the roofline seconds of replaying one forward node in the
// backward. The one owner of that figure: the min-cut's capacities, the plan's
// recompute_seconds and every evaluation read it from here.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"

namespace hyper_ac {

struct CostOptions {
  // Roofline: max(flops / peak_flops, bytes_moved / memory_bandwidth), with
  // bytes_moved = the node's output bytes + the bytes of every input it reads.
  HardwareProfile hardware;
};

// A node's recompute time never exceeds this (seconds): flops near the
// double range over a slow profile stay finite, and so do lambda * seconds
// (lambda <= kMaxLambda, config.h) and sums over any graph.
constexpr double kMaxRecomputeSeconds = 1.0e30;

// Roofline seconds of one replay of `node` (index into graph.nodes); 0 for
// views, getitem, SymInt nodes and anything that is not a call_function.
// Clamped to [0, kMaxRecomputeSeconds]; never NaN.
// Throws std::out_of_range for an index outside the graph.
double recompute_seconds(const Graph& graph, std::int32_t node, const CostOptions& options);

// Sum of recompute_seconds over `nodes` (each counted as often as listed).
double recompute_seconds(const Graph& graph, const std::vector<std::int32_t>& nodes, const CostOptions& options);

}  // namespace hyper_ac
