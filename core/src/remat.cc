#include "hyper_ac/remat.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "hyper_ac/alias.h"
#include "hyper_ac/saturate.h"

namespace hyper_ac {

namespace {

bool recomputable(const Graph& graph, const std::vector<Policy>& policies, std::size_t i) {
  const Node& node = graph.nodes[i];
  return is_recompute(policies[i]) && node.is_forward() && node.kind == NodeKind::CallFunction &&
         node.recomputed_from.empty();
}

// A backward node that may take a recomputed copy. The output node is not one:
// forward outputs must come from the forward itself.
bool backward_consumer(const Node& node) { return node.is_backward() && node.kind != NodeKind::Output; }

bool is_activation(const Node& node) {
  return node.is_forward() && node.kind == NodeKind::CallFunction;
}

std::string name_of(const Graph& graph, std::int32_t index) {
  if (index < 0 || static_cast<std::size_t>(index) >= graph.nodes.size()) return "#" + std::to_string(index);
  return "'" + graph.nodes[static_cast<std::size_t>(index)].name + "'";
}

}  // namespace

std::size_t pin_tuple_projections(const Graph& graph, std::vector<Policy>& policies) {
  std::size_t changed = 0;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.target != "operator.getitem" || node.inputs.empty() || !recomputable(graph, policies, i)) continue;
    auto producer = static_cast<std::size_t>(node.inputs.front());
    if (recomputable(graph, policies, producer)) continue;
    policies[i] = Policy::MustSave;
    ++changed;
  }
  return changed;
}

