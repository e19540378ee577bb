// The streamed plan writer (plan_json.cc) against the JSON-tree writer it
// replaced (kept below as the reference, verbatim but for the version it
// writes): the full form must be byte-identical on every graph the tests plan,
// and the compact form must carry the same decisions.
#include <algorithm>
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "hyper_ac/plan.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using namespace hyper_ac::testing;
using json = nlohmann::json;

namespace {

// The plan writer before plan_json.cc: the document built as an nlohmann tree, then dumped.
std::string reference_plan_json(const Graph& graph, const PlanResult& result, bool include_timings) {
  auto name = [&](std::int32_t index) { return graph.nodes[static_cast<std::size_t>(index)].name; };
  json document;
  document["format"] = "hyper_ac.plan";
  document["version"] = kPlanFormatVersion;
  document["mode"] = to_string(result.mode);
  document["route"] = to_string(result.route.route);
  document["route_reason"] = result.route.reason;
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
  for (const auto& r : result.remat.redirects)
    redirects.push_back({{"node", name(r.node)}, {"input", name(r.input)}, {"duplicate", r.duplicate}});
  document["redirects"] = redirects;
  json erase = json::array();
  for (auto e : result.remat.erase) erase.push_back(name(e));
  document["erase"] = erase;
  json saved = json::array();
  for (auto s : result.remat.saved) saved.push_back(name(s));
  json rng_replays = json::array();
  for (auto r : result.remat.rng_replays) {
    const std::string state = name(r) + "_rng_state";
    rng_replays.push_back({{"of", name(r)}, {"state", state}, {"state_bytes", graph.nodes[static_cast<std::size_t>(r)].rng_state_bytes}});
    saved.push_back(state);
  }
  document["saved"] = saved;
  json kept = json::array();  // saved call_function values with a policy, not duplicated
  for (auto s : result.remat.saved) {
    const auto i = static_cast<std::size_t>(s);
    const bool replayed = std::any_of(result.remat.duplicates.begin(), result.remat.duplicates.end(),
                                      [&](const Duplicate& d) { return d.of == s; });
    if (result.policies[i] != Policy::None && !replayed && graph.nodes[i].kind == NodeKind::CallFunction)
      kept.push_back(name(s));
  }
  document["kept"] = kept;
  if (!rng_replays.empty()) document["rng_replays"] = rng_replays;
  if (!graph.elided_copies.empty()) {
    json elided = json::array();
    for (const auto& copy : graph.elided_copies) elided.push_back({{"node", copy.node}, {"source", copy.source}});
    document["elided_copies"] = elided;
  }
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
      {"nodes_duplicated", rs.nodes_duplicated}, {"nodes_erased", rs.nodes_erased},
      {"saved_bytes_before", rs.saved_bytes_before}, {"saved_bytes_after", rs.saved_bytes_after},
      {"saved_values_before", rs.saved_values_before}, {"saved_values_after", rs.saved_values_after},
      {"recompute_flops", rs.recompute_flops}, {"recompute_seconds", ps.recompute_seconds},
      {"tagged", ts.tagged}, {"must_save", ts.must_save}, {"prefer_save", ts.prefer_save},
      {"must_recompute", ts.must_recompute}, {"prefer_recompute", ts.prefer_recompute},
      {"saved_rng", ts.saved_rng}, {"saved_symint", ts.saved_symint}, {"saved_collective", ts.saved_collective},
      {"saved_inplace", ts.saved_inplace}, {"saved_cross_unit", ts.saved_cross_unit},
      {"rebuilt_for_exclude", ps.rebuilt_for_exclude}, {"units", ps.units}, {"selected_units", ps.selected_units},
      {"scope", ps.scope}, {"user_tagged", ps.user_tagged}, {"regions", ps.regions}, {"lambda", ps.lambda},
      {"simulated_peak_before", ps.simulated_peak_before}, {"simulated_peak_after", ps.simulated_peak_after},
      {"simulated_activation_peak_before", ps.simulated_activation_peak_before},
      {"simulated_activation_peak_after", ps.simulated_activation_peak_after},
      {"simulated_activation_peak_autograd", ps.simulated_activation_peak_autograd},
      {"budget_bytes", ps.budget_bytes}, {"budget_met", ps.budget_met},
  };
  if (ps.stock_simulated_peak >= 0) {
    document["stats"]["stock_simulated_peak"] = ps.stock_simulated_peak;
    document["stats"]["stock_fallback"] = ps.stock_fallback;
  }
  if (rs.rng_replayed > 0 || ts.rng_replay_candidates > 0) {
    document["stats"]["rng_replayed"] = rs.rng_replayed;
    document["stats"]["rng_state_bytes"] = rs.rng_state_bytes;
    document["stats"]["rng_replay_candidates"] = ts.rng_replay_candidates;
  }
  json diagnostics = json::array();
  for (const auto& d : result.diagnostics) {
    json entry = {{"level", to_string(d.severity)}, {"message", d.message}};
    if (d.node >= 0 && static_cast<std::size_t>(d.node) < graph.nodes.size()) entry["node"] = name(d.node);
    diagnostics.push_back(std::move(entry));
  }
  document["diagnostics"] = diagnostics;
  if (result.timeline.recorded) {
    const auto& tl = result.timeline;
    document["timeline"] = {{"before", tl.before}, {"after", tl.after},
                            {"boundary_before", tl.boundary_before}, {"boundary_after", tl.boundary_after}};
    json units = json::array();
    for (std::size_t u = 0; u < result.scope.units.size(); ++u)
      units.push_back({{"fqn", result.scope.units[u].fqn},
                       {"backward_peak_before", tl.unit_backward_peak_before[u]},
                       {"backward_peak_after", tl.unit_backward_peak_after[u]}});
    document["timeline"]["units"] = units;
  }
  if (include_timings) {
    const auto& t = result.timings;
    document["timings"] = {{"scope_seconds", t.scope_seconds},       {"tag_seconds", t.tag_seconds},
                           {"mincut_seconds", t.mincut_seconds},     {"remat_seconds", t.remat_seconds},
                           {"simulate_seconds", t.simulate_seconds}, {"total_seconds", t.total_seconds},
                           {"load_seconds", t.load_seconds}};
  }
  return document.dump();
}

