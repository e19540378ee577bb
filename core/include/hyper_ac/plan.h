// The whole core pipeline for one graph: scope → tags → (min-cut) → remat
// plan → memory estimate, and the plan's JSON form (docs/graph-format.md).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "hyper_ac/config.h"
#include "hyper_ac/cost.h"
#include "hyper_ac/diagnostic.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/tagging.h"

namespace hyper_ac {

// `auto` aims at the knee "least peak at <= 1.05x step time" under
// `hardware: measured` and wherever the caller measures peaks
// (PlanOptions::peak_oracle: the plan is judged by what the compiler runs, so
// auto is the knee of that frontier, not one cut at a fixed exchange rate): of
// the frontier's cuts (frontier_cuts over lambda), the one with the least
// simulated peak whose recompute seconds are at most kKneeSlowdown x the
// step's base seconds (cost.h step_seconds, on the configured profile); ties:
// less recompute. Then the gap to the next cut (past the allowance) is
// searched: that cut saved again within a peak target as the budget mode
// does, the target bisected down to the least that comes within the
// allowance. No cut within it: the least-recompute cut. Otherwise (a roofline
// profile, no oracle) auto keeps its one cut at the effective lambda.
inline constexpr double kKneeSlowdown = 0.05;

struct PlanOptions {
  // The validated pass config (mode, scope, min-cut settings).
  Config config;
  // The operator table (configs/op_policy.yaml); config.op_policy, when given,
  // replaces the categories it names.
  OpPolicyTable op_policy;
  // Also record the live activation bytes per schedule step of the original
  // and the rewritten step (SimulateOptions::record_timeline) in
  // PlanResult::timeline and the plan JSON's "timeline". Off by default: the
  // default plan JSON does not change.
  bool record_timeline = false;
  // The forward values the stock partition (PyTorch's
  // min_cut_rematerialization_partition, called as stock torch.compile calls
  // it) recomputes on this graph, by node name: a fact the caller measures
  // with torch. When set, `auto` compares its plan with that one on the
  // simulator (docs/mincut.md, "Never worse than stock") and returns no
  // rewrite unless its simulated peak is strictly lower; the graph is then
  // partitioned as stock does it. Under scope unit_graph every other mode
  // keeps a block's plan only if it saves no more than that one
  // (keep_unit_under_stock). Names the graph lacks (exact copies the
  // loader elided) are skipped. Unset (the default): no comparison, and the
  // plan JSON does not change.
  std::optional<std::vector<std::string>> stock_recomputed;
  // A graph in which no unit can be found (NoUnitsError) gets a plan that
  // changes nothing, routed to stock (route_reason `no_units`) with a warning
  // naming why, instead of the error. For a compiler backend: a piece of a
  // step that graph breaks cut off (say, only the loss) may hold no block.
  bool unitless_to_stock = false;
  // The compiler's own account of a candidate plan's step peak, where the
  // caller has one (ConfigFacts::peak_oracle; hyper_ac.backend(compiler=
  // "inductor"): Inductor's dry run, docs/mincut.md "Measured peaks"). Called
  // with the candidate's plan document (compact form; route "stock": the stock
  // partition), it returns the bytes the step holds at its peak beyond what
  // exists before it (parameters, inputs), or -1 when it cannot tell (the
  // simulation then stands). The budget's search is checked and continued on
  // it, and no plan measured above stock's is kept. Each distinct candidate is
  // measured once. Empty (the default): the simulation alone.
  std::function<std::int64_t(const std::string& plan_json)> peak_oracle;
  // With peak_oracle: bytes a candidate's measured peak cannot be below,
  // found without compiling (hyper_ac.backend: every value its forward
  // returns, saved for the backward or the user's, all alive when the forward
  // ends), or -1. Asked for the stock partition only: a plan measured at or
  // under stock's bound is under stock's measured
  // peak, so the never-above-stock guard passes without measuring stock (a
  // compile saved). Empty (the default): stock is measured.
  std::function<std::int64_t(const std::string& plan_json)> peak_lower_bound;
};

// Budget mode with a peak oracle: the budget is met on the measured peak when
// a plan measures within [1 - kBudgetMeasuredSlack, 1] x its target; further
// under, memory is left unused and the search moves the simulated target
// towards the measured one (aiming at the middle of that band).
inline constexpr double kBudgetMeasuredSlack = 0.01;
// ... measuring at most this many plans past the simulated choice: the first
// moves the simulated target by the measured gap (one for one), the next by
// the slope the two measured, or by the secant between a plan that fits and
// one over. Each measurement is a compile; on the realistic tier two moves
// land within the slack where one for one did not (Inductor fuses away part
// of each simulated byte); the fourth closes brackets the third left open
// (bench GPT-2 at 0.5 x stock's peak: from the floor, 0.41x, to 0.497x).
inline constexpr std::size_t kOracleSearchProbes = 4;
// Measured bytes per simulated byte the search assumes at most and at least
// when it moves past the plans it measured, whatever two of them measured (a
// plan changes in steps). Between a plan that fits and one over, the secant
// takes their own slope.
inline constexpr double kMeasuredSlopeBounds[2] = {0.25, 1.5};
// When no plan the search tried fits: the most frontier points measured past
// the simulated choice (a bisection over the frontier, least recompute first),
// then the search again between the point that fits and the least plan over.
inline constexpr std::size_t kOracleBudgetProbes = 5;
// Kept further under the target than the slack, with a plan measured over it:
// at most this many plans measured that recompute one more saved value of the
// plan over (the trim, plan_budget.cc). Plans change in steps, and the nearest
// plan over is often a hair over (bench GPT-2 at 0.6 x stock's peak: 2 KiB over
// a 13.8 MB target) while the plan kept is one whole tensor under.
inline constexpr std::size_t kOracleTrimProbes = 2;
// Still further under than the slack after the trim: at most this many plans
// measured that save again one value the kept plan recomputes (the fill,
// plan_budget.cc), the one whose simulated peak rises most within the measured
// gap to the target.
inline constexpr std::size_t kOracleFillProbes = 1;
// Of the plans measured within the target, the kept one is the nearest the
// target among those whose recompute estimate is within this fraction of the
// least: the roofline estimate resolves no finer, and the nearer plan spends
// the memory the user gave (bench TinyTransformer at 0.5 x stock's peak: a plan
// 0.3% under the target recomputes 0.03% more than one 1.8% under).
inline constexpr double kRecomputeTieFraction = 0.01;

struct PlanStats {
  std::size_t regions = 0;
  std::size_t units = 0;
  std::size_t selected_units = 0;
  std::string scope = "units";               // "units", "whole_graph" (one region over the whole forward),
                                             // "unit_graph" (the same, scored by saved bytes: ScopeRule) or
                                             // "no_units" (none found, routed to stock: unitless_to_stock)
  std::size_t user_tagged = 0;               // nodes whose policy the model's own checkpointing set
  double lambda = 0.0;                       // min-cut modes: the λ of the chosen cut
  // Bytes, original / rewritten graph, as the configured compiler allocates
  // them (under inductor: SimulateOptions::fuse_pointwise).
  std::int64_t simulated_peak_before = 0;
  std::int64_t simulated_peak_after = 0;
  // The same peaks without resident values (parameters, buffers, inputs,
  // tangents): what a measurement that starts after they exist sees.
  std::int64_t simulated_activation_peak_before = 0;
  std::int64_t simulated_activation_peak_after = 0;
  // The original graph's activation peak as uncompiled eager autograd runs
  // it (SimulateOptions::autograd_lifetimes): what the uncheckpointed eager
  // step measures. Equals simulated_activation_peak_before on a graph
  // without Node::autograd_node under compiler eager.
  std::int64_t simulated_activation_peak_autograd = 0;
  std::int64_t budget_bytes = 0;             // budget mode: the target
  bool budget_met = true;
  double recompute_seconds = 0.0;            // roofline estimate of the duplicates
  // Inputs of excluded nodes that the backward rebuilds (duplicated) instead
  // of keeping them from the forward.
  std::size_t rebuilt_for_exclude = 0;
  // With PlanOptions::stock_recomputed: the simulated peak (resident values
  // included) of the stock partition's recompute set, and whether the plan
  // fell back to it (no rewrite): auto's own figure was not lower, or under
  // unit_graph another mode's plan saved more than stock's.
  // -1 when no comparison was made (not written to the plan JSON then).
  std::int64_t stock_simulated_peak = -1;
  bool stock_fallback = false;
  // auto under the knee rule (kKneeSlowdown: hardware measured, or a peak oracle): the step's
  // base seconds (cost.h step_seconds), the recompute seconds allowed
  // (kKneeSlowdown of it) and the frontier points weighed; the chosen point is
  // lambda / simulated_peak_after / recompute_seconds above. step_seconds -1:
  // the rule did not run (not written to the plan JSON then).
  double step_seconds = -1.0;
  double knee_allowance_seconds = 0.0;
  std::size_t knee_points = 0;
  // With PlanOptions::peak_oracle: the measured peaks (bytes beyond the
  // resident values) of the chosen plan and of the stock partition, the
  // distinct candidates measured, and whether the plan fell back to stock
  // because its measured peak was above stock's (route_reason
  // measured_above_stock). -1: not measured; oracle_calls 0: none of these is
  // written to the plan JSON.
  std::int64_t measured_peak_after = -1;
  std::int64_t measured_stock_peak = -1;
  // The stock partition's lower bound (PlanOptions::peak_lower_bound; -1: none
  // asked or known). The plan measured at or under it: stock was not measured
  // (measured_stock_peak -1).
  std::int64_t measured_stock_lower_bound = -1;
  // budget: the least measured peak of the plans measured over the target
  // (beyond the resident values, as measured_peak_after); -1: none was. A plan
  // kept more than kBudgetMeasuredSlack under with this a hair over its target
  // is a step of the plans, not a search that stopped short.
  std::int64_t measured_nearest_over = -1;
  std::size_t oracle_calls = 0;
  bool measured_fallback = false;
  // full / selective with regions.output_recompute: the plan with it measured
  // no lower than without it, so it was planned without (a warning says so).
  bool output_recompute_refused = false;
};

// Wall time per stage. Not part of the plan JSON unless asked for: plans are
// byte-identical for the same input, timings are not.
struct PlanTimings {
  double scope_seconds = 0.0;
  double tag_seconds = 0.0;
  double mincut_seconds = 0.0;    // max-flow solves (auto: one; budget: the frontier)
  // Every evaluation plan() runs, each once (budget: each frontier point
  // tried and the descent's trials; the chosen one is among them; auto with
  // stock_recomputed: the stock set's score and, on a fallback, the cut's plan too).
  double remat_seconds = 0.0;
  double simulate_seconds = 0.0;   // the estimate before, then each evaluation's
  double total_seconds = 0.0;      // plan(), end to end; the stages above are disjoint parts of it
  double load_seconds = 0.0;       // JSON parse + validation, filled by the caller that loaded the graph
};

// Live activation bytes per schedule step (simulate.h), before and after the
// rewrite, and the step of the last forward node in each (-1: none). Filled
// only with PlanOptions::record_timeline.
struct PlanTimeline {
  bool recorded = false;
  std::vector<std::int64_t> before;
  std::vector<std::int64_t> after;
  std::int32_t boundary_before = -1;
  std::int32_t boundary_after = -1;
  // Per unit (Scope::units order): the most live bytes while the backward runs
  // that unit's nodes (its replayed copies included), before and after; -1 =
  // the unit has no backward step.
  std::vector<std::int64_t> unit_backward_peak_before;
  std::vector<std::int64_t> unit_backward_peak_after;
};

// Where the planned graph goes: rewritten by the plan, or handed unchanged to
// the stock partition (which a caller runs exactly as stock torch.compile
// does). Decided by plan() alone; a backend reads it (PlanResult::route).
enum class Route { Rewrite, Stock };
const char* to_string(Route route);  // "rewrite", "stock"

struct RouteDecision {
  Route route = Route::Stock;
  // Why, as a stable word (plan JSON "route_reason"):
  //   stock:   "off" (mode off), "no_units" (no unit in the graph, under
  //            PlanOptions::unitless_to_stock), "stock_not_worse" (auto's plan is not below
  //            the stock partition's simulated peak, or under unit_graph a
  //            plan saves more than the stock partition), "nothing_recomputed"
  //            (no duplicate, and the model tagged no node itself),
  //            "measured_above_stock" (PlanOptions::peak_oracle measured the
  //            plan above the stock partition);
  //   rewrite: "recomputes" (the plan duplicates nodes), "user_tagged" (none,
  //            but the model's own tags must be carried out: PlanStats::user_tagged).
  std::string reason = "off";
};

struct PlanResult {
  Mode mode = Mode::Off;
  RouteDecision route;            // rewrite or stock, and why
  Scope scope;
  TagResult tags;                 // tags after the structural rules
  std::vector<Policy> policies;   // final per-node policies (after the cut, if any)
  RematPlan remat;
  PlanStats stats;
  std::vector<Diagnostic> diagnostics;
  PlanTimings timings;
  PlanTimeline timeline;           // empty unless PlanOptions::record_timeline
};

// Options from a config JSON and an operator-table JSON ("" = empty table).
// Throws ConfigError.
PlanOptions parse_plan_options(const std::string& config_json, const std::string& op_policy_json);

// Every stage's options, built from a Config in one place.
struct StageOptions {
  ScopeOptions scope;    // the config's scope with the model adapter's regions applied
  TagOptions tag;        // mode, effective operator table, save_forward_all_gather
  MinCutOptions mincut;  // effective lambda, cost model
  CostOptions cost;      // recompute cost of evaluations (same hardware as the min-cut)
};

// Throws ConfigError when the config asks for adapter regions no adapter provides.
StageOptions stage_options(const Config& config, const OpPolicyTable& op_policy);

// Throws GraphError / ConfigError / ScopeError / PlanError.
PlanResult plan(const Graph& graph, const PlanOptions& options);

// The scope checks plan() runs, on a graph document that may hold only the
// live model's facts (no nodes), so a config that cannot fit the model fails
// before anything traces it (hyper_ac.prepare_activation_checkpoint).
struct ScopeCheck {
  // Whether the unit selection (selection.layer_*) and the region / exclude patterns were
  // checked: only when the units come from the model (the
  // gradient_checkpointing marker); from module stacks they are known only
  // once a graph exists. Mode off checks nothing.
  bool checked = false;
  std::vector<std::string> units;    // unit FQNs (checked only)
  std::vector<std::string> regions;  // region FQNs (checked only)
};

// The adapter checks of stage_options always (mode off aside), then
// resolve_scope when the units come from the model. Throws what plan() would
// (ConfigError, ScopeError, NoUnitsError).
ScopeCheck check_scope(const Graph& graph, const PlanOptions& options);

// What a set of per-node policies costs once applied: the one yardstick of a
// plan, of each frontier point and of a recompute set chosen elsewhere.
struct Evaluation {
  double lambda = 0.0;               // the min-cut lambda the policies came from; 0 otherwise
  RematPlan remat;                   // plan_remat of the policies (remat.policies: with projections pinned)
  std::int64_t saved_bytes = 0;      // activation storage the rewritten backward reads (remat.stats.saved_bytes_after)
  double recompute_seconds = 0.0;    // roofline time of remat.duplicates (cost.h)
  double recompute_flops = 0.0;      // FLOPs of remat.duplicates
  std::size_t nodes_duplicated = 0;
  std::int64_t simulated_peak_bytes = 0;             // rewritten step, everything resident included
  std::int64_t simulated_activation_peak_bytes = 0;  // activations only
  // Wall times (not deterministic).
  double remat_seconds = 0.0;
  double simulate_seconds = 0.0;
};

// plan_remat + simulate_memory + recompute cost for `policies` (sized like
// graph.nodes). `remat` carries the unit of every node (Scope::node_unit) for
// the replay schedule; default: one replay segment. Throws as plan_remat.
Evaluation evaluate(const Graph& graph, const std::vector<Policy>& policies, const CostOptions& cost,
                    const RematOptions& remat = {});

// The memory / recompute frontier under the config's scope and rules (any
// mode: tags are taken as in `auto`): one evaluation per distinct min-cut over
// lambda, least recompute first.
std::vector<Evaluation> frontier(const Graph& graph, const PlanOptions& options);
std::string frontier_to_json(const std::vector<Evaluation>& points);

// The s-t network the `auto` min-cut solves for this graph and config (tags as
// in `auto`, the effective lambda), as DIMACS text (mincut.h).
FlowNetwork flow_network(const Graph& graph, const PlanOptions& options);

// Evaluates a recompute set chosen elsewhere (e.g. by PyTorch's partitioner)
// like a plan: `recomputed` are forward call_function nodes, made
// MUST_RECOMPUTE. Throws std::invalid_argument naming a bad node.
Evaluation score_recompute_set(const Graph& graph, const std::vector<std::int32_t>& recomputed, const CostOptions& cost);

// The plan document's format version (docs/graph-format.md, "Plan document";
// the graph format has its own). Readers refuse any other. 2: the compact
// form next to the full one (whose bytes are version 1's but for this number).
inline constexpr int kPlanFormatVersion = 3;

// How the plan document is written (plan_json.cc). Either form goes straight
// to its output in the format's canonical byte order (keys sorted at every
// level), without building a JSON tree.
struct PlanJsonOptions {
  // The full form: every tagged node's policy, region id and reason keyed by
  // node name. false: the compact form, what a caller needs to apply the plan
  // (policies and region ids as name lists grouped by value, the nodes pinned
  // for correctness); the same decisions.
  bool detail = true;
  // Add the per-stage wall times ("timings"): the document is then not
  // byte-identical from run to run.
  bool timings = false;
};

// The plan document, written to `out` in blocks as it is produced.
void write_plan_json(std::ostream& out, const Graph& graph, const PlanResult& result,
                     const PlanJsonOptions& options = {});
// The plan document as one string.
std::string plan_to_json(const Graph& graph, const PlanResult& result, const PlanJsonOptions& options);
// The full form (with "timings" if asked for).
std::string plan_to_json(const Graph& graph, const PlanResult& result, bool include_timings = false);

// Per-node "POLICY (reason)" strings for print_graph annotations / golden files.
std::vector<std::string> policy_annotations(const Graph& graph, const PlanResult& result);

}  // namespace hyper_ac
