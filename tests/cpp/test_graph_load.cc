// The two graph loaders (docs/graph-format.md, "How loading works"): the
// simdjson fast path must build exactly the reference loader's Graph on every
// valid document, and must accept nothing the reference rejects (the public
// load then names every fault exactly as the reference does).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "graph_builder.h"
#include "load_outcome.h"
#include "hyper_ac/graph.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using hyper_ac::testing::GraphBuilder;
using hyper_ac::testing::json;

namespace {

std::string data(const std::string& name) {
  return hyper_ac::testing::read_text(std::string(HYPER_AC_TEST_DATA) + "/" + name);
}
json tiny() { return json::parse(data("tiny_mlp.json")); }

using hyper_ac::testing::Outcome;
using hyper_ac::testing::load;
using hyper_ac::testing::outcome_of;
using hyper_ac::testing::reference;

// The public load and the reference-only load agree: the same Graph, or the
// same error message.
void expect_same(const std::string& text) {
  INFO("document: " << text.substr(0, 400));
  const Outcome fast = load(text, {});
  const Outcome ref = load(text, reference());
  REQUIRE(fast.ok == ref.ok);
  if (fast.ok)
    CHECK(identical(fast.graph, ref.graph));
  else
    CHECK(fast.error == ref.error);
}

// Valid documents in every shape the tests use.
std::vector<std::pair<std::string, std::string>> valid_documents() {
  std::vector<std::pair<std::string, std::string>> docs;
  docs.emplace_back("tiny_mlp.json", data("tiny_mlp.json"));
  docs.emplace_back("tiny_mlp canonical", graph_to_json(load_graph(data("tiny_mlp.json")).graph));
  docs.emplace_back("two_units", hyper_ac::testing::two_units().text());
  docs.emplace_back("two_units canonical", graph_to_json(hyper_ac::testing::two_units().graph()));
  docs.emplace_back("two_units without model", hyper_ac::testing::two_units(false).text());

  // The compact wire form: interned stacks (one empty entry), defaults left out, nulls.
  json wire = tiny();
  wire["module_stacks"] = json::array({json::array(), json::array({{{"fqn", "layers.0"}, {"type", "Block"}}})});
  for (auto& node : wire["nodes"]) {
    if (node.contains("module_stack")) {
      node.erase("module_stack");
      node["stack"] = 1;
    } else {
      node["stack"] = 0;
    }
    node["policy"] = nullptr;
    node["recomputed_from"] = nullptr;
    node["ac_graph_id"] = nullptr;
    node["rng_state_bytes"] = nullptr;
    node["outputs"] = node.value("outputs", json::array());
  }
  docs.emplace_back("wire form", wire.dump());
  docs.emplace_back("wire form, indented", wire.dump(2));

  // Every optional field set to something other than its default.
  json every = tiny();
  auto& mm = every["nodes"][2];
  mm["rng"] = true;
  mm["rng_state_bytes"] = 16;
  mm["symint"] = true;
  mm["collective"] = true;
  mm["subgraph"] = true;
  mm["fusible"] = true;
  mm["policy"] = "MUST_SAVE";
  mm["ac_graph_id"] = 3;
  mm["recomputed_from"] = "mm_orig";
  mm["mutated_inputs"] = {1, 0, 1};
  mm["aliased_inputs"] = {0};
  mm["flops"] = 1.5e300;
  mm["outputs"] = json::array({{{"bytes", 0}, {"dtype", nullptr}, {"shape", nullptr}},
                               {{"bytes", 4}, {"dtype", "float16"}, {"shape", {2}}},
                               {{"bytes", 9007199254740993}}});
  every["nodes"][0]["mutated"] = true;
  every["nodes"][0]["role"] = "buffer";
  every["nodes"][1]["role"] = "tangent";
  every["nodes"][3]["policy"] = "PREFER_RECOMPUTE";
  every["nodes"][4]["policy"] = "MUST_RECOMPUTE";
  every["nodes"][5]["policy"] = "PREFER_SAVE";
  every["nodes"][5]["flops"] = 0;
  every["nodes"][6]["flops"] = -0.0 + 1e-320;  // a subnormal
  every["model"] = {{"type", "Net"},
                    {"marked", true},
                    {"modules", json::array({{{"fqn", "layers"}, {"type", "ModuleList"}, {"container", true}},
                                             {{"fqn", "layers.0"}, {"type", "Block"}, {"marked", true}},
                                             {{"fqn", "alias"}, {"type", "Block"}, {"same_as", "layers.0"}}})}};
  docs.emplace_back("every optional field", every.dump());

  // Non-ASCII names (UTF-8, unescaped), and the same stack inline on many nodes.
  json utf = tiny();
  utf["nodes"][3]["name"] = "r\xc3\xa9lu_\xe2\x82\xac";
  utf["nodes"][2]["module_stack"] = utf["nodes"][3]["module_stack"];
  docs.emplace_back("utf-8 names", utf.dump());

  // Sparse, large ids past the dense table; an integer flops past int64; version last.
  json sparse = tiny();
  std::map<std::int64_t, std::int64_t> remap;
  for (auto& node : sparse["nodes"]) {
    const std::int64_t id = node["id"];
    remap[id] = (std::int64_t{1} << 40) + id * 1000003;
    node["id"] = remap[id];
  }
  for (auto& node : sparse["nodes"])
    for (auto& input : node["inputs"]) input = remap[input.get<std::int64_t>()];
  sparse["nodes"][2]["flops"] = json::number_unsigned_t{18446744073709551615ull};
  std::string text = sparse.dump();
  docs.emplace_back("sparse ids", text);

  // A graph from the graph builder with many inputs on one node (the sorted distinct check).
  GraphBuilder wide;
  std::vector<std::string> names;
  for (int k = 0; k < 40; ++k) {
    names.push_back("x" + std::to_string(k));
    wide.placeholder(names.back());
  }
  wide.op("cat", "aten::cat.default", names).output({"cat"});
  docs.emplace_back("40 inputs", wide.text());
  docs.emplace_back("empty graph", R"({"format":"hyper_ac.graph","version":1,"nodes":[]})");
  docs.emplace_back("no format, model null", R"( {"version":1,"model":null,"module_stacks":null,"nodes":[]} )");
  return docs;
}

}  // namespace

