// Budget mode (plan_search.h): the least recompute whose scored figure fits the
// budget, on the simulation and, with a peak oracle, on the measured peak.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <variant>

#include "hyper_ac/saturate.h"
#include "cost_indexed.h"
#include "mincut_indexed.h"
#include "plan_search.h"

namespace hyper_ac {
namespace planning {
namespace {

// The budget as a scored figure (scored_bytes). Absolute sizes are that
// figure. A fraction f keeps f of the all-saved activation bytes: the
// all-saved step's peak less (1 - f) of the activations its backward reads;
// under unit_graph, f of the bytes the all-saved forward saves. Saturates to
// [0, kMaxBytes]: a budget at or past 2^63 bytes is above any figure (those
// saturate there too), so it means no limit.
std::int64_t budget_target(const Graph& graph, const MemoryBudget& budget, const SimulateResult& all_saved,
                           const Scope& scope) {
  if (const auto* bytes = std::get_if<BudgetBytes>(&budget)) return bytes_from_double(bytes->bytes);
  const double fraction = std::get<BudgetFraction>(budget).fraction;
  double activations = static_cast<double>(summarize(graph).activation_bytes_read_by_backward);
  if (scope.unit_graph) return bytes_from_double(fraction * activations);
  return bytes_from_double(static_cast<double>(all_saved.peak_bytes_with_resident) - (1.0 - fraction) * activations);
}

// The budget's choice for a simulated target: the first frontier point whose
// scored figure fits, then the descent (choose_within_budget's rule). None: no point fits.
std::optional<Evaluation> choose_on_frontier(const Graph& graph, const detail::NodeIndex& index,
                                             const StageOptions& stages, const FrontierResult& frontier,
                                             std::int64_t target, PlanResult& result, SecondsCache& seconds) {
  const Scope& scope = result.scope;
  const RematOptions schedule = unit_schedule(scope);
  for (const auto& point : frontier.points) {
    Evaluation evaluation =
        evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings, &seconds);
    evaluation.lambda = point.lambda;
    if (scored_bytes(evaluation, scope) > target) continue;
    descend_within_budget(graph, index, result.tags.policies, point.policies, target, scope, stages.cost, schedule,
                          seconds, evaluation, result.timings, descent_cap(graph));
    return evaluation;
  }
  return std::nullopt;
}

// The budget's plan measured more than kBudgetMeasuredSlack under its target:
// the simulation holds more than the compiler does, so a larger simulated
// target, with less recompute, may still fit. The simulated target is raised
// by the measured slack (the two move about alike), halfway back once that
// measures over (kOracleRaiseProbes); the first that fits ends the raise and
// is kept when it recomputes less.
void raise_toward_measured_target(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                                  const BudgetSearch& search, MeasuredPeaks& measured, std::int64_t target,
                                  PlanResult& result, Evaluation& chosen, std::int64_t& chosen_bytes) {
  if (static_cast<double>(target - chosen_bytes) <= kBudgetMeasuredSlack * static_cast<double>(target)) return;
  const std::int64_t fits = search.target;
  std::int64_t over = -1;  // a raised simulated target whose plan measured over
  SecondsCache seconds;
  for (std::size_t probe = 0; probe < kOracleRaiseProbes; ++probe) {
    const std::int64_t proposal =
        over < 0 ? clamp_bytes(static_cast<__int128>(fits) + (target - chosen_bytes)) : fits + (over - fits) / 2;
    if (proposal <= fits) return;
    std::optional<Evaluation> candidate = choose_on_frontier(graph, index, stages, search.frontier, proposal, result,
                                                             seconds);
    if (!candidate) return;
    const std::int64_t bytes = measured.of(*candidate);
    if (bytes < 0) return;
    if (bytes > target) {
      over = proposal;
      continue;
    }
    if (candidate->recompute_seconds < chosen.recompute_seconds) {
      chosen = std::move(*candidate);
      chosen_bytes = bytes;
    }
    return;
  }
}

}  // namespace

Descent descend_within_budget(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& tags,
                              std::vector<Policy> policies, std::int64_t target, const Scope& scope,
                              const CostOptions& cost, const RematOptions& schedule, SecondsCache& seconds,
                              Evaluation& chosen, PlanTimings& timings, std::size_t cap) {
  Descent descent;
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<std::pair<double, std::int32_t>> candidates;
    std::vector<double> own(graph.nodes.size(), 0.0);
    std::vector<char> duplicated(graph.nodes.size(), 0);
    for (const auto& dup : chosen.remat.duplicates) {
      const auto v = static_cast<std::size_t>(dup.of);
      own[v] += detail::recompute_seconds(graph, index, dup.of, cost);
      duplicated[v] = 1;
    }
    for (std::size_t v = 0; v < graph.nodes.size(); ++v)
      if (duplicated[v] && (tags[v] == Policy::PreferRecompute || tags[v] == Policy::PreferSave) &&
          is_recompute(policies[v]))
        candidates.emplace_back(own[v], static_cast<std::int32_t>(v));
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& candidate : candidates) {
      if (descent.evaluations >= cap) {
        descent.bounded = true;
        return descent;
      }
      const auto v = static_cast<std::size_t>(candidate.second);
      if (!is_recompute(policies[v])) continue;
      std::vector<Policy> trial = policies;
      trial[v] = Policy::PreferSave;
      Evaluation evaluation = evaluate_indexed(graph, index, trial, cost, schedule, &timings, &seconds);
      ++descent.evaluations;
      if (scored_bytes(evaluation, scope) > target || !(evaluation.recompute_seconds < chosen.recompute_seconds)) continue;
      evaluation.lambda = chosen.lambda;
      chosen = std::move(evaluation);
      policies = std::move(trial);
      ++descent.saved_again;
      changed = true;
    }
  }
  return descent;
}

