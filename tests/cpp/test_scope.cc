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
  o.unit_count = 1;
  CHECK(resolve_scope(g, o).regions == std::vector<std::string>{"layers.0"});
  o.unit_count = 0;
  Scope none = resolve_scope(g, o);
  CHECK(none.regions.empty());
  REQUIRE(none.diagnostics.size() == 1);
  CHECK(none.diagnostics[0].severity == Severity::Info);
  CHECK(none.diagnostics[0].message.find("zero units") != std::string::npos);
  o.unit_count = 3;
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("exceeds the 2 units"));
  o.unit_count.reset();
  o.unit_indices = std::vector<std::int64_t>{1};
  CHECK(resolve_scope(g, o).regions == std::vector<std::string>{"layers.1"});
  o.unit_indices = std::vector<std::int64_t>{2};
  CHECK_THROWS_WITH(resolve_scope(g, o), Catch::Contains("valid indices are 0..1"));
  o.unit_indices = std::vector<std::int64_t>{-1};
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

namespace {

using nlohmann::json;

std::vector<std::string> fqns_of(const std::vector<ModuleFrame>& units) {
  std::vector<std::string> out;
  for (const auto& unit : units) out.push_back(unit.fqn);
  return out;
}

// A graph with only a `model` section (no nodes): discovery from facts alone.
Graph facts_only(json section) {
  GraphBuilder b;
  b.model_section(std::move(section));
  return b.graph();
}

json module(const std::string& fqn, const std::string& type, json extra = json::object()) {
  json entry = {{"fqn", fqn}, {"type", type}};
  for (auto& [key, value] : extra.items()) entry[key] = value;
  return entry;
}

const json kContainer = {{"container", true}};
const json kMarked = {{"marked", true}};

}  // namespace

TEST_CASE("marker rule: children of the marked module's containers are the units", "[scope][units]") {
  json section = {{"type", "Decoder"}, {"marked", true}, {"modules", json::array({
      module("embed", "Embedding"),
      module("layers", "ModuleList", kContainer),
      module("layers.0", "Block"), module("layers.0.fc", "Linear"),
      module("layers.1", "Block"), module("layers.1.fc", "Linear"),
      module("norm", "LayerNorm"),
  })}};
  Graph g = facts_only(section);
  CHECK(fqns_of(units_from_model(g.model)) == std::vector<std::string>{"layers.0", "layers.1"});
  auto found = discover_units(g);
  CHECK(found.from_model);
  CHECK(found.units[1].type == "Block");

  SECTION("no marker: no unit from the model, the stack rule applies") {
    section.erase("marked");
    Graph unmarked = facts_only(section);
    CHECK(units_from_model(unmarked.model).empty());
    CHECK_FALSE(discover_units(unmarked).from_model);
  }
  SECTION("an empty container gives nothing") {
    section["modules"] = json::array({module("layers", "ModuleList", kContainer), module("norm", "LayerNorm")});
    CHECK(units_from_model(facts_only(section).model).empty());
  }
}

