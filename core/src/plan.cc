#include "hyper_ac/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <variant>

#include <nlohmann/json.hpp>

#include "hyper_ac/cost.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/saturate.h"
#include "hyper_ac/simulate.h"
#include "indexed_stages.h"

namespace hyper_ac {

using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

// Adds the wall time of its scope to one figure. Every time plan() reports
// (PlanTimings) is taken by one of these, each evaluation's once, by
// evaluate_indexed, so a stage is never counted twice or missed on a branch.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& into) : into_(into), start_(Clock::now()) {}
  ~ScopedTimer() { into_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& into_;
  Clock::time_point start_;
};

// PlanOptions::record_timeline: simulate both schedules once more, keeping every step.
void record_timeline(const Graph& graph, PlanResult& result) {
  SimulateOptions options;
  options.record_timeline = true;
  const SimulateResult before = simulate_memory(graph, nullptr, options);
  const SimulateResult after = simulate_memory(graph, &result.remat, options);
  result.timeline.recorded = true;
  result.timeline.before = before.timeline;
  result.timeline.after = after.timeline;
  result.timeline.boundary_before = before.boundary_step;
  result.timeline.boundary_after = after.boundary_step;
  const auto& node_unit = result.scope.node_unit;
  auto unit_peaks = [&](const SimulateResult& simulated) {
    std::vector<std::int64_t> peaks(result.scope.units.size(), -1);
    if (node_unit.size() != graph.nodes.size()) return peaks;
    for (std::size_t s = 0; s < simulated.timeline.size(); ++s) {
      const auto node = static_cast<std::size_t>(simulated.timeline_nodes[s]);
      const std::int32_t unit = node_unit[node];
      // A duplicate step names its forward original: it runs in the backward too.
      const bool in_backward = graph.nodes[node].is_backward() || static_cast<std::int32_t>(s) > simulated.boundary_step;
      if (unit < 0 || !in_backward || static_cast<std::size_t>(unit) >= peaks.size()) continue;
      peaks[static_cast<std::size_t>(unit)] = std::max(peaks[static_cast<std::size_t>(unit)], simulated.timeline[s]);
    }
    return peaks;
  };
  result.timeline.unit_backward_peak_before = unit_peaks(before);
  result.timeline.unit_backward_peak_after = unit_peaks(after);
}

ScopeOptions scope_options(const Config& config) {
  ScopeOptions options = config.scope;
  // The min-cut modes plan a graph without units as one whole-graph region.
  options.whole_graph_when_no_units = config.mode == Mode::Auto || config.mode == Mode::Budget;
  // Checked here, not when parsing: the adapter is known only once the model is.
  if (config.region_source == "model_adapter_safe_regions" && !config.adapter_given)
    throw ConfigError(
        "config selection.source is 'model_adapter_safe_regions' but no model adapter is registered for this model "
        "(register a ModelAdapter with hyper_ac.config.register_adapter)");
  // Adapter regions stand in for configured ones: always when the source asks
  // for them, otherwise only when the config names no regions of its own.
  bool use_adapter = config.adapter_given &&
                     (config.region_source == "model_adapter_safe_regions" || config.scope.include.empty());
  if (use_adapter) {
    if (config.adapter_include.empty())
      throw ConfigError("the registered ModelAdapter declares no region_patterns; it needs at least one");
    options.include = config.adapter_include;
    for (const auto& pattern : config.adapter_exclude) options.exclude.push_back(pattern);
  }
  return options;
}

std::string joined(const std::vector<std::string>& items, std::size_t limit = 8) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > limit) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

// auto / budget: the custom ops whose compute the graph does not tell
// (compute_unknown, cost.h) and which the cut decided (tagged PREFER_*): their
// recompute cost is a lower bound, so say which ones, how many of their nodes
// the plan replays, and what fixes the estimate. None: nothing.
void note_compute_unknown(const Graph& graph, const std::vector<Policy>& tags, const RematPlan& remat,
                          std::vector<Diagnostic>& diagnostics) {
  std::vector<char> duplicated(graph.nodes.size(), 0);
  for (const auto& dup : remat.duplicates) duplicated[static_cast<std::size_t>(dup.of)] = 1;
  std::map<std::string, std::pair<std::size_t, std::size_t>> ops;  // op -> (nodes, replayed); sorted
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!node.is_forward() || (tags[i] != Policy::PreferSave && tags[i] != Policy::PreferRecompute) ||
        !compute_unknown(node))
      continue;
    auto& entry = ops[node.target.substr(0, node.target.find('.', node.target.find("::")))];
    ++entry.first;
    entry.second += duplicated[i] ? 1 : 0;
  }
  if (ops.empty()) return;
  std::vector<std::string> items;
  for (const auto& [op, counts] : ops)
    items.push_back(op + " (" + std::to_string(counts.first) + " node(s), " + std::to_string(counts.second) +
                    " replayed)");
  diagnostics.push_back(
      {Severity::Info, -1,
       "recompute cost of custom op(s) " + joined(items) +
           " priced from the bytes they move only: the graph carries no FLOP count for them (no formula in "
           "torch.utils.flop_counter), so a compute-heavy op looks as cheap to replay as a copy; register one "
           "(torch.utils.flop_counter.register_flop_formula) or name the op in op_policy"});
}

