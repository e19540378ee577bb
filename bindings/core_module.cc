// hyper_ac._core: the torch-free core, exposed with JSON strings in and out.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <pybind11/stl.h>

#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/plan.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/split.h"
#include "hyper_ac/tagging.h"

#include "default_op_policy.h"  // the shipped operator table, compiled in as in the CLI

namespace py = pybind11;
using namespace hyper_ac;

namespace {

// load_graph of text held by Python (a str's UTF-8 or a bytes object, read in
// place): one copy with the fast path's padding, freed once the graph is
// built, instead of pybind's copy to a std::string and the loader's padded
// copy of that (two copies of a 250 MB document at 1M nodes).
LoadResult load_padded(std::string_view text) {
  std::string padded;
  padded.reserve(text.size() + 64);  // graph_load::load_fast reads up to 64 bytes past the end
  padded.append(text.data(), text.size());
  return load_graph(padded);
}

// The operator table a call plans with: None = the shipped one (hyper_ac/configs/op_policy.yaml,
// compiled in, the CLI's default too); "" = none; else the given table.
PlanOptions options_for(const std::string& config_json, const std::optional<std::string>& op_policy_json) {
  return parse_plan_options(config_json, op_policy_json ? *op_policy_json : std::string(hyper_ac_cli::kDefaultOpPolicy));
}

ConfigFactsOptions facts_options(const std::optional<std::string>& runner) {
  ConfigFactsOptions options;
  if (runner) options.runner = parse_compiler_name(*runner);
  return options;
}

// Graph documents: their format, loading, printing and summaries.
void register_graph(py::module_& m) {
  m.attr("GRAPH_FORMAT_VERSION") = kGraphFormatVersion;
  m.attr("PLAN_FORMAT_VERSION") = kPlanFormatVersion;

  m.def("graph_fields", []() {
    py::list fields;
    for (const auto& f : graph_fields()) {
      py::dict d;
      d["section"] = f.section;
      d["name"] = f.name;
      d["kind"] = f.kind;
      d["required"] = f.required;
      d["default_json"] = f.default_json;
      d["member"] = f.member;
      d["always"] = f.always;
      d["flag"] = f.flag;
      d["check"] = f.check;
      fields.append(d);
    }
    return fields;
  }, "The graph document's field table (docs/graph-format.md, \"Field table\"): one dict per field with section, "
     "name, kind, required, default_json, member, always (the canonical form writes it at its default), flag, check.");
  m.def("graph_fields_markdown", []() { return graph_fields_markdown(); },
        "The field table as docs/graph-format.md shows it (Markdown).");
  m.attr("DEFAULT_OP_POLICY") = std::string(hyper_ac_cli::kDefaultOpPolicy);

  m.def("format_bytes", [](std::int64_t bytes) { return format_bytes(bytes); }, py::arg("bytes"),
        "Human-readable byte count (\"1.50 MiB\").");

  m.def("load_graph_summary", [](const std::string& graph_json) {
    auto loaded = load_graph(graph_json);
    return format_summary(summarize(loaded.graph));
  }, py::arg("graph_json"), "Load and validate a graph; return its summary text.");

  m.def("graph_summary", [](const std::string& graph_json) {
    auto loaded = load_graph(graph_json);
    auto s = summarize(loaded.graph);
    py::dict d;
    d["nodes"] = s.nodes;
    d["forward_nodes"] = s.forward_nodes;
    d["backward_nodes"] = s.backward_nodes;
    d["placeholders"] = s.placeholders;
    d["parameters"] = s.parameters;
    d["activation_bytes_read_by_backward"] = s.activation_bytes_read_by_backward;
    d["activations_read_by_backward"] = s.activations_read_by_backward;
    d["forward_flops"] = s.forward_flops;
    d["backward_flops"] = s.backward_flops;
    d["elided_copies"] = s.elided_copies;
    return d;
  }, py::arg("graph_json"), "Load and validate a graph; return its summary as a dict.");

  m.def("print_graph", [](const std::string& graph_json) {
    LoadOptions as_written;
    as_written.elide_copies = false;
    return print_graph(load_graph(graph_json, as_written).graph);
  }, py::arg("graph_json"), "Stable text form of a graph (as written: no copy elided).");

  m.def("roundtrip", [](const std::string& graph_json) {
    LoadOptions as_written;
    as_written.elide_copies = false;
    return graph_to_json(load_graph(graph_json, as_written).graph);
  }, py::arg("graph_json"), "Load a graph and re-emit its canonical JSON (as written: no copy elided).");
}

// Configs and operator tables: validation and the facts the core derives from them.
void register_config(py::module_& m) {
  m.def("validate_config", [](const std::string& config_json) {
    return config_to_json(parse_config(config_json));
  }, py::arg("config_json"), "Validate a config; return its canonical JSON (every option, defaults resolved).");

  m.def("config_facts", [](const std::string& config_json, std::optional<std::string> runner) {
    return config_facts_to_json(config_facts(parse_config(config_json), facts_options(runner)));
  }, py::arg("config_json"), py::arg("runner") = py::none(),
     "What a config resolves to (hyper_ac::config_facts, JSON): plans, compare_with_stock, compiler, split,\n"
     "buffer_reuse, inductor_buffer_reuse, the effective lambda, the hardware, rng, warnings. runner: the compiler\n"
     "that will run the graph (a backend's compiler; validated here).");

  m.def("with_runner", [](const std::string& config_json, const std::string& runner) {
    return config_to_json(with_runner(parse_config(config_json), parse_compiler_name(runner)));
  }, py::arg("config_json"), py::arg("runner"),
     "The canonical config planned for the compiler that runs the graph (hyper_ac::with_runner): a config on the\n"
     "default compiler takes `runner`, one that names inductor keeps it.");

  m.def("correctness_reasons", []() { return correctness_reasons(); },
        "The plan's `reasons` that pin a node for correctness (in-place, rng, collective): a stock partitioner "
        "must keep those nodes saved.");

  m.def("validate_op_policy", [](const std::string& table_json) {
    parse_op_policy(table_json);
  }, py::arg("table_json"));
}

// PlanOptions::peak_oracle / peak_lower_bound from a Python callable (plan JSON text -> bytes or -1), called with
// the GIL; the callable is referenced, never copied, so no reference count moves without it.
std::function<std::int64_t(const std::string&)> bytes_callback_from(const std::optional<py::function>& oracle) {
  if (!oracle) return {};
  const py::function* callable = &*oracle;
  return [callable](const std::string& plan_json) -> std::int64_t {
    py::gil_scoped_acquire gil;
    return (*callable)(plan_json).cast<std::int64_t>();
  };
}

// The plan and its companions: the split, the frontier, the flow network.
void register_planning(py::module_& m) {
  m.def("plan", [](std::string_view graph_json, const std::string& config_json, const std::optional<std::string>& op_policy_json,
                   bool timings, bool timeline, std::optional<std::vector<std::string>> stock_recomputed, bool detail,
                   bool unitless_to_stock, const std::optional<py::function>& peak_oracle,
                   const std::optional<py::function>& peak_lower_bound) {
    auto oracle = bytes_callback_from(peak_oracle);
    auto lower_bound = bytes_callback_from(peak_lower_bound);
    py::gil_scoped_release release;
    const auto started = std::chrono::steady_clock::now();
    auto loaded = load_padded(graph_json);
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    PlanOptions options = options_for(config_json, op_policy_json);
    options.record_timeline = timeline;
    options.stock_recomputed = std::move(stock_recomputed);
    options.unitless_to_stock = unitless_to_stock;
    options.peak_oracle = oracle;
    options.peak_lower_bound = lower_bound;
    auto result = plan(loaded.graph, options);
    result.timings.load_seconds = load_seconds;
    PlanJsonOptions json_options;
    json_options.detail = detail;
    json_options.timings = timings;
    return plan_to_json(loaded.graph, result, json_options);
  }, py::arg("graph_json"), py::arg("config_json"), py::arg("op_policy_json") = py::none(), py::arg("timings") = false,
     py::arg("timeline") = false, py::arg("stock_recomputed") = py::none(), py::arg("detail") = false,
     py::arg("unitless_to_stock") = false, py::arg("peak_oracle") = py::none(), py::arg("peak_lower_bound") = py::none(),
     "Plan save/recompute for a graph (JSON text, str or bytes); return the plan document (docs/graph-format.md):\n"
     "the compact form, or with detail=True the full one (every tagged node's policy, region id and reason by\n"
     "name). With per-stage wall times under 'timings' if asked; without them the plan is byte-identical for the\n"
     "same input. timeline=True adds 'timeline': live activation bytes per schedule step before/after the rewrite\n"
     "and each schedule's last forward step. stock_recomputed: the forward node names the stock partition\n"
     "recomputes (PlanOptions::stock_recomputed): auto then rewrites nothing unless its simulated peak is below\n"
     "that plan's. unitless_to_stock: a graph without units gets an unchanged plan routed to stock, with a\n"
     "warning, instead of NoUnitsError (PlanOptions::unitless_to_stock). peak_oracle: a callable (candidate plan\n"
     "JSON -> bytes the step holds at its peak beyond its inputs, or -1) for the budget's search and the\n"
     "never-above-stock guard (PlanOptions::peak_oracle). peak_lower_bound: a callable (candidate plan JSON ->\n"
     "bytes its measured peak cannot be below, found without compiling, or -1), asked for the stock partition so\n"
     "that a plan measured under it passes the guard without measuring stock (PlanOptions::peak_lower_bound).");

  m.def("plan_split", [](std::string_view graph_json, const std::string& config_json, const std::optional<std::string>& op_policy_json,
                         bool timeline, std::optional<std::vector<std::string>> stock_recomputed, bool detail,
                         bool unitless_to_stock, const std::optional<py::function>& peak_oracle,
                         const std::optional<py::function>& peak_lower_bound) {
    auto oracle = bytes_callback_from(peak_oracle);
    auto lower_bound = bytes_callback_from(peak_lower_bound);
    py::gil_scoped_release release;
    auto loaded = load_padded(graph_json);
    PlanOptions options = options_for(config_json, op_policy_json);
    options.record_timeline = timeline;
    options.stock_recomputed = std::move(stock_recomputed);
    options.unitless_to_stock = unitless_to_stock;
    options.peak_oracle = oracle;
    options.peak_lower_bound = lower_bound;
    auto result = plan(loaded.graph, options);
    auto split = split_joint(loaded.graph, result.remat);
    PlanJsonOptions json_options;
    json_options.detail = detail;
    return std::make_pair(plan_to_json(loaded.graph, result, json_options), split_to_json(loaded.graph, split));
  }, py::arg("graph_json"), py::arg("config_json"), py::arg("op_policy_json") = py::none(), py::arg("timeline") = false,
     py::arg("stock_recomputed") = py::none(), py::arg("detail") = false, py::arg("unitless_to_stock") = false,
     py::arg("peak_oracle") = py::none(), py::arg("peak_lower_bound") = py::none(),
     "(plan JSON, split JSON): the plan exactly as plan() gives it, and the forward/backward split of the rewritten\n"
     "graph (split.h): the nodes each module runs and the values the forward saves, in order (docs/graph-format.md).");

  m.def("frontier", [](const std::string& graph_json, const std::string& config_json, const std::optional<std::string>& op_policy_json) {
    py::gil_scoped_release release;
    auto loaded = load_graph(graph_json);
    return frontier_to_json(frontier(loaded.graph, options_for(config_json, op_policy_json)));
  }, py::arg("graph_json"), py::arg("config_json"), py::arg("op_policy_json") = py::none(),
     "The saved-bytes / recompute-cost frontier across lambda, with simulated peaks (JSON list).");

  m.def("flow_network", [](const std::string& graph_json, const std::string& config_json, const std::optional<std::string>& op_policy_json) {
    py::gil_scoped_release release;
    auto loaded = load_graph(graph_json);
    return flow_network(loaded.graph, options_for(config_json, op_policy_json)).dimacs;
  }, py::arg("graph_json"), py::arg("config_json"), py::arg("op_policy_json") = py::none(),
     "The exact s-t network the auto min-cut solves (tags as in auto, the effective lambda) as DIMACS max-flow text,\n"
     "with 'c vertex V NAME in|out' and 'c max_flow F' comment lines (docs/mincut.md).");
}

// Stage-level entry points for tools and tests (units, scope checks, scoring, printing).
void register_analysis(py::module_& m) {
  m.def("discover_units", [](const std::string& graph_json) {
    auto loaded = load_graph(graph_json);
    std::vector<std::string> fqns;
    for (const auto& unit : discover_units(loaded.graph).units) fqns.push_back(unit.fqn);
    return fqns;
  }, py::arg("graph_json"),
     "The unit FQNs scope finds for a graph: the marker rule over its model facts, else the module-stack rule.");

  m.def("check_scope", [](const std::string& graph_json, const std::string& config_json) {
    const ScopeCheck check = check_scope(load_graph(graph_json).graph, parse_plan_options(config_json, ""));
    py::dict d;
    d["checked"] = check.checked;
    if (!check.checked) return d;
    d["units"] = check.units;
    d["regions"] = check.regions;
    return d;
  }, py::arg("graph_json"), py::arg("config_json"),
     "The scope checks plan() runs (hyper_ac::check_scope), on a graph document that may hold only model facts\n"
     "(no nodes). Raises what plan() would; returns {checked, units, regions}.");

  m.def("score_recompute_set", [](const std::string& graph_json, const std::vector<std::string>& names,
                                  const std::string& config_json) {
    auto loaded = load_graph(graph_json);
    Config config = parse_config(config_json);
    std::unordered_map<std::string, std::int32_t> index;
    for (std::size_t i = 0; i < loaded.graph.nodes.size(); ++i) index.emplace(loaded.graph.nodes[i].name, static_cast<std::int32_t>(i));
    std::vector<std::int32_t> recomputed;
    for (const auto& name : names) {
      auto it = index.find(name);
      if (it == index.end()) throw std::invalid_argument("score_recompute_set: no node named '" + name + "'");
      recomputed.push_back(it->second);
    }
    CostOptions cost;
    cost.hardware = config.mincut.hardware;
    cost.compiler = config.mincut.compiler;
    auto s = score_recompute_set(loaded.graph, recomputed, cost);
    py::dict d;
    d["saved_bytes"] = s.saved_bytes;
    d["recompute_seconds"] = s.recompute_seconds;
    d["recompute_flops"] = s.recompute_flops;
    d["nodes_duplicated"] = s.nodes_duplicated;
    d["simulated_peak_bytes"] = s.simulated_peak_bytes;
    return d;
  }, py::arg("graph_json"), py::arg("recomputed"), py::arg("config_json") = "{}",
     "Score a recompute set chosen elsewhere (saved bytes, roofline time, simulated peak) like a plan.");

  m.def("print_plan", [](const std::string& graph_json, const std::string& config_json, const std::optional<std::string>& op_policy_json) {
    auto loaded = load_graph(graph_json);
    auto result = plan(loaded.graph, options_for(config_json, op_policy_json));
    PrintOptions print;
    print.annotations = policy_annotations(loaded.graph, result);
    return print_graph(loaded.graph, print);
  }, py::arg("graph_json"), py::arg("config_json"), py::arg("op_policy_json") = py::none(),
     "The graph's text form annotated with each node's policy and duplicate placement.");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "hyper_ac C++ core: graph loading, tagging, remat planning (torch-free)";
  py::register_exception<GraphError>(m, "GraphError", PyExc_ValueError);
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  auto scope_error = py::register_exception<ScopeError>(m, "ScopeError", PyExc_ValueError);
  py::register_exception<NoUnitsError>(m, "NoUnitsError", scope_error.ptr());
  py::register_exception<PlanError>(m, "PlanError", PyExc_RuntimeError);
  py::register_exception<MinCutError>(m, "MinCutError", PyExc_ValueError);
  py::register_exception<PolicyConflictError>(m, "PolicyConflictError", PyExc_ValueError);
  register_graph(m);
  register_config(m);
  register_planning(m);
  register_analysis(m);
}
