// The graph format declared once (core/src/graph_fields.h): the field table
// drives both loaders, and they agree; the docs' table is the generated one;
// print_graph shows every flag of the table.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph_builder.h"
#include "load_outcome.h"
#include "hyper_ac/graph.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using hyper_ac::testing::json;

namespace {

const std::filesystem::path kData = HYPER_AC_TEST_DATA;

std::string read(const std::filesystem::path& path) { return hyper_ac::testing::read_text(path.string()); }

using hyper_ac::testing::Outcome;
using hyper_ac::testing::load;
using hyper_ac::testing::outcome_of;
using hyper_ac::testing::reference;

// The fast path accepts a document only if the reference does, with the same
// Graph; where it declines, the public load gives the reference's outcome.
// Returns whether the fast path itself read it.
bool agree(const std::string& text) {
  const Outcome pub = load(text, {});
  const Outcome ref = load(text, reference());
  INFO("document: " << text.substr(0, 600));
  REQUIRE(pub.ok == ref.ok);
  if (ref.ok)
    REQUIRE(identical(pub.graph, ref.graph));
  else
    REQUIRE(pub.error == ref.error);
  return pub.fast;
}

// Every graph document under tests/data (the committed captured graphs included).
std::vector<std::filesystem::path> data_graphs() {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(kData))
    if (entry.path().extension() == ".json" && entry.path().filename() != "plan_hashes.json") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  return paths;
}

// The node fields of the table, by name.
std::vector<std::string> node_fields() {
  std::vector<std::string> names;
  for (const auto& field : graph_fields())
    if (field.section == "node") names.push_back(field.name);
  return names;
}

// ---- structural mutations -----------------------------------------------------

// Values of every JSON kind, and of the shapes the fields take.
json random_value(std::mt19937& rng, const json& node_names) {
  static const std::vector<json> values = {
      nullptr, true, false, 0, 1, 2, 3, -1, -0.0, 1.5, 1e300, std::int64_t{1} << 40, "", "x", "placeholder",
      "call_function", "output", "backward", "forward", "parameter", "tangent", "MUST_SAVE", "PREFER_RECOMPUTE",
      json::array(), json::array({0}), json::array({1, 0}), json::array({0, 0}), json::array({"a"}),
      json::object(), json::array({json::object()}), json::array({{{"bytes", 4}}}),
      json::array({{{"fqn", "layers.0"}, {"type", "Block"}}}), json::array({{{"fqn", "m"}}})};
  if (rng() % 8 == 0 && !node_names.empty()) return node_names[rng() % node_names.size()];
  return values[rng() % values.size()];
}

// Every object in the document with its path, for picking one to edit.
void objects(json& value, std::vector<json*>& out) {
  if (value.is_object()) {
    out.push_back(&value);
    for (auto& item : value.items()) objects(item.value(), out);
  } else if (value.is_array()) {
    for (auto& entry : value) objects(entry, out);
  }
}

// One structural edit of the tree: a key dropped, a value of another kind or
// value, a field of the table added, a node dropped or repeated, inputs rewired.
void mutate(json& doc, std::mt19937& rng, const std::vector<std::string>& fields) {
  std::vector<json*> all;
  objects(doc, all);
  json names = json::array();
  if (doc.contains("nodes") && doc["nodes"].is_array())
    for (auto& node : doc["nodes"])
      if (node.is_object() && node.contains("name")) names.push_back(node["name"]);
  json& target = *all[rng() % all.size()];
  switch (rng() % 6) {
    case 0:  // drop a key
      if (!target.empty()) {
        auto it = target.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % target.size()));
        target.erase(it.key());
      }
      break;
    case 1:
    case 2:  // change a value
      if (!target.empty()) {
        auto it = target.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % target.size()));
        *it = random_value(rng, names);
      }
      break;
    case 3:  // set a field of the table (or an unknown one) on this object
      target[rng() % 10 == 0 ? std::string("extra") : fields[rng() % fields.size()]] = random_value(rng, names);
      break;
    case 4: {  // drop or repeat a node
      json& nodes = doc["nodes"];
      if (!nodes.is_array() || nodes.empty()) break;
      const std::size_t at = rng() % nodes.size();
      if (rng() % 2) nodes.erase(at);
      else nodes.insert(nodes.begin() + static_cast<std::ptrdiff_t>(rng() % nodes.size()), nodes[at]);
      break;
    }
    default: {  // rewire an input to another node's id
      json& nodes = doc["nodes"];
      if (!nodes.is_array() || nodes.size() < 2) break;
      json& node = nodes[rng() % nodes.size()];
      const json& other = nodes[rng() % nodes.size()];
      if (node.is_object() && other.is_object() && other.contains("id") && node.contains("inputs") &&
          node["inputs"].is_array())
        node["inputs"].push_back(other["id"]);
      break;
    }
  }
}