// The replay schedule follows the units (remat.h).
RematOptions unit_schedule(const Scope& scope) {
  RematOptions options;
  options.node_unit = scope.node_unit;
  return options;
}

// evaluate() over a prebuilt node index: plan() builds it once for every
// evaluation (each frontier point) and the memory estimate before them.
// Per node, recompute_seconds (cost.h) once computed; NaN = not yet. Shared by
// the evaluations of one plan (the frontier points replay mostly the same nodes).
using SecondsCache = std::vector<double>;

// `timings`: plan()'s figures, which every evaluation it runs adds its own
// remat and simulate time to (null: a lone evaluate()).
Evaluation evaluate_indexed(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& policies,
                            const CostOptions& cost, const RematOptions& remat, PlanTimings* timings,
                            SecondsCache* seconds = nullptr) {
  Evaluation evaluation;
  detail::FlatSchedule validated;  // the rewritten schedule plan_remat's validation built, if it ran
  {
    ScopedTimer timer(evaluation.remat_seconds);
    evaluation.remat = detail::plan_remat(graph, index, policies, remat, &validated);
  }
  SimulateResult simulated;
  {
    ScopedTimer timer(evaluation.simulate_seconds);
    simulated = remat.validate ? detail::simulate_memory(graph, index, validated, {})
                               : detail::simulate_memory(graph, index, &evaluation.remat, {});
  }
  if (timings != nullptr) {
    timings->remat_seconds += evaluation.remat_seconds;
    timings->simulate_seconds += evaluation.simulate_seconds;
  }
  evaluation.saved_bytes = evaluation.remat.stats.saved_bytes_after;
  evaluation.recompute_flops = evaluation.remat.stats.recompute_flops;
  evaluation.nodes_duplicated = evaluation.remat.duplicates.size();
  if (cost.compiler == Compiler::Eager && seconds != nullptr) {
    // recompute_seconds(graph, replayed, cost) under eager: the sum of the
    // duplicates' own times, in duplicate order.
    if (seconds->size() != graph.nodes.size()) seconds->assign(graph.nodes.size(), std::numeric_limits<double>::quiet_NaN());
    double total = 0.0;
    for (const auto& dup : evaluation.remat.duplicates) {
      double& own = (*seconds)[static_cast<std::size_t>(dup.of)];
      if (std::isnan(own)) own = detail::recompute_seconds(graph, index, dup.of, cost);
      total = add_finite(total, own);
    }
    evaluation.recompute_seconds = total;
  } else if (cost.compiler == Compiler::Eager) {
    // recompute_seconds(graph, replayed, cost) under eager, off the index.
    double total = 0.0;
    for (const auto& dup : evaluation.remat.duplicates)
      total = add_finite(total, detail::recompute_seconds(graph, index, dup.of, cost));
    evaluation.recompute_seconds = total;
  } else {
    std::vector<std::int32_t> replayed;
    replayed.reserve(evaluation.remat.duplicates.size());
    for (const auto& dup : evaluation.remat.duplicates) replayed.push_back(dup.of);
    evaluation.recompute_seconds = recompute_seconds(graph, replayed, cost);
  }
  evaluation.simulated_peak_bytes = simulated.peak_bytes_with_resident;
  evaluation.simulated_activation_peak_bytes = simulated.peak_bytes;
  return evaluation;
}

// The memory figure a plan is scored by: the simulated peak (everything
// resident included), or, for a graph that is one unit of a model compiled
// unit by unit (scope unit_graph), the bytes its forward saves for the
// backward: those stack up over the model's units, while the graph's own
// transient peak occurs once.
std::int64_t scored_bytes(const Evaluation& evaluation, const Scope& scope) {
  return scope.unit_graph ? evaluation.saved_bytes : evaluation.simulated_peak_bytes;
}

const char* scored_figure(const Scope& scope) { return scope.unit_graph ? "saved bytes" : "simulated peak"; }

// Plan `a` scores strictly below plan `b`: a lower scored figure, and under
// unit_graph a simulated peak no higher as well (fewer saved bytes bought
// with a higher transient is no gain for the block's own compile).
bool scores_below(const Evaluation& a, const Evaluation& b, const Scope& scope) {
  return scored_bytes(a, scope) < scored_bytes(b, scope) &&
         (!scope.unit_graph || a.simulated_peak_bytes <= b.simulated_peak_bytes);
}

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

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g s", seconds);
  return text;
}

