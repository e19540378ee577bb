// Never worse than stock (plan_search.h): the stock partition scored on the
// simulator, and with a peak oracle the measured guard and output_recompute's check.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "tagging_indexed.h"
#include "plan_search.h"

namespace hyper_ac {
namespace planning {

namespace {

// The stock partition's recompute set (PlanOptions::stock_recomputed) scored on
// the plan's simulator; its simulated peak goes to the stats.
Evaluation score_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                       const CostOptions& cost, const RematOptions& schedule, PlanResult& result) {
  std::unordered_map<std::string, std::int32_t> by_name;
  by_name.reserve(graph.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) by_name.emplace(graph.nodes[i].name, static_cast<std::int32_t>(i));
  std::vector<Policy> stock(graph.nodes.size(), Policy::None);
  for (const auto& name : names) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // an exact copy the loader elided: read from its source
    const Node& node = graph.nodes[static_cast<std::size_t>(it->second)];
    if (!node.is_forward() || node.kind != NodeKind::CallFunction)
      throw std::invalid_argument("plan: stock_recomputed names '" + name +
                                  "', which is not a forward call_function node of the graph");
    stock[static_cast<std::size_t>(it->second)] = Policy::MustRecompute;
  }
  const Evaluation scored = evaluate_indexed(graph, index, stock, cost, schedule, &result.timings);
  result.stats.stock_simulated_peak = scored.simulated_peak_bytes;
  return scored;
}

// The plan that rewrites nothing: every recompute tag saved (the caller routes
// the graph to the stock partition, which carries out the correctness pins).
void save_everything(const Graph& graph, const detail::NodeIndex& index, const CostOptions& cost,
                     const RematOptions& schedule, PlanResult& result, Evaluation& evaluation) {
  std::vector<Policy> kept = result.tags.policies;
  for (Policy& policy : kept)
    if (policy == Policy::PreferRecompute || policy == Policy::MustRecompute) policy = Policy::PreferSave;
  const double lambda = evaluation.lambda;
  evaluation = evaluate_indexed(graph, index, kept, cost, schedule, &result.timings);
  evaluation.lambda = lambda;
}

}  // namespace

void compare_with_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                        const CostOptions& cost, const RematOptions& schedule, PlanResult& result,
                        Evaluation& evaluation) {
  if (result.tags.stats.user_tagged > 0) return;
  for (Policy policy : result.tags.policies)
    if (policy == Policy::MustRecompute) return;
  const Evaluation scored = score_stock(graph, index, names, cost, schedule, result);
  const Scope& scope = result.scope;
  if (scores_below(evaluation, scored, scope)) return;
  const std::int64_t own = scored_bytes(evaluation, scope), theirs = scored_bytes(scored, scope);
  save_everything(graph, index, cost, schedule, result, evaluation);
  result.stats.stock_fallback = true;
  result.diagnostics.push_back(
      {Severity::Info, -1,
       std::string("auto's plan (") + scored_figure(scope) + " " + format_bytes(own) +
           ") is not below the stock partition's (" + format_bytes(theirs) +
           (scope.unit_graph ? ", at a simulated peak no higher" : "") + "): the graph is left to the stock partition"});
}

void keep_unit_under_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                           const CostOptions& cost, const RematOptions& schedule, PlanResult& result,
                           Evaluation& evaluation) {
  if (!result.scope.unit_graph || result.tags.stats.user_tagged > 0 || evaluation.remat.duplicates.empty()) return;
  const Evaluation scored = score_stock(graph, index, names, cost, schedule, result);
  const bool above = evaluation.saved_bytes > scored.saved_bytes ||
                     (evaluation.saved_bytes == scored.saved_bytes &&
                      evaluation.simulated_peak_bytes > scored.simulated_peak_bytes);
  if (!above) return;
  const std::int64_t own = evaluation.saved_bytes, theirs = scored.saved_bytes;
  const std::int64_t own_peak = evaluation.simulated_peak_bytes, their_peak = scored.simulated_peak_bytes;
  save_everything(graph, index, cost, schedule, result, evaluation);
  result.stats.stock_fallback = true;
  result.diagnostics.push_back(
      {Severity::Warning, -1,
       std::string("mode ") + to_string(result.mode) + ": this block's plan saves " + format_bytes(own) +
           " for the backward (simulated peak " + format_bytes(own_peak) + "), above the stock partition's " +
           format_bytes(theirs) + " (" + format_bytes(their_peak) +
           "); the saved bytes stack up over the model's blocks, so the block is left to the stock partition"});
}

void weigh_output_recompute(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                            MeasuredPeaks& measured, PlanResult& result, Evaluation& evaluation) {
  const auto& marked = result.scope.region_output_recompute;
  if (result.scope.unit_graph) return;  // a block's own peak is not the figure that stacks (guard_with_measured)
  if (std::none_of(marked.begin(), marked.end(), [](bool on) { return on; })) return;
  PlanResult plain = result;
  std::fill(plain.scope.region_output_recompute.begin(), plain.scope.region_output_recompute.end(), false);
  plain.tags = detail::tag_policies(graph, index, plain.scope, stages.tag);
  Evaluation without = evaluate_indexed(graph, index, plain.tags.policies, stages.cost, unit_schedule(plain.scope),
                                        &result.timings);
  const std::int64_t with_it = measured.of(evaluation), without_it = measured.of(without, &plain);
  if (with_it < 0 || without_it < 0) return;
  if (with_it < without_it) {
    result.diagnostics.push_back({Severity::Info, -1,
                                  "output_recompute lowers the measured peak: " + format_bytes(with_it) + " against " +
                                      format_bytes(without_it) + " without it"});
    return;
  }
  result.scope = std::move(plain.scope);
  result.tags = std::move(plain.tags);
  evaluation = std::move(without);
  result.stats.output_recompute_refused = true;
  result.diagnostics.push_back(
      {Severity::Warning, -1,
       "output_recompute refused for this graph: the measured peak with it (" + format_bytes(with_it) +
           ") is not below the same mode without it (" + format_bytes(without_it) +
           "), measured by the compiler's dry run; the regions' outputs are saved"});
}

void guard_with_measured(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                         MeasuredPeaks& measured, PlanResult& result, Evaluation& evaluation) {
  if (evaluation.remat.duplicates.empty() || result.tags.stats.user_tagged > 0 || result.scope.unit_graph) return;
  const std::int64_t own = measured.of(evaluation);
  result.stats.measured_peak_after = own;
  if (own < 0) return;
  // Under what stock's step must hold is under what it holds: no compile of stock needed.
  const std::int64_t bound = measured.lower_bound_of_stock();
  result.stats.measured_stock_lower_bound = bound;
  if (bound >= 0 && own <= bound) return;
  const std::int64_t stock = measured.of_stock();
  result.stats.measured_stock_peak = stock;
  if (stock < 0 || own <= stock) return;
  save_everything(graph, index, stages.cost, unit_schedule(result.scope), result, evaluation);
  result.stats.measured_fallback = true;
  result.stats.measured_peak_after = stock;
  result.diagnostics.push_back(
      {Severity::Warning, -1,
       std::string("mode ") + to_string(result.mode) + ": the plan's measured peak (" + format_bytes(own) +
           ") is above the stock partition's (" + format_bytes(stock) +
           "), measured by the compiler's dry run: the graph is left to the stock partition"});
}

}  // namespace planning
}  // namespace hyper_ac
