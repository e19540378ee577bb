// Min-cut stage: hand-built joint graphs in the spirit of PyTorch's
// partitioner tests, lambda sweeps, infeasible tags, and a brute-force
// property test on random DAGs.
#include <catch2/catch.hpp>

#include <limits>
#include <set>
#include <sstream>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hyper_ac/alias.h"
#include "hyper_ac/mincut.h"
#include "hyper_ac/plan.h"
#include "hyper_ac/remat.h"

using namespace hyper_ac;

namespace {

// Builds a Graph directly (no JSON): forward ops, backward ops, an output.
class Net {
 public:
  std::int32_t input(const std::string& name, std::int64_t bytes, Role role = Role::Input) {
    Node node;
    node.kind = NodeKind::Placeholder;
    node.target = name;
    node.role = role;
    node.outputs = {{bytes, "float32", {bytes / 4}}};
    return push(name, std::move(node));
  }
  std::int32_t tangent(const std::string& name, std::int64_t bytes) {
    std::int32_t i = input(name, bytes, Role::Tangent);
    graph_.nodes[static_cast<std::size_t>(i)].phase = Phase::Backward;
    return i;
  }
  std::int32_t fw(const std::string& name, const std::string& target, const std::vector<std::string>& inputs,
                  std::int64_t bytes, double flops = 0.0) {
    return op(name, target, inputs, bytes, flops, Phase::Forward);
  }
  std::int32_t bw(const std::string& name, const std::vector<std::string>& inputs, std::int64_t bytes = 16) {
    return op(name, "aten::bw.default", inputs, bytes, 0.0, Phase::Backward);
  }
  std::int32_t view(const std::string& name, const std::string& base, std::int64_t bytes) {
    std::int32_t i = fw(name, "aten::view.default", {base}, bytes);
    node(name).view = true;
    node(name).aliased_inputs = {0};
    return i;
  }
  std::int32_t output(const std::vector<std::string>& inputs) {
    Node node;
    node.kind = NodeKind::Output;
    node.phase = Phase::Backward;
    for (const auto& input : inputs) node.inputs.push_back(at(input));
    return push("output", std::move(node));
  }
  Node& node(const std::string& name) { return graph_.nodes[static_cast<std::size_t>(at(name))]; }
  std::int32_t at(const std::string& name) const { return ids_.at(name); }

  Graph graph() const {
    Graph g = graph_;
    g.finalize();
    return g;
  }
  // Every forward call_function gets `fallback`, except the named overrides.
  std::vector<Policy> tags(Policy fallback, const std::map<std::string, Policy>& overrides = {}) const {
    std::vector<Policy> tags(graph_.nodes.size(), Policy::None);
    for (std::size_t i = 0; i < graph_.nodes.size(); ++i) {
      const Node& n = graph_.nodes[i];
      if (n.is_forward() && n.kind == NodeKind::CallFunction) tags[i] = fallback;
      auto it = overrides.find(n.name);
      if (it != overrides.end()) tags[i] = it->second;
    }
    return tags;
  }
  std::vector<std::string> names(const std::vector<std::int32_t>& indices) const {
    std::vector<std::string> out;
    for (auto i : indices) out.push_back(graph_.nodes[static_cast<std::size_t>(i)].name);
    return out;
  }

 private:
  std::int32_t op(const std::string& name, const std::string& target, const std::vector<std::string>& inputs,
                  std::int64_t bytes, double flops, Phase phase) {
    Node node;
    node.target = target;
    node.phase = phase;
    node.flops = flops;
    node.outputs = {{bytes, "float32", {bytes / 4}}};
    for (const auto& input : inputs) node.inputs.push_back(at(input));
    return push(name, std::move(node));
  }
  std::int32_t push(const std::string& name, Node node) {
    node.name = name;
    node.id = static_cast<std::int64_t>(graph_.nodes.size());
    auto index = static_cast<std::int32_t>(graph_.nodes.size());
    graph_.nodes.push_back(std::move(node));
    ids_[name] = index;
    return index;
  }

  Graph graph_;
  std::map<std::string, std::int32_t> ids_;
};

using Names = std::vector<std::string>;

// A GPU-like roofline with round numbers: 1e14 FLOP/s, 1e12 B/s. A pointwise
// op over N bytes (reads N, writes N) then costs 2N / 1e12 seconds.
MinCutOptions gpu(double lambda) {
  MinCutOptions options;
  options.lambda = lambda;
  options.cost.hardware = {"test-gpu", 1.0e14, 1.0e12};
  options.prefer_save_factor = 1.0;
  options.prefer_recompute_factor = 1.0;
  return options;
}

}  // namespace

TEST_CASE("a cos chain saves only its input", "[mincut]") {
  const std::int64_t N = 1000000;
  for (bool input_is_activation : {false, true}) {
    Net net;
    net.input("x0", N);
    net.input("w", N, Role::Parameter);
    // The chain's input: a graph input, or an mm output pinned MUST_SAVE.
    if (input_is_activation)
      net.fw("x", "aten::mm.default", {"x0", "w"}, N, 1e9);
    else
      net.input("x", N);
    net.fw("c1", "aten::cos.default", {"x"}, N);
    net.fw("c2", "aten::cos.default", {"c1"}, N);
    net.fw("c3", "aten::cos.default", {"c2"}, N);
    net.tangent("t", N);
    // d cos(u) = -sin(u): every cos's backward reads its input.
    net.bw("g3", {"t", "c2"});
    net.bw("g2", {"g3", "c1"});
    net.bw("g1", {"g2", "x"});
    net.output({"c3", "g1"});
    Graph g = net.graph();
    auto tags = net.tags(Policy::PreferRecompute, {{"x", Policy::MustSave}});
    MinCutResult r = solve_min_cut(g, tags, gpu(1e11));
    INFO("input_is_activation " << input_is_activation);
    CHECK(net.names(r.recomputed) == Names{"c1", "c2"});
    CHECK(net.names(r.saved) == (input_is_activation ? Names{"x"} : Names{}));
    CHECK(r.saved_bytes == (input_is_activation ? N : 0));
    CHECK(r.policies[static_cast<std::size_t>(net.at("c1"))] == Policy::PreferRecompute);
    CHECK(r.policies[static_cast<std::size_t>(net.at("c2"))] == Policy::PreferRecompute);
    // c3 is a forward output: kept by the forward, never recomputed; its tag stays.
    CHECK(r.policies[static_cast<std::size_t>(net.at("c3"))] == Policy::PreferRecompute);
    CHECK(r.recompute_seconds == Approx(2 * 2.0 * N / 1e12));
  }
}

TEST_CASE("a sum of four inputs followed by two cos saves the single sum", "[mincut]") {
  const std::int64_t N = 1000000;
  Net net;
  for (const char* name : {"a", "b", "c", "d"}) net.input(name, N);
  net.fw("s1", "aten::add.Tensor", {"a", "b"}, N);
  net.fw("s2", "aten::add.Tensor", {"s1", "c"}, N);
  net.fw("s3", "aten::add.Tensor", {"s2", "d"}, N);
  net.fw("k1", "aten::cos.default", {"s3"}, N);
  net.fw("k2", "aten::cos.default", {"k1"}, N);
  net.tangent("t", N);
  net.bw("g2", {"t", "k1"});
  net.bw("g1", {"g2", "s3"});
  net.output({"k2", "g1"});
  Graph g = net.graph();
  // An add moves 3N bytes (0.75 N at lambda 2.5e11), a cos 2N (0.5 N):
  // recomputing the three adds (2.25 N) loses to saving s3 (N); recomputing
  // the cos (0.5 N) beats saving k1 (N).
  MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), gpu(2.5e11));
  CHECK(net.names(r.saved) == Names{"s3"});
  CHECK(net.names(r.recomputed) == Names{"k1"});
  CHECK(r.saved_bytes == N);
  CHECK(r.objective == Approx(N + 2.5e11 * 2.0 * N / 1e12));
  CHECK(r.policies[static_cast<std::size_t>(net.at("s3"))] == Policy::PreferSave);
}