TEST_CASE("the fast loader reads every valid test graph into the reference loader's Graph", "[graph][load]") {
  for (const auto& [name, text] : valid_documents()) {
    INFO("document: " << name);
    const Outcome fast = load(text, {});
    const Outcome ref = load(text, reference());
    REQUIRE(ref.ok);
    REQUIRE(fast.ok);
    CHECK(fast.fast);  // the fast path itself read it (no fallback)
    CHECK_FALSE(ref.fast);
    CHECK(identical(fast.graph, ref.graph));
    CHECK(graph_to_json(fast.graph) == graph_to_json(ref.graph));
    CHECK(print_graph(fast.graph) == print_graph(ref.graph));
  }
}

TEST_CASE("identical() sees every field", "[graph][load]") {
  const Graph base = load_graph(data("tiny_mlp.json")).graph;
  CHECK(identical(base, base));
  std::vector<void (*)(Graph&)> changes = {
      [](Graph& g) { g.nodes[2].flops = -0.0 * g.nodes[2].flops; },
      [](Graph& g) { g.nodes[2].outputs[0].shape.push_back(1); },
      [](Graph& g) { g.nodes[2].target += "x"; },
      [](Graph& g) { g.nodes[2].fusible = !g.nodes[2].fusible; },
      [](Graph& g) { g.nodes[2].rng_state_bytes = 8; },
      [](Graph& g) { g.nodes[2].ac_graph_id = 1; },
      [](Graph& g) { g.nodes[2].recomputed_from = "a"; },
      [](Graph& g) { g.stacks[0][0].type = "Other"; },
      [](Graph& g) { g.model.present = true; },
      [](Graph& g) { g.users[0].clear(); },
  };
  for (std::size_t i = 0; i < changes.size(); ++i) {
    INFO("change " << i);
    Graph changed = base;
    changes[i](changed);
    CHECK_FALSE(identical(base, changed));
  }
}

