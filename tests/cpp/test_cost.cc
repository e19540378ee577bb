// hardware: measured: the per-node measured_seconds field, the cost model's
// use of it (and its roofline fallback), and auto's knee rule (plan.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>

#include "graph_builder.h"
#include "hyper_ac/config.h"
#include "hyper_ac/cost.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/plan.h"

using namespace hyper_ac;
using namespace hyper_ac::testing;

namespace {

std::int32_t at(const Graph& graph, const std::string& name) {
  for (std::size_t i = 0; i < graph.nodes.size(); ++i)
    if (graph.nodes[i].name == name) return static_cast<std::int32_t>(i);
  FAIL("no node " << name);
  return -1;
}

CostOptions cost_of(const char* config_json) {
  const Config config = parse_config(config_json);
  CostOptions cost;
  cost.hardware = config.mincut.hardware;
  cost.compiler = config.mincut.compiler;
  return cost;
}

// x -> mm (measured 2 ms) -> relu (measured 1 ms, fusible) -> view -> sum; backward reads them.
Graph small_graph() {
  GraphBuilder b;
  b.placeholder("x", "input", 4096).placeholder("w", "parameter", 4096);
  b.sized("mm", "aten::mm.default", {"x", "w"}, "", 4096, 1e6);
  b.op("relu", "aten::relu.default", {"mm"}, "", {{"fusible", true}, {"measured_seconds", 1e-3}});
  b.op("v", "aten::view.default", {"relu"}, "", {{"view", true}, {"aliased_inputs", {0}}, {"fusible", true},
                                                 {"measured_seconds", 5e-3}});
  b.op("loss", "aten::sum.default", {"v"}, "", {{"fusible", true}});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "relu"}, {{"measured_seconds", 4e-3}});
  b.bwd("gw", "aten::mm.default", {"x", "g"});
  b.output({"loss", "gw"});
  Graph graph = b.graph();
  graph.nodes[static_cast<std::size_t>(at(graph, "mm"))].measured_seconds = 2e-3;
  return graph;
}

}  // namespace

TEST_CASE("measured_seconds: loaded by both loaders, written only when set, checked", "[cost][graph]") {
  GraphBuilder b;
  b.placeholder("x", "input").op("a", "aten::relu.default", {"x"}, "", {{"measured_seconds", 0.25}});
  b.op("c", "aten::relu.default", {"a"}).output({"c"});
  const Graph graph = b.graph();  // the builder checks the fast and the reference loader agree
  CHECK(graph.nodes[1].measured_seconds == 0.25);
  CHECK(graph.nodes[2].measured_seconds == -1.0);  // absent: not measured
  const std::string text = graph_to_json(graph);
  CHECK(text.find("\"measured_seconds\":0.25") != std::string::npos);
  CHECK(text.find("measured_seconds", text.find("\"name\":\"c\"")) == std::string::npos);
  CHECK(identical(load_graph(text).graph, graph));

  for (const char* bad : {"-1", "\"1\"", "true"}) {
    json doc = json::parse(text);
    doc["nodes"][1]["measured_seconds"] = json::parse(bad);
    for (bool reference : {false, true}) {
      LoadOptions options;
      options.reference_loader = reference;
      INFO(bad << (reference ? " (reference)" : " (fast)"));
      CHECK_THROWS_AS(load_graph(doc.dump(), options), GraphError);
    }
  }
  json doc = json::parse(text);
  doc["nodes"][1]["measured_seconds"] = nullptr;  // null = absent
  CHECK(load_graph(doc.dump()).graph.nodes[1].measured_seconds == -1.0);
}