RematPlan plan_remat(const Graph& graph, const std::vector<Policy>& requested, const RematOptions& options) {
  const std::size_t n = graph.nodes.size();
  if (requested.size() != n)
    throw std::invalid_argument("plan_remat: " + std::to_string(requested.size()) + " policies for " + std::to_string(n) +
                                " nodes");
  RematPlan plan;
  plan.policies = requested;
  plan.stats.pinned_projections = pin_tuple_projections(graph, plan.policies);
  const std::vector<Policy>& policies = plan.policies;

  // Earliest backward consumer of every recomputed node, walking inputs
  // transitively through recomputed nodes. A node already assigned was reached
  // from an earlier consumer together with its recomputed ancestors, so the
  // walk stops there: linear in the graph size.
  std::vector<std::int32_t> target(n, -1);
  std::vector<std::int32_t> stack;
  for (std::size_t b = 0; b < n; ++b) {
    if (!backward_consumer(graph.nodes[b])) continue;
    for (auto input : graph.nodes[b].inputs) stack.push_back(input);
    while (!stack.empty()) {
      auto current = static_cast<std::size_t>(stack.back());
      stack.pop_back();
      if (target[current] >= 0 || !recomputable(graph, policies, current)) continue;
      target[current] = static_cast<std::int32_t>(b);
      for (auto input : graph.nodes[current].inputs) stack.push_back(input);
    }
  }

  std::vector<char> duplicated(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (target[i] < 0) continue;
    plan.duplicates.push_back({static_cast<std::int32_t>(i), target[i]});
    duplicated[i] = 1;
    plan.stats.recompute_flops = add_finite(plan.stats.recompute_flops, graph.nodes[i].flops);
  }
  plan.stats.nodes_duplicated = plan.duplicates.size();

  for (const auto& dup : plan.duplicates)
    for (auto user : graph.users[static_cast<std::size_t>(dup.of)])
      if (backward_consumer(graph.nodes[static_cast<std::size_t>(user)])) plan.redirects.push_back({user, dup.of});
  std::sort(plan.redirects.begin(), plan.redirects.end(), [](const Redirect& a, const Redirect& b) {
    return a.node != b.node ? a.node < b.node : a.input < b.input;
  });

  // An original is erased once every reader is a redirected backward node or
  // another erased original; walk in reverse so readers are decided first.
  std::vector<char> erased(n, 0);
  for (auto it = plan.duplicates.rbegin(); it != plan.duplicates.rend(); ++it) {
    auto i = static_cast<std::size_t>(it->of);
    if (graph.nodes[i].rng) continue;  // a random op still draws in the forward (its replay needs that state)
    bool read = false;
    for (auto user : graph.users[i]) {
      const Node& reader = graph.nodes[static_cast<std::size_t>(user)];
      if (backward_consumer(reader) || erased[static_cast<std::size_t>(user)]) continue;
      read = true;
      break;
    }
    if (!read) {
      erased[i] = 1;
      plan.erase.push_back(it->of);
    }
  }
  plan.stats.nodes_erased = plan.erase.size();

  // What the backward reads from the forward, before and after the rewrite.
  std::vector<char> saved_before(n, 0), saved_after(n, 0);
  for (std::size_t b = 0; b < n; ++b) {
    if (!backward_consumer(graph.nodes[b])) continue;
    for (auto input : graph.nodes[b].inputs) {
      auto x = static_cast<std::size_t>(input);
      if (!graph.nodes[x].is_forward()) continue;
      saved_before[x] = 1;
      if (!duplicated[x]) saved_after[x] = 1;
    }
  }
  for (const auto& dup : plan.duplicates)
    for (auto input : graph.nodes[static_cast<std::size_t>(dup.of)].inputs) {
      auto x = static_cast<std::size_t>(input);
      if (graph.nodes[x].is_forward() && !duplicated[x]) saved_after[x] = 1;
    }
  // Bytes by storage: a saved view keeps its base alive, and a base counts once.
  const auto roots = storage_roots(graph);
  std::vector<char> counted_before(n, 0), counted_after(n, 0);
  auto count = [&](std::size_t i, std::vector<char>& counted, std::size_t& values, std::int64_t& bytes) {
    ++values;
    auto root = static_cast<std::size_t>(roots[i]);
    if (!is_activation(graph.nodes[root]) || counted[root]) return;
    counted[root] = 1;
    bytes = add_bytes(bytes, graph.nodes[root].output_bytes());
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (saved_after[i]) plan.saved.push_back(static_cast<std::int32_t>(i));
    if (!is_activation(graph.nodes[i])) continue;
    if (saved_before[i]) count(i, counted_before, plan.stats.saved_values_before, plan.stats.saved_bytes_before);
    if (saved_after[i]) count(i, counted_after, plan.stats.saved_values_after, plan.stats.saved_bytes_after);
  }

  for (const auto& dup : plan.duplicates) {
    const Node& node = graph.nodes[static_cast<std::size_t>(dup.of)];
    if (!node.rng || node.rng_state_bytes <= 0) continue;
    plan.rng_replays.push_back(dup.of);
    ++plan.stats.rng_replayed;
    plan.stats.rng_state_bytes += node.rng_state_bytes;
    ++plan.stats.saved_values_after;
    plan.stats.saved_bytes_after += node.rng_state_bytes;
  }

  if (options.validate) validate_plan(graph, plan);
  return plan;
}

std::vector<ScheduleStep> rewritten_schedule(const Graph& graph, const RematPlan& plan) {
  const std::size_t n = graph.nodes.size();
  std::vector<std::vector<std::int32_t>> dups_before(n);
  for (std::size_t d = 0; d < plan.duplicates.size(); ++d) {
    const Duplicate& dup = plan.duplicates[d];
    if (dup.before < 0 || static_cast<std::size_t>(dup.before) >= n || dup.of < 0 || static_cast<std::size_t>(dup.of) >= n)
      throw PlanError("duplicate #" + std::to_string(d) + " names a node outside the graph");
    dups_before[static_cast<std::size_t>(dup.before)].push_back(static_cast<std::int32_t>(d));
  }
  std::vector<char> erased(n, 0);
  for (auto e : plan.erase) {
    if (e < 0 || static_cast<std::size_t>(e) >= n) throw PlanError("erase names a node outside the graph");
    erased[static_cast<std::size_t>(e)] = 1;
  }
  std::unordered_set<std::uint64_t> redirected;
  for (const auto& r : plan.redirects)
    redirected.insert((static_cast<std::uint64_t>(static_cast<std::uint32_t>(r.node)) << 32) | static_cast<std::uint32_t>(r.input));

  std::vector<std::int32_t> original_step(n, -1), duplicate_step(n, -1);
  std::vector<ScheduleStep> schedule;
  schedule.reserve(n + plan.duplicates.size());
  for (std::size_t i = 0; i < n; ++i) {
    for (auto d : dups_before[i]) {
      const Duplicate& dup = plan.duplicates[static_cast<std::size_t>(d)];
      ScheduleStep step;
      step.node = dup.of;
      step.duplicate = true;
      for (auto input : graph.nodes[static_cast<std::size_t>(dup.of)].inputs) {
        auto x = static_cast<std::size_t>(input);
        step.inputs.push_back(duplicate_step[x] >= 0 ? duplicate_step[x] : original_step[x]);
      }
      duplicate_step[static_cast<std::size_t>(dup.of)] = static_cast<std::int32_t>(schedule.size());
      schedule.push_back(std::move(step));
    }
    if (erased[i]) continue;
    ScheduleStep step;
    step.node = static_cast<std::int32_t>(i);
    for (auto input : graph.nodes[i].inputs) {
      auto x = static_cast<std::size_t>(input);
      bool via_dup = redirected.count((static_cast<std::uint64_t>(i) << 32) | static_cast<std::uint32_t>(input)) > 0;
      step.inputs.push_back(via_dup ? duplicate_step[x] : original_step[x]);
    }
    original_step[i] = static_cast<std::int32_t>(schedule.size());
    schedule.push_back(std::move(step));
  }
  return schedule;
}