// Budget mode, second step: peak-guided descent from the fitting plan the
// frontier walk chose. The frontier trades saved bytes against recompute, but
// the budget is on the simulated peak, which depends on when values die: a
// recomputed node may be saved again without raising the peak past the
// budget (its saved copy dies before the peak step, or its replay was itself
// at the peak). Candidates are the recomputed nodes the tags leave optional
// (PREFER_*), most expensive duplicates first (ties: graph order); each is
// tried once per pass by re-planning and re-simulating with it saved, and
// kept saved when the peak still fits and the recompute time falls (saving
// it may also drop the duplicates that only fed it). Passes repeat until one
// changes nothing. Bounded by `cap` evaluations (descent_cap).
constexpr std::size_t kBudgetDescentEvaluations = 256;
constexpr std::size_t kBudgetDescentWork = std::size_t{1} << 23;

// The evaluations one plan may spend descending: at most kBudgetDescentEvaluations
// and kBudgetDescentWork node-evaluations (evaluations x graph nodes), so a
// 1M-node graph gets 8, a graph up to 32k nodes the full 256.
std::size_t descent_cap(const Graph& graph) {
  const std::size_t per_evaluation = std::max<std::size_t>(graph.nodes.size(), 1);
  return std::min(kBudgetDescentEvaluations, std::max<std::size_t>(kBudgetDescentWork / per_evaluation, 1));
}

struct Descent {
  std::size_t evaluations = 0;
  std::size_t saved_again = 0;  // candidates kept saved
  bool bounded = false;         // stopped by the bounds, not by a pass without change
};

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

// What the budget's search leaves for a measured check (continue_budget_on_measured):
// the frontier, the target, and which point the simulated choice came from.
struct BudgetSearch {
  ParetoResult frontier;
  std::int64_t target = 0;
  std::int64_t resident_bytes = 0;  // the all-saved step's resident values (parameters, inputs, tangents)
  std::optional<std::size_t> chosen_point;  // frontier index of the chosen plan's point (before its descent)
};

// Budget mode: the least-recompute point of the Pareto frontier whose scored
// figure (scored_bytes: the simulated peak, or a unit graph's saved bytes)
// fits, then the descent above; none fits -> the smallest figure (ties: the
// lower peak), with a warning.
Evaluation choose_within_budget(const Graph& graph, const detail::NodeIndex& index, const Config& config,
                                const StageOptions& stages, const SimulateResult& all_saved, PlanResult& result,
                                BudgetSearch& search) {
  const Scope& scope = result.scope;
  const std::int64_t target = budget_target(graph, config.mincut.memory_budget, all_saved, scope);
  result.stats.budget_bytes = target;
  ParetoResult frontier;
  {
    ScopedTimer timer(result.timings.mincut_seconds);
    frontier = detail::pareto(graph, index, result.tags.policies, stages.mincut);
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
                                  "Pareto search stopped after " + std::to_string(frontier.solves) +
                                      " max-flow solves; the budget plan may not be the least-recompute one"});
  search.frontier = std::move(frontier);
  return chosen;
}

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
                                   const ParetoResult& frontier, const std::vector<PointFigures>& figures,
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