Evaluation choose_within_budget(const Graph& graph, const detail::NodeIndex& index, const Config& config,
                                const StageOptions& stages, const SimulateResult& all_saved, PlanResult& result,
                                BudgetSearch& search) {
  const Scope& scope = result.scope;
  const std::int64_t target = budget_target(graph, config.mincut.memory_budget, all_saved, scope);
  result.stats.budget_bytes = target;
  FrontierResult frontier;
  {
    ScopedTimer timer(result.timings.mincut_seconds);
    frontier = detail::frontier_cuts(graph, index, result.tags.policies, stages.mincut);
  }
  Evaluation chosen;
  bool met = false, any = false;
  const std::vector<Policy>* fitting = nullptr;
  const RematOptions schedule = unit_schedule(result.scope);  // one copy of the unit map for every point
  SecondsCache seconds;
  for (std::size_t k = 0; k < frontier.points.size(); ++k) {
    const auto& point = frontier.points[k];
    Evaluation evaluation = evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings, &seconds);
    evaluation.lambda = point.lambda;
    if (scored_bytes(evaluation, scope) <= target) {
      chosen = std::move(evaluation);
      met = any = true;
      fitting = &point.policies;
      search.chosen_point = k;
      break;
    }
    if (!any || scored_bytes(evaluation, scope) < scored_bytes(chosen, scope) ||
        (scored_bytes(evaluation, scope) == scored_bytes(chosen, scope) &&
         evaluation.simulated_peak_bytes < chosen.simulated_peak_bytes)) {
      chosen = std::move(evaluation);
      any = true;
      search.chosen_point = k;
    }
  }
  if (!any) {
    chosen = evaluate_indexed(graph, index, result.tags.policies, stages.cost, schedule, &result.timings, &seconds);
  }
  if (met) {
    const double frontier_seconds = chosen.recompute_seconds;
    const Descent descent = descend_within_budget(graph, index, result.tags.policies, *fitting, target, scope,
                                                  stages.cost, schedule, seconds, chosen, result.timings,
                                                  descent_cap(graph));
    if (descent.saved_again > 0 || descent.bounded)
      result.diagnostics.push_back(
          {Severity::Info, -1,
           "budget: " + std::to_string(descent.saved_again) +
               " recomputed node(s) of the frontier plan saved again within the budget (recompute " +
               format_seconds(frontier_seconds) + " -> " + format_seconds(chosen.recompute_seconds) + ", " +
               std::to_string(descent.evaluations) + " evaluations" +
               (descent.bounded ? ", stopped by its bound" : "") + ")"});
  }
  result.stats.budget_met = met;
  search.target = target;
  search.resident_bytes = all_saved.peak_bytes_with_resident - all_saved.peak_bytes;
  if (!met) {
    result.diagnostics.push_back(
        {Severity::Warning, -1,
         "memory budget " + format_bytes(target) + " (" + scored_figure(scope) + ")" + " cannot be met: the smallest " +
             scored_figure(scope) + " reachable is " + format_bytes(any ? scored_bytes(chosen, scope) : 0) +
             "; using that plan"});
  }
  if (!frontier.complete)
    result.diagnostics.push_back({Severity::Info, -1,
                                  "frontier search stopped after " + std::to_string(frontier.solves) +
                                      " max-flow solves; the budget plan may not be the least-recompute one"});
  search.frontier = std::move(frontier);
  return chosen;
}

