#include <catch2/catch.hpp>

#include "hyper_ac/scope.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using namespace hyper_ac::testing;

TEST_CASE("fnmatch and containment helpers", "[scope]") {
  CHECK(fqn_matches("*.mlp", "layers.0.mlp"));
  CHECK(fqn_matches("layers.[01].mlp", "layers.1.mlp"));
  CHECK_FALSE(fqn_matches("*.mlp", "layers.0.mlp.fc"));
  CHECK(at_or_under("layers.10.mlp", "layers.10"));
  CHECK_FALSE(at_or_under("layers.10", "layers.1"));
}

TEST_CASE("units come from the live model facts", "[scope]") {
  Scope s = resolve_scope(two_units().graph(), {});
  CHECK(s.units_from_model);
  REQUIRE(s.regions == std::vector<std::string>{"layers.0", "layers.1"});
  auto g = two_units().graph();
  CHECK(s.node_region[3] == 0);  // mm0
  CHECK(s.node_unit[6] == 1);    // mm1
  CHECK(s.node_region[9] == -1); // loss: outside every unit
}

TEST_CASE("without a model, units come from repeated module-stack children", "[scope]") {
  Scope s = resolve_scope(two_units(false).graph(), {});
  CHECK_FALSE(s.units_from_model);
  REQUIRE(s.units.size() == 2);
  CHECK(s.units[0].fqn == "layers.0");
  CHECK(s.units[1].fqn == "layers.1");
}

TEST_CASE("a graph with neither model facts nor repeated blocks is an error", "[scope][errors]") {
  GraphBuilder b;
  b.placeholder("x").op("a", "aten::relu.default", {"x"}, "encoder").output({"a"});
  CHECK_THROWS_WITH(resolve_scope(b.graph(), {}), Catch::Contains("no units found") && Catch::Contains("model="));
  b.model("Net", {{"encoder", "Enc"}}, {});
  CHECK_THROWS_WITH(resolve_scope(b.graph(), {}), Catch::Contains("gradient_checkpointing") && Catch::Contains("module stacks"));
}

TEST_CASE("a live model without the marker falls back to the module stacks; Sequential is a container", "[scope]") {
  GraphBuilder b;
  b.placeholder("x");
  GraphBuilder::NodeSpec spec;
  for (int i = 0; i < 3; ++i) {
    spec.target = "aten::relu.default";
    spec.inputs = {i == 0 ? std::string("x") : "r" + std::to_string(i - 1)};
    spec.extra = {{"module_stack", {{{"fqn", "layer1." + std::to_string(i)}, {"type", "BasicBlock"}},
                                    {{"fqn", "layer1"}, {"type", "Sequential"}}}}};
    b.add("r" + std::to_string(i), spec);
  }
  b.output({"r2"});
  b.model("CNN", {{"layer1", "Sequential"}, {"layer1.0", "BasicBlock"}}, {});
  Scope s = resolve_scope(b.graph(), {});
  CHECK_FALSE(s.units_from_model);
  REQUIRE(s.units.size() == 3);
  CHECK(s.units[2].fqn == "layer1.2");
}

TEST_CASE("layer selection", "[scope]") {
  auto g = two_units().graph();
  ScopeOptions o;
  o.layer_count = 1;
  CHECK(resolve_scope(g, o).regions == std::vector<std::string>{"layers.0"});
  o.layer_count = 0;
  Scope none = resolve_scope(g, o);
  CHECK(none.regions.empty());
  REQUIRE(none.notes.size() == 1);
  CHECK(none.notes[0].find("zero layers") != std::string::npos);
  o.layer_count = 3;
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("exceeds the 2 units"));
  o.layer_count.reset();
  o.layer_indices = std::vector<std::int64_t>{1};
  CHECK(resolve_scope(g, o).regions == std::vector<std::string>{"layers.1"});
  o.layer_indices = std::vector<std::int64_t>{2};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("valid indices are 0..1"));
  o.layer_indices = std::vector<std::int64_t>{-1};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("out of range"));
}

TEST_CASE("regions and exclusions from patterns", "[scope]") {
  auto g = two_units().graph();
  ScopeOptions o;
  o.include = {"*.mlp"};
  Scope s = resolve_scope(g, o);
  CHECK(s.regions == std::vector<std::string>{"layers.0.mlp", "layers.1.mlp"});
  CHECK(s.node_region[5] == -1);  // mul0 sits in layers.0, outside the mlp region
  o.include = {"*.attn"};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("'*.attn' matches no module"));
  o.include = {"*.mlp"};
  o.exclude = {"layers.1.mlp"};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("region root 'layers.1.mlp' is also excluded"));
  o.exclude = {"layers.1"};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("contains region root 'layers.1.mlp'"));
  o.exclude = {"nothing.here"};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("exclude pattern 'nothing.here' matches no module"));
  o.include = {};
  o.exclude = {"*.mlp"};
  Scope ex = resolve_scope(g, o);
  CHECK(ex.node_excluded[3]);  // mm0
  CHECK_FALSE(ex.node_excluded[5]);
}