TEST_CASE("mm -> tanh -> tanh saves the mm output", "[mincut]") {
  // Mixed precision: the mm writes bf16 (N bytes), the tanhs fp32 (2N): one
  // saved mm output plus two cheap recomputes beats any saved tanh.
  const std::int64_t N = 1000000;
  Net net;
  net.input("x", N);
  net.input("w", N, Role::Parameter);
  net.fw("mm", "aten::mm.default", {"x", "w"}, N, 1e11);  // 1 ms: 10 N at lambda 1e10
  net.fw("t1", "aten::tanh.default", {"mm"}, 2 * N);
  net.fw("t2", "aten::tanh.default", {"t1"}, 2 * N);
  net.tangent("t", 2 * N);
  net.bw("g2", {"t", "t2"});  // tanh' = 1 - tanh^2 reads the output
  net.bw("g1", {"g2", "t1"});
  net.bw("gw", {"g1", "x"});
  net.output({"gw"});
  Graph g = net.graph();
  for (Policy mm_tag : {Policy::MustSave, Policy::PreferSave, Policy::PreferRecompute}) {
    INFO("mm tag " << to_string(mm_tag));
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute, {{"mm", mm_tag}}), gpu(1e10));
    CHECK(net.names(r.saved) == Names{"mm"});
    CHECK(net.names(r.recomputed) == Names{"t1", "t2"});
    CHECK(r.policies[static_cast<std::size_t>(net.at("mm"))] ==
          (mm_tag == Policy::MustSave ? Policy::MustSave : Policy::PreferSave));
  }
}

TEST_CASE("a reduction saves the size, not the tensor", "[mincut]") {
  const std::int64_t N = 1000000;
  for (Policy size_tag : {Policy::MustSave, Policy::PreferRecompute}) {
    Net net;
    net.input("x", N);
    net.fw("c", "aten::cos.default", {"x"}, N);
    net.fw("size", "aten::sym_size.int", {"c"}, 0);
    net.node("size").symint = true;
    net.node("size").outputs.clear();
    net.fw("s", "aten::sum.default", {"c"}, 4);
    net.tangent("t", 4);
    net.bw("e", {"t", "size"});  // expand the gradient back to c's shape
    net.bw("gx", {"e", "x"});
    net.output({"s", "gx"});
    Graph g = net.graph();
    INFO("size tag " << to_string(size_tag));
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute, {{"size", size_tag}}), gpu(1e11));
    CHECK(net.names(r.saved) == Names{"size"});
    CHECK(r.recomputed.empty());
    CHECK(r.saved_bytes == 0);
    CHECK(r.objective == Approx(1.0));  // symint_bytes
  }
}

namespace {

// x → h1 = mm(x, w1) → a1 = relu → h2 = mm(a1, w2) → a2 = relu → loss; the
// backward reads a1 and a2. Pointwise ops take 2 µs, mm1 10 µs, mm2 20 µs;
// activations are N = 1e6 bytes. Cuts:
//   keep {a1, a2}:               2N
//   keep {a2}, recompute h1, a1: N + 12 µs · λ   (optimal for 4.55e10 < λ < 8.33e10)
//   recompute everything:        34 µs · λ
Net mlp_net() {
  const std::int64_t N = 1000000;
  Net net;
  net.input("x", N);
  net.input("w1", N, Role::Parameter);
  net.input("w2", N, Role::Parameter);
  net.fw("h1", "aten::mm.default", {"x", "w1"}, N, 1e9);
  net.fw("a1", "aten::relu.default", {"h1"}, N);
  net.fw("h2", "aten::mm.default", {"a1", "w2"}, N, 2e9);
  net.fw("a2", "aten::relu.default", {"h2"}, N);
  net.fw("loss", "aten::sum.default", {"a2"}, 4);
  net.tangent("t", 4);
  net.bw("g2", {"t", "a2"});
  net.bw("gw2", {"g2", "a1"});
  net.bw("g1", {"gw2", "a1", "w2"});
  net.bw("gw1", {"g1", "x"});
  net.output({"loss", "gw1", "gw2"});
  return net;
}

}  // namespace

TEST_CASE("an MLP's saved set follows lambda", "[mincut]") {
  Net net = mlp_net();
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute);
  struct Case {
    double lambda;
    Names saved;
    Names recomputed;
  };
  for (const Case& c : {Case{1e9, {}, {"h1", "a1", "h2", "a2"}}, Case{4e10, {}, {"h1", "a1", "h2", "a2"}},
                        Case{6e10, {"a2"}, {"h1", "a1"}}, Case{8e10, {"a2"}, {"h1", "a1"}},
                        Case{9e10, {"a1", "a2"}, {}}, Case{1e13, {"a1", "a2"}, {}}}) {
    INFO("lambda " << c.lambda);
    for (auto algorithm : {MaxFlowAlgorithm::BoykovKolmogorov, MaxFlowAlgorithm::PushRelabel}) {
      MinCutOptions options = gpu(c.lambda);
      options.algorithm = algorithm;
      MinCutResult r = solve_min_cut(g, tags, options);
      CHECK(net.names(r.saved) == c.saved);
      CHECK(net.names(r.recomputed) == c.recomputed);
    }
  }

  SECTION("the frontier finds exactly the three cuts") {
    FrontierOptions sweep;
    sweep.lambda_min = 1e6;
    sweep.lambda_max = 1e16;
    FrontierResult frontier = frontier_cuts(g, tags, gpu(1e10), sweep);
    CHECK(frontier.complete);
    CHECK(frontier.solves <= 5);
    const auto& points = frontier.points;
    REQUIRE(points.size() == 3);
    CHECK(net.names(points[0].saved) == Names{"a1", "a2"});
    CHECK(net.names(points[1].saved) == Names{"a2"});
    CHECK(net.names(points[2].saved).empty());
    CHECK(points[0].recompute_seconds == 0.0);
    CHECK(points[1].recompute_seconds == Approx(12e-6));
    CHECK(points[2].recompute_seconds == Approx(34e-6));
    CHECK(points[2].recompute_flops == Approx(3e9));
    for (std::size_t i = 1; i < points.size(); ++i) {
      CHECK(points[i].saved_bytes < points[i - 1].saved_bytes);
      CHECK(points[i].recompute_seconds > points[i - 1].recompute_seconds);
      CHECK(points[i].lambda < points[i - 1].lambda);
    }
    // Policies are ready for plan_remat.
    CHECK(points[1].policies[static_cast<std::size_t>(net.at("a1"))] == Policy::PreferRecompute);
    CHECK(points[1].policies[static_cast<std::size_t>(net.at("a2"))] == Policy::PreferSave);
  }

  SECTION("PREFER_SAVE makes recomputing an mm look twice as expensive") {
    // With the bias, recomputing h1 (10 µs → 20 µs) moves the middle cut's
    // upper breakpoint from 8.33e10 to N / 22 µs = 4.55e10: the middle cut vanishes.
    MinCutOptions options = gpu(6e10);
    options.prefer_save_factor = 2.0;
    auto biased = net.tags(Policy::PreferRecompute, {{"h1", Policy::PreferSave}, {"h2", Policy::PreferSave}});
    MinCutResult r = solve_min_cut(g, biased, options);
    CHECK(net.names(r.saved) == Names{"a1", "a2"});
  }
}

TEST_CASE("an RNG op is never recomputed, at any lambda", "[mincut]") {
  const std::int64_t N = 1000;
  Net net;
  net.input("x", N);
  net.fw("drop", "aten::native_dropout.default", {"x"}, N);
  net.node("drop").rng = true;
  net.fw("y", "aten::mul.Tensor", {"drop", "x"}, N);
  net.fw("z", "aten::cos.default", {"y"}, N);
  net.tangent("t", N);
  net.bw("gz", {"t", "y"});
  net.bw("gy", {"gz", "drop"});
  net.output({"z", "gy"});
  Graph g = net.graph();
  for (Policy drop_tag : {Policy::MustSave, Policy::PreferRecompute}) {
    auto tags = net.tags(Policy::PreferRecompute, {{"drop", drop_tag}});
    for (double lambda : {0.0, 1.0, 1e3, 1e6, 1e9, 1e12, 1e15, 1e20}) {
      INFO("tag " << to_string(drop_tag) << " lambda " << lambda);
      MinCutResult r = solve_min_cut(g, tags, gpu(lambda));
      auto recomputed = net.names(r.recomputed);
      CHECK(std::find(recomputed.begin(), recomputed.end(), "drop") == recomputed.end());
      CHECK(r.policies[static_cast<std::size_t>(net.at("drop"))] == Policy::MustSave);
    }
    for (const auto& point : frontier_cuts(g, tags, gpu(1.0)).points) {
      auto recomputed = net.names(point.recomputed);
      CHECK(std::find(recomputed.begin(), recomputed.end(), "drop") == recomputed.end());
    }
  }
}

