// The reference graph loader: the document as a JSON tree (nlohmann, with
// json_reader's strict checks), validated node by node with the field table
// (graph_fields.h). It accepts exactly what the fast path accepts and names
// every problem: load_graph runs it whenever the fast path declines a
// document, so every error message is this loader's.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph_fields.h"
#include "graph_load.h"
#include "json_reader.h"

namespace hyper_ac {
namespace graph_load {
namespace {

using json = nlohmann::json;
namespace gf = field_table;

// Names where in the document a problem is, for error messages.
std::string node_label(std::size_t index, const json& node) {
  std::string label = "node #" + std::to_string(index);
  if (node.is_object()) {
    auto it = node.find("name");
    if (it != node.end() && it->is_string()) label += " '" + it->get<std::string>() + "'";
  }
  return label;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw GraphError(where + ": " + what); }

[[noreturn]] void fail_read(const json_reader::ReadError& error) {
  if (error.kind == json_reader::ReadError::Kind::Malformed)
    throw GraphError(std::string("graph JSON is malformed: ") + error.what());
  throw GraphError(std::string("graph JSON: ") + error.what());
}

const char* json_type(const json& value) { return value.type_name(); }

const json& require(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) fail(where, std::string("missing required field '") + key + "'");
  return *it;
}

std::string get_string(const json& value, const char* key, const std::string& where) {
  if (!value.is_string()) fail(where, std::string("field '") + key + "' must be a string, got " + json_type(value));
  return value.get<std::string>();
}

bool get_bool(const json& value, const char* key, const std::string& where) {
  if (!value.is_boolean()) fail(where, std::string("field '") + key + "' must be a boolean, got " + json_type(value));
  return value.get<bool>();
}

bool optional_bool(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  return it != object.end() && !it->is_null() && get_bool(*it, key, where);
}

std::int64_t get_int(const json& value, const std::string& what, const std::string& where) {
  if (!value.is_number_integer()) fail(where, what + " must be an integer, got " + json_type(value));
  return value.get<std::int64_t>();
}

// The keys of one section of the field table, for "expected ..." messages.
std::string section_keys(const char* section) {
  std::string keys;
  for (const auto& field : graph_fields())
    if (field.section == section) keys += (keys.empty() ? "" : ", ") + field.name;
  return keys;
}

bool in_section(const char* section, const std::string& key) {
  for (const auto& field : graph_fields())
    if (field.section == section && field.name == key) return true;
  return false;
}

std::vector<std::int32_t> get_positions(const json& value, const char* key, std::size_t input_count,
                                        const std::string& where) {
  if (!value.is_array()) fail(where, std::string("field '") + key + "' must be an array, got " + json_type(value));
  std::vector<std::int32_t> positions;
  for (const auto& entry : value) {
    std::int64_t position = get_int(entry, std::string("entry of '") + key + "'", where);
    if (position < 0 || static_cast<std::size_t>(position) >= input_count)
      fail(where, std::string("'") + key + "' position " + std::to_string(position) + " is out of range (node has " +
                      std::to_string(input_count) + " inputs)");
    positions.push_back(static_cast<std::int32_t>(position));
  }
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  return positions;
}

ModuleFrame parse_frame(const json& value, const std::string& where) {
  if (!value.is_object()) fail(where, std::string("module frame must be an object, got ") + json_type(value));
  ModuleFrame frame;
  frame.fqn = get_string(require(value, "fqn", where), "fqn", where);
  frame.type = get_string(require(value, "type", where), "type", where);
  return frame;
}

std::vector<ModuleFrame> parse_frames(const json& value, const char* key, const std::string& where) {
  if (!value.is_array()) fail(where, std::string("field '") + key + "' must be an array, got " + json_type(value));
  std::vector<ModuleFrame> frames;
  frames.reserve(value.size());
  for (const auto& entry : value) frames.push_back(parse_frame(entry, where + " " + key));
  return frames;
}

ModuleFact parse_module(const json& raw, const std::string& at) {
  if (!raw.is_object()) fail(at, std::string("must be an object, got ") + json_type(raw));
  for (const auto& item : raw.items())
    if (!in_section("module", item.key()))
      fail(at, "unknown field '" + item.key() + "' (expected " + section_keys("module") + ")");
  ModuleFact fact;
  fact.fqn = get_string(require(raw, "fqn", at), "fqn", at);
  if (fact.fqn.empty()) fail(at, "field 'fqn' is empty (the root module is not listed)");
  fact.type = get_string(require(raw, "type", at), "type", at);
  fact.container = optional_bool(raw, "container", at);
  fact.marked = optional_bool(raw, "marked", at);
  auto same = raw.find("same_as");
  if (same != raw.end() && !same->is_null()) fact.same_as = get_string(*same, "same_as", at);
  return fact;
}

// The `model` section: the live module tree (docs/graph-format.md).
ModelFacts parse_model(const json& model) {
  const std::string where = "graph 'model'";
  if (!model.is_object()) fail(where, std::string("must be an object, got ") + json_type(model));
  if (model.contains("units"))
    fail(where, "carries 'units', the unit list of an older format: units are now discovered by the core from the "
                "module tree; re-serialise the graph with this hyper_ac (hyper_ac.serialize.to_json(gm, model))");
  for (const auto& item : model.items())
    if (!in_section("model", item.key()))
      fail(where, "unknown field '" + item.key() + "' (expected " + section_keys("model") + ")");
  ModelFacts facts;
  facts.present = true;
  auto type = model.find("type");
  if (type != model.end() && !type->is_null()) facts.type = get_string(*type, "type", where);
  facts.marked = optional_bool(model, "marked", where);
  auto modules = model.find("modules");
  if (modules == model.end() || modules->is_null()) return facts;
  if (!modules->is_array()) fail(where, std::string("field 'modules' must be an array, got ") + json_type(*modules));
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < modules->size(); ++i) {
    const std::string at = where + " modules[" + std::to_string(i) + "]";
    ModuleFact fact = parse_module((*modules)[i], at);
    if (!fact.same_as.empty()) {
      auto first = index.find(fact.same_as);
      if (first == index.end())
        fail(at, "'same_as' names '" + fact.same_as + "', which is not listed before '" + fact.fqn + "'");
      if (!facts.modules[first->second].same_as.empty())
        fail(at, "'same_as' names '" + fact.same_as + "', itself a repeat of '" +
                     facts.modules[first->second].same_as + "'; name the first listing");
    }
    if (!index.emplace(fact.fqn, facts.modules.size()).second) fail(at, "module '" + fact.fqn + "' is listed twice");
    facts.modules.push_back(std::move(fact));
  }
  return facts;
}

TensorFact parse_fact(const json& value, const std::string& where) {
  if (!value.is_object()) fail(where, std::string("output fact must be an object, got ") + json_type(value));
  TensorFact fact;
  fact.bytes = get_int(require(value, "bytes", where), "output 'bytes'", where);
  if (fact.bytes < 0) fail(where, "output 'bytes' is negative (" + std::to_string(fact.bytes) + ")");
  auto dtype = value.find("dtype");
  if (dtype != value.end() && !dtype->is_null()) fact.dtype = get_string(*dtype, "dtype", where);
  auto shape = value.find("shape");
  if (shape != value.end() && !shape->is_null()) {
    if (!shape->is_array()) fail(where, std::string("output 'shape' must be an array, got ") + json_type(*shape));
    for (const auto& dim : *shape) {
      std::int64_t size = get_int(dim, "shape entry", where);
      if (size < 0) fail(where, "shape entry is negative (" + std::to_string(size) + ")");
      fact.shape.push_back(size);
    }
  }
  return fact;
}

std::string stack_key(const std::vector<ModuleFrame>& frames) {
  std::string key;
  for (const auto& frame : frames) {
    key += frame.fqn;
    key += '\x1f';
    key += frame.type;
    key += '\x1e';
  }
  return key;
}

// What reading the nodes keeps from node to node.
struct Reader {
  const json& nodes;
  Graph& graph;
  std::vector<std::int32_t> table_index;  // module_stacks entry -> Graph::stacks index (-1: empty)
  std::unordered_map<std::int64_t, std::int32_t> index_of_id;
  std::unordered_map<std::string, std::int32_t> index_of_name;
  std::unordered_map<std::string, std::int32_t> stack_index;
};

// `inputs`: ids of earlier nodes, each once. Ids and names are checked unique first.
void read_inputs(Reader& r, std::size_t i, const json& inputs, Node& node, const std::string& where) {
  if (!r.index_of_id.emplace(node.id, static_cast<std::int32_t>(i)).second)
    fail(where, "duplicate id " + std::to_string(node.id) + " (also used by node '" +
                    r.graph.nodes[static_cast<std::size_t>(r.index_of_id[node.id])].name + "')");
  if (!r.index_of_name.emplace(node.name, static_cast<std::int32_t>(i)).second)
    fail(where, "duplicate name '" + node.name + "'");
  if (!inputs.is_array()) fail(where, std::string("field 'inputs' must be an array, got ") + json_type(inputs));
  for (const auto& entry : inputs) {
    std::int64_t input_id = get_int(entry, "input id", where);
    if (input_id == node.id) fail(where, "reads itself (input id " + std::to_string(input_id) + "): the graph has a cycle");
    auto found = r.index_of_id.find(input_id);
    if (found == r.index_of_id.end()) {
      bool later = false;
      for (std::size_t j = i + 1; j < r.nodes.size() && !later; ++j) {
        const json& other = r.nodes[j];
        auto id_field = other.is_object() ? other.find("id") : other.end();
        later = other.is_object() && id_field != other.end() && *id_field == input_id;
      }
      if (later)
        fail(where, "forward reference to input id " + std::to_string(input_id) +
                        " (nodes must be in topological order; a cycle also shows up this way)");
      fail(where, "dangling input id " + std::to_string(input_id) + " (no node has this id)");
    }
    if (std::find(node.inputs.begin(), node.inputs.end(), found->second) != node.inputs.end())
      fail(where, "lists input id " + std::to_string(input_id) +
                      " twice (each distinct input appears once in 'inputs', in FX all_input_nodes order)");
    node.inputs.push_back(found->second);
  }
}

// One field's value (present, and not null unless the field is required), by its kind.
void read_field(Reader& r, std::size_t i, int f, const json& value, Node& node, const std::string& where) {
  const gf::FieldSpec& spec = gf::kFields[f];
  const std::string field = std::string("field '") + spec.name + "'";
  switch (spec.kind) {
    case gf::Kind::Int: *gf::slot<std::int64_t>(f, node) = get_int(value, field, where); break;
    case gf::Kind::Number:
      if (!value.is_number()) fail(where, field + " must be a number, got " + json_type(value));
      *gf::slot<double>(f, node) = value.get<double>();
      break;
    case gf::Kind::Bool: *gf::slot<bool>(f, node) = get_bool(value, spec.name, where); break;
    case gf::Kind::String: *gf::slot<std::string>(f, node) = get_string(value, spec.name, where); break;
    case gf::Kind::Enum: {
      const std::string text = get_string(value, spec.name, where);
      if (!gf::set_enum(f, text, node)) fail(where, gf::enum_error(f, text));
      break;
    }
    case gf::Kind::Ids: read_inputs(r, i, value, node, where); break;
    case gf::Kind::Positions:
      *gf::slot<std::vector<std::int32_t>>(f, node) = get_positions(value, spec.name, node.inputs.size(), where);
      break;
    case gf::Kind::Outputs:
      if (!value.is_array()) fail(where, field + " must be an array, got " + json_type(value));
      for (const auto& fact : value) node.outputs.push_back(parse_fact(fact, where));
      break;
    case gf::Kind::Frames: {
      auto frames = parse_frames(value, spec.name, where);
      if (frames.empty()) break;
      auto [it, inserted] = r.stack_index.emplace(stack_key(frames), static_cast<std::int32_t>(r.graph.stacks.size()));
      if (inserted) r.graph.stacks.push_back(std::move(frames));
      node.stack = it->second;
      break;
    }
    case gf::Kind::StackRef: {
      const std::int64_t at = get_int(value, field, where);
      if (at < 0 || static_cast<std::size_t>(at) >= r.table_index.size())
        fail(where, "'stack' " + std::to_string(at) + " is out of range ('module_stacks' has " +
                        std::to_string(r.table_index.size()) + " entries)");
      node.stack = r.table_index[static_cast<std::size_t>(at)];
      break;
    }
  }
  if (!gf::value_ok(f, node)) fail(where, gf::value_error(f, node));
}

// One node: every field in table order, then the cross-field rules.
void read_node(Reader& r, std::size_t i) {
  const json& raw = r.nodes[i];
  const std::string where = node_label(i, raw);
  if (!raw.is_object()) fail(where, std::string("must be an object, got ") + json_type(raw));
  for (const auto& item : raw.items())
    if (gf::field_of(item.key()) < 0)
      fail(where, "unknown field '" + item.key() + "' (see docs/graph-format.md for the fields of version 1)");
  Node node;
  std::uint32_t given = 0, keys = 0;
  for (int f = 0; f < gf::kFieldCount; ++f) {
    const gf::FieldSpec& spec = gf::kFields[f];
    auto it = raw.find(spec.name);
    if (it == raw.end()) {
      if (spec.required) fail(where, std::string("missing required field '") + spec.name + "'");
      continue;
    }
    keys |= gf::bit(f);
    if (it->is_null() && !spec.required) continue;  // null = the default (a required field's reader names it)
    given |= gf::bit(f);
    read_field(r, i, f, *it, node, where);
  }
  const std::string problem = gf::check_node(node, given, keys);
  if (!problem.empty()) fail(where, problem);
  r.graph.nodes.push_back(std::move(node));
}

// The top level: format, version, the stack table and the nodes array.
const json& check_document(const json& document, const LoadOptions& options) {
  if (!document.is_object()) fail("graph document", std::string("must be a JSON object, got ") + json_type(document));
  for (const auto& item : document.items())
    if (!in_section("document", item.key()))
      fail("graph document", "unknown top-level field '" + item.key() + "' (see docs/graph-format.md)");
  auto format = document.find("format");
  if (format != document.end() && !(format->is_string() && *format == "hyper_ac.graph"))
    fail("graph document", "'format' must be \"hyper_ac.graph\"");
  auto version = document.find("version");
  if (version == document.end()) fail("graph document", "missing required field 'version'");
  if (!version->is_number_integer())
    fail("graph document", std::string("'version' must be an integer, got ") + json_type(*version));
  if (options.strict_version && version->get<std::int64_t>() != kGraphFormatVersion)
    fail("graph document", "unsupported version " + std::to_string(version->get<std::int64_t>()) +
                               " (this build reads version " + std::to_string(kGraphFormatVersion) +
                               "; re-serialise the graph with the matching hyper_ac)");
  const json& nodes = require(document, "nodes", "graph document");
  if (!nodes.is_array()) fail("graph document", std::string("'nodes' must be an array, got ") + json_type(nodes));
  return nodes;
}

// The compact wire form interns module stacks in a top-level table.
void read_table(const json& document, Reader& r) {
  auto table = document.find("module_stacks");
  if (table == document.end() || table->is_null()) return;
  if (!table->is_array()) fail("graph document", std::string("'module_stacks' must be an array, got ") + json_type(*table));
  for (std::size_t t = 0; t < table->size(); ++t) {
    auto frames = parse_frames((*table)[t], "module_stacks", "graph 'module_stacks' entry " + std::to_string(t));
    if (frames.empty()) {
      r.table_index.push_back(-1);
      continue;
    }
    r.table_index.push_back(static_cast<std::int32_t>(r.graph.stacks.size()));
    r.graph.stacks.push_back(std::move(frames));
  }
}

}  // namespace

ModelFacts parse_model_text(std::string_view text) { return parse_model(json_reader::parse_strict(std::string(text))); }

LoadResult load_reference(const std::string& json_text, const LoadOptions& options) {
  json document;
  try {
    document = json_reader::parse_strict(json_text);
  } catch (const json_reader::ReadError& error) {
    fail_read(error);
  }
  const json& nodes = check_document(document, options);
  LoadResult result;
  Reader r{nodes, result.graph, {}, {}, {}, {}};
  read_table(document, r);
  result.graph.nodes.reserve(nodes.size());
  r.index_of_id.reserve(nodes.size());
  r.index_of_name.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) read_node(r, i);
  auto model = document.find("model");
  if (model != document.end() && !model->is_null()) result.graph.model = parse_model(*model);
  result.graph.finalize();
  return result;
}

}  // namespace graph_load
}  // namespace hyper_ac
