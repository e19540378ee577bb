#include "schedule.h"

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
    std::uint16_t f = 0;
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
}

FlatSchedule flat_schedule(const Graph& graph, const NodeIndex& index, const RematPlan& plan) {
  const std::size_t n = index.size();
  // Duplicates by insertion point, as a CSR (list order within a point).
  std::vector<std::int32_t> dup_start(n + 1, 0);
  for (std::size_t d = 0; d < plan.duplicates.size(); ++d) {
    const Duplicate& dup = plan.duplicates[d];
    if (dup.before < 0 || static_cast<std::size_t>(dup.before) >= n || dup.of < 0 || static_cast<std::size_t>(dup.of) >= n)
      throw PlanError("duplicate #" + std::to_string(d) + " names a node outside the graph");
    ++dup_start[static_cast<std::size_t>(dup.before) + 1];
  }
  for (std::size_t i = 0; i < n; ++i) dup_start[i + 1] += dup_start[i];
  std::vector<std::int32_t> dups_before(plan.duplicates.size());
  {
    std::vector<std::int32_t> fill(dup_start.begin(), dup_start.end() - 1);
    for (std::size_t d = 0; d < plan.duplicates.size(); ++d)
      dups_before[static_cast<std::size_t>(fill[static_cast<std::size_t>(plan.duplicates[d].before)]++)] =
          static_cast<std::int32_t>(d);
  }
  std::vector<char> erased(n, 0);
  for (auto e : plan.erase) {
    if (e < 0 || static_cast<std::size_t>(e) >= n) throw PlanError("erase names a node outside the graph");
    erased[static_cast<std::size_t>(e)] = 1;
  }
  // Redirects by consumer, as a CSR (list order within a consumer).
  std::vector<std::int32_t> redirect_start(n + 1, 0);
  for (const auto& r : plan.redirects) {
    if (r.node < 0 || static_cast<std::size_t>(r.node) >= n || r.input < 0 || static_cast<std::size_t>(r.input) >= n)
      throw PlanError("a redirect names a node outside the graph");
    if (r.copy >= 0 && (static_cast<std::size_t>(r.copy) >= plan.duplicates.size() || plan.duplicates[static_cast<std::size_t>(r.copy)].of != r.input))
      throw PlanError("redirect of '" + graph.nodes[static_cast<std::size_t>(r.node)].name + "' names copy #" +
                      std::to_string(r.copy) + ", which is not a duplicate of '" +
                      graph.nodes[static_cast<std::size_t>(r.input)].name + "'");
    ++redirect_start[static_cast<std::size_t>(r.node) + 1];
  }
  for (std::size_t i = 0; i < n; ++i) redirect_start[i + 1] += redirect_start[i];
  std::vector<std::int32_t> redirects_of(plan.redirects.size());
  {
    std::vector<std::int32_t> fill(redirect_start.begin(), redirect_start.end() - 1);
    for (std::size_t k = 0; k < plan.redirects.size(); ++k)
      redirects_of[static_cast<std::size_t>(fill[static_cast<std::size_t>(plan.redirects[k].node)]++)] =
          static_cast<std::int32_t>(k);
  }
  // Per consumer i: redirect_mark[x] == i when (i, x) is redirected, to copy
  // redirect_copy[x] (the last redirect listed for the pair wins).
  std::vector<std::int32_t> redirect_mark(n, -1), redirect_copy(n, -1);
  std::vector<std::int32_t> copy_step(plan.duplicates.size(), -1);
  std::vector<std::int32_t> original_step(n, -1), duplicate_step(n, -1);

  FlatSchedule schedule;
  const std::size_t steps = n + plan.duplicates.size();
  schedule.node.reserve(steps);
  schedule.duplicate.reserve(steps);
  schedule.start.reserve(steps + 1);
  std::size_t edges = index.inputs.size();
  for (const auto& dup : plan.duplicates) {
    const auto of = static_cast<std::size_t>(dup.of);
    edges += static_cast<std::size_t>(index.input_start[of + 1] - index.input_start[of]);
  }
  schedule.inputs.reserve(edges);
  schedule.start.push_back(0);
  for (std::size_t i = 0; i < n; ++i) {
    for (auto k = dup_start[i]; k < dup_start[i + 1]; ++k) {
      const auto d = dups_before[static_cast<std::size_t>(k)];
      const Duplicate& dup = plan.duplicates[static_cast<std::size_t>(d)];
      const auto of = static_cast<std::size_t>(dup.of);
      for (auto e = index.input_start[of]; e < index.input_start[of + 1]; ++e) {
        auto x = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)]);
        schedule.inputs.push_back(duplicate_step[x] >= 0 ? duplicate_step[x] : original_step[x]);
      }
      const auto here = static_cast<std::int32_t>(schedule.node.size());
      duplicate_step[static_cast<std::size_t>(dup.of)] = here;
      copy_step[static_cast<std::size_t>(d)] = here;
      schedule.node.push_back(dup.of);
      schedule.duplicate.push_back(1);
      schedule.start.push_back(static_cast<std::int32_t>(schedule.inputs.size()));
    }
    if (erased[i]) continue;
    for (auto k = redirect_start[i]; k < redirect_start[i + 1]; ++k) {
      const Redirect& r = plan.redirects[static_cast<std::size_t>(redirects_of[static_cast<std::size_t>(k)])];
      redirect_mark[static_cast<std::size_t>(r.input)] = static_cast<std::int32_t>(i);
      redirect_copy[static_cast<std::size_t>(r.input)] = r.copy;
    }
    for (auto e = index.input_start[i]; e < index.input_start[i + 1]; ++e) {
      auto x = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)]);
      if (redirect_mark[x] != static_cast<std::int32_t>(i))
        schedule.inputs.push_back(original_step[x]);
      else
        schedule.inputs.push_back(redirect_copy[x] >= 0 ? copy_step[static_cast<std::size_t>(redirect_copy[x])]
                                                        : duplicate_step[x]);
    }
    original_step[i] = static_cast<std::int32_t>(schedule.node.size());
    schedule.node.push_back(static_cast<std::int32_t>(i));
    schedule.duplicate.push_back(0);
    schedule.start.push_back(static_cast<std::int32_t>(schedule.inputs.size()));
  }
  return schedule;
}

}  // namespace detail

}  // namespace hyper_ac