// A key written twice in one node object (a tree cannot hold it: text level).
std::string duplicate_key(const std::string& text, std::mt19937& rng, const std::vector<std::string>& fields) {
  const std::string key = "\"" + fields[rng() % fields.size()] + "\":";
  std::vector<std::size_t> at;
  for (std::size_t p = text.find(key); p != std::string::npos; p = text.find(key, p + 1)) at.push_back(p);
  if (at.empty()) return text;
  std::string out = text;
  out.insert(at[rng() % at.size()], key + (rng() % 2 ? "null," : "0,"));
  return out;
}

}  // namespace

TEST_CASE("the field table: every node field once, Node's members named", "[graph][fields]") {
  std::set<std::string> seen;
  for (const auto& name : node_fields()) CHECK(seen.insert(name).second);
  for (const char* name : {"id", "name", "kind", "target", "inputs", "phase", "fusible", "rng_state_bytes", "policy",
                           "ac_graph_id", "copy", "stack", "module_stack"})
    CHECK(seen.count(name) == 1);
  for (const auto& field : graph_fields()) {
    INFO(field.section << "." << field.name);
    CHECK(field.required == field.default_json.empty());
  }
}

TEST_CASE("docs/graph-format.md's field table is the generated one", "[graph][fields][docs]") {
  const std::string doc = read(kData / ".." / ".." / "docs" / "graph-format.md");
  const std::string begin = "<!-- graph_fields: generated by hyper_ac._core.graph_fields_markdown() -->\n";
  const std::string end = "<!-- graph_fields: end -->";
  const auto from = doc.find(begin);
  const auto to = doc.find(end);
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  CHECK(doc.substr(from + begin.size(), to - from - begin.size()) == graph_fields_markdown());
}

TEST_CASE("the loaders agree on every test graph", "[graph][fields][load]") {
  int fast = 0, graphs = 0;
  for (const auto& path : data_graphs()) {
    INFO(path.string());
    const std::string text = read(path);
    fast += agree(text) ? 1 : 0;
    ++graphs;
    // and on its canonical form
    const Outcome ref = load(text, reference());
    if (ref.ok) fast += agree(graph_to_json(ref.graph)) ? 1 : 0;
  }
  CHECK(graphs >= 4);
  CHECK(fast >= 4);  // the valid ones are the fast path's own
  agree(hyper_ac::testing::two_units().text());
}

TEST_CASE("the loaders agree on 10,000 structurally mutated documents", "[graph][fields][load][errors]") {
  const std::vector<std::string> fields = [] {
    auto names = node_fields();
    for (const char* other : {"bytes", "dtype", "shape", "fqn", "type", "format", "version", "model", "module_stacks",
                              "nodes", "modules", "container", "marked", "same_as"})
      names.push_back(other);
    return names;
  }();
  // Small bases (each load is cheap): the test graphs under 20 kB.
  std::vector<json> bases;
  for (const auto& path : data_graphs()) {
    const std::string text = read(path);
    if (text.size() < 20000 && load(text, reference()).ok) bases.push_back(json::parse(text));
  }
  bases.push_back(json::parse(hyper_ac::testing::two_units().text()));
  REQUIRE(bases.size() >= 3);
  std::mt19937 rng(23);
  int accepted = 0, fast = 0;
  for (int trial = 0; trial < 10000; ++trial) {
    json doc = bases[static_cast<std::size_t>(trial) % bases.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) mutate(doc, rng, fields);
    std::string text = doc.dump();
    if (rng() % 8 == 0) text = duplicate_key(text, rng, fields);
    const bool by_fast = agree(text);
    fast += by_fast ? 1 : 0;
    accepted += load(text, reference()).ok ? 1 : 0;
  }
  // The edits reach both sides: many are accepted (by the fast path itself), many rejected.
  CHECK(accepted > 500);
  CHECK(fast > 500);
  CHECK(accepted < 9500);
}