// auto under hardware: measured: the knee of the frontier (kKneeSlowdown,
// plan.h), then descend_past_allowance.
Evaluation choose_knee(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                       PlanResult& result) {
  ParetoResult frontier;
  {
    ScopedTimer timer(result.timings.mincut_seconds);
    frontier = detail::pareto(graph, index, result.tags.policies, stages.mincut);
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
  char ratio[32], lambda[32];
  std::snprintf(lambda, sizeof lambda, "%.3g", chosen.lambda);
  std::snprintf(ratio, sizeof ratio, "%.2f%%", base > 0.0 ? 100.0 * chosen.recompute_seconds / base : 0.0);
  result.diagnostics.push_back(
      {Severity::Info, -1,
       "auto (hardware: measured) chose the knee: lambda " + std::string(lambda) +
           ", " + scored_figure(result.scope) + " " + format_bytes(scored_bytes(chosen, result.scope)) + ", recompute " +
           format_seconds(chosen.recompute_seconds) + " = " + ratio + " of the step's " + format_seconds(base) +
           " (aim: least peak at <= 1.02x step time; " + std::to_string(frontier.points.size()) + " frontier points" +
           (descended.steps > 0 ? "; found between frontier points by saving again within a peak (" +
                                      std::to_string(descended.evaluations) + " evaluations)"
                                : "") +
           (within || !any ? "" : "; none within 2%: the least-recompute one") + ")"});
  if (!frontier.complete)
    result.diagnostics.push_back({Severity::Info, -1,
                                  "Pareto search stopped after " + std::to_string(frontier.solves) +
                                      " max-flow solves; the knee is the best of the points found"});
  return chosen;
}

// Scope and tags as the `auto` mode sees them (the frontier and the flow network).
TagResult auto_tags(const Graph& graph, const detail::NodeIndex& index, const PlanOptions& options, StageOptions& stages,
                    Scope* scope_out = nullptr) {
  Config config = options.config;
  config.mode = Mode::Auto;
  config.mincut.memory_budget = std::monostate{};
  stages = stage_options(config, options.op_policy);
  Scope scope = detail::resolve_scope(graph, index, stages.scope);
  stages.mincut.charge_inputs = scope.whole_graph;
  TagResult tags = detail::tag_policies(graph, index, scope, stages.tag);
  if (scope_out != nullptr) *scope_out = std::move(scope);
  return tags;
}

// Never worse than stock (docs/mincut.md): the stock partition's recompute set
// (PlanOptions::stock_recomputed) scored on the same simulator as the plan.
// auto keeps its own plan only when its simulated peak is strictly lower;
// otherwise every candidate is saved (no rewrite), and the caller partitions
// the graph as stock does it. Hard recompute constraints (the model's own
// tags, a table MUST_RECOMPUTE) are not stock's to drop: no comparison then.
void compare_with_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                        const CostOptions& cost, const RematOptions& schedule, PlanResult& result,
                        Evaluation& evaluation) {
  if (result.tags.stats.user_tagged > 0) return;
  for (Policy policy : result.tags.policies)
    if (policy == Policy::MustRecompute) return;
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
  const Scope& scope = result.scope;
  if (scores_below(evaluation, scored, scope)) return;
  const std::int64_t own = scored_bytes(evaluation, scope), theirs = scored_bytes(scored, scope);
  std::vector<Policy> kept = result.tags.policies;
  for (Policy& policy : kept)
    if (policy == Policy::PreferRecompute) policy = Policy::PreferSave;
  const double lambda = evaluation.lambda;
  evaluation = evaluate_indexed(graph, index, kept, cost, schedule, &result.timings);
  evaluation.lambda = lambda;
  result.stats.stock_fallback = true;
  result.diagnostics.push_back(
      {Severity::Info, -1,
       std::string("auto's plan (") + scored_figure(scope) + " " + format_bytes(own) +
           ") is not below the stock partition's (" + format_bytes(theirs) +
           (scope.unit_graph ? ", at a simulated peak no higher" : "") + "): the graph is left to the stock partition"});
}

// The route rule, in one place: a plan that duplicates nothing on a graph the
// model did not tag itself changes nothing, so the graph goes to the stock
// partition (which may recompute what it fuses); so does mode off, and auto's
// fallback when its plan is not below stock's.
RouteDecision decide_route(const PlanResult& result) {
  if (result.mode == Mode::Off) return {Route::Stock, "off"};
  if (result.stats.scope == "no_units") return {Route::Stock, "no_units"};
  if (result.stats.measured_fallback) return {Route::Stock, "measured_above_stock"};
  if (!result.remat.duplicates.empty()) return {Route::Rewrite, "recomputes"};
  if (result.stats.user_tagged > 0) return {Route::Rewrite, "user_tagged"};
  if (result.stats.stock_fallback) return {Route::Stock, "stock_not_worse"};
  return {Route::Stock, "nothing_recomputed"};
}

// PlanOptions::peak_oracle, asked once per distinct candidate: a candidate is
// sent as the plan document it would be (compact form), the stock partition
// as the unchanged plan routed to stock.
class MeasuredPeaks {
 public:
  MeasuredPeaks(const Graph& graph, const PlanOptions& options, PlanResult& result)
      : graph_(graph), oracle_(options.peak_oracle), result_(result) {}

  bool available() const { return static_cast<bool>(oracle_); }

  // `base`: the plan the candidate belongs to (its scope and tags), the plan being made by default.
  std::int64_t of(const Evaluation& candidate, const PlanResult* base = nullptr) {
    PlanResult as_plan = base ? *base : result_;
    as_plan.remat = candidate.remat;
    as_plan.policies = candidate.remat.policies;
    as_plan.stats.lambda = candidate.lambda;
    as_plan.stats.simulated_peak_after = candidate.simulated_peak_bytes;
    as_plan.stats.simulated_activation_peak_after = candidate.simulated_activation_peak_bytes;
    as_plan.stats.recompute_seconds = candidate.recompute_seconds;
    as_plan.route = decide_route(as_plan);
    return ask(as_plan);
  }