TEST_CASE("views are never saved on their own; aliases of parameters are free", "[mincut]") {
  const std::int64_t N = 1000000;
  Net net;
  net.input("x", N);
  net.input("w", N, Role::Parameter);
  net.view("wt", "w", N);                       // t(w): free, like w
  net.fw("a", "aten::exp.default", {"x"}, N);
  net.view("v1", "a", N);
  net.view("v2", "v1", N);
  net.fw("m", "aten::mm.default", {"v2", "wt"}, N, 1e9);
  net.tangent("t", N);
  net.bw("g", {"t", "v2", "wt"});
  net.output({"m", "g"});
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute);
  SECTION("expensive recompute: the base is saved, the views rebuilt") {
    MinCutResult r = solve_min_cut(g, tags, gpu(1e13));
    CHECK(net.names(r.saved) == Names{"a"});
    CHECK(net.names(r.recomputed) == Names{"v1", "v2"});
    CHECK(r.recompute_seconds == 0.0);
    CHECK(r.stats.free_nodes >= 3);  // x, w, wt (and m, a forward output)
  }
  SECTION("cheap recompute: everything rebuilt from the input") {
    MinCutResult r = solve_min_cut(g, tags, gpu(1e9));
    CHECK(r.saved.empty());
    CHECK(net.names(r.recomputed) == Names{"a", "v1", "v2"});
  }
  SECTION("a pinned view is saved with its own bytes") {
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute, {{"v2", Policy::MustSave}}), gpu(1e9));
    CHECK(net.names(r.saved) == Names{"v2"});
    CHECK(r.policies[static_cast<std::size_t>(net.at("v2"))] == Policy::MustSave);
  }
}

TEST_CASE("an element of a multi-output view is never saved on its own", "[mincut]") {
  // qkv = mm(x, w); q, k, v = split(qkv): each getitem shares qkv's storage, so
  // saving v alone would keep all of qkv alive while the cut charged v's bytes.
  const std::int64_t N = 1000000;
  for (Compiler compiler : {Compiler::Eager, Compiler::Inductor}) {
    Net net;
    net.input("x", N);
    net.input("w", 3 * N, Role::Parameter);
    net.fw("qkv", "aten::mm.default", {"x", "w"}, 3 * N, 1e12);  // expensive to replay
    net.fw("sp", "aten::split.Tensor", {"qkv"}, N);
    net.node("sp").view = true;
    net.node("sp").aliased_inputs = {0};
    net.node("sp").outputs = {{N, "float32", {N / 4}}, {N, "float32", {N / 4}}, {N, "float32", {N / 4}}};
    for (const char* name : {"q", "k", "v"}) {
      net.fw(name, "operator.getitem", {"sp"}, N);
      net.node(name).aliased_inputs = {0};
    }
    net.fw("vc", "aten::clone.default", {"v"}, N);  // a contiguous copy: storage of its own
    net.fw("o", "aten::mm.default", {"q", "k", "vc"}, N, 1e9);
    for (const char* name : {"sp", "q", "k", "v", "vc"}) net.node(name).fusible = true;
    net.tangent("t", N);
    MinCutOptions options = gpu(2.5e11);
    options.cost.compiler = compiler;
    SECTION(std::string("the backward reads the element: its base is saved (") +
            (compiler == Compiler::Eager ? "eager)" : "inductor)")) {
      net.bw("g", {"t", "v"});
      net.output({"o", "g"});
      Graph g = net.graph();
      MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), options);
      CHECK(net.names(r.saved) == Names{"qkv"});
      CHECK(net.names(r.recomputed) == Names{"sp", "v"});
    }
    SECTION(std::string("the backward reads the element and a copy of it: the base is saved (") +
            (compiler == Compiler::Eager ? "eager)" : "inductor)")) {
      net.view("vt", "vc", N);
      net.bw("g", {"t", "v", "vt"});
      net.output({"o", "g"});
      Graph g = net.graph();
      // v itself is read too, so qkv is saved; vc is rebuilt from it (cheap) rather than saved.
      MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), options);
      CHECK(net.names(r.saved) == Names{"qkv"});
      CHECK(net.names(r.recomputed) == Names{"sp", "v", "vc", "vt"});
    }
  }
}

TEST_CASE("infeasible tags name the chain and the rule pinning each node", "[mincut][errors]") {
  Net net;
  net.input("x", 64);
  net.fw("noise", "aten::rand_like.default", {"x"}, 64);
  net.node("noise").rng = true;
  net.view("nv", "noise", 64);
  net.fw("m", "aten::mul.Tensor", {"nv", "x"}, 64);
  net.fw("out", "aten::sum.default", {"m"}, 4);
  net.tangent("t", 4);
  net.bw("gm", {"t", "m"});
  net.output({"out", "gm"});
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute, {{"noise", Policy::MustRecompute}, {"m", Policy::MustRecompute}});
  try {
    solve_min_cut(g, tags, gpu(1e10));
    FAIL("expected MinCutError");
  } catch (const MinCutError& error) {
    std::string message = error.what();
    INFO(message);
    for (const char* fragment : {"backward node 'gm' reads 'm'", "'m', which is never saved (tagged MUST_RECOMPUTE)",
                                 "recomputed from 'nv'", "'nv', which is never saved (a view",
                                 "recomputed from 'noise'", "'noise', which is never saved (tagged MUST_RECOMPUTE)",
                                 "never recomputed (an RNG op)"})
      CHECK(message.find(fragment) != std::string::npos);
    CHECK(message.find("unbounded") == std::string::npos);
  }
  // Saving the RNG op resolves it.
  tags[static_cast<std::size_t>(net.at("noise"))] = Policy::MustSave;
  MinCutResult r = solve_min_cut(g, tags, gpu(1e10));
  CHECK(net.names(r.saved) == Names{"noise"});
  CHECK(net.names(r.recomputed) == Names{"nv", "m"});
}

TEST_CASE("min-cut rejects bad arguments", "[mincut][errors]") {
  Net net = mlp_net();
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute);
  CHECK_THROWS_AS(solve_min_cut(g, std::vector<Policy>(3), gpu(1)), std::invalid_argument);
  CHECK_THROWS_AS(solve_min_cut(g, tags, gpu(-1)), std::invalid_argument);
  CHECK_THROWS_AS(solve_min_cut(g, tags, gpu(NAN)), std::invalid_argument);
  MinCutOptions zero = gpu(1);
  zero.cost.hardware.memory_bandwidth = 0;
  CHECK_THROWS_AS(solve_min_cut(g, tags, zero), std::invalid_argument);
  FrontierOptions backwards;
  backwards.lambda_min = 10;
  backwards.lambda_max = 1;
  CHECK_THROWS_AS(frontier_cuts(g, tags, gpu(1), backwards), std::invalid_argument);
}