TEST_CASE("marker rule: BERT-depth search, identity dedup, nothing inside a unit", "[scope][units]") {
  SECTION("layers one level deeper (BertModel's encoder.layer)") {
    json section = {{"type", "BertForMaskedLM"}, {"marked", true}, {"modules", json::array({
        module("bert", "BertModel", kMarked),
        module("bert.embeddings", "BertEmbeddings"),
        module("bert.encoder", "BertEncoder"),
        module("bert.encoder.layer", "ModuleList", kContainer),
        module("bert.encoder.layer.0", "BertLayer"),
        module("bert.encoder.layer.0.attention", "BertAttention"),
        module("bert.encoder.layer.1", "BertLayer"),
        module("cls", "BertOnlyMLMHead"),
    })}};
    CHECK(fqns_of(units_from_model(facts_only(section).model)) ==
          std::vector<std::string>{"bert.encoder.layer.0", "bert.encoder.layer.1"});
  }
  SECTION("the rule details of hyper_ac.serialize's old discover_units") {
    // Net: layers = [Block, shared, MoEBlock(marked; mlp.experts = [Block, Block])],
    // extra = {enc: Block, dec: shared}, empty = [], head = Sequential(Linear).
    json section = {{"type", "Net"}, {"marked", true}, {"modules", json::array({
        module("layers", "ModuleList", kContainer),
        module("layers.0", "Block"), module("layers.0.lin", "Linear"),
        module("layers.1", "Block"), module("layers.1.lin", "Linear"),
        module("layers.2", "MoEBlock", kMarked), module("layers.2.mlp", "Module"),
        module("layers.2.mlp.experts", "ModuleList", kContainer),
        module("layers.2.mlp.experts.0", "Block"), module("layers.2.mlp.experts.0.lin", "Linear"),
        module("layers.2.mlp.experts.1", "Block"), module("layers.2.mlp.experts.1.lin", "Linear"),
        module("extra", "ModuleDict", kContainer),
        module("extra.enc", "Block"), module("extra.enc.lin", "Linear"),
        module("extra.dec", "Block", {{"same_as", "layers.1"}}),
        module("extra.dec.lin", "Linear", {{"same_as", "layers.1.lin"}}),
        module("empty", "ModuleList", kContainer),
        module("head", "Sequential", kContainer), module("head.0", "Linear"),
    })}};
    Graph g = facts_only(section);
    // flattened in discovery order; ModuleDict keys kept; the shared module
    // once; the marked MoE layer's experts lie inside a unit, so are not units
    CHECK(fqns_of(units_from_model(g.model)) ==
          std::vector<std::string>{"layers.0", "layers.1", "layers.2", "extra.enc", "head.0"});
  }
  SECTION("a marked unit's own block list is not searched (T5: encoder.block.N.layer)") {
    json section = {{"type", "T5ForConditionalGeneration"}, {"marked", true}, {"modules", json::array({
        module("encoder", "T5Stack", kMarked),
        module("encoder.block", "ModuleList", kContainer),
        module("encoder.block.0", "T5Block", kMarked),
        module("encoder.block.0.layer", "ModuleList", kContainer),
        module("encoder.block.0.layer.0", "T5LayerSelfAttention"),
        module("encoder.block.0.layer.1", "T5LayerFF"),
        module("encoder.block.1", "T5Block", kMarked),
        module("encoder.block.1.layer", "ModuleList", kContainer),
        module("encoder.block.1.layer.0", "T5LayerSelfAttention"),
        module("encoder.block.1.layer.1", "T5LayerFF"),
        module("decoder", "T5Stack", kMarked),
        module("decoder.block", "ModuleList", kContainer),
        module("decoder.block.0", "T5Block", kMarked),
        module("decoder.block.0.layer", "ModuleList", kContainer),
        module("decoder.block.0.layer.0", "T5LayerSelfAttention"),
    })}};
    CHECK(fqns_of(units_from_model(facts_only(section).model)) ==
          std::vector<std::string>{"encoder.block.0", "encoder.block.1", "decoder.block.0"});
  }
  SECTION("a shared block listed twice in one container counts once") {
    json section = {{"type", "Net"}, {"marked", true}, {"modules", json::array({
        module("layers", "ModuleList", kContainer),
        module("layers.0", "Block"),
        module("layers.1", "Block", {{"same_as", "layers.0"}}),
        module("layers.2", "Block"),
    })}};
    CHECK(fqns_of(units_from_model(facts_only(section).model)) == std::vector<std::string>{"layers.0", "layers.2"});
  }
}

TEST_CASE("model facts: loading checks the module list and rejects the old unit list", "[scope][units][graph]") {
  json old = {{"type", "Net"}, {"modules", json::array()}, {"units", json::array({module("layers.0", "Block")})}};
  CHECK_THROWS_WITH(facts_only(old), Catch::Contains("'units'") && Catch::Contains("re-serialise"));
  json forward = {{"type", "Net"}, {"modules", json::array({module("a", "A", {{"same_as", "b"}}), module("b", "A")})}};
  CHECK_THROWS_WITH(facts_only(forward), Catch::Contains("not listed before"));
  json unknown = {{"type", "Net"}, {"modules", json::array({module("a", "A", {{"shared", true}})})}};
  CHECK_THROWS_WITH(facts_only(unknown), Catch::Contains("unknown field 'shared'"));
}

TEST_CASE("region patterns match over the first listings of the live modules", "[scope][units]") {
  GraphBuilder b;
  b.placeholder("x")
      .op("a", "aten::relu.default", {"x"}, "layers.0.mlp")
      .op("c", "aten::relu.default", {"a"}, "layers.1.mlp")
      .output({"c"});
  b.model_section({{"type", "Net"}, {"marked", true}, {"modules", json::array({
      module("layers", "ModuleList", kContainer),
      module("layers.0", "Block"), module("layers.0.mlp", "MLP"),
      module("layers.1", "Block"), module("layers.1.mlp", "MLP"),
      module("alias", "MLP", {{"same_as", "layers.0.mlp"}}),
  })}});
  ScopeOptions options;
  options.include = {"*mlp"};
  Scope s = resolve_scope(b.graph(), options);
  CHECK(s.units_from_model);
  CHECK(s.regions == std::vector<std::string>{"layers.0.mlp", "layers.1.mlp"});
  options.exclude = {"alias"};
  CHECK_THROWS_WITH(resolve_scope(b.graph(), options), Catch::Contains("exclude pattern 'alias' matches no module"));
}

