// libFuzzer target: graph JSON + config JSON -> plan (docs/testing.md, "Fuzzing").
//
// Input layout: GRAPH_JSON, one NUL byte, CONFIG_JSON. Without a NUL byte the
// whole input is the graph and the config is {"ac_mode": "auto"}. The
// operator table is the default one (tests/fuzz/op_policy.json, the output of
// `python -m hyper_ac op-policy`), read once at start-up.
//
// A finding is anything but a documented outcome:
//   - a plan, or GraphError / ConfigError / ScopeError / MinCutError /
//     PolicyConflictError (std::invalid_argument subclasses naming what is
//     wrong; the last: the graph's own checkpoint tags ask for what a rule forbids);
//   - PlanError means the planner built an invalid plan for a valid graph (a bug): it aborts;
//   - any other exception (a bare JSON-library error, a "would be a bug"
//     runtime_error, std::bad_alloc ...) aborts;
//   - the public graph load (simdjson fast path) and the reference loader
//     disagree: validity, the Graph built, or the error message (check_loaders);
//   - a plan whose numbers are impossible (negative or non-finite peaks,
//     recompute seconds, budget) aborts;
//   - a sanitizer report, a crash or a hang (libFuzzer's -timeout) is one.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/plan.h"
#include "hyper_ac/remat.h"
#include "hyper_ac/scope.h"
#include "hyper_ac/tagging.h"

#ifndef HYPER_AC_FUZZ_OP_POLICY
#define HYPER_AC_FUZZ_OP_POLICY ""
#endif

namespace {

std::string read_op_policy() {
  const char* env = std::getenv("HYPER_AC_FUZZ_OP_POLICY");
  const std::string path = env ? env : HYPER_AC_FUZZ_OP_POLICY;
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_plan: cannot open the operator table '%s'\n", path.c_str());
    std::abort();
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

const std::string& op_policy() {
  static const std::string table = read_op_policy();
  return table;
}

// HYPER_AC_FUZZ_VERBOSE=1: say what each input gave (for reading a reproducer).
bool verbose() {
  static const bool on = std::getenv("HYPER_AC_FUZZ_VERBOSE") != nullptr;
  return on;
}

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_plan finding: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_plan(const hyper_ac::PlanResult& result) {
  const auto& s = result.stats;
  if (s.simulated_peak_before < 0 || s.simulated_peak_after < 0 || s.simulated_activation_peak_before < 0 ||
      s.simulated_activation_peak_after < 0)
    finding("negative simulated peak", std::to_string(s.simulated_peak_before) + " / " +
                                           std::to_string(s.simulated_peak_after));
  if (!std::isfinite(s.recompute_seconds) || s.recompute_seconds < 0)
    finding("recompute_seconds not finite and >= 0", std::to_string(s.recompute_seconds));
  if (!std::isfinite(s.lambda)) finding("lambda not finite", std::to_string(s.lambda));
  const double flops = result.remat.stats.recompute_flops;
  if (!std::isfinite(flops) || flops < 0) finding("recompute_flops not finite and >= 0", std::to_string(flops));
  if (result.remat.stats.saved_bytes_before < 0 || result.remat.stats.saved_bytes_after < 0)
    finding("negative saved bytes", std::to_string(result.remat.stats.saved_bytes_after));
  if (s.budget_bytes < 0) finding("negative budget_bytes", std::to_string(s.budget_bytes));
}

// The graph loaders agree (docs/graph-format.md, "How loading works"): the
// public load (simdjson fast path, then the reference) and the reference alone
// give the same Graph or the same GraphError message. Anything else thrown
// reaches the caller's handlers.
void check_loaders(const std::string& graph_json) {
  hyper_ac::LoadOptions reference;
  reference.reference_loader = true;
  std::optional<hyper_ac::LoadResult> fast, ref;
  std::string fast_error, ref_error;
  try {
    fast = hyper_ac::load_graph(graph_json);
  } catch (const hyper_ac::GraphError& e) {
    fast_error = e.what();
  }
  try {
    ref = hyper_ac::load_graph(graph_json, reference);
  } catch (const hyper_ac::GraphError& e) {
    ref_error = e.what();
  }
  if (fast.has_value() != ref.has_value())
    finding("the fast and reference loaders disagree on validity", fast ? "fast accepted: " + ref_error : fast_error);
  if (fast && !hyper_ac::identical(fast->graph, ref->graph)) finding("the fast and reference loaders built different graphs", "");
  if (!fast && fast_error != ref_error) finding("the public load and the reference name different errors", fast_error + " / " + ref_error);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  const std::string graph_json = nul == std::string::npos ? input : input.substr(0, nul);
  const std::string config_json = nul == std::string::npos ? std::string("{\"ac_mode\": \"auto\"}") : input.substr(nul + 1);
  try {
    check_loaders(graph_json);
    const auto options = hyper_ac::parse_plan_options(config_json, op_policy());
    const auto loaded = hyper_ac::load_graph(graph_json);
    const auto result = hyper_ac::plan(loaded.graph, options);
    check_plan(result);
    (void)hyper_ac::plan_to_json(loaded.graph, result);
    if (verbose()) std::fprintf(stderr, "fuzz_plan: planned, peak %lld -> %lld bytes, budget %lld\n",
                                static_cast<long long>(result.stats.simulated_peak_before),
                                static_cast<long long>(result.stats.simulated_peak_after),
                                static_cast<long long>(result.stats.budget_bytes));
  } catch (const std::invalid_argument& e) {
    // GraphError, ConfigError, ScopeError (NoUnitsError), MinCutError, PolicyConflictError: documented.
    if (!dynamic_cast<const hyper_ac::GraphError*>(&e) && !dynamic_cast<const hyper_ac::ConfigError*>(&e) &&
        !dynamic_cast<const hyper_ac::ScopeError*>(&e) && !dynamic_cast<const hyper_ac::MinCutError*>(&e) &&
        !dynamic_cast<const hyper_ac::PolicyConflictError*>(&e))
      finding("undocumented invalid_argument", e.what());
    if (verbose()) std::fprintf(stderr, "fuzz_plan: rejected: %s\n", e.what());
  } catch (const std::exception& e) {
    finding("undocumented exception", e.what());
  }
  return 0;
}