TEST_CASE("shapes the fast loader leaves to the reference loader load the same", "[graph][load]") {
  // Each is valid; the fast path declines it (escapes, unknown fact or frame
  // fields, the stack table after the nodes, an integer -0) and the reference reads it.
  std::vector<std::string> docs;
  json escaped = tiny();
  std::string text = escaped.dump();
  const std::string relu = "\"name\":\"relu\"";
  REQUIRE(text.find(relu) != std::string::npos);
  text.replace(text.find(relu), relu.size(), "\"name\":\"r\\u0065lu\\n\"");
  docs.push_back(text);
  text = escaped.dump();
  text.replace(text.find("\"kind\""), 6, "\"\\u006bind\"");  // an escaped key
  docs.push_back(text);
  json extra = tiny();
  extra["nodes"][2]["outputs"][0]["note"] = {{"nested", {1, 2, {{"x", 3}}}}};
  docs.push_back(extra.dump());
  extra = tiny();
  extra["nodes"][2]["module_stack"][0]["note"] = 1;
  docs.push_back(extra.dump());
  json after = tiny();
  text = after.dump();
  text.pop_back();
  text += R"(,"module_stacks":[[{"fqn":"layers.0","type":"Block"}]]})";
  docs.push_back(text);
  text = tiny().dump();
  text.replace(text.find("\"flops\":128"), 11, "\"flops\":-0");
  docs.push_back(text);
  for (const auto& doc : docs) {
    INFO("document: " << doc.substr(0, 300));
    const Outcome fast = load(doc, {});
    const Outcome ref = load(doc, reference());
    REQUIRE(ref.ok);
    REQUIRE(fast.ok);
    CHECK_FALSE(fast.fast);
    CHECK(identical(fast.graph, ref.graph));
  }
}

