#include "hyper_ac/cost.h"

#include <algorithm>
#include <cmath>

#include "hyper_ac/alias.h"
#include "hyper_ac/saturate.h"

namespace hyper_ac {

double recompute_seconds(const Graph& graph, std::int32_t index, const CostOptions& options) {
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  if (node.kind != NodeKind::CallFunction || is_view_like(node) || is_getitem(node) || node.symint) return 0.0;
  double bytes = static_cast<double>(node.output_bytes());
  for (auto input : node.inputs) bytes += static_cast<double>(graph.nodes[static_cast<std::size_t>(input)].output_bytes());
  // 0 / 0 (no work on a zero-speed profile) is no time; x / 0 and anything
  // past the range clamp to kMaxRecomputeSeconds.
  auto part = [](double work, double speed) { return work > 0.0 ? work / speed : 0.0; };
  const double seconds = std::max(part(node.flops, options.hardware.peak_flops),
                                  part(bytes, options.hardware.memory_bandwidth));
  if (!(seconds < kMaxRecomputeSeconds)) return kMaxRecomputeSeconds;  // also NaN (negative speed)
  return seconds > 0.0 ? seconds : 0.0;
}

double recompute_seconds(const Graph& graph, const std::vector<std::int32_t>& nodes, const CostOptions& options) {
  double total = 0.0;
  for (auto node : nodes) total = add_finite(total, recompute_seconds(graph, node, options));
  return total;
}

}  // namespace hyper_ac