// Every key the writer may emit that a plan shows only sometimes; the corpus must reach each.
std::set<std::string> optional_keys_seen;

// The full form equals the reference byte for byte (with and without timings,
// to a string and to a stream); the compact form holds the same decisions.
void check_writers(const Graph& graph, const PlanResult& result) {
  for (bool timings : {false, true}) {
    const std::string expected = reference_plan_json(graph, result, timings);
    PlanJsonOptions options;
    options.timings = timings;
    CHECK(plan_to_json(graph, result, options) == expected);
    CHECK(plan_to_json(graph, result, timings) == expected);
    std::ostringstream streamed;
    write_plan_json(streamed, graph, result, options);
    CHECK(streamed.str() == expected);
  }
  const json full = json::parse(plan_to_json(graph, result, false));
  PlanJsonOptions compact_options;
  compact_options.detail = false;
  const json compact = json::parse(plan_to_json(graph, result, compact_options));
  for (const char* key : {"rng_replays", "elided_copies", "timeline"})
    if (full.contains(key)) optional_keys_seen.insert(key);
  if (full["stats"].contains("stock_fallback")) optional_keys_seen.insert("stock_fallback");
  for (const auto& d : full["diagnostics"])
    if (d.contains("node")) optional_keys_seen.insert("diagnostic node");
  CHECK(compact["form"] == "compact");
  CHECK(compact["version"] == kPlanFormatVersion);
  for (const char* key : {"mode", "duplicates", "redirects", "erase", "saved", "stats", "diagnostics", "regions",
                          "excluded", "rng_replays", "elided_copies", "timeline"})
    CHECK(compact.value(key, json()) == full.value(key, json()));
  // Policies and region ids regrouped by value; pinned = the correctness reasons.
  json policies = json::object(), graph_ids = json::object();
  for (const auto& [policy, names] : compact["policies"].items())
    for (const auto& n : names) policies[n.get<std::string>()] = policy;
  for (const auto& [id, names] : compact["graph_ids"].items())
    for (const auto& n : names) graph_ids[n.get<std::string>()] = std::stoi(id);
  CHECK(policies == full["policies"]);
  CHECK(graph_ids == full["graph_ids"]);
  json pinned = json::array();
  for (const auto& [node, reason] : full["reasons"].items())
    if (is_correctness_reason(reason.get<std::string>())) pinned.push_back(node);
  std::set<std::string> a(pinned.begin(), pinned.end()), b(compact["pinned"].begin(), compact["pinned"].end());
  CHECK(a == b);
  CHECK(!compact.contains("reasons"));
  // kept (both forms): the saved call_function values holding a policy that no duplicate replays, in saved's order.
  CHECK(compact["kept"] == full["kept"]);
  std::set<std::string> replayed, call_functions;
  for (const auto& d : full["duplicates"]) replayed.insert(d["of"].get<std::string>());
  for (const auto& node : graph.nodes)
    if (node.kind == NodeKind::CallFunction) call_functions.insert(node.name);
  json kept = json::array();
  for (const auto& value : full["saved"]) {
    const std::string n = value.get<std::string>();
    if (full["policies"].contains(n) && !replayed.count(n) && call_functions.count(n)) kept.push_back(n);
  }
  CHECK(kept == full["kept"]);
}

