// hyper-ac-plan: load and validate a graph JSON; with --config, plan it.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "default_op_policy.h"  // generated from hyper_ac/configs/op_policy.yaml
#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/plan.h"

namespace {

const char* kUsage =
    "usage: hyper-ac-plan GRAPH.json [--config CONFIG.json] [--op-policy TABLE.json] [--print]\n"
    "                     [--json [--detail] [--out PLAN.json]] [--frontier | --flow-network]\n"
    "       hyper-ac-plan --print-op-policy [--op-policy TABLE.json]\n"
    "  Loads and validates GRAPH.json (docs/graph-format.md) and prints its summary.\n"
    "  --config     plan it with this config (JSON; `python -m hyper_ac config FILE.yaml` converts YAML)\n"
    "  --op-policy  replace the built-in operator table (hyper_ac/configs/op_policy.yaml, compiled in) with\n"
    "               this JSON one (`python -m hyper_ac op-policy` prints the default as JSON)\n"
    "  --print-op-policy  print the operator table in use as JSON and exit\n"
    "  --print      print the graph's text form (annotated with policies when planning)\n"
    "  --json       print the plan document (docs/graph-format.md) instead of the summary: the compact form,\n"
    "               what a caller needs to apply it\n"
    "  --detail     with --json: the full form (every tagged node's policy, region id and reason by name)\n"
    "  --out FILE   with --json: write the plan document to FILE instead of stdout\n"
    "  --timings    print the wall time of each stage to stderr\n"
    "  --reference-loader  load with the reference loader (a JSON tree) only, not the simdjson fast path\n"
    "               (same graph and errors, slower; for comparison)\n"
    "  --frontier        print the memory/recompute frontier (JSON, as _core.frontier) instead of planning\n"
    "  --flow-network  print the auto min-cut's s-t network as DIMACS (as _core.flow_network)\n";

// The whole file (a config or an operator table; the graph is read by
// load_graph_file).
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot open '" + path + "'");
  const std::streamoff size = in.tellg();
  if (size < 0) throw std::runtime_error("cannot read '" + path + "'");
  std::string text(static_cast<std::size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(text.data(), size)) throw std::runtime_error("cannot read '" + path + "'");
  return text;
}