TEST_CASE("hardware: measured parses, round-trips and asks the caller to measure", "[cost][config]") {
  const Config config = parse_config(R"({"ac_mode": "auto", "ac_hardware": "measured"})");
  CHECK(config.mincut.hardware.measured);
  CHECK(config.mincut.hardware.name == "measured");
  CHECK(config.mincut.hardware.peak_flops == 1.0e11);  // the cpu roofline prices nodes without a time
  CHECK(parse_config(config_to_json(config)).mincut.hardware.measured);
  CHECK(config_facts(config).measure_op_times);
  CHECK_FALSE(config_facts(parse_config(R"({"ac_mode": "auto"})")).measure_op_times);
  CHECK_FALSE(parse_config(R"({"ac_mode": "auto", "ac_hardware": "h100"})").mincut.hardware.measured);
  const Config custom = parse_config(
      R"({"ac_mode": "auto", "ac_hardware": {"name": "measured", "peak_flops": 1e12, "memory_bandwidth": 1e11}})");
  CHECK(custom.mincut.hardware.measured);
  CHECK(custom.mincut.hardware.memory_bandwidth == 1e11);
  CHECK_THROWS_AS(parse_config(R"({"ac_hardware": "measure"})"), ConfigError);
}

TEST_CASE("recompute cost: measured time when present, the roofline otherwise", "[cost]") {
  const Graph graph = small_graph();
  const auto mm = at(graph, "mm"), relu = at(graph, "relu"), v = at(graph, "v"), loss = at(graph, "loss");
  const CostOptions cpu = cost_of(R"({"ac_hardware": "cpu"})");
  const CostOptions measured = cost_of(R"({"ac_hardware": "measured"})");
  const double mm_roofline = recompute_seconds(graph, mm, cpu);
  CHECK(mm_roofline == Approx(std::max(1e6 / 1e11, (3 * 4096.0) / 2e10)));

  SECTION("eager: every node with a time is priced by it") {
    CHECK(recompute_seconds(graph, mm, measured) == 2e-3);
    CHECK(recompute_seconds(graph, relu, measured) == 1e-3);
    CHECK(recompute_seconds(graph, v, measured) == 0.0);                     // a view replays for free
    CHECK(recompute_seconds(graph, loss, measured) == recompute_seconds(graph, loss, cpu));  // no time: roofline
    CHECK(recompute_seconds(graph, std::vector<std::int32_t>{mm, relu, v, loss}, measured) ==
          Approx(3e-3 + recompute_seconds(graph, loss, cpu)));
  }
  SECTION("inductor: fusion groups keep their formula, non-fusible nodes take their time") {
    CostOptions inductor = measured;
    inductor.compiler = Compiler::Inductor;
    CostOptions roofline = cpu;
    roofline.compiler = Compiler::Inductor;
    CHECK(recompute_seconds(graph, mm, inductor) == 2e-3);
    CHECK_FALSE(uses_measured_time(graph.nodes[static_cast<std::size_t>(relu)], inductor));
    const std::vector<std::int32_t> group = {relu, v, loss};
    CHECK(recompute_seconds(graph, group, inductor) == recompute_seconds(graph, group, roofline));
  }
  SECTION("the step's base seconds") {
    const auto g = at(graph, "g"), gw = at(graph, "gw");
    const double expected = 2e-3 + 1e-3 + recompute_seconds(graph, loss, cpu) + 4e-3 + recompute_seconds(graph, gw, cpu);
    CHECK(step_seconds(graph, measured) == Approx(expected));
    CHECK(recompute_seconds(graph, g, measured) == 4e-3);
    CHECK(step_seconds(graph, cpu) < step_seconds(graph, measured));
  }
}