  std::int64_t of_stock() {
    PlanResult as_plan = result_;
    as_plan.policies.assign(graph_.nodes.size(), Policy::None);
    as_plan.remat = plan_remat(graph_, as_plan.policies);
    as_plan.route = {Route::Stock, "off"};
    return ask(as_plan);
  }

 private:
  // Keyed by what the measured step depends on: the route, the per-node policies and the
  // duplicates with their insertion points (not the stats or notes the document also carries).
  std::int64_t ask(const PlanResult& as_plan) {
    std::string key = to_string(as_plan.route.route);
    key.reserve(key.size() + as_plan.policies.size() + 8 * as_plan.remat.duplicates.size());
    for (Policy policy : as_plan.policies) key.push_back(static_cast<char>('a' + static_cast<int>(policy)));
    for (const auto& dup : as_plan.remat.duplicates)
      key += ";" + std::to_string(dup.of) + ">" + std::to_string(dup.before);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    PlanJsonOptions compact;
    compact.detail = false;
    const std::int64_t bytes = oracle_(plan_to_json(graph_, as_plan, compact));
    ++result_.stats.oracle_calls;
    cache_.emplace(std::move(key), bytes);
    return bytes;
  }

  const Graph& graph_;
  const std::function<std::int64_t(const std::string&)>& oracle_;
  PlanResult& result_;
  std::map<std::string, std::int64_t> cache_;
};

