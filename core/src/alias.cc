#include "hyper_ac/alias.h"

#include <string_view>

namespace hyper_ac {

std::vector<std::int32_t> alias_positions(const Node& node) {
  if (node.kind != NodeKind::CallFunction) return {};
  std::vector<std::int32_t> positions;
  for (auto p : node.aliased_inputs)
    if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size()) positions.push_back(p);
  if (positions.empty() && node.view && !node.inputs.empty()) positions.push_back(0);
  return positions;
}

std::int32_t first_alias_position(const Node& node) {
  if (node.kind != NodeKind::CallFunction) return -1;
  for (auto p : node.aliased_inputs)
    if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size()) return p;
  return node.view && !node.inputs.empty() ? 0 : -1;
}

bool is_aliasing(const Node& node) { return first_alias_position(node) >= 0; }

// string_view compares the lengths first: most targets differ in length.
bool is_getitem(const Node& node) { return std::string_view(node.target) == std::string_view("operator.getitem"); }

bool is_view_like(const Node& node) { return node.view && !is_getitem(node); }

std::vector<std::int32_t> storage_roots(const Graph& graph) {
  std::vector<std::int32_t> roots(graph.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const std::int32_t position = first_alias_position(graph.nodes[i]);
    roots[i] = position < 0 ? static_cast<std::int32_t>(i)
                            : roots[static_cast<std::size_t>(graph.nodes[i].inputs[static_cast<std::size_t>(position)])];
  }
  return roots;
}

}  // namespace hyper_ac