namespace {

struct RandomCase {
  Net net;
  std::vector<Policy> tags;
};

// A random joint graph: inputs, parameters, forward ops with random tags,
// views, RNG ops and SymInts, backward nodes reading random forward values.
RandomCase random_case(std::mt19937& rng, int forward_ops, int backward_ops, int fusible_percent = 0) {
  RandomCase rc;
  Net& net = rc.net;
  std::uniform_int_distribution<int> percent(0, 99);
  std::vector<std::string> values;
  std::map<std::string, Policy> overrides;
  for (int i = 0; i < 2; ++i) {
    values.push_back("in" + std::to_string(i));
    net.input(values.back(), 1000 * (1 + percent(rng) % 8));
  }
  values.push_back("p0");
  net.input("p0", 4000, Role::Parameter);
  const Policy policies[] = {Policy::None, Policy::MustSave, Policy::PreferSave, Policy::PreferRecompute,
                             Policy::MustRecompute};
  std::vector<std::string> forward;
  for (int i = 0; i < forward_ops; ++i) {
    std::string name = "f" + std::to_string(i);
    std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
    std::vector<std::string> inputs{values[pick(rng)]};
    int kind = percent(rng);
    if (kind < 15) {
      net.view(name, inputs[0], 1000 * (1 + percent(rng) % 8));
      if (percent(rng) < fusible_percent) net.node(name).fusible = true;
    } else {
      if (percent(rng) < 60) {
        auto second = values[pick(rng)];
        if (second != inputs[0]) inputs.push_back(second);
      }
      net.fw(name, "aten::op.default", inputs, 1000 * (1 + percent(rng) % 8), 1e6 * (percent(rng) % 50));
      if (kind < 20) net.node(name).rng = true;
      if (percent(rng) < fusible_percent) net.node(name).fusible = true;
      if (kind >= 95) {
        net.node(name).symint = true;
        net.node(name).outputs.clear();
      }
    }
    int t = percent(rng);
    // Mostly PREFER_*; a few of each pin (and some contradictions).
    Policy tag = t < 8 ? policies[0] : t < 18 ? policies[1] : t < 45 ? policies[2] : t < 90 ? policies[3] : policies[4];
    overrides[name] = tag;
    values.push_back(name);
    forward.push_back(name);
  }
  net.tangent("t", 1000);
  std::string last = "t";
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  for (int i = 0; i < backward_ops; ++i) {
    std::string name = "b" + std::to_string(i);
    net.bw(name, {last, values[pick(rng)]});
    last = name;
  }
  net.output({forward.back(), last});
  rc.tags = net.tags(Policy::PreferRecompute, overrides);
  return rc;
}

// Independent model of the objective, for brute force. Returns -1 when the
// recompute set violates a rule (needs saving what can't be saved, or
// recomputes what can't be recomputed).
struct Model {
  const Graph& g;
  const std::vector<Policy>& tags;
  const MinCutOptions& options;
  std::vector<char> free, no_recompute, no_save;
  std::vector<double> bytes, seconds;
  // Inductor: fusion group per node (-1 = none), recomputed independently of cost.cc.
  std::vector<int> group;

  Model(const Graph& graph, const std::vector<Policy>& t, const MinCutOptions& o) : g(graph), tags(t), options(o) {
    const std::size_t n = g.nodes.size();
    free.assign(n, 0);
    no_recompute.assign(n, 0);
    no_save.assign(n, 0);
    bytes.assign(n, 0);
    seconds.assign(n, 0);
    std::vector<char> output_read(n, 0);
    for (const auto& node : g.nodes)
      if (node.kind == NodeKind::Output)
        for (auto x : node.inputs) output_read[static_cast<std::size_t>(x)] = 1;
    // Groups by flood fill over fusible forward call_function neighbours (either direction).
    group.assign(n, -1);
    auto member = [&](std::size_t i) {
      const Node& node = g.nodes[i];
      return options.cost.compiler == Compiler::Inductor && node.fusible && node.is_forward() &&
             node.kind == NodeKind::CallFunction && !node.rng && !node.symint;
    };
    int groups = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!member(i) || group[i] >= 0) continue;
      std::vector<std::size_t> stack{i};
      group[i] = groups;
      while (!stack.empty()) {
        auto v = stack.back();
        stack.pop_back();
        std::vector<std::size_t> next;
        for (auto x : g.nodes[v].inputs) next.push_back(static_cast<std::size_t>(x));
        for (std::size_t u = 0; u < n; ++u)
          for (auto x : g.nodes[u].inputs)
            if (static_cast<std::size_t>(x) == v) next.push_back(u);
        for (auto w : next)
          if (member(w) && group[w] < 0) {
            group[w] = groups;
            stack.push_back(w);
          }
      }
      ++groups;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = g.nodes[i];
      if (!node.is_forward()) continue;
      free[i] = node.kind != NodeKind::CallFunction ||
                (tags[i] != Policy::MustRecompute &&
                 (output_read[i] || (node.view && free[static_cast<std::size_t>(node.inputs[0])])));
      no_recompute[i] = tags[i] == Policy::None || tags[i] == Policy::MustSave || node.rng;
      no_save[i] = tags[i] == Policy::MustRecompute || (!no_recompute[i] && node.view);
      bytes[i] = node.symint ? 1.0 : static_cast<double>(node.output_bytes());
      if (tags[i] == Policy::PreferRecompute) bytes[i] *= options.prefer_recompute_factor;
      if (group[i] >= 0) {
        // FLOPs, plus the write when the value leaves the group (views write nothing).
        seconds[i] = node.flops / options.cost.hardware.peak_flops +
                     (leaves(i) && !node.view ? static_cast<double>(node.output_bytes()) / options.cost.hardware.memory_bandwidth
                                              : 0.0);
      } else {
        seconds[i] = recompute_seconds(g, static_cast<std::int32_t>(i), options.cost);
      }
      if (tags[i] == Policy::PreferSave) seconds[i] *= options.prefer_save_factor;
    }
  }
  bool network(std::int32_t i) const {
    return g.nodes[static_cast<std::size_t>(i)].is_forward() && !free[static_cast<std::size_t>(i)];
  }
  // A group member's value leaves its kernel: some user outside the group, or a
  // view/getitem of it in the group whose own value leaves.
  bool leaves(std::size_t i) const {
    for (std::size_t u = 0; u < g.nodes.size(); ++u)
      for (auto x : g.nodes[u].inputs)
        if (static_cast<std::size_t>(x) == i &&
            (group[u] != group[i] || ((is_view_like(g.nodes[u]) || is_getitem(g.nodes[u])) && leaves(u))))
          return true;
    return false;
  }
  // What replayed member k reads: a view reads nothing; others read their
  // inputs, through replayed views of the same group.
  void reads_of(std::size_t k, const std::vector<char>& replayed, std::set<std::int32_t>& out) const {
    for (auto x : g.nodes[k].inputs) {
      auto u = static_cast<std::size_t>(x);
      if (replayed[u] && group[u] == group[k] && is_view_like(g.nodes[u]))
        reads_of(u, replayed, out);
      else
        out.insert(x);
    }
  }
  double cost(const std::vector<char>& recompute) const {
    const std::size_t n = g.nodes.size();
    std::vector<char> needed(n, 0);
    for (const auto& node : g.nodes)
      if (node.is_backward() && node.kind != NodeKind::Output)
        for (auto x : node.inputs)
          if (network(x)) needed[static_cast<std::size_t>(x)] = 1;
    double total = 0;
    std::vector<char> replayed(n, 0);
    for (std::size_t k = n; k-- > 0;) {
      if (!needed[k]) continue;
      if (recompute[k]) {
        if (no_recompute[k]) return -1;
        replayed[k] = 1;
        total += options.lambda * seconds[k];
        for (auto x : g.nodes[k].inputs)
          if (network(x)) needed[static_cast<std::size_t>(x)] = 1;
      } else {
        if (no_save[k]) return -1;
        total += bytes[k];
      }
    }
    // Group reads: each distinct (input, group) pair a replayed member reads,
    // unless the input is replayed in the same group.
    std::set<std::pair<std::int32_t, int>> reads;
    for (std::size_t k = 0; k < n; ++k) {
      if (!replayed[k] || group[k] < 0 || is_view_like(g.nodes[k])) continue;
      std::set<std::int32_t> read;
      reads_of(k, replayed, read);
      for (auto x : read) {
        auto u = static_cast<std::size_t>(x);
        if (replayed[u] && group[u] == group[k]) continue;
        if (g.nodes[u].symint || !reads.emplace(x, group[k]).second) continue;
        total += options.lambda * static_cast<double>(g.nodes[u].output_bytes()) / options.cost.hardware.memory_bandwidth;
      }
    }
    return total;
  }
  // The nodes a cut may recompute: in the network and not pinned to saving.
  std::vector<std::size_t> choosable() const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      if (network(static_cast<std::int32_t>(i)) && !no_recompute[i]) out.push_back(i);
    return out;
  }
  // The least cost over every subset of choosable() recomputed: the oracle the
  // cut is checked against (-1: no subset obeys the rules).
  double brute_force() const {
    const std::vector<std::size_t> nodes = choosable();
    REQUIRE(nodes.size() <= 16);
    double best = -1;
    std::vector<char> recompute(g.nodes.size(), 0);
    for (std::uint32_t mask = 0; mask < (1u << nodes.size()); ++mask) {
      for (std::size_t k = 0; k < nodes.size(); ++k) recompute[nodes[k]] = (mask >> k) & 1u;
      const double c = cost(recompute);
      if (c >= 0 && (best < 0 || c < best)) best = c;
    }
    return best;
  }
};

}  // namespace