// Budget mode with a peak oracle: the simulated choice measured; above the
// target (less the resident bytes, which the measured figure leaves out), the
// frontier from its point on is bisected on the measured peak (least recompute
// first, kOracleBudgetProbes measurements) for the least-recompute point
// that fits. None fits: the least measured of those tried, with a warning.
// A simulated miss that measures within the target is met.
// The budget's choice for a simulated target: the first frontier point whose
// scored figure fits, then the descent (choose_within_budget's rule). None: no point fits.
std::optional<Evaluation> choose_on_frontier(const Graph& graph, const detail::NodeIndex& index,
                                             const StageOptions& stages, const ParetoResult& frontier,
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
// by the measured slack (the two move about alike), or bisected once a raise
// measured over; a candidate that fits with less recompute is kept.
void raise_toward_measured_target(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                                  const BudgetSearch& search, MeasuredPeaks& measured, std::int64_t target,
                                  PlanResult& result, Evaluation& chosen, std::int64_t& chosen_bytes) {
  std::int64_t fits = search.target, over = -1;  // simulated targets whose plan measured within / over
  std::int64_t slack = target - chosen_bytes;
  const std::int64_t resolution = std::max<std::int64_t>(1, target / 1000);
  SecondsCache seconds;
  for (std::size_t probe = 0; probe < kOracleBudgetProbes; ++probe) {
    if (static_cast<double>(target - chosen_bytes) <= kBudgetMeasuredSlack * static_cast<double>(target)) break;
    if (over >= 0 && over - fits <= resolution) break;
    const std::int64_t proposal =
        over < 0 ? clamp_bytes(static_cast<__int128>(fits) + slack) : fits + (over - fits) / 2;
    if (proposal <= fits) break;
    std::optional<Evaluation> candidate = choose_on_frontier(graph, index, stages, search.frontier, proposal, result,
                                                             seconds);
    if (!candidate) break;
    const std::int64_t bytes = measured.of(*candidate);
    if (bytes < 0) break;
    if (bytes > target) {
      over = proposal;
      continue;
    }
    fits = proposal;
    slack = target - bytes;
    if (candidate->recompute_seconds < chosen.recompute_seconds) {
      chosen = std::move(*candidate);
      chosen_bytes = bytes;
    }
  }
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

// full / selective with regions.output_recompute and a peak oracle: the plan
// with it is measured against the same mode without it (the regions' outputs
// saved); unless it measures strictly lower, output_recompute is refused for
// this graph with a warning naming both figures (stats.output_recompute_refused),
// and the plan without it goes on. Output recompute exists to lower the peak;
// a replay chain the compiler fuses or holds alive can raise it instead.
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

// No plan measured above stock: with a peak oracle, a plan that rewrites is
// measured against the stock partition; above it, nothing is rewritten (the
// stock route) and a warning names both figures. A graph the model tagged
// itself keeps its tags (stock's partition carries them out alike). Not under
// unit_graph: a block's own peak is a transient that occurs once, while what
// stacks up over the model's blocks is the bytes each saves, which fusion
// does not change and the simulation scores exactly (ScopeRule::UnitGraph).
void guard_with_measured(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                         MeasuredPeaks& measured, PlanResult& result, Evaluation& evaluation) {
  if (evaluation.remat.duplicates.empty() || result.tags.stats.user_tagged > 0 || result.scope.unit_graph) return;
  const std::int64_t own = measured.of(evaluation);
  result.stats.measured_peak_after = own;
  if (own < 0) return;
  const std::int64_t stock = measured.of_stock();
  result.stats.measured_stock_peak = stock;
  if (stock < 0 || own <= stock) return;
  std::vector<Policy> kept = result.tags.policies;
  for (Policy& policy : kept)
    if (policy == Policy::PreferRecompute || policy == Policy::MustRecompute) policy = Policy::PreferSave;
  const double lambda = evaluation.lambda;
  evaluation = evaluate_indexed(graph, index, kept, stages.cost, unit_schedule(result.scope), &result.timings);
  evaluation.lambda = lambda;
  result.stats.measured_fallback = true;
  result.stats.measured_peak_after = stock;
  result.diagnostics.push_back(
      {Severity::Warning, -1,
       std::string("mode ") + to_string(result.mode) + ": the plan's measured peak (" + format_bytes(own) +
           ") is above the stock partition's (" + format_bytes(stock) +
           "), measured by the compiler's dry run: the graph is left to the stock partition"});
}

}  // namespace

const char* to_string(Route route) { return route == Route::Rewrite ? "rewrite" : "stock"; }

ScopeCheck check_scope(const Graph& graph, const PlanOptions& options) {
  ScopeCheck check;
  if (options.config.mode == Mode::Off) return check;
  const StageOptions stages = stage_options(options.config, options.op_policy);  // the adapter checks
  if (!discover_units(graph).from_model) return check;  // units from module stacks: known after tracing
  const Scope scope = resolve_scope(graph, stages.scope);  // unit selection, region / exclude patterns
  check.checked = true;
  for (const auto& unit : scope.units) check.units.push_back(unit.fqn);
  check.regions = scope.regions;
  return check;
}

PlanOptions parse_plan_options(const std::string& config_json, const std::string& op_policy_json) {
  PlanOptions options;
  options.config = parse_config(config_json);
  if (!op_policy_json.empty()) options.op_policy = parse_op_policy(op_policy_json);
  return options;
}

StageOptions stage_options(const Config& config, const OpPolicyTable& op_policy) {
  StageOptions stages;
  stages.scope = scope_options(config);
  stages.tag.mode = config.mode;
  stages.tag.op_policy = effective_op_policy(config, op_policy);
  stages.tag.save_forward_all_gather = config.save_forward_all_gather;
  stages.tag.rng = config.rng;
  stages.cost.hardware = config.mincut.hardware;
  stages.cost.compiler = config.mincut.compiler;
  stages.mincut.lambda = effective_lambda(config.mincut);
  stages.mincut.cost = stages.cost;
  return stages;
}

Evaluation evaluate(const Graph& graph, const std::vector<Policy>& policies, const CostOptions& cost,
                    const RematOptions& remat) {
  return evaluate_indexed(graph, detail::NodeIndex(graph), policies, cost, remat, nullptr);
}

namespace {

// plan()'s stages, in order, into `result` (plan() times the whole).
// A plan that changes nothing, routed to stock: mode off, or a graph without
// units under PlanOptions::unitless_to_stock.
void leave_unchanged(const Graph& graph, const PlanOptions& options, Diagnostic why, PlanResult& result) {
  result.policies.assign(graph.nodes.size(), Policy::None);
  result.tags = {};
  result.tags.policies = result.policies;
  result.tags.graph_id.assign(graph.nodes.size(), -1);
  result.tags.reasons.assign(graph.nodes.size(), "");
  result.remat = plan_remat(graph, result.policies);
  result.diagnostics.push_back(std::move(why));
  result.route = decide_route(result);
  if (options.record_timeline) record_timeline(graph, result);
}

void run_plan(const Graph& graph, const PlanOptions& options, PlanResult& result) {
  const Config& config = options.config;
  result.mode = config.mode;
  result.policies.assign(graph.nodes.size(), Policy::None);
  if (config.mode == Mode::Off) {
    leave_unchanged(graph, options, {Severity::Info, -1, "ac_mode is off: graph left unchanged"}, result);
    return;
  }
  StageOptions stages = stage_options(config, options.op_policy);

  std::optional<detail::NodeIndex> built;
  try {
    ScopedTimer timer(result.timings.scope_seconds);
    // Compact node facts, built once (counted in the scope stage): scope, tags,
    // the memory estimates and every evaluation read them instead of the nodes.
    built.emplace(graph);
    result.scope = detail::resolve_scope(graph, *built, stages.scope);
  } catch (const NoUnitsError& error) {
    if (!options.unitless_to_stock) throw;
    result.stats.scope = "no_units";
    leave_unchanged(graph, options,
                    {Severity::Warning, -1,
                     std::string("this graph is left without activation checkpointing: ") + error.what() +
                         " (it is partitioned as stock torch.compile does it)"},
                    result);
    return;
  }
  const detail::NodeIndex& index = *built;
  stages.mincut.charge_inputs = result.scope.whole_graph;
  for (const auto& note : result.scope.diagnostics) result.diagnostics.push_back(note);
  result.stats.units = result.scope.units.size();
  result.stats.selected_units = result.scope.selected_units.size();
  result.stats.scope = result.scope.unit_graph ? "unit_graph" : result.scope.whole_graph ? "whole_graph" : "units";
  result.stats.regions = result.scope.regions.size();

  {
    ScopedTimer timer(result.timings.tag_seconds);
    result.tags = detail::tag_policies(graph, index, result.scope, stages.tag);
  }
  result.stats.user_tagged = result.tags.stats.user_tagged;

  SimulateResult before;
  {
    ScopedTimer timer(result.timings.simulate_seconds);
    before = detail::simulate_memory(graph, index, nullptr, {});
  }
  result.stats.simulated_peak_before = before.peak_bytes_with_resident;
  result.stats.simulated_activation_peak_before = before.peak_bytes;

  Evaluation evaluation;
  if (config.mode == Mode::Auto && stages.cost.hardware.measured) {
    evaluation = choose_knee(graph, index, stages, result);
    if (options.stock_recomputed)
      compare_with_stock(graph, index, *options.stock_recomputed, stages.cost, unit_schedule(result.scope), result,
                         evaluation);
  } else if (config.mode == Mode::Auto) {
    MinCutResult cut;
    {
      ScopedTimer timer(result.timings.mincut_seconds);
      cut = detail::solve_min_cut(graph, index, result.tags.policies, stages.mincut);
    }
    for (const auto& note : cut.diagnostics) result.diagnostics.push_back(note);
    evaluation = evaluate_indexed(graph, index, cut.policies, stages.cost, unit_schedule(result.scope), &result.timings);
    evaluation.lambda = cut.lambda;
    if (options.stock_recomputed)
      compare_with_stock(graph, index, *options.stock_recomputed, stages.cost, unit_schedule(result.scope), result,
                         evaluation);
  }
  MeasuredPeaks measured(graph, options, result);
  if (config.mode == Mode::Budget) {
    BudgetSearch search;
    evaluation = choose_within_budget(graph, index, config, stages, before, result, search);
    if (measured.available()) continue_budget_on_measured(graph, index, stages, search, measured, result, evaluation);
  } else if (config.mode != Mode::Auto) {
    evaluation = evaluate_indexed(graph, index, result.tags.policies, stages.cost, unit_schedule(result.scope),
                                  &result.timings);
    if (measured.available()) weigh_output_recompute(graph, index, stages, measured, result, evaluation);
  }
  if (measured.available()) guard_with_measured(graph, index, stages, measured, result, evaluation);
  result.stats.lambda = evaluation.lambda;
  result.stats.simulated_peak_after = evaluation.simulated_peak_bytes;
  result.stats.simulated_activation_peak_after = evaluation.simulated_activation_peak_bytes;
  result.stats.recompute_seconds = evaluation.recompute_seconds;
  result.remat = std::move(evaluation.remat);
  result.policies = result.remat.policies;
  if (config.mode == Mode::Auto || config.mode == Mode::Budget)
    note_compute_unknown(graph, result.tags.policies, result.remat, result.diagnostics);

  std::vector<char> duplicated(graph.nodes.size(), 0);
  for (const auto& dup : result.remat.duplicates) duplicated[static_cast<std::size_t>(dup.of)] = 1;
  std::vector<char> rebuilt(graph.nodes.size(), 0);
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!result.scope.node_excluded[i] || !graph.nodes[i].is_forward()) continue;
    for (auto input : graph.nodes[i].inputs)
      if (duplicated[static_cast<std::size_t>(input)] && !rebuilt[static_cast<std::size_t>(input)]) {
        rebuilt[static_cast<std::size_t>(input)] = 1;
        ++result.stats.rebuilt_for_exclude;
      }
  }

  bool already_rematted = false;
  for (std::size_t i = 0; i < index.size() && !already_rematted; ++i)
    already_rematted = index.has(i, detail::NodeIndex::kRecomputedFrom);
  if (result.remat.duplicates.empty() && !result.scope.regions.empty() && !already_rematted &&
      !result.stats.stock_fallback)
    result.diagnostics.push_back(
        {Severity::Warning, -1,
         "activation checkpointing matched scope [" + joined(result.scope.regions) +
             "] but recomputed no node; the model may already be wrapped by eager checkpointing, or "
             "every candidate was pinned to save"});
  // full and selective replay what the mode says even where that buys no memory
  // (the step's peak is set elsewhere, say by the gradients): say so, since the
  // recompute is then pure cost. auto compares with stock; budget reports its target.
  const bool fixed_mode = config.mode == Mode::Full || config.mode == Mode::Selective;
  if (fixed_mode && !result.remat.duplicates.empty() && result.scope.unit_graph &&
      result.remat.stats.saved_bytes_after >= result.remat.stats.saved_bytes_before)
    result.diagnostics.push_back(
        {Severity::Warning, -1,
         std::string("mode ") + to_string(config.mode) + " replays " + std::to_string(result.remat.duplicates.size()) +
             " nodes but does not lower the bytes the block saves for the backward (" +
             format_bytes(result.remat.stats.saved_bytes_before) + " before, " +
             format_bytes(result.remat.stats.saved_bytes_after) + " after): the recompute is pure cost here"});
  if (fixed_mode && !result.remat.duplicates.empty() && !result.scope.unit_graph &&
      result.stats.simulated_peak_after >= result.stats.simulated_peak_before)
    result.diagnostics.push_back(
        {Severity::Warning, -1,
         std::string("mode ") + to_string(config.mode) + " replays " + std::to_string(result.remat.duplicates.size()) +
             " nodes but does not lower the simulated peak (" + format_bytes(result.stats.simulated_peak_before) +
             " before, " + format_bytes(result.stats.simulated_peak_after) +
             " after): the step's peak is not set by the activations it recomputes, so the recompute is pure "
             "cost here; mode auto keeps the lower of its plan and the stock partition"});
  result.route = decide_route(result);
  if (options.record_timeline) record_timeline(graph, result);
}

}  // namespace

