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

// What exists before the step, which a measured peak leaves out: the parameters,
// buffers, the user's inputs and the graph's constants. Not the tangents: the step makes them (autograd
// materialises an unused output's as zeros), so the measured figure holds them.
std::int64_t bytes_before_step(const Graph& graph) {
  __int128 total = 0;
  for (const auto& node : graph.nodes)
    if (node.kind == NodeKind::GetAttr ||
        (node.kind == NodeKind::Placeholder &&
         (node.role == Role::Parameter || node.role == Role::Buffer || node.role == Role::Input)))
      total += node.output_bytes();
  return clamp_bytes(total);
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

// The measured search's tries in all, new measurements or not.
constexpr std::size_t kSearchTries = 4 * kOracleSearchProbes;

// One plan the measured search tried: the simulated target it was chosen for
// (choose_on_frontier) and the peak the oracle measured.
struct Tried {
  std::int64_t simulated = 0;
  std::int64_t measured = 0;
};

// Measured bytes per simulated byte between two tried plans, within bounds:
// Inductor fuses away part of what a simulated byte adds (slopes of 0.5-0.8
// on the realistic tier), and a step of the plan between two targets can
// measure anything. Unknown: one for one. For moving past both, not between
// them (search_measured_target interpolates a bracket with its own slope).
double measured_slope(const std::optional<Tried>& a, const std::optional<Tried>& b) {
  if (!a || !b || a->simulated == b->simulated) return 1.0;
  const double slope = static_cast<double>(b->measured - a->measured) / static_cast<double>(b->simulated - a->simulated);
  return std::clamp(slope, kMeasuredSlopeBounds[0], kMeasuredSlopeBounds[1]);
}

// What the measured search knows: the highest plan that fit and the lowest
// over (by simulated target) with the plan it measured, every plan that fit
// with its measured bytes, and which of those is kept (keep_fitting).
struct MeasuredSearch {
  std::optional<Tried> fits, over;
  std::optional<Evaluation> over_plan;  // the plan `over` measured
  std::vector<std::pair<Evaluation, std::int64_t>> fitting;
  std::optional<std::size_t> kept;  // index into `fitting`
  std::int64_t kept_bytes = -1;
  const Evaluation& kept_plan() const { return fitting[*kept].first; }
  double least_seconds = 0.0;  // the least recompute of the plans that fit
  std::int64_t least_over = -1;  // the least measured of the plans over; -1: none
};

// Records a plan measured over the target: its measured bytes, and the plan when it is the
// lowest over so far by simulated target.
void note_over(MeasuredSearch& state, const Tried& tried, const Evaluation& plan) {
  if (state.least_over < 0 || tried.measured < state.least_over) state.least_over = tried.measured;
  if (state.over && tried.simulated >= state.over->simulated) return;
  state.over = tried;
  state.over_plan = plan;
}

// Records a plan that fits and keeps, of all that fit, the one nearest the
// target (the memory is the user's to spend) among those that recompute within
// kRecomputeTieFraction of the least; ties: less recompute.
void keep_fitting(MeasuredSearch& state, const Evaluation& plan, std::int64_t bytes) {
  state.least_seconds =
      state.fitting.empty() ? plan.recompute_seconds : std::min(state.least_seconds, plan.recompute_seconds);
  state.fitting.emplace_back(plan, bytes);
  const double least = state.least_seconds;
  std::optional<std::size_t> best;
  for (std::size_t k = 0; k < state.fitting.size(); ++k) {
    const auto& entry = state.fitting[k];
    if (entry.first.recompute_seconds > least * (1.0 + kRecomputeTieFraction)) continue;
    if (!best || entry.second > state.fitting[*best].second ||
        (entry.second == state.fitting[*best].second &&
         entry.first.recompute_seconds < state.fitting[*best].first.recompute_seconds))
      best = k;
  }
  state.kept = best;
  state.kept_bytes = state.fitting[*best].second;
}

// A tag that leaves the plan free to save or recompute the node.
bool left_optional(Policy tag) { return tag == Policy::PreferRecompute || tag == Policy::PreferSave; }

// Of the plans that set one candidate's policy in `base` to `to` (candidates in
// order, each evaluated, at most `cap` evaluations counted in `evaluations`;
// `schedule` and `seconds` are the caller's, shared by its probes),
// the one `accepted` with the highest simulated peak (nearest the target from
// below; ties: less recompute). None: nothing accepted.
template <typename Accept>
std::optional<Evaluation> best_single_change(const Graph& graph, const detail::NodeIndex& index,
                                             const StageOptions& stages, const RematOptions& schedule,
                                             SecondsCache& seconds, PlanResult& result, const Evaluation& base,
                                             const std::vector<std::pair<double, std::int32_t>>& candidates, Policy to,
                                             const Accept& accepted, std::size_t& evaluations, std::size_t cap) {
  std::optional<Evaluation> best;
  for (const auto& candidate : candidates) {
    if (evaluations >= cap) break;
    std::vector<Policy> trial = base.remat.policies;
    trial[static_cast<std::size_t>(candidate.second)] = to;
    Evaluation evaluation = evaluate_indexed(graph, index, trial, stages.cost, schedule, &result.timings, &seconds);
    ++evaluations;
    if (!accepted(evaluation)) continue;
    if (!best || evaluation.simulated_peak_bytes > best->simulated_peak_bytes ||
        (evaluation.simulated_peak_bytes == best->simulated_peak_bytes &&
         evaluation.recompute_seconds < best->recompute_seconds)) {
      evaluation.lambda = base.lambda;
      best = std::move(evaluation);
    }
  }
  return best;
}

// The measured search (continue_budget_on_measured): from the simulated
// choice, which measured `fits` (within the target) or `over` it, the
// simulated target is moved to aim inside [1 - kBudgetMeasuredSlack, 1] x the
// measured target: past one measured point by the slope learnt so far, or
// between a plan that fits and one over by the secant. Each target's plan is
// the budget's own (first fitting frontier point, then the descent). It stops
// when a plan that fits is within the slack, after kOracleSearchProbes new
// measurements (a target whose plan was measured before is free: the next
// moves further, by the flatter slope it learnt), or when the two bracket no
// simulated byte. The kept plan is
// the least-recompute one that fits.
void search_measured_target(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                            const BudgetSearch& search, MeasuredPeaks& measured, std::int64_t target,
                            PlanResult& result, MeasuredSearch& state) {
  std::optional<Tried>& fits = state.fits;
  std::optional<Tried>& over = state.over;
  const double slack = kBudgetMeasuredSlack * static_cast<double>(target);
  const double aim = static_cast<double>(target) - slack / 2;
  std::optional<Tried> last = fits ? fits : over, before;
  SecondsCache seconds;
  // A target whose plan was measured before costs no compile: only new measurements count
  // against kOracleSearchProbes, and the tries are bounded apart.
  std::size_t new_measurements = 0;
  bool repeated = false;  // the last try's plan was measured before
  // Regula falsi, Illinois style: each time the same side of the bracket moves again, the
  // other side's distance from the aim counts half as much, so a bracket whose measured peak
  // bends (a step up just past the floor) is not closed in on from one side only.
  double fits_weight = 1.0, over_weight = 1.0;
  int moved = 0;  // the side the last try moved: +1 over, -1 fits, 0 none yet
  for (std::size_t tries = 0; new_measurements < kOracleSearchProbes && tries < kSearchTries; ++tries) {
    if (fits && static_cast<double>(target - fits->measured) <= slack) return;
    double proposal;
    if (fits && over) {
      if (over->simulated - fits->simulated <= 1) return;
      // Between a plan that fits and one over: the secant of the two, weighted as above (their
      // own slope: the aim lies between their measured figures, so the secant lies between
      // them), or, after a try that found a plan measured before (the plans step, and the
      // secant keeps landing on the same one), the middle of the two targets.
      const double below = fits_weight * (aim - static_cast<double>(fits->measured));
      const double above = over_weight * (static_cast<double>(over->measured) - aim);
      const double width = static_cast<double>(over->simulated - fits->simulated);
      proposal = static_cast<double>(fits->simulated) + (repeated ? width / 2 : width * below / (below + above));
      proposal = std::clamp(proposal, static_cast<double>(fits->simulated + 1), static_cast<double>(over->simulated - 1));
    } else {
      proposal = static_cast<double>(last->simulated) + (aim - static_cast<double>(last->measured)) / measured_slope(before, last);
    }
    const std::int64_t simulated = bytes_from_double(proposal);
    std::optional<Evaluation> candidate = choose_on_frontier(graph, index, stages, search.frontier, simulated, result,
                                                             seconds);
    if (!candidate) return;
    const std::size_t calls = result.stats.oracle_calls;
    const std::int64_t bytes = measured.of(*candidate);
    if (bytes < 0) return;
    repeated = result.stats.oracle_calls == calls;
    new_measurements += repeated ? 0 : 1;
    before = last;
    last = Tried{simulated, bytes};
    if (bytes > target) {
      // A plan over stands at its own figure where that is past the plan that fits (a target
      // between gives another plan, so the bracket closes in without measuring it again); a
      // bounded descent can leave it under, and then at its target.
      const std::int64_t own = scored_bytes(*candidate, result.scope);
      if (own < simulated && (!fits || own > fits->simulated)) last->simulated = own;
      const bool lowest = !over || last->simulated < over->simulated;
      note_over(state, *last, *candidate);
      if (lowest) {
        over_weight = 1.0;
        if (moved > 0) fits_weight /= 2;
        moved = 1;
      }
      continue;
    }
    if (!fits || last->simulated > fits->simulated) {
      fits = last;
      fits_weight = 1.0;
      if (moved < 0) over_weight /= 2;
      moved = -1;
    }
    keep_fitting(state, *candidate, bytes);
  }
}

// The trim (kOracleTrimProbes): from the plan measured over, each value it
// saves that the tags leave optional and whose bytes cover the measured excess
// is recomputed in turn (cheapest own recompute first, at most descent_cap
// evaluations). Of those whose simulated peak falls by at least that excess
// and whose recompute is within kRecomputeTieFraction of the least that fit,
// the one whose peak falls least (nearest the target; ties: less recompute)
// is measured. It fits: recorded as any plan that fits (keep_fitting). Still
// over, but lower: the next trim starts from it.
void trim_over_plan(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                    MeasuredPeaks& measured, std::int64_t target, PlanResult& result, MeasuredSearch& state) {
  if (!state.kept || !state.over || !state.over_plan) return;
  const double slack = kBudgetMeasuredSlack * static_cast<double>(target);
  const std::vector<Policy>& tags = result.tags.policies;
  const std::size_t cap = descent_cap(graph);
  const RematOptions schedule = unit_schedule(result.scope);
  SecondsCache seconds;
  Evaluation base = *state.over_plan;
  std::int64_t base_bytes = state.over->measured;
  std::size_t evaluations = 0;
  for (std::size_t probe = 0; probe < kOracleTrimProbes; ++probe) {
    if (static_cast<double>(target - state.kept_bytes) <= slack) return;
    const std::int64_t excess = base_bytes - target;
    std::vector<std::pair<double, std::int32_t>> candidates;
    for (const std::int32_t v : base.remat.saved) {
      const auto i = static_cast<std::size_t>(v);
      if (left_optional(tags[i]) && !is_recompute(base.remat.policies[i]) && graph.nodes[i].output_bytes() >= excess)
        candidates.emplace_back(detail::recompute_seconds(graph, index, v, stages.cost), v);
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const double allowed_seconds = state.least_seconds * (1.0 + kRecomputeTieFraction);
    std::optional<Evaluation> best = best_single_change(
        graph, index, stages, schedule, seconds, result, base, candidates, Policy::PreferRecompute,
        [&](const Evaluation& e) {
          return base.simulated_peak_bytes - e.simulated_peak_bytes >= excess && e.recompute_seconds <= allowed_seconds;
        },
        evaluations, cap);
    if (!best) return;
    const std::int64_t bytes = measured.of(*best);
    if (bytes < 0) return;
    if (bytes <= target) {
      keep_fitting(state, *best, bytes);
      return;
    }
    note_over(state, Tried{scored_bytes(*best, result.scope), bytes}, *best);
    if (bytes >= base_bytes) return;  // recomputing it did not lower the measured peak
    base = std::move(*best);
    base_bytes = bytes;
  }
}

// The fill (kOracleFillProbes): still kept further under than the slack, each
// value the kept plan recomputes that the tags leave optional is saved again in
// turn (most expensive own recompute first, at most descent_cap evaluations); of
// those that recompute less and whose simulated peak rises by no more than the
// measured gap to the target, the one whose peak rises most (nearest the
// target; ties: less recompute) is measured, and recorded when it fits.
void fill_kept_plan(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                    MeasuredPeaks& measured, std::int64_t target, PlanResult& result, MeasuredSearch& state) {
  if (!state.kept) return;
  const double slack = kBudgetMeasuredSlack * static_cast<double>(target);
  const std::vector<Policy>& tags = result.tags.policies;
  const std::size_t cap = descent_cap(graph);
  const RematOptions schedule = unit_schedule(result.scope);
  SecondsCache seconds;
  std::size_t evaluations = 0;
  for (std::size_t probe = 0; probe < kOracleFillProbes; ++probe) {
    if (static_cast<double>(target - state.kept_bytes) <= slack) return;
    const Evaluation base = state.kept_plan();
    const std::int64_t gap = target - state.kept_bytes;
    std::vector<char> seen(graph.nodes.size(), 0);
    std::vector<std::pair<double, std::int32_t>> candidates;
    for (const auto& dup : base.remat.duplicates) {
      const auto i = static_cast<std::size_t>(dup.of);
      if (seen[i] || !left_optional(tags[i]) || !is_recompute(base.remat.policies[i])) continue;
      seen[i] = 1;
      candidates.emplace_back(detail::recompute_seconds(graph, index, dup.of, stages.cost), dup.of);
    }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::optional<Evaluation> best = best_single_change(
        graph, index, stages, schedule, seconds, result, base, candidates, Policy::PreferSave,
        [&](const Evaluation& e) {
          return e.simulated_peak_bytes - base.simulated_peak_bytes <= gap && e.recompute_seconds < base.recompute_seconds;
        },
        evaluations, cap);
    if (!best) return;
    const std::int64_t bytes = measured.of(*best);
    if (bytes < 0) return;
    if (bytes > target) {
      note_over(state, Tried{scored_bytes(*best, result.scope), bytes}, *best);
      return;
    }
    keep_fitting(state, *best, bytes);
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
      if (duplicated[v] && left_optional(tags[v]) && is_recompute(policies[v]))
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
  search.resident_bytes = bytes_before_step(graph);
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
  const std::int64_t first_bytes = measured.of(chosen);
  if (first_bytes < 0) return;
  const bool met_before = result.stats.budget_met;
  const double first_seconds = chosen.recompute_seconds;
  // The choice as a tried plan: the simulated target it was chosen for, or, missed on the
  // simulation (its own figure is the least reachable) or measured over, its own figure.
  const Tried first{met_before && first_bytes <= target ? search.target : scored_bytes(chosen, result.scope),
                    first_bytes};
  MeasuredSearch state;
  if (first_bytes <= target) {
    state.fits = first;
    keep_fitting(state, chosen, first_bytes);
  } else {
    note_over(state, first, chosen);
  }
  search_measured_target(graph, index, stages, search, measured, target, result, state);
  if (!state.kept) {
    // Nothing near the choice fits: the frontier from the choice's own point (its descent may
    // have saved again what the compiler needs replayed) to its end is bisected on the measured
    // peak for the least-recompute point that fits, and the gap between that point and the
    // least plan over is searched as above.
    const RematOptions schedule = unit_schedule(result.scope);
    SecondsCache seconds;
    std::int64_t least_bytes = first_bytes;
    std::size_t lo = *search.chosen_point, hi = search.frontier.points.size();  // [lo, hi)
    for (std::size_t probe = 0; probe < kOracleBudgetProbes && lo < hi; ++probe) {
      const std::size_t mid = lo + (hi - lo) / 2;
      const auto& point = search.frontier.points[mid];
      Evaluation evaluation = evaluate_indexed(graph, index, point.policies, stages.cost, schedule, &result.timings,
                                               &seconds);
      evaluation.lambda = point.lambda;
      const std::int64_t bytes = measured.of(evaluation);
      if (bytes < 0) break;
      const Tried tried{scored_bytes(evaluation, result.scope), bytes};
      if (bytes <= target) {
        state.fits = tried;
        keep_fitting(state, evaluation, bytes);
        hi = mid;
      } else {
        note_over(state, tried, evaluation);
        if (bytes < least_bytes) {
          chosen = std::move(evaluation);
          least_bytes = bytes;
        }
        lo = mid + 1;
      }
    }
    if (state.kept) search_measured_target(graph, index, stages, search, measured, target, result, state);
    if (!state.kept) state.kept_bytes = least_bytes;
  }
  trim_over_plan(graph, index, stages, measured, target, result, state);
  fill_kept_plan(graph, index, stages, measured, target, result, state);
  if (state.kept) chosen = state.kept_plan();
  const std::int64_t kept_bytes = state.kept_bytes;
  result.stats.budget_met = kept_bytes <= target;
  result.stats.measured_peak_after = kept_bytes;
  result.stats.measured_nearest_over = state.least_over;
  if (result.stats.budget_met && met_before && kept_bytes != first_bytes)
    result.diagnostics.push_back({Severity::Info, -1,
                                  "memory budget on the measured peak (" + format_bytes(target) +
                                      "): the simulated choice measured " + format_bytes(first_bytes) + " (recompute " +
                                      format_seconds(first_seconds) + "); a plan measuring " +
                                      format_bytes(kept_bytes) + " recomputes " +
                                      format_seconds(chosen.recompute_seconds) + " (" +
                                      std::to_string(result.stats.oracle_calls) + " plans measured)"});
  // Met further under than the slack: plans change in steps, and the search says which step it found over.
  if (result.stats.budget_met && state.least_over >= 0 &&
      static_cast<double>(target - kept_bytes) > kBudgetMeasuredSlack * static_cast<double>(target))
    result.diagnostics.push_back({Severity::Info, -1,
                                  "memory budget on the measured peak (" + format_bytes(target) + "): kept " +
                                      format_bytes(kept_bytes) + ", more than " +
                                      std::to_string(static_cast<int>(kBudgetMeasuredSlack * 100)) +
                                      "% under it; the nearest plan the search measured over it holds " +
                                      format_bytes(state.least_over) + " (" + format_bytes(state.least_over - target) +
                                      " over; plans change in steps)"});
  if (result.stats.budget_met != met_before || !result.stats.budget_met)
    result.diagnostics.push_back(
        {result.stats.budget_met ? Severity::Info : Severity::Warning, -1,
         std::string("memory budget on the measured peak (") + format_bytes(target) + " beyond the " +
             format_bytes(search.resident_bytes) + " resident): " +
             (result.stats.budget_met ? "met, at " : "cannot be met; the least measured is ") +
             format_bytes(kept_bytes) + " (" + std::to_string(result.stats.oracle_calls) +
             " plans measured); using that plan"});
}

}  // namespace planning
}  // namespace hyper_ac
