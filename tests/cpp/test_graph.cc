#include <catch2/catch.hpp>

#include <map>

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

// ---- issue 14: faults of the JSON itself, named ----------------------------

TEST_CASE("a number past double range is a GraphError naming the field", "[graph][errors]") {
  std::string text = tiny().dump();
  const std::string flops = "\"flops\":128";
  REQUIRE(text.find(flops) != std::string::npos);
  text.replace(text.find(flops), flops.size(), "\"flops\":1e309");
  try {
    load_graph(text);
    FAIL("expected GraphError");
  } catch (const GraphError& error) {
    std::string message = error.what();
    INFO(message);
    CHECK(message.find("1e309") != std::string::npos);
    CHECK(message.find("nodes[2].flops") != std::string::npos);
    CHECK(message.find("out of range") != std::string::npos);
  }
  // The reproducer the fuzzer found (a GraphError, not nlohmann's out_of_range.406).
  CHECK_THROWS_AS(load_graph(R"({"format": "hyper_ac.graph", "version": 1, "nodes": [{"id": 1e309}]})"), GraphError);
}

TEST_CASE("duplicate input ids on a node are rejected", "[graph][errors]") {
  json doc = tiny();
  doc["nodes"][9]["inputs"] = {8, 7, 8};
  expect_error(doc, {"'mm_1'", "lists input id 8 twice"});
  // Also on a node with many inputs (the fast path's sorted check).
  doc = tiny();
  json many = json::array();
  for (int k = 0; k < 20; ++k) many.push_back(k % 10);
  many.push_back(4);
  doc["nodes"][10]["inputs"] = many;
  expect_error(doc, {"'output'", "lists input id 0 twice"});
}

TEST_CASE("a JSON key repeated in one object is rejected, naming it", "[graph][errors]") {
  std::string text = tiny().dump();
  const std::string kind = "\"kind\":\"call_function\"";
  const auto at = text.find(kind);
  REQUIRE(at != std::string::npos);
  text.insert(at, "\"kind\":\"placeholder\",");
  CHECK_THROWS_WITH(load_graph(text), Catch::Contains("key 'kind' appears twice in 'nodes[2]'"));
  CHECK_THROWS_WITH(load_graph(R"({"version": 1, "version": 1, "nodes": []})"),
                    Catch::Contains("key 'version' appears twice in the document"));
  // Repeats inside nested objects and the model section are caught too.
  CHECK_THROWS_WITH(
      load_graph(R"({"version": 1, "nodes": [], "model": {"type": "A", "modules": [{"fqn": "a", "fqn": "b", "type": "T"}]}})"),
      Catch::Contains("key 'fqn' appears twice in 'model.modules[0]'"));
}

// Valid documents in shapes the loaders treat specially (the fast path
// declines some of them): the same graph as the plain document.
TEST_CASE("special shapes load: table after nodes, null optionals, ignored fact fields, sparse ids", "[graph][roundtrip]") {
  json wire = tiny();
  for (auto& node : wire["nodes"]) {
    if (node.contains("module_stack")) {
      node.erase("module_stack");
      node["stack"] = 1;
    }
    node["policy"] = nullptr;
    node["recomputed_from"] = nullptr;
    if (node.contains("outputs")) node["outputs"][0]["note"] = {{"nested", {1, 2, {{"x", 3}}}}};
  }
  wire["module_stacks"] = json::array({json::array(), json::array({{{"fqn", "layers.0"}, {"type", "Block"}}})});
  auto streamed = load_graph(wire.dump()).graph;
  CHECK(print_graph(streamed) == print_graph(load_graph(tiny().dump()).graph));
  CHECK(graph_to_json(streamed) == graph_to_json(load_graph(tiny().dump()).graph));
  // module_stacks after nodes: legal, read by the reference path.
  json after = wire;
  after.erase("module_stacks");
  std::string text = after.dump();
  text.pop_back();  // the closing brace: append the table after 'nodes'
  text += R"(,"module_stacks":[[],[{"fqn":"layers.0","type":"Block"}]]})";
  auto a = load_graph(text).graph;
  CHECK(a.stack_of(a.nodes[2]).front().fqn == "layers.0");
  CHECK(a.nodes[0].stack == -1);
  // Sparse, large ids (past the dense table).
  json sparse = tiny();
  std::map<std::int64_t, std::int64_t> remap;
  for (auto& node : sparse["nodes"]) {
    std::int64_t id = node["id"];
    remap[id] = (std::int64_t{1} << 40) + id * 1000003;
    node["id"] = remap[id];
  }
  for (auto& node : sparse["nodes"])
    for (auto& input : node["inputs"]) input = remap[input.get<std::int64_t>()];
  auto s = load_graph(sparse.dump()).graph;
  auto t = load_graph(tiny().dump()).graph;
  CHECK(print_graph(s) == print_graph(t));
  CHECK(s.users == t.users);
  // Flops as an integer past int64 (a valid number) and as a float.
  json big = tiny();
  big["nodes"][2]["flops"] = json::number_unsigned_t{18446744073709551615ull};
  CHECK(load_graph(big.dump()).graph.nodes[2].flops == Approx(1.8446744073709552e19));
}