TEST_CASE("whole-graph scope: auto/budget plan a graph without units as one region", "[scope]") {
  // cos(cos(cos(x))): no module stacks, no units.
  GraphBuilder b;
  b.placeholder("x", "input");
  b.op("c1", "aten::cos.default", {"x"}).op("c2", "aten::cos.default", {"c1"}).op("c3", "aten::cos.default", {"c2"});
  b.placeholder("t", "tangent", 64, "backward");
  b.bwd("s2", "aten::sin.default", {"c2"}).bwd("g2", "aten::mul.Tensor", {"t", "s2"})
      .bwd("s1", "aten::sin.default", {"c1"}).bwd("g1", "aten::mul.Tensor", {"g2", "s1"})
      .bwd("s0", "aten::sin.default", {"x"}).bwd("g0", "aten::mul.Tensor", {"g1", "s0"})
      .output({"c3", "g0"});
  ScopeOptions options;
  CHECK_THROWS_AS(resolve_scope(b.graph(), options), NoUnitsError);
  options.whole_graph_when_no_units = true;
  Scope scope = resolve_scope(b.graph(), options);
  CHECK(scope.whole_graph);
  REQUIRE(scope.regions == std::vector<std::string>{""});
  CHECK(scope.node_region[static_cast<std::size_t>(b.index("c2"))] == 0);
  CHECK(scope.node_unit[static_cast<std::size_t>(b.index("c2"))] == -1);
  options.rule = ScopeRule::Units;
  CHECK_THROWS_AS(resolve_scope(b.graph(), options), NoUnitsError);
  options.rule = ScopeRule::WholeGraph;
  options.whole_graph_when_no_units = false;
  CHECK(resolve_scope(b.graph(), options).whole_graph);
  CHECK_FALSE(resolve_scope(b.graph(), options).unit_graph);
  // unit_graph: the same one region, marked as one unit of a per-block compile.
  options.rule = ScopeRule::UnitGraph;
  const Scope unit = resolve_scope(b.graph(), options);
  CHECK(unit.whole_graph);
  CHECK(unit.unit_graph);
  CHECK(unit.regions == std::vector<std::string>{""});
  CHECK(std::string(to_string(ScopeRule::UnitGraph)) == "unit_graph");
  options.unit_count = 1;
  CHECK_THROWS_AS(resolve_scope(b.graph(), options), ScopeError);
  options.rule = ScopeRule::WholeGraph;
  CHECK_THROWS_AS(resolve_scope(b.graph(), options), ScopeError);
}

// Per-block compile: the graph is one block (attn, mlp, mlp.act); regions.include
// picks modules inside it under whole_graph / unit_graph (before, it was ignored),
// and under auto a unitless graph with include is planned over those modules.
TEST_CASE("whole-graph scopes honour regions.include", "[scope]") {
  GraphBuilder b;
  b.placeholder("x", "input");
  b.op("q", "aten::mm.default", {"x"}, "attn").op("h", "aten::mm.default", {"q"}, "mlp");
  b.op("a", "aten::gelu.default", {"h"}, "mlp.act").op("o", "aten::mm.default", {"a"}, "mlp");
  b.op("n", "aten::relu.default", {"o"});  // no module: outside every included region
  b.placeholder("t", "tangent", 64, "backward");
  b.bwd("g", "aten::mul.Tensor", {"t", "a"}).output({"n", "g"});
  for (ScopeRule rule : {ScopeRule::WholeGraph, ScopeRule::UnitGraph, ScopeRule::Auto}) {
    INFO("rule " << to_string(rule));
    ScopeOptions options;
    options.rule = rule;
    options.whole_graph_when_no_units = true;
    options.include = {"mlp"};
    options.exclude = {"mlp.act"};
    const Scope scope = resolve_scope(b.graph(), options);
    CHECK(scope.whole_graph);
    CHECK(scope.unit_graph == (rule == ScopeRule::UnitGraph));
    REQUIRE(scope.regions == std::vector<std::string>{"mlp"});
    CHECK(scope.region_output_recompute == std::vector<bool>{false});
    CHECK(scope.node_region[static_cast<std::size_t>(b.index("h"))] == 0);
    CHECK(scope.node_region[static_cast<std::size_t>(b.index("a"))] == 0);
    CHECK(scope.node_excluded[static_cast<std::size_t>(b.index("a"))]);
    CHECK(scope.node_region[static_cast<std::size_t>(b.index("q"))] == -1);
    CHECK(scope.node_region[static_cast<std::size_t>(b.index("n"))] == -1);
    CHECK(scope.node_region[static_cast<std::size_t>(b.index("g"))] == -1);  // backward: never a region
    options.include = {"mlp", "decoder"};
    CHECK_THROWS_WITH(resolve_scope(b.graph(), options), Catch::Contains("'decoder' matches no module in the graph"));
    options.include = {"mlp"};
    options.exclude = {"mlp"};
    CHECK_THROWS_WITH(resolve_scope(b.graph(), options), Catch::Contains("also excluded"));
  }
  // Without include: one region "" over every forward node, as before.
  ScopeOptions whole;
  whole.rule = ScopeRule::UnitGraph;
  const Scope all = resolve_scope(b.graph(), whole);
  CHECK(all.regions == std::vector<std::string>{""});
  CHECK(all.node_region[static_cast<std::size_t>(b.index("n"))] == 0);
  CHECK(all.node_region[static_cast<std::size_t>(b.index("g"))] == -1);
}