namespace {

// `units` blocks of mm -> gelu -> mul -> mm -> tanh over 1 MiB activations,
// each node with a measured time: mm `mm_seconds`, pointwise 10 us; the
// backward's mms `backward_mm_seconds` (they set the step's base).
Graph timed_blocks(int units, double mm_seconds, double backward_mm_seconds) {
  const std::int64_t A = 1 << 20;
  GraphBuilder b;
  b.placeholder("x", "input", A);
  std::vector<std::pair<std::string, std::string>> modules;
  std::string in = "x";
  for (int u = 0; u < units; ++u) {
    const std::string s = std::to_string(u), fqn = "layers." + s;
    b.placeholder("w" + s, "parameter", 4096).placeholder("v" + s, "parameter", 4096);
    b.sized("mm" + s, "aten::mm.default", {in, "w" + s}, fqn, A, 4e9);
    b.sized("gelu" + s, "aten::gelu.default", {"mm" + s}, fqn, A);
    b.sized("mul" + s, "aten::mul.Tensor", {"gelu" + s, in}, fqn, A);
    b.sized("mm2_" + s, "aten::mm.default", {"mul" + s, "v" + s}, fqn, A, 4e9);
    b.sized("tanh" + s, "aten::tanh.default", {"mm2_" + s}, fqn, A);
    modules.push_back({fqn, "Block"});
    in = "tanh" + s;
  }
  b.sized("loss", "aten::sum.default", {in}, "", 4);
  b.placeholder("tangent", "tangent", 4, "backward");
  std::string g = "tangent";
  std::vector<std::string> outs = {"loss"};
  for (int u = units - 1; u >= 0; --u) {
    const std::string s = std::to_string(u), prev = u == 0 ? "x" : "tanh" + std::to_string(u - 1);
    b.sized("g_tanh" + s, "aten::tanh_backward.default", {g, "tanh" + s}, "", A, 0, "backward");
    b.sized("g_v" + s, "aten::mm.default", {"mul" + s, "g_tanh" + s}, "", 4096, 4e9, "backward");
    b.sized("g_mul" + s, "aten::mm.default", {"g_tanh" + s, "v" + s}, "", A, 4e9, "backward");
    b.sized("g_gelu" + s, "aten::mul.Tensor", {"g_mul" + s, prev}, "", A, 0, "backward");
    b.sized("g_mm" + s, "aten::gelu_backward.default", {"g_gelu" + s, "mm" + s}, "", A, 0, "backward");
    b.sized("g_w" + s, "aten::mm.default", {prev, "g_mm" + s}, "", 4096, 4e9, "backward");
    b.sized("g_in" + s, "aten::mm.default", {"g_mm" + s, "w" + s}, "", A, 4e9, "backward");
    g = "g_in" + s;
    outs.push_back("g_w" + s);
    outs.push_back("g_v" + s);
  }
  b.output(outs);
  b.model("Net", modules, modules);
  Graph graph = b.graph();
  for (auto& node : graph.nodes) {
    if (node.kind != NodeKind::CallFunction) continue;
    const bool mm = node.target == "aten::mm.default";
    node.measured_seconds = mm ? (node.is_forward() ? mm_seconds : backward_mm_seconds) : 1e-5;
  }
  return graph;
}

PlanOptions measured_auto() {
  PlanOptions options;
  options.config = parse_config(R"({"ac_mode": "auto", "ac_hardware": "measured"})");
  return options;
}

// The rule, by brute force over the frontier: the least peak within the allowance.
std::int64_t least_peak_within(const std::vector<Evaluation>& points, double allowance) {
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  for (const auto& p : points)
    if (p.recompute_seconds <= allowance) best = std::min(best, p.simulated_peak_bytes);
  return best;
}

// The knee's stats: the step priced on the plan's own profile, and the allowance kKneeSlowdown of it.
double check_knee_stats(const Graph& graph, const PlanOptions& options, const PlanResult& result) {
  CostOptions cost;
  cost.hardware = options.config.mincut.hardware;
  const double base = step_seconds(graph, cost);
  CHECK(result.stats.step_seconds == Approx(base));
  CHECK(result.stats.knee_allowance_seconds == Approx(kKneeSlowdown * base));
  return base;
}

}  // namespace

