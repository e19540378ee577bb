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

namespace {

// Rewrites `inputs` through `map` in place. An input read twice is then listed once (first
// position, as FX's all_input_nodes); `position[p]` receives input p's new position, and is
// filled only when a repeat appeared (`true`). `slot` is all -1 on entry and on return.
bool remap_inputs(std::vector<std::int32_t>& inputs, const std::vector<std::int32_t>& map,
                  std::vector<std::int32_t>& slot, std::vector<std::int32_t>& position) {
  bool repeated = false;
  for (auto& input : inputs) {
    input = map[static_cast<std::size_t>(input)];
    std::int32_t& at = slot[static_cast<std::size_t>(input)];
    repeated = repeated || at >= 0;
    at = 0;
  }
  for (auto input : inputs) slot[static_cast<std::size_t>(input)] = -1;
  if (!repeated) return false;
  // A lookup table, not a search of the kept list: the output node reads tens of thousands of values.
  position.assign(inputs.size(), -1);
  std::size_t kept = 0;
  for (std::size_t p = 0; p < inputs.size(); ++p) {
    std::int32_t& at = slot[static_cast<std::size_t>(inputs[p])];
    if (at < 0) {
      at = static_cast<std::int32_t>(kept);
      inputs[kept++] = inputs[p];
    }
    position[p] = at;
  }
  inputs.resize(kept);
  for (auto input : inputs) slot[static_cast<std::size_t>(input)] = -1;
  return true;
}

// Positions into a node's inputs, moved by remap_inputs; each listed once.
void remap_positions(std::vector<std::int32_t>& positions, const std::vector<std::int32_t>& position) {
  std::vector<std::int32_t> out;
  for (auto p : positions) {
    const std::int32_t q = p >= 0 && static_cast<std::size_t>(p) < position.size() ? position[static_cast<std::size_t>(p)] : p;
    if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
  }
  positions = std::move(out);
}

}  // namespace

std::vector<ElidedCopy> elide_copies(Graph& graph) {
  const std::size_t n = graph.nodes.size();
  std::vector<ElidedCopy> elided;
  // Most graphs carry no copy flag: skip the storage walk for them.
  bool flagged = false;
  for (const Node& node : graph.nodes) flagged = flagged || node.copy;
  if (!flagged) {
    if (graph.users.size() != n) graph.finalize();
    return elided;
  }
  const std::vector<std::int32_t> roots = storage_roots(graph);
  std::vector<char> written(n, 0), returned(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    if (node.mutated) written[static_cast<std::size_t>(roots[i])] = 1;
    for (auto p : node.mutated_inputs)
      if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size())
        written[static_cast<std::size_t>(roots[static_cast<std::size_t>(node.inputs[static_cast<std::size_t>(p)])])] = 1;
    if (node.kind == NodeKind::Output)
      for (auto input : node.inputs) returned[static_cast<std::size_t>(input)] = 1;
  }
  // source[i]: the node that replaces i (i itself unless i is elided).
  std::vector<std::int32_t> source(n);
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    source[i] = static_cast<std::int32_t>(i);
    const Node& c = graph.nodes[i];
    if (!c.copy || c.kind != NodeKind::CallFunction || !c.is_forward() || c.inputs.size() != 1 || c.rng || c.collective ||
        c.symint || !c.mutated_inputs.empty() || !c.aliased_inputs.empty() || !c.recomputed_from.empty() || written[i] ||
        returned[i])
      continue;
    const auto s = static_cast<std::size_t>(source[static_cast<std::size_t>(c.inputs[0])]);
    const Node& from = graph.nodes[s];
    if (written[static_cast<std::size_t>(roots[s])] || from.symint || from.kind == NodeKind::Output || c.policy != from.policy)
      continue;
    source[i] = static_cast<std::int32_t>(s);
    elided.push_back({c.name, from.name});
    any = true;
  }
  if (!any) {
    if (graph.users.size() != n) graph.finalize();
    return elided;
  }

  // map[i]: the new index of the node that replaces i. Nodes are compacted in place.
  std::vector<std::int32_t> map(n, -1);
  std::int32_t next = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (source[i] == static_cast<std::int32_t>(i)) map[i] = next++;
  for (std::size_t i = 0; i < n; ++i) map[i] = map[static_cast<std::size_t>(source[i])];
  std::vector<std::int32_t> slot(static_cast<std::size_t>(next), -1), position;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (source[i] != static_cast<std::int32_t>(i)) continue;
    Node& node = graph.nodes[i];
    if (remap_inputs(node.inputs, map, slot, position)) {
      remap_positions(node.mutated_inputs, position);
      remap_positions(node.aliased_inputs, position);
    }
    if (kept != i) graph.nodes[kept] = std::move(node);
    ++kept;
  }
  graph.nodes.resize(kept);
  graph.finalize();
  return elided;
}

}  // namespace hyper_ac
