#include "hyper_ac/alias.h"

namespace hyper_ac {

std::vector<std::int32_t> alias_positions(const Node& node) {
  if (node.kind != NodeKind::CallFunction) return {};
  std::vector<std::int32_t> positions;
  for (auto p : node.aliased_inputs)
    if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size()) positions.push_back(p);
  if (positions.empty() && node.view && !node.inputs.empty()) positions.push_back(0);
  return positions;
}

bool is_aliasing(const Node& node) { return !alias_positions(node).empty(); }

bool is_getitem(const Node& node) { return node.target == "operator.getitem"; }

bool is_view_like(const Node& node) { return node.view && !is_getitem(node); }

std::vector<std::int32_t> storage_roots(const Graph& graph) {
  std::vector<std::int32_t> roots(graph.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto positions = alias_positions(graph.nodes[i]);
    roots[i] = positions.empty()
                   ? static_cast<std::int32_t>(i)
                   : roots[static_cast<std::size_t>(graph.nodes[i].inputs[static_cast<std::size_t>(positions.front())])];
  }
  return roots;
}

}  // namespace hyper_ac
