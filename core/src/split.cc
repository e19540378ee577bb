// The forward/backward split of a planned joint graph (split.h).
#include "hyper_ac/split.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyper_ac {
namespace {

using json = nlohmann::json;

bool runs(const Node& node) { return node.kind == NodeKind::CallFunction || node.kind == NodeKind::GetAttr; }

bool is_getitem(const Node& node) {
  return node.kind == NodeKind::CallFunction && node.target == "operator.getitem" && node.inputs.size() == 1;
}

// Forward nodes in the order hyper_ac.apply leaves them: each getitem moved
// right after its producer (apply's _flatten_getitems, which keeps the
// getitems of one producer in their order), nested getitems after theirs.
std::vector<std::int32_t> flattened_forward_order(const Graph& graph) {
  const std::size_t n = graph.nodes.size();
  std::vector<std::vector<std::int32_t>> getitems(n);
  std::vector<char> moved(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    if (!node.is_forward() || !is_getitem(node)) continue;
    getitems[static_cast<std::size_t>(node.inputs[0])].push_back(static_cast<std::int32_t>(i));
    moved[i] = 1;
  }
  std::vector<std::int32_t> order;
  order.reserve(n);
  std::vector<std::int32_t> stack;
  for (std::size_t i = 0; i < n; ++i) {
    if (!graph.nodes[i].is_forward() || moved[i]) continue;
    stack.push_back(static_cast<std::int32_t>(i));
    while (!stack.empty()) {
      const auto k = stack.back();
      stack.pop_back();
      order.push_back(k);
      const auto& children = getitems[static_cast<std::size_t>(k)];
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
  }
  return order;
}

std::string quoted(const Graph& graph, std::int32_t index) { return "'" + graph.nodes[static_cast<std::size_t>(index)].name + "'"; }

void validate_split(const Graph& graph, const RematPlan& plan, const std::vector<char>& saved) {
  const auto schedule = rewritten_schedule(graph, plan);
  std::vector<char> read_by_backward(graph.nodes.size(), 0);
  for (const auto& step : schedule) {
    const Node& node = graph.nodes[static_cast<std::size_t>(step.node)];
    if (node.kind == NodeKind::Output || node.kind == NodeKind::Placeholder) continue;
    const bool in_backward = step.duplicate || node.is_backward();
    for (std::size_t p = 0; p < step.inputs.size(); ++p) {
      const auto s = step.inputs[p];
      if (s < 0)
        throw PlanError("split: " + quoted(graph, step.node) + " reads " + quoted(graph, node.inputs[p]) +
                        ", which the rewritten graph does not compute");
      const auto& input_step = schedule[static_cast<std::size_t>(s)];
      const Node& input = graph.nodes[static_cast<std::size_t>(input_step.node)];
      const bool input_backward = input_step.duplicate || input.is_backward();
      if (!in_backward && input_backward)
        throw PlanError("split: forward node " + quoted(graph, step.node) + " reads backward node " +
                        quoted(graph, input_step.node) + "; the forward module cannot run it");
      if (in_backward && !input_backward) {
        if (!saved[static_cast<std::size_t>(input_step.node)])
          throw PlanError("split: backward node " + quoted(graph, step.node) + (step.duplicate ? " (a duplicate)" : "") +
                          " reads forward value " + quoted(graph, input_step.node) + ", which the plan does not save");
        read_by_backward[static_cast<std::size_t>(input_step.node)] = 1;
      }
    }
  }
  for (std::size_t i = 0; i < graph.nodes.size(); ++i)  // read by the output node's gradient part
    if (graph.nodes[i].backward_output) read_by_backward[i] = 1;
  for (auto s : plan.saved)
    if (!read_by_backward[static_cast<std::size_t>(s)])
      throw PlanError("split: the plan saves " + quoted(graph, s) + ", which no backward node reads");
}

}  // namespace

Split split_joint(const Graph& graph, const RematPlan& plan, const SplitOptions& options) {
  const std::size_t n = graph.nodes.size();
  Split split;
  std::vector<char> erased(n, 0);
  for (auto e : plan.erase) {
    if (e < 0 || static_cast<std::size_t>(e) >= n) throw PlanError("split: erase names a node outside the graph");
    erased[static_cast<std::size_t>(e)] = 1;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    if (!runs(node) || erased[i]) continue;
    (node.is_forward() ? split.forward : split.backward).push_back(static_cast<std::int32_t>(i));
  }
  split.backward_duplicates.reserve(plan.duplicates.size());
  for (std::size_t d = 0; d < plan.duplicates.size(); ++d) {
    const auto of = plan.duplicates[d].of;
    if (of < 0 || static_cast<std::size_t>(of) >= n || !graph.nodes[static_cast<std::size_t>(of)].is_forward())
      throw PlanError("split: duplicate #" + std::to_string(d) + " does not copy a forward node");
    split.backward_duplicates.push_back(static_cast<std::int32_t>(d));
  }

  std::vector<char> saved(n, 0), state(n, 0);
  for (auto s : plan.saved) {
    if (s < 0 || static_cast<std::size_t>(s) >= n) throw PlanError("split: the plan saves a node outside the graph");
    const Node& node = graph.nodes[static_cast<std::size_t>(s)];
    if (!node.is_forward() || node.kind == NodeKind::Output)
      throw PlanError("split: the plan saves " + quoted(graph, s) + ", which is not a forward value");
    if (erased[static_cast<std::size_t>(s)])
      throw PlanError("split: the plan saves " + quoted(graph, s) + " and erases it");
    saved[static_cast<std::size_t>(s)] = 1;
    if (node.symint) split.saved_symints.push_back(s);
    else if (node.opaque) split.saved_opaque.push_back(s);
  }
  for (auto r : plan.rng_replays) {
    if (r < 0 || static_cast<std::size_t>(r) >= n) throw PlanError("split: an rng replay names a node outside the graph");
    state[static_cast<std::size_t>(r)] = 1;
  }
  for (auto k : flattened_forward_order(graph)) {
    const auto i = static_cast<std::size_t>(k);
    if (state[i]) split.saved.push_back({k, true});  // the state getitem stands where the random op was
    if (saved[i] && !graph.nodes[i].symint && !graph.nodes[i].opaque) split.saved.push_back({k, false});
  }
  if (options.validate) validate_split(graph, plan, saved);

  split.stats.forward_nodes = split.forward.size();
  split.stats.backward_duplicates = split.backward_duplicates.size();
  split.stats.backward_nodes = split.backward.size() + split.backward_duplicates.size();
  split.stats.saved_tensors = split.saved.size();
  split.stats.saved_symints = split.saved_symints.size();
  split.stats.saved_opaque = split.saved_opaque.size();
  return split;
}

std::string split_to_json(const Graph& graph, const Split& split) {
  auto names = [&](const std::vector<std::int32_t>& nodes) {
    json out = json::array();
    for (auto k : nodes) out.push_back(graph.nodes[static_cast<std::size_t>(k)].name);
    return out;
  };
  json saved = json::array();
  for (const auto& s : split.saved) {
    const std::string& name = graph.nodes[static_cast<std::size_t>(s.node)].name;
    saved.push_back(s.rng_state ? name + "_rng_state" : name);
  }
  json document;
  document["forward"] = names(split.forward);
  document["backward"] = names(split.backward);
  document["backward_duplicates"] = split.backward_duplicates;
  document["saved"] = std::move(saved);
  document["saved_symints"] = names(split.saved_symints);
  document["saved_opaque"] = names(split.saved_opaque);
  document["stats"] = {{"forward_nodes", split.stats.forward_nodes},
                       {"backward_nodes", split.stats.backward_nodes},
                       {"backward_duplicates", split.stats.backward_duplicates},
                       {"saved_tensors", split.stats.saved_tensors},
                       {"saved_symints", split.stats.saved_symints},
                       {"saved_opaque", split.stats.saved_opaque}};
  return document.dump();
}

}  // namespace hyper_ac