TEST_CASE("random DAGs: the cut obeys every rule and matches brute force", "[mincut]") {
  std::mt19937 rng(20240531);
  int feasible = 0, infeasible = 0, nontrivial = 0;
  for (int round = 0; round < 300; ++round) {
    RandomCase rc = random_case(rng, 6 + round % 9, 5);
    Graph g = rc.net.graph();
    const double lambdas[] = {1e8, 1e10, 3e11, 1e13};
    MinCutOptions options = gpu(lambdas[round % 4]);
    options.prefer_save_factor = 1.5;
    options.prefer_recompute_factor = 1.25;
    Model model(g, rc.tags, options);

    const double best = model.brute_force();
    std::vector<char> recompute(g.nodes.size(), 0);

    INFO("round " << round);
    MinCutResult r;
    try {
      r = solve_min_cut(g, rc.tags, options);
    } catch (const MinCutError& error) {
      INFO(error.what());
      CHECK(best < 0);  // brute force agrees: nothing is feasible
      ++infeasible;
      continue;
    }
    ++feasible;
    REQUIRE(best >= 0);
    std::fill(recompute.begin(), recompute.end(), 0);
    for (auto i : r.recomputed) recompute[static_cast<std::size_t>(i)] = 1;
    double mine = model.cost(recompute);
    REQUIRE(mine >= 0);  // the cut obeys every rule
    CHECK(mine == Approx(best).epsilon(1e-9).margin(4.0));
    CHECK(r.objective == Approx(mine).epsilon(1e-9).margin(1e-6));
    if (!r.recomputed.empty() && !r.saved.empty()) ++nontrivial;

    // Every value the backward reads is saved, free or recomputed, and every
    // recomputed node's inputs are too.
    std::vector<char> available(g.nodes.size(), 0);
    for (auto i : r.saved) available[static_cast<std::size_t>(i)] = 1;
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      if (!model.network(static_cast<std::int32_t>(i))) available[i] = 1;
    for (auto i : r.recomputed) {
      for (auto x : g.nodes[static_cast<std::size_t>(i)].inputs) CHECK(available[static_cast<std::size_t>(x)]);
      available[static_cast<std::size_t>(i)] = 1;
      CHECK(rc.tags[static_cast<std::size_t>(i)] != Policy::MustSave);
      CHECK_FALSE(g.nodes[static_cast<std::size_t>(i)].rng);
      CHECK(is_recompute(r.policies[static_cast<std::size_t>(i)]));
    }
    for (const auto& node : g.nodes)
      if (node.is_backward() && node.kind != NodeKind::Output)
        for (auto x : node.inputs) CHECK(available[static_cast<std::size_t>(x)]);
    for (auto i : r.saved) {
      CHECK(rc.tags[static_cast<std::size_t>(i)] != Policy::MustRecompute);
      CHECK_FALSE(is_recompute(r.policies[static_cast<std::size_t>(i)]));
    }

    // plan_remat turns the policies into exactly the cut's duplicates; it
    // also counts the free call_function values (aliases of parameters,
    // forward outputs) the backward reads as saved.
    RematPlan plan = plan_remat(g, r.policies);
    std::vector<std::int32_t> duplicated;
    for (const auto& dup : plan.duplicates) duplicated.push_back(dup.of);
    // Duplicates come in schedule order (one replay segment here: no units).
    std::sort(duplicated.begin(), duplicated.end());
    CHECK(duplicated == r.recomputed);
    // Saved bytes count storage once (a view keeps its base, parameters are
    // not activations), and cover everything the cut saved.
    const auto roots = storage_roots(g);
    std::set<std::int32_t> plan_roots, cut_roots;
    auto activation = [&](std::int32_t i) {
      const Node& node = g.nodes[static_cast<std::size_t>(i)];
      return node.is_forward() && node.kind == NodeKind::CallFunction;
    };
    for (auto i : plan.saved)
      if (activation(roots[static_cast<std::size_t>(i)])) plan_roots.insert(roots[static_cast<std::size_t>(i)]);
    for (auto i : r.saved)
      if (activation(roots[static_cast<std::size_t>(i)])) cut_roots.insert(roots[static_cast<std::size_t>(i)]);
    auto bytes_of = [&](const std::set<std::int32_t>& set) {
      std::int64_t total = 0;
      for (auto i : set) total += g.nodes[static_cast<std::size_t>(i)].output_bytes();
      return total;
    };
    CHECK(plan.stats.saved_bytes_after == bytes_of(plan_roots));
    CHECK(std::includes(plan_roots.begin(), plan_roots.end(), cut_roots.begin(), cut_roots.end()));

    // The frontier holds the optimum for every lambda in its range.
    if (round % 5 == 0) {
      MinCutOptions neutral = gpu(1.0);
      FrontierOptions sweep;
      sweep.lambda_min = 1e6;
      sweep.lambda_max = 1e14;
      FrontierResult frontier = frontier_cuts(g, rc.tags, neutral, sweep);
      CHECK(frontier.complete);
      for (double lambda : {1e6, 3e7, 1e9, 2e10, 7e10, 4e11, 1e13, 1e14}) {
        neutral.lambda = lambda;
        MinCutResult direct = solve_min_cut(g, rc.tags, neutral);
        double best_point = -1;
        for (const auto& p : frontier.points) {
          double value = static_cast<double>(p.saved_bytes) + lambda * p.recompute_seconds;
          if (best_point < 0 || value < best_point) best_point = value;
        }
        double direct_value = static_cast<double>(direct.saved_bytes) + lambda * direct.recompute_seconds;
        CHECK(best_point == Approx(direct_value).epsilon(1e-9).margin(32.0));
      }
    }

    // Deterministic, and both solvers find the same (minimal) cut.
    MinCutOptions other = options;
    other.algorithm = MaxFlowAlgorithm::PushRelabel;
    MinCutResult again = solve_min_cut(g, rc.tags, options);
    MinCutResult pr = solve_min_cut(g, rc.tags, other);
    CHECK(again.policies == r.policies);
    CHECK(again.saved == r.saved);
    CHECK(again.stats.max_flow == r.stats.max_flow);
    CHECK(again.diagnostics == r.diagnostics);
    CHECK(pr.policies == r.policies);
    CHECK(pr.recomputed == r.recomputed);
    CHECK(pr.stats.max_flow == r.stats.max_flow);
  }
  CHECK(feasible > 150);
  CHECK(infeasible > 0);
  CHECK(nontrivial > 20);
}

