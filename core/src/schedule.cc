#include "schedule.h"

#include <string>

namespace hyper_ac {
namespace detail {

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
    if (r.duplicate >= 0 && (static_cast<std::size_t>(r.duplicate) >= plan.duplicates.size() || plan.duplicates[static_cast<std::size_t>(r.duplicate)].of != r.input))
      throw PlanError("redirect of '" + graph.nodes[static_cast<std::size_t>(r.node)].name + "' names copy #" +
                      std::to_string(r.duplicate) + ", which is not a duplicate of '" +
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
  // redirect_duplicate[x] (the last redirect listed for the pair wins).
  std::vector<std::int32_t> redirect_mark(n, -1), redirect_duplicate(n, -1);
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
      redirect_duplicate[static_cast<std::size_t>(r.input)] = r.duplicate;
    }
    for (auto e = index.input_start[i]; e < index.input_start[i + 1]; ++e) {
      auto x = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)]);
      if (redirect_mark[x] != static_cast<std::int32_t>(i))
        schedule.inputs.push_back(original_step[x]);
      else
        schedule.inputs.push_back(redirect_duplicate[x] >= 0 ? copy_step[static_cast<std::size_t>(redirect_duplicate[x])]
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
