#include "hyper_ac/plan.h"

#include <nlohmann/json.hpp>

namespace hyper_ac {

using json = nlohmann::json;

namespace {

ScopeOptions scope_options(const Config& config) {
  ScopeOptions options = config.scope;
  // Checked here, not when parsing: the adapter is known only once the model is.
  if (config.region_source == "model_adapter_safe_regions" && !config.adapter_given)
    throw ConfigError(
        "config selection.source is 'model_adapter_safe_regions' but no model adapter is registered for this model "
        "(register a RecomputePolicy with hyper_ac.config.register_adapter)");
  // Adapter regions stand in for configured ones: always when the source asks
  // for them, otherwise only when the config names no regions of its own.
  bool use_adapter = config.adapter_given &&
                     (config.region_source == "model_adapter_safe_regions" || config.scope.include.empty());
  if (use_adapter) {
    if (config.adapter_include.empty())
      throw ConfigError("the model adapter's RecomputePolicy declares no region_patterns; it needs at least one");
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

}  // namespace

PlanResult make_plan(const Graph& graph, const PlanOptions& options) {
  const Config& config = options.config;
  PlanResult result;
  result.mode = config.mode;
  result.policies.assign(graph.nodes.size(), Policy::None);
  if (config.mode == Mode::Off) {
    result.tags.policies = result.policies;
    result.tags.graph_id.assign(graph.nodes.size(), -1);
    result.tags.reasons.assign(graph.nodes.size(), "");
    result.remat = plan_remat(graph, result.policies);
    result.diagnostics.push_back({"info", "ac_mode is off: graph left unchanged"});
    return result;
  }

  result.scope = resolve_scope(graph, scope_options(config));
  for (const auto& note : result.scope.notes) result.diagnostics.push_back({"info", note});
  result.stats.units = result.scope.units.size();
  result.stats.selected_units = result.scope.selected_units.size();
  result.stats.regions = result.scope.regions.size();

  TagOptions tag_options;
  tag_options.mode = config.mode;
  tag_options.op_policy = effective_op_policy(config, options.op_policy);
  tag_options.save_forward_all_gather = config.save_forward_all_gather;
  result.tags = tag_policies(graph, result.scope, tag_options);
  result.policies = result.tags.policies;

  result.remat = plan_remat(graph, result.policies);

  bool already_rematted = false;
  for (const auto& node : graph.nodes) already_rematted = already_rematted || !node.recomputed_from.empty();
  if (result.remat.duplicates.empty() && !result.scope.regions.empty() && !already_rematted)
    result.diagnostics.push_back(
        {"warning", "activation checkpointing matched scope [" + joined(result.scope.regions) +
                        "] but recomputed no node; the model may already be wrapped by eager checkpointing, or "
                        "every candidate was pinned to save"});
  return result;
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

std::string plan_to_json(const Graph& graph, const PlanResult& result) {
  auto name = [&](std::int32_t index) { return graph.nodes[static_cast<std::size_t>(index)].name; };
  json document;
  document["format"] = "hyper_ac.plan";
  document["version"] = kGraphFormatVersion;
  document["mode"] = to_string(result.mode);
  json policies = json::object(), graph_ids = json::object(), reasons = json::object();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (result.policies[i] == Policy::None) continue;
    policies[graph.nodes[i].name] = to_string(result.policies[i]);
    if (i < result.tags.graph_id.size() && result.tags.graph_id[i] >= 0) graph_ids[graph.nodes[i].name] = result.tags.graph_id[i];
    if (i < result.tags.reasons.size() && !result.tags.reasons[i].empty()) reasons[graph.nodes[i].name] = result.tags.reasons[i];
  }
  document["policies"] = policies;
  document["graph_ids"] = graph_ids;
  document["reasons"] = reasons;
  json duplicates = json::array();
  for (const auto& dup : result.remat.duplicates) {
    json private_inputs = json::array();
    for (auto input : graph.nodes[static_cast<std::size_t>(dup.of)].inputs)
      if (graph.nodes[static_cast<std::size_t>(input)].subgraph) private_inputs.push_back(name(input));
    duplicates.push_back({{"of", name(dup.of)}, {"before", name(dup.before)}, {"private_get_attrs", private_inputs}});
  }
  document["duplicates"] = duplicates;
  json redirects = json::array();
  for (const auto& r : result.remat.redirects) redirects.push_back({{"node", name(r.node)}, {"input", name(r.input)}});
  document["redirects"] = redirects;
  json erase = json::array();
  for (auto e : result.remat.erase) erase.push_back(name(e));
  document["erase"] = erase;
  json saved = json::array();
  for (auto s : result.remat.saved) saved.push_back(name(s));
  document["saved"] = saved;
  json regions = json::array();
  for (std::size_t r = 0; r < result.scope.regions.size(); ++r)
    regions.push_back({{"fqn", result.scope.regions[r]},
                       {"output_recompute", r < result.scope.region_output_recompute.size() &&
                                                result.scope.region_output_recompute[r]}});
  document["regions"] = regions;
  document["excluded"] = result.scope.excluded;

  const auto& rs = result.remat.stats;
  const auto& ts = result.tags.stats;
  const auto& ps = result.stats;
  document["stats"] = {
      {"nodes_duplicated", rs.nodes_duplicated},
      {"nodes_erased", rs.nodes_erased},
      {"saved_bytes_before", rs.saved_bytes_before},
      {"saved_bytes_after", rs.saved_bytes_after},
      {"saved_values_before", rs.saved_values_before},
      {"saved_values_after", rs.saved_values_after},
      {"recompute_flops", rs.recompute_flops},
      {"recompute_seconds", ps.recompute_seconds},
      {"tagged", ts.tagged},
      {"must_save", ts.must_save},
      {"prefer_save", ts.prefer_save},
      {"must_recompute", ts.must_recompute},
      {"prefer_recompute", ts.prefer_recompute},
      {"saved_rng", ts.saved_rng},
      {"saved_symint", ts.saved_symint},
      {"saved_collective", ts.saved_collective},
      {"saved_inplace", ts.saved_inplace},
      {"saved_cross_unit", ts.saved_cross_unit},
      {"rebuilt_for_exclude", ts.rebuilt_for_exclude},
      {"units", ps.units},
      {"selected_units", ps.selected_units},
      {"regions", ps.regions},
      {"lambda", ps.lambda},
      {"simulated_peak_before", ps.simulated_peak_before},
      {"simulated_peak_after", ps.simulated_peak_after},
      {"budget_bytes", ps.budget_bytes},
      {"budget_met", ps.budget_met},
  };
  json diagnostics = json::array();
  for (const auto& d : result.diagnostics) diagnostics.push_back({{"level", d.level}, {"message", d.message}});
  document["diagnostics"] = diagnostics;
  return document.dump();
}

}  // namespace hyper_ac