namespace {

// Layered random graph: `layers` x `width` forward ops each reading one or two
// values of the previous layer; a backward node for every 4th forward op.
Graph layered_graph(std::size_t layers, std::size_t width, std::vector<Policy>& tags, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> column(0, width - 1);
  std::uniform_int_distribution<int> percent(0, 99);
  Graph g;
  auto add = [&](NodeKind kind, Phase phase, std::vector<std::int32_t> inputs, std::int64_t bytes, double flops) {
    Node node;
    node.id = static_cast<std::int64_t>(g.nodes.size());
    node.name = "n" + std::to_string(g.nodes.size());
    node.kind = kind;
    node.target = kind == NodeKind::Placeholder ? node.name : "aten::op.default";
    node.phase = phase;
    node.inputs = std::move(inputs);
    node.outputs = {{bytes, "float32", {bytes / 4}}};
    node.flops = flops;
    g.nodes.push_back(std::move(node));
    return static_cast<std::int32_t>(g.nodes.size() - 1);
  };
  std::vector<std::int32_t> previous;
  for (std::size_t c = 0; c < width; ++c) previous.push_back(add(NodeKind::Placeholder, Phase::Forward, {}, 1 << 20, 0));
  std::vector<std::int32_t> forward;
  for (std::size_t l = 0; l < layers; ++l) {
    std::vector<std::int32_t> current;
    for (std::size_t c = 0; c < width; ++c) {
      std::vector<std::int32_t> inputs{previous[c]};
      auto other = previous[column(rng)];
      if (other != inputs[0] && percent(rng) < 50) inputs.push_back(other);
      std::int64_t bytes = (1 + percent(rng) % 16) << 18;
      double flops = percent(rng) < 20 ? 1e10 : 1e6;
      auto i = add(NodeKind::CallFunction, Phase::Forward, inputs, bytes, flops);
      current.push_back(i);
      forward.push_back(i);
    }
    previous = std::move(current);
  }
  for (std::size_t k = 0; k < forward.size(); k += 4) add(NodeKind::CallFunction, Phase::Backward, {forward[k]}, 64, 0);
  tags.assign(g.nodes.size(), Policy::None);
  for (auto i : forward) {
    int p = percent(rng);
    tags[static_cast<std::size_t>(i)] = p < 5 ? Policy::MustSave : p < 25 ? Policy::PreferSave : Policy::PreferRecompute;
  }
  g.finalize();
  return g;
}

}  // namespace

TEST_CASE("a mid-size layered graph solves identically with both algorithms", "[mincut]") {
  std::vector<Policy> tags;
  Graph g = layered_graph(200, 50, tags, 7);
  MinCutOptions bk = gpu(1e10), pr = gpu(1e10);
  pr.algorithm = MaxFlowAlgorithm::PushRelabel;
  MinCutResult a = solve_min_cut(g, tags, bk);
  MinCutResult b = solve_min_cut(g, tags, pr);
  CHECK(a.policies == b.policies);
  CHECK(a.stats.max_flow == b.stats.max_flow);
  CHECK(a.saved_bytes == b.saved_bytes);
  CHECK_FALSE(a.recomputed.empty());
  CHECK_FALSE(a.saved.empty());
}

TEST_CASE("1M-node layered graph timing", "[.bench]") {
  std::vector<Policy> tags;
  auto t0 = std::chrono::steady_clock::now();
  Graph g = layered_graph(4000, 200, tags, 11);  // 800k forward + 200k backward
  double build = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "graph: " << g.nodes.size() << " nodes, built in " << build << " s\n";
  for (double lambda : {1e9, 1e10, 1e11}) {
    for (auto algorithm : {MaxFlowAlgorithm::BoykovKolmogorov, MaxFlowAlgorithm::PushRelabel}) {
      MinCutOptions options = gpu(lambda);
      options.algorithm = algorithm;
      MinCutResult r = solve_min_cut(g, tags, options);
      std::cout << to_string(algorithm) << " lambda " << lambda << ": " << r.solve_seconds << " s, network "
                << r.stats.network_vertices << " vertices / " << r.stats.network_edges << " edges, saved "
                << r.saved.size() << " (" << format_bytes(r.saved_bytes) << "), recomputed " << r.recomputed.size()
                << ", max flow " << r.stats.max_flow << "\n";
    }
  }
  FrontierOptions sweep;
  sweep.max_solves = 16;
  FrontierResult frontier = frontier_cuts(g, tags, gpu(1e10), sweep);
  std::cout << "frontier_cuts: " << frontier.points.size() << " points from " << frontier.solves << " solves in "
            << frontier.solve_seconds << " s (complete: " << frontier.complete << ")\n";
  // One evaluation (plan_remat + simulate_memory + cost), what each step of
  // budget mode's descent costs (descent_cap, plan_search.h: 33 of them at most on 1M nodes).
  for (const auto& point : {frontier.points.front(), frontier.points.back()}) {
    const Evaluation e = evaluate(g, point.policies, gpu(1e10).cost);
    std::cout << "evaluate (" << e.nodes_duplicated << " duplicates): remat " << e.remat_seconds << " s, simulate "
              << e.simulate_seconds << " s\n";
  }
  SUCCEED();
}

namespace {

// Edmonds-Karp over a DIMACS max-flow text: an independent check that the
// exported network carries the flow the core reports.
std::int64_t dimacs_max_flow(const std::string& text, std::size_t& vertices, std::size_t& arcs, std::int64_t& reported) {
  std::istringstream in(text);
  std::string line;
  std::size_t n = 0, source = 0, sink = 0;
  std::vector<std::map<std::size_t, std::int64_t>> cap;
  arcs = 0;
  reported = -1;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "p") {
      std::string max;
      std::size_t m = 0;
      words >> max >> n >> m;
      cap.assign(n + 1, {});
      vertices = n;
    } else if (kind == "n") {
      std::size_t v = 0;
      std::string role;
      words >> v >> role;
      (role == "s" ? source : sink) = v;
    } else if (kind == "a") {
      std::size_t u = 0, v = 0;
      std::int64_t c = 0;
      words >> u >> v >> c;
      cap[u][v] += c;
      cap[v][u] += 0;  // the reverse residual arc
      ++arcs;
    } else if (kind == "c") {
      std::string what;
      words >> what;
      if (what == "max_flow") words >> reported;
    }
  }
  std::int64_t flow = 0;
  while (true) {
    std::vector<std::size_t> parent(n + 1, 0);
    std::vector<char> seen(n + 1, 0);
    std::vector<std::size_t> queue{source};
    seen[source] = 1;
    for (std::size_t head = 0; head < queue.size() && !seen[sink]; ++head)
      for (auto& [v, c] : cap[queue[head]])
        if (c > 0 && !seen[v]) {
          seen[v] = 1;
          parent[v] = queue[head];
          queue.push_back(v);
        }
    if (!seen[sink]) return flow;
    std::int64_t push = std::numeric_limits<std::int64_t>::max();
    for (std::size_t v = sink; v != source; v = parent[v]) push = std::min(push, cap[parent[v]][v]);
    for (std::size_t v = sink; v != source; v = parent[v]) {
      cap[parent[v]][v] -= push;
      cap[v][parent[v]] += push;
    }
    flow += push;
  }
}

}  // namespace

TEST_CASE("random DAGs with fusion groups (inductor): the cut matches brute force", "[mincut][fusion]") {
  std::mt19937 rng(20261130);
  int feasible = 0, grouped = 0, differs = 0;
  for (int round = 0; round < 300; ++round) {
    RandomCase rc = random_case(rng, 6 + round % 9, 5, 70);
    Graph g = rc.net.graph();
    const double lambdas[] = {1e10, 3e11, 1e12, 1e13};
    MinCutOptions options = gpu(lambdas[round % 4]);
    options.cost.compiler = Compiler::Inductor;
    options.prefer_save_factor = 1.5;
    options.prefer_recompute_factor = 1.25;
    Model model(g, rc.tags, options);
    const double best = model.brute_force();
    std::vector<char> recompute(g.nodes.size(), 0);
    INFO("round " << round);
    MinCutResult r;
    try {
      r = solve_min_cut(g, rc.tags, options);
    } catch (const MinCutError& error) {
      INFO(error.what());
      CHECK(best < 0);
      continue;
    }
    ++feasible;
    REQUIRE(best >= 0);
    std::fill(recompute.begin(), recompute.end(), 0);
    for (auto i : r.recomputed) recompute[static_cast<std::size_t>(i)] = 1;
    double mine = model.cost(recompute);
    REQUIRE(mine >= 0);
    // Capacities are rounded to whole bytes per arc: the cut is optimal up to that.
    CHECK(mine == Approx(best).epsilon(1e-9).margin(static_cast<double>(r.stats.network_edges) + 1.0));
    CHECK(r.objective == Approx(mine).epsilon(1e-9).margin(1e-6));
    // The export carries the read vertices and the same flow.
    FlowNetwork net = flow_network(g, rc.tags, options);
    CHECK(net.max_flow == r.stats.max_flow);
    CHECK(static_cast<double>(net.max_flow) * net.capacity_unit ==
          Approx(best).epsilon(1e-9).margin(static_cast<double>(net.arcs) + 1.0));
    if (fusion_groups(g, options.cost).count > 0) ++grouped;
    // The eager cost of the same graph is a different objective (the groups matter).
    MinCutOptions eager = options;
    eager.cost.compiler = Compiler::Eager;
    if (solve_min_cut(g, rc.tags, eager).recomputed != r.recomputed) ++differs;
  }
  CHECK(feasible >= 100);
  CHECK(grouped >= 100);
  CHECK(differs >= 2);
}