void continue_budget_on_measured(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                                 const BudgetSearch& search, MeasuredPeaks& measured, PlanResult& result,
                                 Evaluation& chosen) {
  if (result.scope.unit_graph || !search.chosen_point) return;  // a unit graph's budget is on its saved bytes
  const std::int64_t target = clamp_bytes(static_cast<__int128>(search.target) - search.resident_bytes);
  std::int64_t chosen_bytes = measured.of(chosen);
  if (chosen_bytes < 0) return;
  const bool met_before = result.stats.budget_met;
  const std::int64_t first_bytes = chosen_bytes;
  if (chosen_bytes <= target) {
    result.stats.budget_met = true;
    raise_toward_measured_target(graph, index, stages, search, measured, target, result, chosen, chosen_bytes);
  } else {
    const RematOptions schedule = unit_schedule(result.scope);
    SecondsCache seconds;
    // From the chosen plan's own frontier point (its descent may have saved again what the
    // compiler needs replayed) to the frontier's end.
    std::size_t lo = *search.chosen_point, hi = search.frontier.points.size();  // [lo, hi)
    std::optional<Evaluation> fit;
    std::int64_t fit_bytes = -1;
    for (std::size_t probe = 0; probe < kOracleBudgetProbes && lo < hi; ++probe) {
      const std::size_t mid = lo + (hi - lo) / 2;
      const auto& point = search.frontier.points[mid];
      Evaluation evaluation = evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings,
                                               &seconds);
      evaluation.lambda = point.lambda;
      const std::int64_t bytes = measured.of(evaluation);
      if (bytes < 0) break;
      if (bytes <= target) {
        fit = std::move(evaluation);
        fit_bytes = bytes;
        hi = mid;
      } else {
        if (bytes < chosen_bytes) {
          chosen = std::move(evaluation);
          chosen_bytes = bytes;
        }
        lo = mid + 1;
      }
    }
    if (fit) {
      chosen = std::move(*fit);
      chosen_bytes = fit_bytes;
    }
    result.stats.budget_met = fit.has_value();
  }
  result.stats.measured_peak_after = chosen_bytes;
  if (result.stats.budget_met && met_before && chosen_bytes != first_bytes)
    result.diagnostics.push_back({Severity::Info, -1,
                                  "memory budget on the measured peak (" + format_bytes(target) +
                                      "): the simulated choice measured " + format_bytes(first_bytes) +
                                      "; a plan with less recompute measures " + format_bytes(chosen_bytes) + " (" +
                                      std::to_string(result.stats.oracle_calls) + " plans measured)"});
  if (result.stats.budget_met != met_before || !result.stats.budget_met)
    result.diagnostics.push_back(
        {result.stats.budget_met ? Severity::Info : Severity::Warning, -1,
         std::string("memory budget on the measured peak (") + format_bytes(target) + " beyond the " +
             format_bytes(search.resident_bytes) + " resident): " +
             (result.stats.budget_met ? "met, at " : "cannot be met; the least measured is ") +
             format_bytes(chosen_bytes) + " (" + std::to_string(result.stats.oracle_calls) +
             " plans measured); using that plan"});
}

}  // namespace planning
}  // namespace hyper_ac
