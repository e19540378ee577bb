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
#include "scope_indexed.h"
#include "tagging_indexed.h"
#include "cost_indexed.h"
#include "mincut_indexed.h"
#include "remat_indexed.h"
#include "simulate_indexed.h"
#include "plan_search.h"

namespace hyper_ac {

using json = nlohmann::json;

namespace planning {

SimulateOptions simulate_options(Compiler compiler) {
  SimulateOptions options;
  options.fuse_pointwise = compiler == Compiler::Inductor;
  return options;
}

Evaluation evaluate_indexed(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& policies,
                            const CostOptions& cost, const RematOptions& remat, PlanTimings* timings,
                            SecondsCache* seconds) {
  Evaluation evaluation;
  detail::FlatSchedule validated;  // the rewritten schedule plan_remat's validation built, if it ran
  {
    ScopedTimer timer(evaluation.remat_seconds);
    evaluation.remat = detail::plan_remat(graph, index, policies, remat, &validated);
  }
  SimulateResult simulated;
  {
    ScopedTimer timer(evaluation.simulate_seconds);
    const SimulateOptions options = simulate_options(cost.compiler);
    simulated = remat.validate ? detail::simulate_memory(graph, index, validated, options)
                               : detail::simulate_memory(graph, index, &evaluation.remat, options);
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

}  // namespace planning

namespace {

using namespace planning;  // plan()'s helpers and searches (plan_search.h)

// PlanOptions::record_timeline: simulate both schedules once more, keeping every step.
// The rewritten schedule's allocations as plan() scored them (fused replays
// under the config's compiler).
void record_timeline(const Graph& graph, const PlanOptions& plan_options, PlanResult& result) {
  SimulateOptions options = simulate_options(plan_options.config.mincut.compiler);
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
  if (options.record_timeline) record_timeline(graph, options, result);
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
    // The step as the configured compiler allocates it; the autograd figure is the uncompiled step's.
    before = detail::simulate_memory(graph, index, nullptr, simulate_options(config.mincut.compiler));
    result.stats.simulated_activation_peak_autograd =
        config.mincut.compiler == Compiler::Eager ? before.peak_bytes
                                                  : detail::simulate_memory(graph, index, nullptr, {}).peak_bytes;
    const bool grouped = std::any_of(graph.nodes.begin(), graph.nodes.end(),
                                     [](const Node& node) { return node.autograd_node >= 0; });
    if (grouped) {
      SimulateOptions autograd;
      autograd.autograd_lifetimes = true;
      result.stats.simulated_activation_peak_autograd =
          detail::simulate_memory(graph, index, nullptr, autograd).peak_bytes;
    }
  }
  result.stats.simulated_peak_before = before.peak_bytes_with_resident;
  result.stats.simulated_activation_peak_before = before.peak_bytes;

  Evaluation evaluation;
  if (config.mode == Mode::Auto && (stages.cost.hardware.measured || options.peak_oracle)) {
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
  if (config.mode != Mode::Auto && options.stock_recomputed)
    keep_unit_under_stock(graph, index, *options.stock_recomputed, stages.cost, unit_schedule(result.scope), result,
                          evaluation);
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
  if (options.record_timeline) record_timeline(graph, options, result);
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

std::vector<Evaluation> frontier(const Graph& graph, const PlanOptions& options) {
  StageOptions stages;
  Scope scope;
  const detail::NodeIndex index(graph);
  const TagResult tags = auto_tags(graph, index, options, stages, &scope);
  FrontierResult cuts = detail::frontier_cuts(graph, index, tags.policies, stages.mincut);
  std::vector<Evaluation> points;
  const RematOptions schedule = unit_schedule(scope);
  SecondsCache seconds;
  for (const auto& point : cuts.points) {
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

std::string frontier_to_json(const std::vector<Evaluation>& points) {
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