TEST_CASE("a decomposed norm chain is recomputed as one kernel under inductor, not under eager", "[mincut][fusion]") {
  // x -> mm -> [var_mean, sub, rsqrt, mul, mul(g)] -> mm2; the backward reads
  // the residual h (saved anyway), rstd, the normalised value and mm2's input.
  // Eager charges every node its own traffic (the chain moves ~7x its output
  // bytes); inductor charges one read of h and g plus the writes the backward
  // needs: replaying the chain from h beats saving its outputs.
  Net net;
  net.input("x", 4000);
  net.input("w", 4000, Role::Parameter);
  net.fw("h", "aten::mm.default", {"x", "w"}, 4000, 2e6);
  net.fw("vm", "aten::var_mean.correction", {"h"}, 40);
  net.fw("sub", "aten::sub.Tensor", {"h", "vm"}, 4000);
  net.fw("rs", "aten::rsqrt.default", {"vm"}, 40);
  net.fw("norm", "aten::mul.Tensor", {"sub", "rs"}, 4000);
  net.input("g", 40, Role::Parameter);  // the norm's weight
  net.fw("scaled", "aten::mul.Tensor", {"norm", "g"}, 4000);
  net.fw("h2", "aten::mm.default", {"scaled", "w"}, 4000, 2e6);
  for (const char* name : {"vm", "sub", "rs", "norm", "scaled"}) net.node(name).fusible = true;
  net.tangent("t", 4000);
  net.bw("b0", {"t", "scaled"});
  net.bw("b1", {"b0", "norm"});
  net.bw("b2", {"b1", "rs"});
  net.bw("b3", {"b2", "h"});
  net.output({"h2", "b3"});
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute, {{"h", Policy::MustSave}});
  MinCutOptions options = gpu(2.5e11);  // bandwidth / 4
  MinCutResult eager = solve_min_cut(g, tags, options);
  options.cost.compiler = Compiler::Inductor;
  MinCutResult inductor = solve_min_cut(g, tags, options);
  CHECK(net.names(eager.recomputed) == Names{"scaled"});
  CHECK(net.names(eager.saved) == Names{"h", "rs", "norm"});
  CHECK(net.names(inductor.saved) == Names{"h"});
  CHECK(net.names(inductor.recomputed) == Names{"vm", "sub", "rs", "norm", "scaled"});
  // One read each of h and g + writes of rs, norm, scaled (their users leave the group).
  CHECK(inductor.recompute_seconds == Approx((4000.0 + 40 + 40 + 4000 + 4000) / 1e12));
  FusionGroups groups = fusion_groups(g, options.cost);
  CHECK(groups.count == 1);
  CHECK(groups.group[static_cast<std::size_t>(net.at("h"))] == -1);
}

TEST_CASE("flow_network exports the solved network; its flow is the brute-force cut", "[mincut][flow_network]") {
  std::mt19937 rng(77);
  int checked = 0;
  for (int round = 0; round < 60; ++round) {
    RandomCase rc = random_case(rng, 5 + round % 6, 4);
    Graph g = rc.net.graph();
    MinCutOptions options = gpu(round % 2 ? 1e10 : 3e11);
    Model model(g, rc.tags, options);
    const double best = model.brute_force();
    if (best < 0) {
      CHECK_THROWS_AS(flow_network(g, rc.tags, options), MinCutError);
      continue;
    }
    INFO("round " << round);
    FlowNetwork net = flow_network(g, rc.tags, options);
    MinCutResult cut = solve_min_cut(g, rc.tags, options);
    CHECK(net.max_flow == cut.stats.max_flow);
    CHECK(net.vertices == cut.stats.network_vertices);
    CHECK(net.arcs == cut.stats.network_edges);
    // The flow value in bytes is the brute-force optimum (integer rounding per arc aside).
    CHECK(static_cast<double>(net.max_flow) * net.capacity_unit ==
          Approx(best).epsilon(1e-9).margin(static_cast<double>(net.arcs) + 1.0));
    std::size_t vertices = 0, arcs = 0;
    std::int64_t reported = -1;
    CHECK(dimacs_max_flow(net.dimacs, vertices, arcs, reported) == net.max_flow);
    CHECK(reported == net.max_flow);
    CHECK(vertices == net.vertices);
    CHECK(arcs == net.arcs);
    CHECK(net.dimacs.find("n 1 s\n") != std::string::npos);
    CHECK(net.dimacs.find("n 2 t\n") != std::string::npos);
    // Every candidate node names the vertices of both its sides.
    for (std::size_t i = 0; i < g.nodes.size(); ++i)
      if (model.network(static_cast<std::int32_t>(i)) && net.vertices > 2 &&
          net.dimacs.find(" " + g.nodes[i].name + " in\n") != std::string::npos)
        CHECK(net.dimacs.find(" " + g.nodes[i].name + " out\n") != std::string::npos);
    ++checked;
  }
  CHECK(checked >= 20);
}

TEST_CASE("capacities past 2^50 in all are scaled and the cut is still the optimum", "[mincut][scale]") {
  // The cos chain of "a cos chain saves only its input" at 2^61 bytes a value:
  // the finite capacities add up past int64 unless scaled (unit > 1). Every
  // capacity scales with N (bytes, and the roofline seconds of pointwise ops),
  // so the optimal cut is the same as at a small N.
  for (std::int64_t N : {std::int64_t{1000000}, std::int64_t{1} << 61}) {
    Net net;
    net.input("x0", N);
    net.input("w", N, Role::Parameter);
    net.fw("x", "aten::mm.default", {"x0", "w"}, N, 1e9);
    net.fw("c1", "aten::cos.default", {"x"}, N);
    net.fw("c2", "aten::cos.default", {"c1"}, N);
    net.fw("c3", "aten::cos.default", {"c2"}, N);
    net.tangent("t", N);
    net.bw("g3", {"t", "c2"});
    net.bw("g2", {"g3", "c1"});
    net.bw("g1", {"g2", "x"});
    net.output({"c3", "g1"});
    Graph g = net.graph();
    auto tags = net.tags(Policy::PreferRecompute, {{"x", Policy::MustSave}});
    MinCutResult r = solve_min_cut(g, tags, gpu(1e11));
    INFO("N " << N << ", capacity unit " << r.stats.capacity_unit);
    if (N > 1000000) CHECK(r.stats.capacity_unit > 1.0);
    CHECK(net.names(r.recomputed) == Names{"c1", "c2"});
    CHECK(net.names(r.saved) == Names{"x"});
    CHECK(r.saved_bytes == N);
  }
}