TEST_CASE("invalid documents give the reference loader's error through the public load", "[graph][load][errors]") {
  std::vector<std::string> docs = {
      "", " ", "{not json", "[1,2]", "null", "{}", R"({"version":1})", R"({"version":1,"nodes":{}})",
      R"({"version":1,"nodes":[]} x)", R"({"version":1,"nodes":[]}})", R"({"version":1,"nodes":[],})",
      R"({"version":1,"version":1,"nodes":[]})", R"({"version":2,"nodes":[]})", R"({"version":1.0,"nodes":[]})",
      R"({"version":"1","nodes":[]})", R"({"version":18446744073709551615,"nodes":[]})",
      R"({"format":"other","version":1,"nodes":[]})", R"({"format":null,"version":1,"nodes":[]})",
      R"({"version":1,"nodes":[],"extra":1})", R"({"version":1,"nodes":[],"model":{"type":"A","units":[]}})",
      R"({"version":1,"nodes":[],"model":{"type":"A","modules":[{"fqn":"a","fqn":"b","type":"T"}]}})",
      R"({"version":1,"nodes":[],"model":[]})", R"({"version":1,"nodes":[],"module_stacks":[[{"fqn":"a"}]]})",
      R"({"version":1,"nodes":[],"module_stacks":[[{"fqn":"a","type":"T","fqn":"b"}]]})",
      R"({"version":1,"nodes":[{"id": 1e309}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","flops":1e999}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","flops":-1}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","flops":null,"rng":null,"rng_state_bytes":4}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","ac_graph_id":0}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","stack":0}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x\ud800","kind":"placeholder","target":"x","inputs":[],"phase":"forward"}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x	","kind":"placeholder","target":"x","inputs":[],"phase":"forward"}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward"},{"id":0,"name":"y","kind":"placeholder","target":"x","inputs":[],"phase":"forward"}]})",
      R"({"version":1,"nodes":[{"id":0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward"},{"id":1,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward"}]})",
      R"({"version":1,"nodes":[{"id":-0,"name":"x","kind":"placeholder","target":"x","inputs":[],"phase":"forward","mutated":true,"mutated_inputs":[0]}]})",
      "{\"version\":1,\"nodes\":[{\"id\":0,\"name\":\"\xff\",\"kind\":\"placeholder\",\"target\":\"x\",\"inputs\":[],\"phase\":\"forward\"}]}",
      data("bad_dangling.json"),
  };
  // The fuzz findings kept as regressions (graph part, up to the NUL): some
  // are valid graphs with a bad config, so only "the same outcome" is required.
  const std::filesystem::path fixed = std::filesystem::path(HYPER_AC_TEST_DATA) / ".." / "fuzz" / "regressions" / "fixed";
  int regressions = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fixed)) {
    std::string input = hyper_ac::testing::read_text(entry.path().string());
    expect_same(input.substr(0, input.find('\0')));
    ++regressions;
  }
  CHECK(regressions >= 6);
  // Every document of the error tests in test_graph.cc, in the same shapes.
  auto edit = [&](auto change) {
    json doc = tiny();
    change(doc);
    docs.push_back(doc.dump());
  };
  edit([](json& d) { d.erase("version"); });
  edit([](json& d) { d["nodes"][3].erase("target"); });
  edit([](json& d) { d["nodes"][2]["flops"] = "many"; });
  edit([](json& d) { d["nodes"][2]["rng"] = 1; });
  edit([](json& d) { d["nodes"][2]["outputs"][0]["bytes"] = -5; });
  edit([](json& d) { d["nodes"][2]["outputs"][0]["bytes"] = nullptr; });
  edit([](json& d) { d["nodes"][2]["outputs"][0]["shape"] = {-1}; });
  edit([](json& d) { d["nodes"][2]["kind"] = "call_method"; });
  edit([](json& d) { d["nodes"][2]["phase"] = "sideways"; });
  edit([](json& d) { d["nodes"][0]["role"] = "weight"; });
  edit([](json& d) { d["nodes"][2]["policy"] = "SAVE"; });
  edit([](json& d) { d["nodes"][2]["colour"] = "red"; });
  edit([](json& d) { d["nodes"][3]["id"] = 2; });
  edit([](json& d) { d["nodes"][3]["name"] = "mm"; });
  edit([](json& d) { d["nodes"][3]["name"] = ""; });
  edit([](json& d) { d["nodes"][7]["inputs"] = {6, 42}; });
  edit([](json& d) { d["nodes"][2]["inputs"] = {0, 3}; });
  edit([](json& d) { d["nodes"][3]["inputs"] = {3}; });
  edit([](json& d) { d["nodes"][3]["inputs"] = nullptr; });
  edit([](json& d) { d["nodes"][9]["inputs"] = {8, 7, 8}; });
  edit([](json& d) { d["nodes"][6]["aliased_inputs"] = {3}; });
  edit([](json& d) { d["nodes"][6]["mutated_inputs"] = {-1}; });
  edit([](json& d) { d["nodes"][0]["inputs"] = {1}; });
  edit([](json& d) { d["nodes"][2]["mutated"] = true; });
  edit([](json& d) { d["nodes"][2]["module_stack"] = json::object(); });
  edit([](json& d) { d["nodes"][2]["module_stack"][0].erase("type"); });
  edit([](json& d) { d["nodes"][2]["stack"] = 0; });
  edit([](json& d) { d["nodes"][2]["id"] = 1.5; });
  edit([](json& d) { d["nodes"][2]["id"] = json::number_unsigned_t{18446744073709551615ull}; });
  edit([](json& d) { d["nodes"][2]["ac_graph_id"] = -1; });
  edit([](json& d) { d["nodes"][2]["outputs"] = json::object(); });
  edit([](json& d) { d["nodes"][2] = 5; });
  edit([](json& d) { d["model"] = {{"type", "A"}, {"modules", {{{"fqn", "a"}, {"type", "T"}, {"same_as", "b"}}}}}; });
  for (const auto& doc : docs) {
    INFO("document: " << doc.substr(0, 400));
    const Outcome fast = load(doc, {});
    const Outcome ref = load(doc, reference());
    REQUIRE_FALSE(ref.ok);
    REQUIRE_FALSE(fast.ok);
    CHECK(fast.error == ref.error);
  }
}