void plan_and_check(const Graph& graph, const std::string& config, bool timeline,
                    std::optional<std::vector<std::string>> stock = std::nullopt) {
  PlanOptions options = parse_plan_options(config, kTable);
  options.record_timeline = timeline;
  options.stock_recomputed = std::move(stock);
  PlanResult result;
  try {
    result = plan(graph, options);
  } catch (const std::exception&) {  // a config the graph cannot take (no units, say): nothing to write
    return;
  }
  check_writers(graph, result);
}

const char* kConfigs[] = {R"({"ac_mode": "off"})", R"({"ac_mode": "full"})", R"({"ac_mode": "selective"})",
                          R"({"ac_mode": "auto"})", R"({"ac_mode": "budget", "ac_memory_budget": 0.5})",
                          R"({"activation_checkpoint": {"mode": "full", "regions": {"output_recompute": true}}})"};

}  // namespace

TEST_CASE("plan writer: the full form is byte-identical to the JSON-tree writer", "[plan][plan_json]") {
  std::vector<std::pair<std::string, Graph>> graphs;
  graphs.emplace_back("two_units", two_units().graph());
  graphs.emplace_back("two_units, no model", two_units(false).graph());
  graphs.emplace_back("tiny_mlp", load_graph(read_text(std::string(HYPER_AC_TEST_DATA) + "/tiny_mlp.json")).graph);
  {  // a replayed random op and an exact copy the loader elides
    GraphBuilder b;
    b.placeholder("x").placeholder("w", "parameter");
    b.op("drop", "aten::native_dropout.default", {"x"}, "layers.0", {{"rng", true}, {"rng_state_bytes", 16}})
        .op("drop_out", "operator.getitem", {"drop"}, "layers.0", {{"aliased_inputs", {0}}})
        .op("clone", "aten::clone.default", {"drop_out"}, "layers.0", {{"copy", true}})
        .op("relu", "aten::relu.default", {"clone"}, "layers.0")
        .op("out", "aten::sum.default", {"relu"}, "layers.0");
    b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
    b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
    graphs.emplace_back("rng + copy", b.graph());
  }
  // The fuzz corpus (graph, NUL, config): every seed the loader takes.
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HYPER_AC_TEST_DATA) + "/../fuzz/corpus")) {
    const std::string input = read_text(entry.path().string());
    try {
      graphs.emplace_back(entry.path().filename().string(), load_graph(input.substr(0, input.find('\0'))).graph);
    } catch (const GraphError&) {
    }
  }
  for (const auto& [label, graph] : graphs) {
    INFO(label);
    for (const char* config : kConfigs)
      for (bool timeline : {false, true}) plan_and_check(graph, config, timeline);
    // auto against a stock recompute set: the stock_* stats.
    std::vector<std::string> forward;
    for (const auto& node : graph.nodes)
      if (node.is_forward() && node.kind == NodeKind::CallFunction) forward.push_back(node.name);
    plan_and_check(graph, R"({"ac_mode": "auto"})", false, forward);
    plan_and_check(graph, R"({"ac_mode": "auto"})", false, std::vector<std::string>{});
  }
  // Not vacuous: the optional parts were written somewhere.
  for (const char* key : {"rng_replays", "elided_copies", "timeline", "stock_fallback"}) {
    INFO(key);
    CHECK(optional_keys_seen.count(key) == 1);
  }
}

TEST_CASE("plan writer: strings outside plain ASCII are escaped as nlohmann does", "[plan][plan_json]") {
  GraphBuilder b = two_units();
  Graph graph = b.graph();
  PlanResult result = plan(graph, parse_plan_options(kSelective, kTable));
  result.diagnostics.push_back({Severity::Warning, 0, "tab\there, quote \" backslash \\ unicode \xc3\xa9 ctl \x01 del \x7f"});
  CHECK(plan_to_json(graph, result, false) == reference_plan_json(graph, result, false));
  result.diagnostics.push_back({Severity::Info, -1, "bad utf-8 \xff"});
  CHECK_THROWS(plan_to_json(graph, result, false));
  CHECK_THROWS(reference_plan_json(graph, result, false));
}