// Issue 14: floats at the edges of their range. FLOPs near the double range on
// the slowest accepted hardware with the largest accepted lambda keep every
// capacity finite (recompute seconds clamp at kMaxRecomputeSeconds), the
// capacities are scaled (unit > 1) and the cut is the brute-force optimum.
TEST_CASE("extreme accepted floats give finite capacities and the optimal cut", "[mincut][numeric]") {
  Net net;
  net.input("x0", 1000);
  net.input("w", 1000, Role::Parameter);
  net.fw("x", "aten::mm.default", {"x0", "w"}, 1000, 1e308);
  net.fw("huge", "aten::mm.default", {"x", "w"}, 1000, 1.7e308);
  net.fw("c1", "aten::cos.default", {"w"}, 1000000);
  net.tangent("t", 1000);
  net.bw("g2", {"t", "c1"});
  net.bw("g1", {"g2", "huge", "x"});
  net.output({"g1"});
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute);
  MinCutOptions options = gpu(kMaxLambda);
  // The slowest accepted FLOP rate: each mm's 1e308 FLOPs would take 1e308 s;
  // clamped to 1e30 s, times lambda 1e30 is 1e60 "bytes": finite.
  options.cost.hardware = {"edge", kMinHardwareSpeed, kMaxHardwareSpeed};
  options.prefer_recompute_factor = 2.0;
  CHECK(recompute_seconds(g, net.at("huge"), options.cost) == kMaxRecomputeSeconds);
  for (auto algorithm : {MaxFlowAlgorithm::BoykovKolmogorov, MaxFlowAlgorithm::PushRelabel}) {
    options.algorithm = algorithm;
    MinCutResult r = solve_min_cut(g, tags, options);
    INFO("capacity unit " << r.stats.capacity_unit);
    CHECK(r.stats.capacity_unit > 1.0);
    CHECK(std::isfinite(r.objective));
    CHECK(std::isfinite(r.recompute_seconds));
    CHECK(std::isfinite(r.recompute_flops));
    // Recomputing an mm costs ~1e60: both are saved. c1 (2e6 to save, 1e6 to
    // recompute) is below one capacity unit (~1e45): either side is optimal
    // within the documented bound of one unit per arc.
    const Names saved = net.names(r.saved);
    CHECK(std::count(saved.begin(), saved.end(), "x") == 1);
    CHECK(std::count(saved.begin(), saved.end(), "huge") == 1);
    CHECK(r.saved.size() + r.recomputed.size() == 3);
    CHECK(r.objective < 1e40);  // never the 1e60 of recomputing an mm
    FlowNetwork flow = flow_network(g, tags, options);
    CHECK(flow.infinite_capacity > 0);
    CHECK(flow.max_flow < flow.infinite_capacity);
  }
  // The frontier sweep over the same graph stays finite too.
  FrontierResult frontier = frontier_cuts(g, tags, options);
  for (const auto& p : frontier.points) CHECK(std::isfinite(p.objective));
  // FLOP totals saturate at the largest double instead of becoming infinite.
  std::vector<Policy> all(g.nodes.size(), Policy::None);
  all[static_cast<std::size_t>(net.at("x"))] = Policy::MustRecompute;
  all[static_cast<std::size_t>(net.at("huge"))] = Policy::MustRecompute;
  RematPlan plan = plan_remat(g, all);
  CHECK(plan.stats.recompute_flops == std::numeric_limits<double>::max());
}

TEST_CASE("min-cut rejects floats outside the stated ranges", "[mincut][errors][numeric]") {
  Net net = mlp_net();
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute);
  CHECK_THROWS_AS(solve_min_cut(g, tags, gpu(kMaxLambda * 10)), std::invalid_argument);
  CHECK_THROWS_AS(solve_min_cut(g, tags, gpu(INFINITY)), std::invalid_argument);
  for (double speed : {1e-300, 0.5, 1e31, double(INFINITY), double(NAN)}) {
    INFO("speed " << speed);
    MinCutOptions slow = gpu(1e10);
    slow.cost.hardware.peak_flops = speed;
    CHECK_THROWS_AS(solve_min_cut(g, tags, slow), std::invalid_argument);
    slow = gpu(1e10);
    slow.cost.hardware.memory_bandwidth = speed;
    CHECK_THROWS_AS(solve_min_cut(g, tags, slow), std::invalid_argument);
  }
  MinCutOptions factor = gpu(1e10);
  factor.prefer_save_factor = 1e7;
  CHECK_THROWS_AS(solve_min_cut(g, tags, factor), std::invalid_argument);
  factor = gpu(1e10);
  factor.prefer_recompute_factor = NAN;
  CHECK_THROWS_AS(solve_min_cut(g, tags, factor), std::invalid_argument);
}

TEST_CASE("a replayable RNG op is recomputed when its state costs less than its output", "[mincut][rng]") {
  // x -> drop (random, replayable) -> y = drop * x; the backward reads drop.
  auto build = [](std::int64_t state_bytes) {
    Net net;
    net.input("x", 1000);
    net.fw("drop", "aten::native_dropout.default", {"x"}, 1000);
    net.node("drop").rng = true;
    net.node("drop").rng_state_bytes = state_bytes;
    net.fw("y", "aten::mul.Tensor", {"drop", "x"}, 1000);
    net.tangent("t", 1000);
    net.bw("gy", {"t", "drop"});
    net.output({"y", "gy"});
    return net;
  };
  SECTION("small state: recomputed, and the plan replays it, keeps the original and charges the state") {
    Net net = build(16);
    Graph g = net.graph();
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), gpu(1.0));
    CHECK(net.names(r.recomputed) == Names{"drop"});
    CHECK(r.saved.empty());
    RematPlan plan = plan_remat(g, r.policies);
    CHECK(net.names(plan.rng_replays) == Names{"drop"});
    CHECK(plan.erase.empty());  // the forward still draws
    CHECK(plan.stats.rng_replayed == 1);
    CHECK(plan.stats.rng_state_bytes == 16);
    CHECK(plan.stats.saved_bytes_after == 16);
  }
  SECTION("state larger than the output: saved") {
    Net net = build(5056);
    Graph g = net.graph();
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), gpu(1.0));
    CHECK(net.names(r.saved) == Names{"drop"});
    CHECK(r.recomputed.empty());
  }
  SECTION("not replayable (no state bytes): never recomputed") {
    Net net = build(0);
    Graph g = net.graph();
    MinCutResult r = solve_min_cut(g, net.tags(Policy::PreferRecompute), gpu(1.0));
    CHECK(net.names(r.saved) == Names{"drop"});
  }
}

TEST_CASE("under inductor a view is no kernel: replayed views read nothing, and a copy behind views is written",
          "[mincut][fusion]") {
  // Attention output (GPT-NeoX): o = bmm(p, v); c = clone(permute(view(o)));
  // the projection's input is view(view(c)), which the backward's weight
  // gradient reads too. Saving c keeps the same bytes as saving o and replays
  // nothing; saving o replays the copy, which reads o and writes c.
  Net net;
  const std::int64_t N = 4096;
  net.input("p", 4 * N);
  net.input("v", N);
  net.input("w", N, Role::Parameter);
  net.fw("o", "aten::bmm.default", {"p", "v"}, N, 1e6);
  net.view("o4", "o", N);
  net.view("perm", "o4", N);
  net.fw("c", "aten::clone.default", {"perm"}, N);
  net.view("c3", "c", N);
  net.view("c2", "c3", N);
  net.fw("proj", "aten::mm.default", {"c2", "w"}, N, 1e6);
  for (const char* name : {"o4", "perm", "c", "c3", "c2"}) net.node(name).fusible = true;
  net.tangent("t", N);
  net.bw("gw", {"t", "c2"});
  net.output({"proj", "gw"});
  Graph g = net.graph();
  auto tags = net.tags(Policy::PreferRecompute, {{"o", Policy::PreferSave}, {"proj", Policy::MustSave}});
  MinCutOptions options = gpu(2.5e11);  // bandwidth / 4
  options.cost.compiler = Compiler::Inductor;
  MinCutResult r = solve_min_cut(g, tags, options);
  CHECK(net.names(r.saved) == Names{"c"});
  CHECK(net.names(r.recomputed) == Names{"c3", "c2"});
  // The copy's replay: one read of o, one write of c (the views c3, c2 leave
  // the group through the mm and the backward); the views cost nothing.
  const double bandwidth = options.cost.hardware.memory_bandwidth;
  std::vector<std::int32_t> copy_replay{net.at("o4"), net.at("perm"), net.at("c"), net.at("c3"), net.at("c2")};
  CHECK(recompute_seconds(g, copy_replay, options.cost) == Approx(2.0 * N / bandwidth));
  CHECK(recompute_seconds(g, {net.at("c3"), net.at("c2")}, options.cost) == 0.0);
  CHECK(fusion_groups(g, options.cost).materialized[static_cast<std::size_t>(net.at("c"))]);
}