TEST_CASE("the cross-field rules (check_node) are named by the public load", "[graph][fields][errors]") {
  const json base = json::parse(read(kData / "tiny_mlp.json"));
  auto error_of = [](const json& doc) {
    const Outcome out = load(doc.dump(), {});
    return out.ok ? std::string("(accepted)") : out.error;
  };
  json doc = base;
  doc["nodes"][2]["rng_state_bytes"] = 16;
  CHECK_THAT(error_of(doc), Catch::Contains("'rng_state_bytes' is only meaningful with 'rng': true"));
  doc["nodes"][2]["rng"] = true;
  CHECK(error_of(doc) == "(accepted)");
  doc = base;
  doc["nodes"][2]["ac_graph_id"] = 1;
  CHECK_THAT(error_of(doc), Catch::Contains("'ac_graph_id' is set without a 'policy'"));
  doc = base;
  doc["nodes"][2]["copy"] = true;  // mm has two inputs
  CHECK_THAT(error_of(doc), Catch::Contains("'copy' marks an exact copy of one input"));
  doc = base;
  doc["nodes"][0]["copy"] = true;  // a placeholder
  CHECK_THAT(error_of(doc), Catch::Contains("'copy' marks an exact copy of one input"));
  doc = base;
  doc["nodes"][2]["mutated"] = true;
  CHECK_THAT(error_of(doc), Catch::Contains("'mutated' is only meaningful on placeholders"));
  doc = base;
  doc["nodes"][1]["inputs"] = {0};
  CHECK_THAT(error_of(doc), Catch::Contains("a placeholder cannot have inputs"));
  doc = base;
  doc["nodes"][2]["autograd_node"] = 4;  // a forward op
  CHECK_THAT(error_of(doc), Catch::Contains("'autograd_node' names the eager autograd node a backward op runs in"));
  doc = base;
  doc["nodes"][2]["autograd_node"] = -2;
  CHECK_THAT(error_of(doc), Catch::Contains("'autograd_node' must be >= 0"));
  doc = base;
  doc["nodes"][7]["autograd_node"] = 4;  // threshold_backward: a backward op
  CHECK(error_of(doc) == "(accepted)");
}

TEST_CASE("print_graph shows every flag of the table", "[graph][fields][print]") {
  json doc = json::parse(read(kData / "tiny_mlp.json"));
  json& mm = doc["nodes"][2];
  mm["rng"] = true;
  mm["rng_state_bytes"] = 16;
  mm["fusible"] = true;
  mm["policy"] = "MUST_SAVE";
  mm["ac_graph_id"] = 3;
  const std::string text = print_graph(load_graph(doc.dump()).graph);
  INFO(text);
  CHECK(text.find("{rng,rng_state_bytes=16,fusible,policy=MUST_SAVE,ac_graph_id=3}") != std::string::npos);
  // A field changed anywhere changes the text (the golden tests see it).
  const Graph base = load_graph(read(kData / "tiny_mlp.json")).graph;
  for (const auto& field : graph_fields()) {
    if (field.section != "node" || field.flag.empty()) continue;
    INFO(field.name);
    json changed = json::parse(read(kData / "tiny_mlp.json"));
    json& node = changed["nodes"][field.name == "mutated" ? 0 : 3];  // a placeholder / relu, one input, no flags
    if (field.kind == "boolean") node[field.name] = true;
    else if (field.name == "rng_state_bytes") node["rng"] = true, node[field.name] = 8;
    else if (field.name == "mutated_inputs") node[field.name] = {0};
    else if (field.name == "role") node[field.name] = "buffer";
    else if (field.name == "policy") node[field.name] = "MUST_SAVE";
    else if (field.name == "ac_graph_id") node["policy"] = "MUST_SAVE", node[field.name] = 2;
    else if (field.name == "recomputed_from") node[field.name] = "mm";
    else if (field.name == "measured_seconds") node[field.name] = 0.5;
    else FAIL("a flag the test does not set: " << field.name);
    LoadOptions as_written;
    as_written.elide_copies = false;
    CHECK(print_graph(load_graph(changed.dump(), as_written).graph) != print_graph(base));
  }
}
