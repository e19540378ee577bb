#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "hyper_ac/remat.h"
#include "hyper_ac/split.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using namespace hyper_ac::testing;

namespace {

std::vector<std::string> saved_names(const Graph& g, const Split& split) {
  std::vector<std::string> out;
  for (const auto& s : split.saved)
    out.push_back(g.nodes[static_cast<std::size_t>(s.node)].name + (s.rng_state ? "_rng_state" : ""));
  return out;
}

std::vector<Policy> policies_for(const Graph& g, const std::set<std::string>& recomputed) {
  std::vector<Policy> policies(g.nodes.size(), Policy::None);
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (recomputed.count(g.nodes[i].name)) policies[i] = Policy::MustRecompute;
  return policies;
}

}  // namespace

TEST_CASE("split: forward nodes stay in the forward, duplicates and backward nodes in the backward", "[split]") {
  GraphBuilder b;
  b.placeholder("x").placeholder("w", "parameter");
  b.op("mm", "aten::mm.default", {"x", "w"}).op("relu", "aten::relu.default", {"mm"}).op("sum", "aten::sum.default", {"relu"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g1", "aten::threshold_backward.default", {"t", "relu"}).bwd("g2", "aten::mm.default", {"g1", "x"});
  b.output({"sum", "g2"});
  Graph g = b.graph();
  auto plan = plan_remat(g, policies_for(g, {"relu"}));
  Split split = split_joint(g, plan);
  CHECK(names(g, split.forward) == std::vector<std::string>{"mm", "relu", "sum"});
  CHECK(names(g, split.backward) == std::vector<std::string>{"g1", "g2"});
  REQUIRE(plan.duplicates.size() == 1);
  CHECK(split.backward_duplicates == std::vector<std::int32_t>{0});
  // The backward reads mm (through relu's duplicate) and x; graph order.
  CHECK(saved_names(g, split) == std::vector<std::string>{"x", "mm"});
  CHECK(split.saved_symints.empty());
  CHECK(split.stats.backward_nodes == 3);
  CHECK(split.stats.saved_tensors == 2);
  const std::string text = split_to_json(g, split);
  CHECK(text.find("\"backward_duplicates\":[0]") != std::string::npos);
  CHECK(text.find("\"saved\":[\"x\",\"mm\"]") != std::string::npos);
}

TEST_CASE("split: an erased original is in neither module; SymInts are saved apart", "[split]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("size", "aten::sym_size.int", {"x"}, "", {{"symint", true}});
  b.op("a", "aten::sin.default", {"x"}).op("c", "aten::cos.default", {"a"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "a"}).bwd("v", "aten::view.default", {"g", "size"});
  b.output({"c", "v"});
  Graph g = b.graph();
  // a is recomputed; its original still feeds c in the forward, so it is not erased.
  auto plan = plan_remat(g, policies_for(g, {"a"}));
  Split split = split_joint(g, plan);
  CHECK(names(g, split.forward) == std::vector<std::string>{"size", "a", "c"});
  CHECK(saved_names(g, split) == std::vector<std::string>{"x"});
  CHECK(names(g, split.saved_symints) == std::vector<std::string>{"size"});
}

TEST_CASE("split: a saved getitem stands right after its producer; a replay state where its random op was", "[split]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("pair", "aten::var_mean.correction", {"x"});
  b.op("late", "aten::exp.default", {"x"});
  b.op("second", "operator.getitem", {"pair"});  // after `late` in the graph; apply moves it up
  b.op("drop", "aten::rand_like.default", {"late"}, "", {{"rng", true}, {"rng_state_bytes", 16}});
  b.op("use", "aten::mul.Tensor", {"drop", "second"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "use"}).bwd("h", "aten::add.Tensor", {"g", "late"});
  b.output({"use", "h"});
  Graph g = b.graph();
  auto plan = plan_remat(g, policies_for(g, {"use", "drop"}));
  REQUIRE(plan.rng_replays.size() == 1);
  Split split = split_joint(g, plan);
  CHECK(saved_names(g, split) == std::vector<std::string>{"second", "late", "drop_rng_state"});
}

TEST_CASE("split: the rewritten graph of a random plan always splits and validates", "[split]") {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    GraphBuilder b;
    std::vector<std::string> fwd = {"p0", "p1"};
    b.placeholder("p0").placeholder("p1", "parameter");
    for (int i = 0; i < 12; ++i) {
      std::vector<std::string> inputs = {fwd[rng() % fwd.size()]};
      auto other = fwd[rng() % fwd.size()];
      if (other != inputs[0]) inputs.push_back(other);
      b.op("f" + std::to_string(i), "aten::add.Tensor", inputs);
      fwd.push_back("f" + std::to_string(i));
    }
    std::vector<std::string> bwd = {"t"};
    b.placeholder("t", "tangent", 4, "backward");
    for (int i = 0; i < 8; ++i) {
      b.bwd("b" + std::to_string(i), "aten::mul.Tensor", {bwd[rng() % bwd.size()], fwd[rng() % fwd.size()]});
      bwd.push_back("b" + std::to_string(i));
    }
    b.output({fwd.back(), bwd.back()});
    Graph g = b.graph();
    std::set<std::string> recomputed;
    for (int i = 0; i < 12; ++i)
      if (rng() % 2) recomputed.insert("f" + std::to_string(i));
    auto plan = plan_remat(g, policies_for(g, recomputed));
    Split split;
    REQUIRE_NOTHROW(split = split_joint(g, plan));
    // Every forward node not erased is in the forward; saved = the plan's saved set.
    CHECK(split.forward.size() + plan.erase.size() == 12);
    CHECK(split.saved.size() + split.saved_symints.size() == plan.saved.size());
    CHECK(split.backward_duplicates.size() == plan.duplicates.size());
  }
}

TEST_CASE("split: a plan whose backward reads an unsaved forward value is rejected", "[split]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("a", "aten::sin.default", {"x"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "a"});
  b.output({"a", "g"});
  Graph g = b.graph();
  auto plan = plan_remat(g, policies_for(g, {}));
  plan.saved.clear();
  CHECK_THROWS_WITH(split_joint(g, plan), Catch::Contains("backward node 'g' reads forward value 'a', which the plan does not save"));
}

TEST_CASE("split: a DTensor step's mesh (opaque) is saved apart, and a backward output that is a primal is saved",
          "[split]") {
  // aot_autograd flattens a DTensor parameter into its local tensor and its DeviceMesh;
  // the gradient DTensor's mesh component is the forward's mesh placeholder itself.
  GraphBuilder b;
  b.placeholder("x").placeholder("w", "parameter");
  GraphBuilder::NodeSpec mesh;
  mesh.kind = "placeholder";
  mesh.target = "mesh";
  mesh.role = "parameter";
  mesh.extra = {{"opaque", true}, {"backward_output", true}, {"outputs", json::array()}};
  b.add("mesh", mesh);
  b.op("mm", "aten::mm.default", {"x", "w"}).op("relu", "aten::relu.default", {"mm"}).op("sum", "aten::sum.default", {"relu"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g1", "aten::threshold_backward.default", {"t", "relu"}).bwd("g2", "aten::mm.default", {"g1", "x"});
  b.output({"sum", "g2", "mesh"});
  Graph g = b.graph();
  REQUIRE(g.nodes[2].opaque);
  REQUIRE(g.nodes[2].backward_output);
  for (const std::set<std::string>& recomputed : {std::set<std::string>{}, std::set<std::string>{"relu"}}) {
    auto plan = plan_remat(g, policies_for(g, recomputed));
    // Read by no backward node, only returned: saved all the same.
    CHECK(std::find(plan.saved.begin(), plan.saved.end(), 2) != plan.saved.end());
    Split split = split_joint(g, plan);
    CHECK(names(g, split.saved_opaque) == std::vector<std::string>{"mesh"});
    for (const auto& s : split.saved) CHECK(g.nodes[static_cast<std::size_t>(s.node)].name != "mesh");
    CHECK(split.stats.saved_opaque == 1);
    CHECK(split_to_json(g, split).find("\"saved_opaque\":[\"mesh\"]") != std::string::npos);
  }
}

TEST_CASE("graph: backward_output is refused on a backward node", "[split]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("sum", "aten::sum.default", {"x"});
  b.placeholder("t", "tangent", 4, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "x"}, {{"backward_output", true}});
  b.output({"sum", "g"});
  CHECK_THROWS_WITH(load_graph(b.text()), Catch::Contains("'backward_output'") && Catch::Contains("'g'"));
}
