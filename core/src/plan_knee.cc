// auto's knee (plan.h kKneeSlowdown; plan_search.h): the knee of the frontier, then
// the budget's descent past the allowance.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "mincut_indexed.h"
#include "plan_search.h"

namespace hyper_ac {
namespace planning {
namespace {

// One frontier point as the knee's walk evaluated it.
struct PointFigures {
  std::int64_t scored_bytes = 0;
  double recompute_seconds = 0.0;
};

struct KneeDescent {
  std::size_t steps = 0;        // bisection steps that came within the allowance
  std::size_t evaluations = 0;  // spent on it, at most kKneeDescentCaps x descent_cap
};

// Bisection steps of the knee's second step, and its evaluations in all in
// units of one budget descent's (descent_cap).
constexpr int kKneeBisections = 6;
constexpr std::size_t kKneeDescentCaps = 4;

// The knee's second step. The frontier is a lambda sweep: between the knee
// and the next point (the highest peak past the allowance) it has no cut, and
// that gap can be wide. Plans inside it are the budget mode's: the next point
// descended (recomputed nodes saved again while the peak stays within a
// target). Bisecting the target between the two peaks finds the least one
// whose descended plan comes within the allowance.
KneeDescent descend_past_allowance(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                                   const FrontierResult& frontier, const std::vector<PointFigures>& figures,
                                   double allowance, const RematOptions& schedule, SecondsCache& seconds,
                                   PlanResult& result, Evaluation& chosen) {
  KneeDescent out;
  const Scope& scope = result.scope;
  std::int64_t high = scored_bytes(chosen, scope), low = -1;
  std::size_t next = 0;
  for (std::size_t k = 0; k < figures.size(); ++k)
    if (figures[k].recompute_seconds > allowance && figures[k].scored_bytes < high && figures[k].scored_bytes > low) {
      low = figures[k].scored_bytes;
      next = k;
    }
  if (low < 0) return out;
  const std::size_t cap = kKneeDescentCaps * descent_cap(graph), per_step = std::max<std::size_t>(cap / kKneeBisections, 1);
  const auto& point = frontier.points[next];
  Evaluation start = evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings, &seconds);
  start.lambda = point.lambda;
  for (int step = 0; step < kKneeBisections && high - low > 1 && out.evaluations < cap; ++step) {
    const std::int64_t target = low + (high - low) / 2;
    Evaluation trial = start;  // each step descends the same cut towards its own target
    const Descent descent = descend_within_budget(graph, index, result.tags.policies, point.policies, target, scope,
                                                  stages.cost, schedule, seconds, trial, result.timings,
                                                  std::min(per_step, cap - out.evaluations));
    out.evaluations += descent.evaluations;
    if (trial.recompute_seconds <= allowance && scored_bytes(trial, scope) < scored_bytes(chosen, scope)) {
      high = scored_bytes(trial, scope);
      chosen = std::move(trial);
      ++out.steps;
    } else {
      low = target;
    }
  }
  return out;
}

}  // namespace

Evaluation choose_knee(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                       PlanResult& result) {
  FrontierResult frontier;
  {
    ScopedTimer timer(result.timings.mincut_seconds);
    frontier = detail::frontier_cuts(graph, index, result.tags.policies, stages.mincut);
  }
  const double base = step_seconds(graph, stages.cost);
  const double allowance = kKneeSlowdown * base;
  result.stats.step_seconds = base;
  result.stats.knee_allowance_seconds = allowance;
  result.stats.knee_points = frontier.points.size();
  const RematOptions schedule = unit_schedule(result.scope);
  SecondsCache seconds;
  Evaluation chosen;
  bool any = false, within = false;
  std::vector<PointFigures> figures;
  for (const auto& point : frontier.points) {  // least recompute first
    Evaluation evaluation = evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings, &seconds);
    evaluation.lambda = point.lambda;
    figures.push_back({scored_bytes(evaluation, result.scope), evaluation.recompute_seconds});
    const bool fits = evaluation.recompute_seconds <= allowance;
    const bool better = !any || (fits && !within) ||
                        (fits == within && within && scored_bytes(evaluation, result.scope) < scored_bytes(chosen, result.scope));
    if (better) {
      within = within || fits;
      chosen = std::move(evaluation);
      any = true;
    }
  }
  if (!any) chosen = evaluate_indexed(graph, index, result.tags.policies, stages.cost, schedule, &result.timings, &seconds);
  const KneeDescent descended =
      within ? descend_past_allowance(graph, index, stages, frontier, figures, allowance, schedule, seconds, result, chosen)
             : KneeDescent{};
  char ratio[32], lambda[32], aim[32];
  std::snprintf(aim, sizeof aim, "%.2f", 1.0 + kKneeSlowdown);
  std::snprintf(lambda, sizeof lambda, "%.3g", chosen.lambda);
  std::snprintf(ratio, sizeof ratio, "%.2f%%", base > 0.0 ? 100.0 * chosen.recompute_seconds / base : 0.0);
  result.diagnostics.push_back(
      {Severity::Info, -1,
       "auto chose the knee: lambda " + std::string(lambda) +
           ", " + scored_figure(result.scope) + " " + format_bytes(scored_bytes(chosen, result.scope)) + ", recompute " +
           format_seconds(chosen.recompute_seconds) + " = " + ratio + " of the step's " + format_seconds(base) +
           " (aim: least peak at <= " + aim + "x step time; " + std::to_string(frontier.points.size()) + " frontier points" +
           (descended.steps > 0 ? "; found between frontier points by saving again within a peak (" +
                                      std::to_string(descended.evaluations) + " evaluations)"
                                : "") +
           (within || !any ? "" : "; none within the allowance: the least-recompute one") + ")"});
  if (!frontier.complete)
    result.diagnostics.push_back({Severity::Info, -1,
                                  "frontier search stopped after " + std::to_string(frontier.solves) +
                                      " max-flow solves; the knee is the best of the points found"});
  return chosen;
}

}  // namespace planning
}  // namespace hyper_ac