TEST_CASE("auto under hardware: measured takes the knee: least peak within kKneeSlowdown of the step", "[cost][plan][knee]") {
  SECTION("the mms are dear against the step: only pointwise ops are replayed") {
    const Graph graph = timed_blocks(3, 1e-3, 1e-3);
    const PlanOptions options = measured_auto();
    const PlanResult result = plan(graph, options);
    const double base = check_knee_stats(graph, options, result);
    const std::vector<Evaluation> points = frontier(graph, options);
    REQUIRE(points.size() >= 3);
    CHECK(result.stats.knee_points == points.size());
    CHECK(result.stats.recompute_seconds <= kKneeSlowdown * base);
    CHECK(result.stats.recompute_seconds > 0.0);
    CHECK(result.stats.simulated_peak_after <= least_peak_within(points, kKneeSlowdown * base));
    // The rule matters here: a lower peak exists beyond the allowance, and the
    // knee is not the least-recompute point.
    CHECK(least_peak_within(points, 1e30) < result.stats.simulated_peak_after);
    CHECK(result.stats.simulated_peak_after < points.front().simulated_peak_bytes);
    for (const auto& dup : result.remat.duplicates)
      CHECK(graph.nodes[static_cast<std::size_t>(dup.of)].target != "aten::mm.default");
    const std::string text = plan_to_json(graph, result);
    CHECK(text.find("\"step_seconds\"") != std::string::npos);
    CHECK(text.find("chose the knee") != std::string::npos);
  }
  SECTION("a slow backward makes room for the mms: the least peak of all") {
    const Graph graph = timed_blocks(3, 1e-3, 1.0);
    const PlanOptions options = measured_auto();
    const PlanResult result = plan(graph, options);
    const std::vector<Evaluation> points = frontier(graph, options);
    CHECK(result.stats.simulated_peak_after == least_peak_within(points, 1e30));
  }
  SECTION("the roofline profiles keep auto's single cut and write no knee") {
    const Graph graph = timed_blocks(3, 1e-3, 1e-3);
    PlanOptions options;
    options.config = parse_config(R"({"ac_mode": "auto"})");
    const PlanResult result = plan(graph, options);
    CHECK(result.stats.step_seconds == -1.0);
    CHECK(result.stats.lambda == effective_lambda(options.config.mincut));
    CHECK(plan_to_json(graph, result).find("\"step_seconds\"") == std::string::npos);
  }
  SECTION("a roofline profile with a peak oracle takes the knee too: plans are judged on the compiled step") {
    const Graph graph = timed_blocks(3, 1e-3, 1e-3);
    PlanOptions roofline;
    roofline.config = parse_config(R"({"ac_mode": "auto"})");
    PlanOptions options = roofline;
    std::size_t asked = 0;
    options.peak_oracle = [&](const std::string&) -> std::int64_t {
      ++asked;
      return -1;  // cannot tell: the simulation stands
    };
    const PlanResult result = plan(graph, options);
    const PlanResult single_cut = plan(graph, roofline);
    const double base = check_knee_stats(graph, options, result);
    CHECK(result.stats.recompute_seconds <= kKneeSlowdown * base);
    CHECK(result.stats.simulated_peak_after <= least_peak_within(frontier(graph, options), kKneeSlowdown * base));
    // The knee is a different plan from the fixed exchange rate's cut here, or this checks nothing new.
    CHECK(result.stats.simulated_peak_after != single_cut.stats.simulated_peak_after);
    CHECK(asked >= 1);  // and it is measured, as every plan with an oracle is
    CHECK(plan_to_json(graph, result).find("chose the knee") != std::string::npos);
  }
}

TEST_CASE("the knee finds cuts between frontier points: descended within a peak, inside the allowance",
          "[cost][plan][knee]") {
  // The allowance moved across the frontier's gaps by the mms' times.
  int between = 0;
  for (const double mm : {1e-5, 3e-5, 1e-4, 3e-4, 1e-3})
    for (const double backward_mm : {1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1}) {
      const Graph graph = timed_blocks(4, mm, backward_mm);
      const PlanOptions options = measured_auto();
      const PlanResult result = plan(graph, options);
      const double allowance = result.stats.knee_allowance_seconds;
      const std::vector<Evaluation> points = frontier(graph, options);
      INFO("mm " << mm << " s, backward mm " << backward_mm << " s");
      CHECK(result.stats.recompute_seconds <= allowance);
      const std::int64_t walk = least_peak_within(points, allowance);
      CHECK(result.stats.simulated_peak_after <= walk);
      if (result.stats.simulated_peak_after < walk) {
        ++between;
        // Down to the next lower frontier point (past the allowance) at most:
        // it, or a cut above it, saved again within a peak.
        std::int64_t next_lower = -1;
        for (const auto& p : points)
          if (p.simulated_peak_bytes < walk) next_lower = std::max(next_lower, p.simulated_peak_bytes);
        CHECK(result.stats.simulated_peak_after >= next_lower);
        CHECK(plan_to_json(graph, result).find("found between frontier points") != std::string::npos);
      }
    }
  // The descent must matter somewhere in the sweep, or this test checks nothing new.
  CHECK(between > 0);
}
