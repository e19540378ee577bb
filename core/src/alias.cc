#include "hyper_ac/alias.h"

#include <algorithm>
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

std::vector<ElidedCopy> elide_copies(Graph& graph) {
  const std::size_t n = graph.nodes.size();
  std::vector<ElidedCopy> elided;
  // Most graphs carry no copy flag: skip the storage walk for them.
  bool flagged = false;
  for (const Node& node : graph.nodes) flagged = flagged || node.copy;
  if (!flagged) return elided;
  if (graph.users.size() != n) graph.finalize();
  const std::vector<std::int32_t> roots = storage_roots(graph);
  std::vector<char> written(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    if (node.mutated) written[static_cast<std::size_t>(roots[i])] = 1;
    for (auto p : node.mutated_inputs)
      if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size())
        written[static_cast<std::size_t>(roots[static_cast<std::size_t>(node.inputs[static_cast<std::size_t>(p)])])] = 1;
  }
  // source[i]: the node that replaces i (i itself unless i is elided).
  std::vector<std::int32_t> source(n);
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    source[i] = static_cast<std::int32_t>(i);
    const Node& c = graph.nodes[i];
    if (!c.copy || c.kind != NodeKind::CallFunction || !c.is_forward() || c.inputs.size() != 1 || c.rng || c.collective ||
        c.symint || !c.mutated_inputs.empty() || !c.aliased_inputs.empty() || !c.recomputed_from.empty() || written[i])
      continue;
    const auto s = static_cast<std::size_t>(source[static_cast<std::size_t>(c.inputs[0])]);
    const Node& from = graph.nodes[s];
    if (written[static_cast<std::size_t>(roots[s])] || from.symint || from.kind == NodeKind::Output || c.policy != from.policy)
      continue;
    bool returned = false;
    for (auto user : graph.users[i]) returned = returned || graph.nodes[static_cast<std::size_t>(user)].kind == NodeKind::Output;
    if (returned) continue;
    source[i] = static_cast<std::int32_t>(s);
    elided.push_back({c.name, from.name});
    any = true;
  }
  if (!any) return elided;

  std::vector<std::int32_t> new_index(n, -1);
  std::int32_t next = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (source[i] == static_cast<std::int32_t>(i)) new_index[i] = next++;
  std::vector<Node> kept;
  kept.reserve(static_cast<std::size_t>(next));
  for (std::size_t i = 0; i < n; ++i) {
    if (new_index[i] < 0) continue;
    Node node = std::move(graph.nodes[i]);
    // Readers of a copy read its source; an input read twice is listed once
    // (first position, as FX's all_input_nodes), positions follow.
    std::vector<std::int32_t> inputs;
    std::vector<std::int32_t> position(node.inputs.size(), -1);
    for (std::size_t p = 0; p < node.inputs.size(); ++p) {
      const std::int32_t mapped = new_index[static_cast<std::size_t>(source[static_cast<std::size_t>(node.inputs[p])])];
      auto at = std::find(inputs.begin(), inputs.end(), mapped);
      position[p] = static_cast<std::int32_t>(at - inputs.begin());
      if (at == inputs.end()) inputs.push_back(mapped);
    }
    auto remap = [&](std::vector<std::int32_t>& positions) {
      std::vector<std::int32_t> out;
      for (auto p : positions) {
        const std::int32_t q = p >= 0 && static_cast<std::size_t>(p) < position.size() ? position[static_cast<std::size_t>(p)] : p;
        if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
      }
      positions = std::move(out);
    };
    if (inputs.size() != node.inputs.size()) {
      remap(node.mutated_inputs);
      remap(node.aliased_inputs);
    }
    node.inputs = std::move(inputs);
    kept.push_back(std::move(node));
  }
  graph.nodes = std::move(kept);
  graph.finalize();
  return elided;
}

}  // namespace hyper_ac