PlanResult plan(const Graph& graph, const PlanOptions& options) {
  PlanResult result;
  {
    ScopedTimer timer(result.timings.total_seconds);
    run_plan(graph, options, result);
  }
  return result;
}

std::vector<Evaluation> pareto(const Graph& graph, const PlanOptions& options) {
  StageOptions stages;
  Scope scope;
  const detail::NodeIndex index(graph);
  const TagResult tags = auto_tags(graph, index, options, stages, &scope);
  ParetoResult frontier = detail::pareto(graph, index, tags.policies, stages.mincut);
  std::vector<Evaluation> points;
  const RematOptions schedule = unit_schedule(scope);
  SecondsCache seconds;
  for (const auto& point : frontier.points) {
    points.push_back(evaluate_indexed(graph, index, point.policies, stages.cost, schedule, nullptr, &seconds));
    points.back().lambda = point.lambda;
  }
  return points;
}

FlowNetwork flow_network(const Graph& graph, const PlanOptions& options) {
  StageOptions stages;
  const detail::NodeIndex index(graph);
  const TagResult tags = auto_tags(graph, index, options, stages);
  return flow_network(graph, tags.policies, stages.mincut);
}

Evaluation score_recompute_set(const Graph& graph, const std::vector<std::int32_t>& recomputed, const CostOptions& cost) {
  std::vector<Policy> policies(graph.nodes.size(), Policy::None);
  for (auto i : recomputed) {
    if (i < 0 || static_cast<std::size_t>(i) >= graph.nodes.size())
      throw std::invalid_argument("score_recompute_set: node index " + std::to_string(i) + " is outside the graph");
    const Node& node = graph.nodes[static_cast<std::size_t>(i)];
    if (!node.is_forward() || node.kind != NodeKind::CallFunction)
      throw std::invalid_argument("score_recompute_set: '" + node.name + "' is not a forward call_function node");
    policies[static_cast<std::size_t>(i)] = Policy::MustRecompute;
  }
  return evaluate(graph, policies, cost);
}

std::string pareto_to_json(const std::vector<Evaluation>& points) {
  json out = json::array();
  for (const auto& p : points)
    out.push_back({{"lambda", p.lambda},
                   {"saved_bytes", p.saved_bytes},
                   {"recompute_seconds", p.recompute_seconds},
                   {"recompute_flops", p.recompute_flops},
                   {"nodes_duplicated", p.nodes_duplicated},
                   {"simulated_peak_bytes", p.simulated_peak_bytes},
                   {"simulated_activation_peak_bytes", p.simulated_activation_peak_bytes}});
  return out.dump();
}

std::vector<std::string> policy_annotations(const Graph& graph, const PlanResult& result) {
  std::vector<std::string> notes(graph.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    Policy policy = result.policies[i];
    if (policy == Policy::None) continue;
    notes[i] = to_string(policy);
    if (i < result.tags.reasons.size() && !result.tags.reasons[i].empty()) notes[i] += " (" + result.tags.reasons[i] + ")";
  }
  for (const auto& dup : result.remat.duplicates) {
    auto& note = notes[static_cast<std::size_t>(dup.of)];
    note += " -> dup before " + graph.nodes[static_cast<std::size_t>(dup.before)].name;
  }
  return notes;
}

}  // namespace hyper_ac