void validate_plan(const Graph& graph, const RematPlan& plan) {
  const std::size_t n = graph.nodes.size();
  std::vector<char> has_dup(n, 0);
  for (const auto& dup : plan.duplicates) {
    if (dup.of < 0 || static_cast<std::size_t>(dup.of) >= n || dup.before < 0 || static_cast<std::size_t>(dup.before) >= n)
      throw PlanError("a duplicate names a node outside the graph");
    const Node& original = graph.nodes[static_cast<std::size_t>(dup.of)];
    const Node& before = graph.nodes[static_cast<std::size_t>(dup.before)];
    if (has_dup[static_cast<std::size_t>(dup.of)]) throw PlanError("node " + name_of(graph, dup.of) + " is duplicated twice");
    has_dup[static_cast<std::size_t>(dup.of)] = 1;
    if (!original.is_forward() || original.kind != NodeKind::CallFunction)
      throw PlanError("duplicate of " + name_of(graph, dup.of) + ": only forward call_function nodes can be recomputed");
    if (!before.is_backward())
      throw PlanError("duplicate of " + name_of(graph, dup.of) + " is inserted before " + name_of(graph, dup.before) +
                      ", which is not a backward node");
    if (dup.before <= dup.of)
      throw PlanError("duplicate of " + name_of(graph, dup.of) + " is inserted before " + name_of(graph, dup.before) +
                      ", which precedes the original");
  }
  for (const auto& r : plan.redirects) {
    if (r.node < 0 || static_cast<std::size_t>(r.node) >= n || r.input < 0 || static_cast<std::size_t>(r.input) >= n)
      throw PlanError("a redirect names a node outside the graph");
    if (!has_dup[static_cast<std::size_t>(r.input)])
      throw PlanError("redirect of " + name_of(graph, r.node) + " to the duplicate of " + name_of(graph, r.input) +
                      ", which has none");
    const auto& inputs = graph.nodes[static_cast<std::size_t>(r.node)].inputs;
    if (std::find(inputs.begin(), inputs.end(), r.input) == inputs.end())
      throw PlanError("redirect of " + name_of(graph, r.node) + " names " + name_of(graph, r.input) + ", which it does not read");
  }
  auto schedule = rewritten_schedule(graph, plan);
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    const ScheduleStep& step = schedule[s];
    const Node& node = graph.nodes[static_cast<std::size_t>(step.node)];
    for (std::size_t k = 0; k < step.inputs.size(); ++k) {
      if (step.inputs[k] >= 0 && static_cast<std::size_t>(step.inputs[k]) < s) continue;
      std::string who = step.duplicate ? "the duplicate of " + name_of(graph, step.node) : name_of(graph, step.node);
      throw PlanError(who + " reads " + name_of(graph, node.inputs[k]) + " before it is available in the rewritten graph");
    }
  }
}

}  // namespace hyper_ac