// Exact copies (docs/graph-format.md, "Elided copies"): the dropout-with-p=0
// clone of a decomposed attention, read by the forward and the backward.
namespace {

GraphBuilder attention_like(json copy_extra = {{"copy", true}}) {
  GraphBuilder b;
  b.placeholder("x").placeholder("v")
      .op("probs", "aten._softmax.default", {"x"})
      .op("clone", "aten.clone.default", {"probs"}, "", copy_extra)
      .op("expand", "aten.expand.default", {"clone"}, "", {{"view", true}})
      .op("out", "aten.bmm.default", {"expand", "v"})
      .bwd("grad_v", "aten.bmm.default", {"expand", "out"})
      .bwd("grad_x", "aten._softmax_backward_data.default", {"probs", "clone", "grad_v"})
      .output({"out", "grad_x"});
  return b;
}

}  // namespace

TEST_CASE("an exact forward copy is elided at load: its readers read the source", "[graph][copy]") {
  const GraphBuilder b = attention_like();
  const LoadResult loaded = load_graph(b.text());
  const Graph& g = loaded.graph;
  CHECK(loaded.stats.elided_copies == 1);
  CHECK(loaded.stats.nodes == 8);
  REQUIRE(g.elided_copies.size() == 1);
  CHECK(g.elided_copies[0].node == "clone");
  CHECK(g.elided_copies[0].source == "probs");
  std::map<std::string, std::int32_t> at;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) at[g.nodes[i].name] = static_cast<std::int32_t>(i);
  CHECK(at.count("clone") == 0);
  // The view of the copy is a view of the source now.
  CHECK(g.nodes[static_cast<std::size_t>(at["expand"])].inputs == std::vector<std::int32_t>{at["probs"]});
  // A reader of both lists the source once, and keeps its other inputs in order.
  CHECK(g.nodes[static_cast<std::size_t>(at["grad_x"])].inputs == std::vector<std::int32_t>{at["probs"], at["grad_v"]});
  const auto& users = g.users[static_cast<std::size_t>(at["probs"])];
  CHECK(users == std::vector<std::int32_t>{at["expand"], at["grad_x"]});
  // As written (the printer, round trips): nothing removed, the flag kept.
  LoadOptions as_written;
  as_written.elide_copies = false;
  const Graph raw = load_graph(b.text(), as_written).graph;
  CHECK(raw.nodes.size() == 9);
  CHECK(raw.elided_copies.empty());
  CHECK(raw.nodes[3].copy);
  CHECK(load_graph(graph_to_json(raw), as_written).graph.nodes[3].copy);
  CHECK(print_graph(raw).find("{copy}") != std::string::npos);
  // What the backward reads shrinks by the copy's bytes (one storage, not two).
  CHECK(summarize(g).activation_bytes_read_by_backward + 64 == summarize(raw).activation_bytes_read_by_backward);
  CHECK(summarize(g).elided_copies == 1);
  CHECK(format_summary(summarize(g)).find("elided copies: 1 ") != std::string::npos);
}

TEST_CASE("a copy that something could tell apart from its source is kept", "[graph][copy]") {
  auto kept = [](const GraphBuilder& b) { return load_graph(b.text()).graph.elided_copies.empty(); };
  SECTION("the source is written in place later") {
    GraphBuilder b = attention_like();
    b.op("relu_", "aten.relu_.default", {"probs"}, "", {{"mutated_inputs", {0}}, {"aliased_inputs", {0}}});
    CHECK(kept(b));
  }
  SECTION("the copy is written in place (through a view)") {
    GraphBuilder b = attention_like();
    b.op("add_", "aten.add_.Tensor", {"expand"}, "", {{"mutated_inputs", {0}}, {"aliased_inputs", {0}}});
    CHECK(kept(b));
  }
  SECTION("the copy is returned") {
    GraphBuilder b;
    b.placeholder("x").op("probs", "aten._softmax.default", {"x"})
        .op("clone", "aten.clone.default", {"probs"}, "", {{"copy", true}})
        .bwd("g", "aten.mul.Tensor", {"probs"})
        .output({"clone", "g"});
    CHECK(kept(b));
  }
  SECTION("the source is a placeholder the step writes") {
    GraphBuilder b;
    b.placeholder("buf").op("clone", "aten.clone.default", {"buf"}, "", {{"copy", true}})
        .bwd("g", "aten.mul.Tensor", {"clone"}).output({"g"});
    json doc = b.document();
    doc["nodes"][0]["mutated"] = true;
    CHECK(load_graph(doc.dump()).graph.elided_copies.empty());
  }
  SECTION("the user tagged the copy differently from its source") {
    CHECK(kept(attention_like({{"copy", true}, {"policy", "MUST_SAVE"}})));
  }
  SECTION("not marked") {
    CHECK(kept(attention_like(json::object())));
  }
}

TEST_CASE("a chain of copies resolves to the first source", "[graph][copy]") {
  GraphBuilder b;
  b.placeholder("x").op("a", "aten.relu.default", {"x"})
      .op("c1", "aten.clone.default", {"a"}, "", {{"copy", true}})
      .op("c2", "aten.clone.default", {"c1"}, "", {{"copy", true}})
      .bwd("g", "aten.mul.Tensor", {"c2", "c1"})
      .output({"g"});
  const Graph g = load_graph(b.text()).graph;
  REQUIRE(g.elided_copies.size() == 2);
  CHECK(g.elided_copies[1].node == "c2");
  CHECK(g.elided_copies[1].source == "a");
  CHECK(g.nodes[2].name == "g");
  CHECK(g.nodes[2].inputs == std::vector<std::int32_t>{1});
}

TEST_CASE("'copy' is only accepted on a call_function with one input", "[graph][copy][errors]") {
  GraphBuilder b;
  b.placeholder("x").placeholder("y").op("c", "aten.clone.default", {"x", "y"}, "", {{"copy", true}}).output({"c"});
  expect_error(b.document(), {"'c'", "'copy' marks an exact copy of one input"});
}