TEST_CASE("mutated documents: the public load and the reference agree byte for byte", "[graph][load][errors]") {
  // One-byte edits (replace, insert, delete) of two valid documents, drawn
  // with a fixed seed: the fast path may accept an edit only if the reference
  // accepts it and builds the same Graph; otherwise both name the same error.
  json every = tiny();
  every["nodes"][2]["flops"] = 1.25e3;
  every["nodes"][2]["policy"] = "MUST_SAVE";
  every["nodes"][2]["ac_graph_id"] = 0;
  every["module_stacks"] = json::array({json::array({{{"fqn", "layers.0"}, {"type", "Block"}}})});
  every["nodes"][4]["stack"] = 0;
  every["nodes"][4].erase("module_stack");
  every["model"] = {{"type", "Net"}, {"modules", {{{"fqn", "layers.0"}, {"type", "Block"}}}}};
  const std::vector<std::string> bases = {tiny().dump(), every.dump()};
  const std::string alphabet = "\"\\{}[],: 0-19.eEnulltrfasx\x01\xc3";
  std::mt19937 rng(13);
  int accepted_by_fast = 0;
  for (const auto& base : bases) {
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text = base;
      const std::size_t at = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text[at] = c; break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: text.erase(at, 1); break;
      }
      const Outcome fast = load(text, {});
      const Outcome ref = load(text, reference());
      INFO("document: " << text);
      REQUIRE(fast.ok == ref.ok);
      if (fast.ok) {
        REQUIRE(identical(fast.graph, ref.graph));
        accepted_by_fast += fast.fast ? 1 : 0;
      } else {
        REQUIRE(fast.error == ref.error);
      }
    }
  }
  CHECK(accepted_by_fast > 100);  // the edits do reach the fast path (e.g. changed digits and names)
}

TEST_CASE("a string with spare capacity is read in place, one without is copied: same graph", "[graph][load]") {
  const std::string text = data("tiny_mlp.json");
  std::string padded;
  padded.reserve(text.size() + 64);
  padded = text;
  std::string tight = text;
  tight.shrink_to_fit();
  const auto a = load_graph(padded);
  const auto b = load_graph(tight);
  CHECK(a.stats.fast_path);
  CHECK(b.stats.fast_path);
  CHECK(identical(a.graph, b.graph));
  expect_same(text);
}

namespace {

// `text` written to a fresh file under the system temp directory.
std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("hyper_ac_test_" + name);
  std::FILE* out = std::fopen(path.string().c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(std::fwrite(text.data(), 1, text.size(), out) == text.size());
  std::fclose(out);
  return path.string();
}

// load_graph_file of `text` gives what load_graph gives: the same graph and
// stats, or the same error message.
void expect_file_same(const std::string& name, const std::string& text, const LoadOptions& options = {}) {
  INFO("file " << name << " (" << text.size() << " bytes)");
  const std::string path = temp_file(name, text);
  const Outcome from_file = outcome_of([&] { return load_graph_file(path, options); });
  std::filesystem::remove(path);
  const Outcome from_text = load(text, options);
  REQUIRE(from_file.ok == from_text.ok);
  CHECK(from_file.fast == from_text.fast);
  if (from_file.ok)
    CHECK(identical(from_file.graph, from_text.graph));
  else
    CHECK(from_file.error == from_text.error);
}

}  // namespace

// The CLI reads graphs with load_graph_file: the file mapped and read in place
// with a zero tail as the fast path's padding (graph.h).
TEST_CASE("load_graph_file reads a file as load_graph reads its bytes", "[graph][load][file]") {
  const std::string text = data("tiny_mlp.json");
  expect_file_same("tiny.json", text);
  expect_file_same("tiny_reference.json", text, reference());
  for (const auto& [name, doc] : valid_documents()) expect_file_same("valid.json", doc);
  // A document ending exactly at a page boundary: the padding is the
  // anonymous pages after the file, not the rest of its last page.
  for (std::size_t page : {std::size_t{4096}, std::size_t{16384}}) {
    std::string exact = text;
    while (!exact.empty() && (exact.back() == '\n' || exact.back() == ' ')) exact.pop_back();
    const std::size_t size = (exact.size() / page + 1) * page;
    exact.insert(exact.size() - 1, size - exact.size(), ' ');  // spaces before the closing brace
    REQUIRE(exact.size() == size);
    expect_file_same("page.json", exact);
  }
  // Errors: the reference loader's message, as through load_graph.
  expect_file_same("dangling.json", data("bad_dangling.json"));
  expect_file_same("broken.json", "{not json");
  expect_file_same("empty.json", "");
  try {
    load_graph_file("/nonexistent/hyper_ac/graph.json");
    FAIL("no error for a missing file");
  } catch (const std::runtime_error& error) {
    CHECK(std::string(error.what()) == "cannot open '/nonexistent/hyper_ac/graph.json'");
  }
  try {
    load_graph_file(std::filesystem::temp_directory_path().string());
    FAIL("no error for a directory");
  } catch (const std::runtime_error& error) {
    CHECK(std::string(error.what()).rfind("cannot read '", 0) == 0);
  }
}
