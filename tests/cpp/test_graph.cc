#include <catch2/catch.hpp>

#include "graph_builder.h"
#include "hyper_ac/graph.h"

using namespace hyper_ac;
using hyper_ac::testing::GraphBuilder;
using hyper_ac::testing::json;

namespace {

json tiny() { return json::parse(hyper_ac::testing::read_text(std::string(HYPER_AC_TEST_DATA) + "/tiny_mlp.json")); }

// Loading `doc` fails with a GraphError whose message contains every fragment.
void expect_error(const json& doc, std::initializer_list<const char*> fragments) {
  try {
    load_graph(doc.dump());
    FAIL("expected GraphError for " << doc.dump().substr(0, 120));
  } catch (const GraphError& error) {
    std::string message = error.what();
    for (const char* fragment : fragments) {
      INFO("message: " << message);
      CHECK(message.find(fragment) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("loads a small joint graph with every field", "[graph]") {
  auto loaded = load_graph(tiny().dump());
  const Graph& g = loaded.graph;
  REQUIRE(g.nodes.size() == 11);
  CHECK(loaded.stats.forward_nodes == 5);
  CHECK(loaded.stats.backward_nodes == 6);
  CHECK(g.nodes[1].role == Role::Parameter);
  CHECK(g.nodes[2].flops == 128);
  CHECK(g.stack_of(g.nodes[2]).front().fqn == "layers.0");
  CHECK(g.nodes[2].stack == g.nodes[3].stack);  // interned
  CHECK(g.nodes[6].view);
  CHECK(g.nodes[6].aliased_inputs == std::vector<std::int32_t>{0});
  CHECK(g.users[3] == std::vector<std::int32_t>{4, 7});
}

TEST_CASE("summary counts activations the backward reads", "[graph]") {
  auto s = summarize(load_graph(tiny().dump()).graph);
  CHECK(s.activations_read_by_backward == 1);  // relu; the output node does not count
  CHECK(s.activation_bytes_read_by_backward == 64);
  CHECK(s.parameters == 1);
}

TEST_CASE("rejects malformed JSON and bad documents", "[graph][errors]") {
  CHECK_THROWS_AS(load_graph("{not json"), GraphError);
  CHECK_THROWS_WITH(load_graph("[1,2]"), Catch::Contains("must be a JSON object"));
  json doc = tiny();
  doc["format"] = "other";
  expect_error(doc, {"'format'"});
}

TEST_CASE("rejects a missing or unsupported version", "[graph][errors]") {
  json doc = tiny();
  doc.erase("version");
  expect_error(doc, {"missing required field 'version'"});
  doc["version"] = 7;
  expect_error(doc, {"unsupported version 7", "reads version 1"});
  doc["version"] = "1";
  expect_error(doc, {"'version' must be an integer"});
}

TEST_CASE("rejects a missing required field, naming the node", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][3].erase("target");
  expect_error(doc, {"node #3 'relu'", "missing required field 'target'"});
}

TEST_CASE("rejects a field of the wrong type", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][2]["flops"] = "many";
  expect_error(doc, {"'mm'", "'flops' must be a number"});
  doc = tiny();
  doc["nodes"][2]["rng"] = 1;
  expect_error(doc, {"'mm'", "'rng' must be a boolean"});
  doc = tiny();
  doc["nodes"][2]["outputs"][0]["bytes"] = -5;
  expect_error(doc, {"'mm'", "negative"});
}

TEST_CASE("rejects an unknown kind, phase, role or field", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][2]["kind"] = "call_method";
  expect_error(doc, {"'mm'", "unknown kind 'call_method'"});
  doc = tiny();
  doc["nodes"][2]["phase"] = "sideways";
  expect_error(doc, {"'mm'", "unknown phase 'sideways'"});
  doc = tiny();
  doc["nodes"][0]["role"] = "weight";
  expect_error(doc, {"'x'", "unknown role 'weight'"});
  doc = tiny();
  doc["nodes"][2]["colour"] = "red";
  expect_error(doc, {"'mm'", "unknown field 'colour'"});
}

TEST_CASE("rejects duplicate ids and names", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][3]["id"] = 2;
  expect_error(doc, {"'relu'", "duplicate id 2", "'mm'"});
  doc = tiny();
  doc["nodes"][3]["name"] = "mm";
  expect_error(doc, {"duplicate name 'mm'"});
}

TEST_CASE("rejects dangling and forward references and cycles", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][7]["inputs"] = {6, 42};
  expect_error(doc, {"'threshold_backward'", "dangling input id 42"});
  doc = tiny();
  doc["nodes"][2]["inputs"] = {0, 3};  // mm reads relu, which reads mm: a cycle
  expect_error(doc, {"'mm'", "forward reference to input id 3"});
  doc = tiny();
  doc["nodes"][3]["inputs"] = {3};
  expect_error(doc, {"'relu'", "cycle"});
}

TEST_CASE("rejects input positions out of range", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][6]["aliased_inputs"] = {3};
  expect_error(doc, {"'expand'", "'aliased_inputs' position 3 is out of range"});
}

TEST_CASE("prints a stable text form", "[graph][print]") {
  auto g = load_graph(tiny().dump()).graph;
  std::string text = print_graph(g);
  CHECK(text == print_graph(load_graph(tiny().dump()).graph));
  CHECK(hyper_ac::testing::matches_golden("tiny_mlp", text));
}

TEST_CASE("round-trips through canonical JSON", "[graph][roundtrip]") {
  auto g = load_graph(tiny().dump()).graph;
  std::string once = graph_to_json(g);
  auto again = load_graph(once).graph;
  CHECK(graph_to_json(again) == once);
  CHECK(print_graph(again) == print_graph(g));
  GraphBuilder b;
  b.placeholder("x").op("a", "aten::relu.default", {"x"}, "layers.0").output({"a"});
  b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
  auto with_model = b.graph();
  auto back = load_graph(graph_to_json(with_model)).graph;
  CHECK(back.model.present);
  CHECK(back.model.marked);
  REQUIRE(back.model.modules.size() == 2);
  CHECK(back.model.modules[0].fqn == "layers");
  CHECK(back.model.modules[0].container);
  CHECK(back.model.modules[1].fqn == "layers.0");
  CHECK_FALSE(back.model.modules[1].container);
  CHECK(graph_to_json(back) == graph_to_json(with_model));
}

TEST_CASE("the compact wire form (interned stacks, defaults left out) loads the same graph", "[graph][roundtrip]") {
  json full = tiny();
  json wire = full;
  wire["module_stacks"] = json::array({json::array({{{"fqn", "layers.0"}, {"type", "Block"}}})});
  for (auto& node : wire["nodes"]) {
    if (node.contains("module_stack")) {
      node.erase("module_stack");
      node["stack"] = 0;
    }
  }
  auto a = load_graph(full.dump()).graph;
  auto b = load_graph(wire.dump()).graph;
  CHECK(graph_to_json(a) == graph_to_json(b));
  CHECK(print_graph(a) == print_graph(b));

  json bad = wire;
  bad["nodes"][2]["stack"] = 3;
  expect_error(bad, {"'mm'", "'stack' 3 is out of range"});
  bad = wire;
  bad["nodes"][2]["module_stack"] = json::array();
  expect_error(bad, {"'mm'", "both 'stack' and 'module_stack'"});
  bad = wire;
  bad["extra"] = 1;
  expect_error(bad, {"unknown top-level field 'extra'"});
}