// The plan document to `out_path` ("" = stdout), streamed as it is written
// (plan_json.cc): no copy of the document is held in memory.
void write_plan(const hyper_ac::Graph& graph, const hyper_ac::PlanResult& result, bool detail,
                const std::string& out_path) {
  hyper_ac::PlanJsonOptions options;
  options.detail = detail;
  if (out_path.empty()) {
    hyper_ac::write_plan_json(std::cout, graph, result, options);
    std::cout << "\n";
    std::cout.flush();
    if (!std::cout) throw std::runtime_error("cannot write the plan to stdout");
    return;
  }
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write '" + out_path + "'");
  hyper_ac::write_plan_json(out, graph, result, options);
  out << "\n";
  out.close();
  if (!out) throw std::runtime_error("cannot write '" + out_path + "'");
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, config_path, table_path, out_path;
  bool print = false, as_json = false, detail = false, timings = false, print_frontier = false, network = false, print_table = false;
  hyper_ac::LoadOptions load_options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "hyper-ac-plan: " << flag << " needs a file\n" << kUsage;
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--config") config_path = value("--config");
    else if (arg == "--op-policy") table_path = value("--op-policy");
    else if (arg == "--print") print = true;
    else if (arg == "--print-op-policy") print_table = true;
    else if (arg == "--json") as_json = true;
    else if (arg == "--detail") detail = true;
    else if (arg == "--out") out_path = value("--out");
    else if (arg == "--timings") timings = true;
    else if (arg == "--reference-loader") load_options.reference_loader = true;
    else if (arg == "--frontier") print_frontier = true;
    else if (arg == "--flow-network") network = true;
    else if (arg == "-h" || arg == "--help") { std::cout << kUsage; return 0; }
    else if (!arg.empty() && arg[0] == '-') { std::cerr << "hyper-ac-plan: unknown option " << arg << "\n" << kUsage; return 2; }
    else if (graph_path.empty()) graph_path = arg;
    else { std::cerr << "hyper-ac-plan: more than one graph given\n" << kUsage; return 2; }
  }
  // The operator table: the shipped one unless --op-policy replaces it.
  std::string table_json = hyper_ac_cli::kDefaultOpPolicy;
  if (!table_path.empty()) {
    try {
      table_json = read_file(table_path);
      hyper_ac::parse_op_policy(table_json);
    } catch (const std::exception& error) {
      std::cerr << "hyper-ac-plan: " << table_path << ": " << error.what() << "\n";
      return 1;
    }
  }
  if (print_table) {
    std::cout << table_json << "\n";
    return 0;
  }
  if (graph_path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  if ((print_frontier || network) && config_path.empty()) {
    std::cerr << "hyper-ac-plan: --frontier and --flow-network need --config\n" << kUsage;
    return 2;
  }
  try {
    const auto started = std::chrono::steady_clock::now();
    auto loaded = hyper_ac::load_graph_file(graph_path, load_options);
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (config_path.empty()) {
      if (timings)
        std::cerr << "timings: load " << load_seconds << " s (" << (loaded.stats.fast_path ? "fast" : "reference")
                  << " loader)\n";
      if (print) std::cout << hyper_ac::print_graph(loaded.graph);
      std::cout << hyper_ac::format_summary(hyper_ac::summarize(loaded.graph));
      return 0;
    }
    auto options = hyper_ac::parse_plan_options(read_file(config_path), table_json);
    if (print_frontier) {
      std::cout << hyper_ac::frontier_to_json(hyper_ac::frontier(loaded.graph, options)) << "\n";
      return 0;
    }
    if (network) {
      std::cout << hyper_ac::flow_network(loaded.graph, options).dimacs;
      return 0;
    }
    auto result = hyper_ac::plan(loaded.graph, options);
    if (timings) {
      const auto& t = result.timings;
      std::cerr << "timings: load " << load_seconds << " s, scope " << t.scope_seconds << " s, tag " << t.tag_seconds
                << " s, min-cut " << t.mincut_seconds << " s, remat " << t.remat_seconds << " s, simulate "
                << t.simulate_seconds << " s, plan total " << t.total_seconds << " s\n";
    }
    if (as_json) {
      const auto writing = std::chrono::steady_clock::now();
      write_plan(loaded.graph, result, detail, out_path);
      if (timings)
        std::cerr << "timings: write " << std::chrono::duration<double>(std::chrono::steady_clock::now() - writing).count()
                  << " s\n";
      // Everything is written and flushed: leave without destroying the graph and the plan
      // (the OS takes the memory back at once; freeing a 1M-node graph object by object took
      // about a tenth of the run's wall time), as compilers do (clang -disable-free).
      std::cerr.flush();
      std::_Exit(0);
    }
    if (print) {
      hyper_ac::PrintOptions print_options;
      print_options.annotations = hyper_ac::policy_annotations(loaded.graph, result);
      std::cout << hyper_ac::print_graph(loaded.graph, print_options);
    }
    std::cout << hyper_ac::format_summary(hyper_ac::summarize(loaded.graph));
    const auto& s = result.remat.stats;
    std::cout << "mode: " << hyper_ac::to_string(result.mode) << ", regions: " << result.scope.regions.size()
              << ", duplicated: " << s.nodes_duplicated << ", saved for backward: "
              << hyper_ac::format_bytes(s.saved_bytes_before) << " -> " << hyper_ac::format_bytes(s.saved_bytes_after)
              << "\n";
    for (const auto& d : result.diagnostics) std::cout << hyper_ac::to_string(d.severity) << ": " << d.message << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hyper-ac-plan: " << graph_path << ": " << error.what() << "\n";
    return 1;
  }
}
