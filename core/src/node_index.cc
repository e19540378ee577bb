#include "node_index.h"

#include <string>

#include "string_ids.h"

#include "hyper_ac/alias.h"

namespace hyper_ac {
namespace detail {

NodeIndex::NodeIndex(const Graph& graph) {
  const std::size_t n = graph.nodes.size();
  flags.assign(n, 0);
  input_start.resize(n + 1);
  output_bytes.resize(n);
  alias_first.resize(n);
  storage_root.resize(n);
  stack.resize(n);
  policy.resize(n);
  target.resize(n);
  StringIds target_ids;
  input_start[0] = 0;
  std::size_t edges = 0;
  for (std::size_t i = 0; i < n; ++i) {
    edges += graph.nodes[i].inputs.size();
    input_start[i + 1] = static_cast<std::int32_t>(edges);
  }
  inputs.reserve(edges);
  // Nodes with more than one output (for kProjects below), noted while the node is at hand.
  std::vector<char> multi_output(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    multi_output[i] = node.outputs.size() > 1;
    inputs.insert(inputs.end(), node.inputs.begin(), node.inputs.end());
    std::uint32_t f = 0;
    if (node.is_forward()) f |= kForward;
    if (node.kind == NodeKind::CallFunction) f |= kCallFunction;
    if (node.kind == NodeKind::Output) f |= kOutput;
    if (node.kind == NodeKind::Placeholder || node.kind == NodeKind::GetAttr) f |= kResident;
    if (node.rng) f |= kRng;
    if (!node.recomputed_from.empty()) f |= kRecomputedFrom;
    if (is_getitem(node)) f |= kGetitem;
    if (node.mutated) f |= kMutated;
    if (!node.mutated_inputs.empty()) f |= kMutatesInputs;
    if (node.symint) f |= kSymint;
    if (node.view) f |= kView;
    if (node.outputs.empty()) f |= kNoOutputs;
    if (node.backward_output) f |= kBackwardOutput;
    if (node.opaque) f |= kOpaque;
    stack[i] = node.stack;
    policy[i] = node.policy;
    auto [id, inserted] = target_ids.insert(std::string_view(node.target));
    if (inserted) targets.push_back(std::string_view(node.target));
    target[i] = id;
    const std::int32_t first = first_alias_position(node);
    alias_first[i] = first;
    if (first >= 0) {
      int count = 0;
      for_each_alias_position(node, [&](std::int32_t) { ++count; });
      if (count > 1) f |= kMultiAlias;
    }
    // An input that is not an earlier node (a graph built by hand, not yet
    // validated) keeps its own storage here; the stages report such graphs.
    const std::int32_t base = first < 0 ? -1 : node.inputs[static_cast<std::size_t>(first)];
    storage_root[i] = base >= 0 && static_cast<std::size_t>(base) < i ? storage_root[static_cast<std::size_t>(base)]
                                                                      : static_cast<std::int32_t>(i);
    output_bytes[i] = node.output_bytes();
    flags[i] = f;
  }
  // A getitem of a producer that allocates several outputs (simulate.cc). Not
  // for split / chunk / unbind and other multi-output views: their elements
  // share the input's storage and stay united with it.
  for (std::size_t i = 0; i < n; ++i) {
    if (!(flags[i] & kCallFunction) || !(flags[i] & kGetitem) || input_start[i] == input_start[i + 1]) continue;
    const auto producer = static_cast<std::size_t>(inputs[static_cast<std::size_t>(input_start[i])]);
    if (multi_output[producer] && alias_first[producer] < 0) flags[i] |= kProjects;
  }
  for (std::size_t i = 0; i < n; ++i) {
    constexpr std::uint32_t kNotInlinable = kRng | kSymint | kView | kGetitem | kMutated | kMutatesInputs | kOpaque |
                                            kNoOutputs | kMultiAlias;
    if (graph.nodes[i].fusible && (flags[i] & kCallFunction) && !(flags[i] & kNotInlinable) && alias_first[i] < 0)
      flags[i] |= kInlinable;
  }
}

}  // namespace detail
}  // namespace hyper_ac
