// Internal to the core: what plan() (plan.cc) shares with its searches, each
// in a file of its own: plan_budget.cc (budget mode: the frontier walk, the
// descent, the measured continuation), plan_knee.cc (auto's knee under
// hardware: measured or a peak oracle) and plan_stock.cc (never worse than
// stock: the simulated comparison, the peak oracle's guard and
// output_recompute's check).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hyper_ac/cost.h"
#include "hyper_ac/plan.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/simulate.h"
#include "node_index.h"

namespace hyper_ac {
namespace planning {

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

// The replay schedule follows the units (remat.h).
inline RematOptions unit_schedule(const Scope& scope) {
  RematOptions options;
  options.node_unit = scope.node_unit;
  return options;
}

// The simulation under `compiler`: under Inductor, ops it inlines into their
// readers' kernels hold no buffer (SimulateOptions::fuse_pointwise), so a
// plan's simulated peak counts what the compiler will allocate.
SimulateOptions simulate_options(Compiler compiler);

// evaluate() over a prebuilt node index: plan() builds it once for every
// evaluation (each frontier point) and the memory estimate before them.
// Per node, recompute_seconds (cost.h) once computed; NaN = not yet. Shared by
// the evaluations of one plan (the frontier points replay mostly the same nodes).
using SecondsCache = std::vector<double>;

// `timings`: plan()'s figures, which every evaluation it runs adds its own
// remat and simulate time to (null: a lone evaluate()).
Evaluation evaluate_indexed(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& policies,
                            const CostOptions& cost, const RematOptions& remat, PlanTimings* timings,
                            SecondsCache* seconds = nullptr);

// The memory figure a plan is scored by: the simulated peak (everything
// resident included), or, for a graph that is one unit of a model compiled
// unit by unit (scope unit_graph), the bytes its forward saves for the
// backward: those stack up over the model's units, while the graph's own
// transient peak occurs once.
inline std::int64_t scored_bytes(const Evaluation& evaluation, const Scope& scope) {
  return scope.unit_graph ? evaluation.saved_bytes : evaluation.simulated_peak_bytes;
}

inline const char* scored_figure(const Scope& scope) { return scope.unit_graph ? "saved bytes" : "simulated peak"; }

// Plan `a` scores strictly below plan `b`: a lower scored figure, and under
// unit_graph a simulated peak no higher as well (fewer saved bytes bought
// with a higher transient is no gain for the block's own compile).
inline bool scores_below(const Evaluation& a, const Evaluation& b, const Scope& scope) {
  return scored_bytes(a, scope) < scored_bytes(b, scope) &&
         (!scope.unit_graph || a.simulated_peak_bytes <= b.simulated_peak_bytes);
}

inline std::string format_seconds(double seconds) {
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
inline constexpr std::size_t kBudgetDescentEvaluations = 256;
inline constexpr std::size_t kBudgetDescentWork = std::size_t{1} << 23;

// The evaluations one plan may spend descending: at most kBudgetDescentEvaluations
// and kBudgetDescentWork node-evaluations (evaluations x graph nodes), so a
// 1M-node graph gets 8, a graph up to 32k nodes the full 256.
inline std::size_t descent_cap(const Graph& graph) {
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
                              Evaluation& chosen, PlanTimings& timings, std::size_t cap);

// What the budget's search leaves for a measured check (continue_budget_on_measured):
// the frontier, the target, and which point the simulated choice came from.
struct BudgetSearch {
  FrontierResult frontier;
  std::int64_t target = 0;
  std::int64_t resident_bytes = 0;  // what exists before the step: parameters, buffers, inputs (not tangents)
  std::optional<std::size_t> chosen_point;  // frontier index of the chosen plan's point (before its descent)
};

// Budget mode: the least-recompute point of the frontier whose scored
// figure (scored_bytes: the simulated peak, or a unit graph's saved bytes)
// fits, then the descent above; none fits -> the smallest figure (ties: the
// lower peak), with a warning.
Evaluation choose_within_budget(const Graph& graph, const detail::NodeIndex& index, const Config& config,
                                const StageOptions& stages, const SimulateResult& all_saved, PlanResult& result,
                                BudgetSearch& search);

// auto under hardware: measured or a peak oracle: the knee of the frontier
// (kKneeSlowdown, plan.h), then descend_past_allowance.
Evaluation choose_knee(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                       PlanResult& result);

// Never worse than stock (docs/mincut.md): the stock partition's recompute set
// (PlanOptions::stock_recomputed) scored on the same simulator as the plan.
// auto keeps its own plan only when its simulated peak is strictly lower;
// otherwise every candidate is saved (no rewrite), and the caller partitions
// the graph as stock does it. Hard recompute constraints (the model's own
// tags, a table MUST_RECOMPUTE) are not stock's to drop: no comparison then.
void compare_with_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                        const CostOptions& cost, const RematOptions& schedule, PlanResult& result,
                        Evaluation& evaluation);

// Never above stock under unit_graph, for the modes that do not compare with
// stock by their own rule (auto does, compare_with_stock): a block's plan that
// saves more bytes for the backward than the stock partition's recompute set
// (PlanOptions::stock_recomputed) on the same simulator, or as many at a higher
// simulated peak, is not kept; nothing is rewritten (route stock_not_worse,
// stats.stock_fallback) and a warning names both figures. The saved bytes are
// what stacks up over a model compiled block by block; a budget whose fraction
// of the all-saved block is above what stock saves is met by stock's partition
// too, at less memory. A graph the model tagged itself keeps its tags.
void keep_unit_under_stock(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& names,
                           const CostOptions& cost, const RematOptions& schedule, PlanResult& result,
                           Evaluation& evaluation);

// The route rule, in one place: a plan that duplicates nothing on a graph the
// model did not tag itself changes nothing, so the graph goes to the stock
// partition (which may recompute what it fuses); so does mode off, and auto's
// fallback when its plan is not below stock's.
inline RouteDecision decide_route(const PlanResult& result) {
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
      : graph_(graph), oracle_(options.peak_oracle), lower_bound_(options.peak_lower_bound), result_(result) {}

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

  std::int64_t of_stock() { return ask(stock_plan()); }

  // PlanOptions::peak_lower_bound of the stock partition (-1: none), asked once.
  std::int64_t lower_bound_of_stock() {
    if (!lower_bound_) return -1;
    if (!stock_lower_bound_) {
      PlanJsonOptions compact;
      compact.detail = false;
      stock_lower_bound_ = lower_bound_(plan_to_json(graph_, stock_plan(), compact));
    }
    return *stock_lower_bound_;
  }

 private:
  PlanResult stock_plan() const {
    PlanResult as_plan = result_;
    as_plan.policies.assign(graph_.nodes.size(), Policy::None);
    as_plan.remat = plan_remat(graph_, as_plan.policies);
    as_plan.route = {Route::Stock, "off"};
    return as_plan;
  }

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
  const std::function<std::int64_t(const std::string&)>& lower_bound_;
  PlanResult& result_;
  std::map<std::string, std::int64_t> cache_;
  std::optional<std::int64_t> stock_lower_bound_;
};

// Budget mode with a peak oracle: the simulated choice measured; above the
// target (less the resident bytes, which the measured figure leaves out), the
// frontier from its point on is bisected on the measured peak (least recompute
// first, kOracleBudgetProbes measurements) for the least-recompute point
// that fits. None fits: the least measured of those tried, with a warning.
// A simulated miss that measures within the target is met.
void continue_budget_on_measured(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                                 const BudgetSearch& search, MeasuredPeaks& measured, PlanResult& result,
                                 Evaluation& chosen);

// full / selective with regions.output_recompute and a peak oracle: the plan
// with it is measured against the same mode without it (the regions' outputs
// saved); unless it measures strictly lower, output_recompute is refused for
// this graph with a warning naming both figures (stats.output_recompute_refused),
// and the plan without it goes on. Output recompute exists to lower the peak;
// a replay chain the compiler fuses or holds alive can raise it instead.
void weigh_output_recompute(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                            MeasuredPeaks& measured, PlanResult& result, Evaluation& evaluation);

// No plan measured above stock: with a peak oracle, a plan that rewrites is
// measured against the stock partition; above it, nothing is rewritten (the
// stock route) and a warning names both figures. Stock is not measured when
// the plan measures at or under stock's lower bound
// (PlanOptions::peak_lower_bound). A graph the model tagged itself keeps its
// tags (stock's partition carries them out alike). Not under unit_graph: a
// block's own peak is a transient that occurs once, while what stacks up over
// the model's blocks is the bytes each saves, which fusion does not change
// and the simulation scores exactly (ScopeRule::UnitGraph).
void guard_with_measured(const Graph& graph, const detail::NodeIndex& index, const StageOptions& stages,
                         MeasuredPeaks& measured, PlanResult& result, Evaluation& evaluation);

}  // namespace planning
}  // namespace hyper_ac
