#include "hyper_ac/cost.h"

#include <algorithm>

#include "hyper_ac/alias.h"

namespace hyper_ac {

double recompute_seconds(const Graph& graph, std::int32_t index, const CostOptions& options) {
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  if (node.kind != NodeKind::CallFunction || is_view_like(node) || is_getitem(node) || node.symint) return 0.0;
  double bytes = static_cast<double>(node.output_bytes());
  for (auto input : node.inputs) bytes += static_cast<double>(graph.nodes[static_cast<std::size_t>(input)].output_bytes());
  return std::max(node.flops / options.hardware.peak_flops, bytes / options.hardware.memory_bandwidth);
}

double recompute_seconds(const Graph& graph, const std::vector<std::int32_t>& nodes, const CostOptions& options) {
  double total = 0.0;
  for (auto node : nodes) total += recompute_seconds(graph, node, options);
  return total;
}

}  // namespace hyper_ac
