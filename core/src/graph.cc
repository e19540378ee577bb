#include "hyper_ac/graph.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "hyper_ac/alias.h"

namespace hyper_ac {

using json = nlohmann::json;

const char* to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::Placeholder: return "placeholder";
    case NodeKind::CallFunction: return "call_function";
    case NodeKind::GetAttr: return "get_attr";
    case NodeKind::Output: return "output";
  }
  return "?";
}

const char* to_string(Phase phase) { return phase == Phase::Forward ? "forward" : "backward"; }

const char* to_string(Role role) {
  switch (role) {
    case Role::Activation: return "activation";
    case Role::Parameter: return "parameter";
    case Role::Buffer: return "buffer";
    case Role::Input: return "input";
    case Role::Tangent: return "tangent";
  }
  return "?";
}

const char* to_string(Policy policy) {
  switch (policy) {
    case Policy::None: return "";
    case Policy::MustSave: return "MUST_SAVE";
    case Policy::PreferSave: return "PREFER_SAVE";
    case Policy::MustRecompute: return "MUST_RECOMPUTE";
    case Policy::PreferRecompute: return "PREFER_RECOMPUTE";
  }
  return "?";
}

bool is_recompute(Policy policy) {
  return policy == Policy::MustRecompute || policy == Policy::PreferRecompute;
}

std::int64_t Node::output_bytes() const {
  std::int64_t total = 0;
  for (const auto& fact : outputs) total += fact.bytes;
  return total;
}

const std::vector<ModuleFrame>& Graph::stack_of(const Node& node) const {
  static const std::vector<ModuleFrame> kEmpty;
  return node.stack < 0 ? kEmpty : stacks[static_cast<std::size_t>(node.stack)];
}

void Graph::finalize() {
  users.assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::int32_t input : nodes[i].inputs) users[static_cast<std::size_t>(input)].push_back(static_cast<std::int32_t>(i));
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0)
    std::snprintf(buffer, sizeof buffer, "%" PRId64 " B", bytes);
  else
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, units[unit]);
  return buffer;
}

namespace {

// Names where in the document a problem is, for error messages.
std::string node_label(std::size_t index, const json& node) {
  std::string label = "node #" + std::to_string(index);
  if (node.is_object()) {
    auto it = node.find("name");
    if (it != node.end() && it->is_string()) label += " '" + it->get<std::string>() + "'";
  }
  return label;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw GraphError(where + ": " + what);
}

const char* json_type(const json& value) { return value.type_name(); }

const json& require(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) fail(where, std::string("missing required field '") + key + "'");
  return *it;
}

std::string get_string(const json& value, const char* key, const std::string& where) {
  if (!value.is_string())
    fail(where, std::string("field '") + key + "' must be a string, got " + json_type(value));
  return value.get<std::string>();
}

bool get_bool(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean())
    fail(where, std::string("field '") + key + "' must be a boolean, got " + json_type(*it));
  return it->get<bool>();
}

std::int64_t get_int(const json& value, const std::string& what, const std::string& where) {
  if (!value.is_number_integer())
    fail(where, what + " must be an integer, got " + json_type(value));
  return value.get<std::int64_t>();
}

std::vector<std::int32_t> get_positions(const json& object, const char* key, std::size_t input_count,
                                        const std::string& where) {
  std::vector<std::int32_t> positions;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return positions;
  if (!it->is_array()) fail(where, std::string("field '") + key + "' must be an array, got " + json_type(*it));
  for (const auto& entry : *it) {
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

NodeKind parse_kind(const std::string& text, const std::string& where) {
  if (text == "placeholder") return NodeKind::Placeholder;
  if (text == "call_function") return NodeKind::CallFunction;
  if (text == "get_attr") return NodeKind::GetAttr;
  if (text == "output") return NodeKind::Output;
  fail(where, "unknown kind '" + text + "' (expected placeholder, call_function, get_attr or output)");
}

Phase parse_phase(const std::string& text, const std::string& where) {
  if (text == "forward") return Phase::Forward;
  if (text == "backward") return Phase::Backward;
  fail(where, "unknown phase '" + text + "' (expected forward or backward)");
}

Role parse_role(const std::string& text, const std::string& where) {
  if (text == "activation") return Role::Activation;
  if (text == "parameter") return Role::Parameter;
  if (text == "buffer") return Role::Buffer;
  if (text == "input") return Role::Input;
  if (text == "tangent") return Role::Tangent;
  fail(where, "unknown role '" + text + "' (expected activation, parameter, buffer, input or tangent)");
}

Policy parse_policy(const std::string& text, const std::string& where) {
  if (text == "MUST_SAVE") return Policy::MustSave;
  if (text == "PREFER_SAVE") return Policy::PreferSave;
  if (text == "MUST_RECOMPUTE") return Policy::MustRecompute;
  if (text == "PREFER_RECOMPUTE") return Policy::PreferRecompute;
  fail(where, "unknown policy '" + text + "' (expected MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE or PREFER_RECOMPUTE)");
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

// The `model` section: the live module tree (docs/graph-format.md).
ModelFacts parse_model(const json& model) {
  const std::string where = "graph 'model'";
  if (!model.is_object()) fail(where, std::string("must be an object, got ") + json_type(model));
  if (model.contains("units"))
    fail(where, "carries 'units', the unit list of an older format: units are now discovered by the core from the "
                "module tree; re-serialise the graph with this hyper_ac (hyper_ac.serialize.to_json(gm, model))");
  for (const auto& item : model.items())
    if (item.key() != "type" && item.key() != "marked" && item.key() != "modules")
      fail(where, "unknown field '" + item.key() + "' (expected type, marked, modules)");
  ModelFacts facts;
  facts.present = true;
  auto type = model.find("type");
  if (type != model.end() && !type->is_null()) facts.type = get_string(*type, "type", where);
  facts.marked = get_bool(model, "marked", where);
  auto modules = model.find("modules");
  if (modules == model.end() || modules->is_null()) return facts;
  if (!modules->is_array()) fail(where, std::string("field 'modules' must be an array, got ") + json_type(*modules));
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < modules->size(); ++i) {
    const json& raw = (*modules)[i];
    const std::string at = where + " modules[" + std::to_string(i) + "]";
    if (!raw.is_object()) fail(at, std::string("must be an object, got ") + json_type(raw));
    for (const auto& item : raw.items())
      if (item.key() != "fqn" && item.key() != "type" && item.key() != "container" && item.key() != "marked" &&
          item.key() != "same_as")
        fail(at, "unknown field '" + item.key() + "' (expected fqn, type, container, marked, same_as)");
    ModuleFact fact;
    fact.fqn = get_string(require(raw, "fqn", at), "fqn", at);
    if (fact.fqn.empty()) fail(at, "field 'fqn' is empty (the root module is not listed)");
    fact.type = get_string(require(raw, "type", at), "type", at);
    fact.container = get_bool(raw, "container", at);
    fact.marked = get_bool(raw, "marked", at);
    auto same = raw.find("same_as");
    if (same != raw.end() && !same->is_null()) {
      fact.same_as = get_string(*same, "same_as", at);
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

const std::unordered_set<std::string> kNodeKeys = {
    "id", "name", "kind", "target", "inputs", "phase", "outputs", "flops", "module_stack", "rng", "symint",
    "collective", "view", "subgraph", "mutated", "mutated_inputs", "stack", "aliased_inputs", "role", "policy", "ac_graph_id", "recomputed_from"};

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

}  // namespace

LoadResult load_graph(const std::string& json_text, const LoadOptions& options) {
  json document;
  try {
    document = json::parse(json_text);
  } catch (const json::parse_error& error) {
    throw GraphError(std::string("graph JSON is malformed: ") + error.what());
  }
  if (!document.is_object()) fail("graph document", std::string("must be a JSON object, got ") + json_type(document));
  for (const auto& item : document.items())
    if (item.key() != "format" && item.key() != "version" && item.key() != "model" && item.key() != "nodes" &&
        item.key() != "module_stacks")
      fail("graph document", "unknown top-level field '" + item.key() + "' (see docs/graph-format.md)");
  auto format = document.find("format");
  if (format != document.end() && !(format->is_string() && *format == "hyper_ac.graph"))
    fail("graph document", "'format' must be \"hyper_ac.graph\"");
  auto version = document.find("version");
  if (version == document.end()) fail("graph document", "missing required field 'version'");
  if (!version->is_number_integer()) fail("graph document", std::string("'version' must be an integer, got ") + json_type(*version));
  if (options.strict_version && version->get<std::int64_t>() != kGraphFormatVersion)
    fail("graph document", "unsupported version " + std::to_string(version->get<std::int64_t>()) +
                               " (this build reads version " + std::to_string(kGraphFormatVersion) +
                               "; re-serialise the graph with the matching hyper_ac)");
  const json& nodes = require(document, "nodes", "graph document");
  if (!nodes.is_array()) fail("graph document", std::string("'nodes' must be an array, got ") + json_type(nodes));

  LoadResult result;
  Graph& graph = result.graph;
  // The compact wire form interns module stacks in a top-level table.
  auto table = document.find("module_stacks");
  std::vector<std::int32_t> table_index;
  if (table != document.end() && !table->is_null()) {
    if (!table->is_array()) fail("graph document", std::string("'module_stacks' must be an array, got ") + json_type(*table));
    for (std::size_t t = 0; t < table->size(); ++t) {
      auto frames = parse_frames((*table)[t], "module_stacks", "graph 'module_stacks' entry " + std::to_string(t));
      if (frames.empty()) {
        table_index.push_back(-1);
        continue;
      }
      table_index.push_back(static_cast<std::int32_t>(graph.stacks.size()));
      graph.stacks.push_back(std::move(frames));
    }
  }
  graph.nodes.reserve(nodes.size());
  std::unordered_map<std::int64_t, std::int32_t> index_of_id;
  std::unordered_map<std::string, std::int32_t> index_of_name;
  std::unordered_map<std::string, std::int32_t> stack_index;
  index_of_id.reserve(nodes.size());
  index_of_name.reserve(nodes.size());

  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const json& raw = nodes[i];
    std::string where = node_label(i, raw);
    if (!raw.is_object()) fail(where, std::string("must be an object, got ") + json_type(raw));
    for (const auto& item : raw.items())
      if (!kNodeKeys.count(item.key()))
        fail(where, "unknown field '" + item.key() + "' (see docs/graph-format.md for the fields of version 1)");
    Node node;
    node.id = get_int(require(raw, "id", where), "field 'id'", where);
    if (node.id < 0) fail(where, "field 'id' is negative (" + std::to_string(node.id) + ")");
    node.name = get_string(require(raw, "name", where), "name", where);
    if (node.name.empty()) fail(where, "field 'name' is empty");
    node.kind = parse_kind(get_string(require(raw, "kind", where), "kind", where), where);
    node.target = get_string(require(raw, "target", where), "target", where);
    node.phase = parse_phase(get_string(require(raw, "phase", where), "phase", where), where);

    if (!index_of_id.emplace(node.id, static_cast<std::int32_t>(i)).second)
      fail(where, "duplicate id " + std::to_string(node.id) + " (also used by node '" +
                      graph.nodes[static_cast<std::size_t>(index_of_id[node.id])].name + "')");
    if (!index_of_name.emplace(node.name, static_cast<std::int32_t>(i)).second)
      fail(where, "duplicate name '" + node.name + "'");

    const json& inputs = require(raw, "inputs", where);
    if (!inputs.is_array()) fail(where, std::string("field 'inputs' must be an array, got ") + json_type(inputs));
    for (const auto& entry : inputs) {
      std::int64_t input_id = get_int(entry, "input id", where);
      if (input_id == node.id) fail(where, "reads itself (input id " + std::to_string(input_id) + "): the graph has a cycle");
      auto found = index_of_id.find(input_id);
      if (found == index_of_id.end()) {
        bool later = false;
        for (std::size_t j = i + 1; j < nodes.size() && !later; ++j) {
          auto id_field = nodes[j].is_object() ? nodes[j].find("id") : nodes[j].end();
          later = nodes[j].is_object() && id_field != nodes[j].end() && *id_field == input_id;
        }
        if (later)
          fail(where, "forward reference to input id " + std::to_string(input_id) +
                          " (nodes must be in topological order; a cycle also shows up this way)");
        fail(where, "dangling input id " + std::to_string(input_id) + " (no node has this id)");
      }
      node.inputs.push_back(found->second);
    }

    auto outputs = raw.find("outputs");
    if (outputs != raw.end() && !outputs->is_null()) {
      if (!outputs->is_array()) fail(where, std::string("field 'outputs' must be an array, got ") + json_type(*outputs));
      for (const auto& fact : *outputs) node.outputs.push_back(parse_fact(fact, where));
    }
    auto flops = raw.find("flops");
    if (flops != raw.end() && !flops->is_null()) {
      if (!flops->is_number()) fail(where, std::string("field 'flops' must be a number, got ") + json_type(*flops));
      node.flops = flops->get<double>();
      if (!(node.flops >= 0.0)) fail(where, "field 'flops' must be >= 0");
    }
    auto stack_ref = raw.find("stack");
    if (stack_ref != raw.end() && !stack_ref->is_null()) {
      if (raw.contains("module_stack")) fail(where, "has both 'stack' and 'module_stack'; give one");
      std::int64_t at = get_int(*stack_ref, "field 'stack'", where);
      if (at < 0 || static_cast<std::size_t>(at) >= table_index.size())
        fail(where, "'stack' " + std::to_string(at) + " is out of range ('module_stacks' has " +
                        std::to_string(table_index.size()) + " entries)");
      node.stack = table_index[static_cast<std::size_t>(at)];
    }
    auto stack = raw.find("module_stack");
    if (stack != raw.end() && !stack->is_null()) {
      auto frames = parse_frames(*stack, "module_stack", where);
      if (!frames.empty()) {
        auto [it, inserted] = stack_index.emplace(stack_key(frames), static_cast<std::int32_t>(graph.stacks.size()));
        if (inserted) graph.stacks.push_back(std::move(frames));
        node.stack = it->second;
      }
    }
    node.rng = get_bool(raw, "rng", where);
    node.symint = get_bool(raw, "symint", where);
    node.collective = get_bool(raw, "collective", where);
    node.view = get_bool(raw, "view", where);
    node.subgraph = get_bool(raw, "subgraph", where);
    node.mutated = get_bool(raw, "mutated", where);
    node.mutated_inputs = get_positions(raw, "mutated_inputs", node.inputs.size(), where);
    node.aliased_inputs = get_positions(raw, "aliased_inputs", node.inputs.size(), where);
    auto role = raw.find("role");
    if (role != raw.end() && !role->is_null()) node.role = parse_role(get_string(*role, "role", where), where);
    auto policy = raw.find("policy");
    if (policy != raw.end() && !policy->is_null()) node.policy = parse_policy(get_string(*policy, "policy", where), where);
    auto graph_id = raw.find("ac_graph_id");
    if (graph_id != raw.end() && !graph_id->is_null()) {
      node.ac_graph_id = get_int(*graph_id, "field 'ac_graph_id'", where);
      if (node.ac_graph_id < 0) fail(where, "'ac_graph_id' must be >= 0 (or null)");
      if (node.policy == Policy::None) fail(where, "'ac_graph_id' is set without a 'policy'");
    }
    auto from = raw.find("recomputed_from");
    if (from != raw.end() && !from->is_null()) node.recomputed_from = get_string(*from, "recomputed_from", where);

    if (node.kind == NodeKind::Placeholder && !node.inputs.empty()) fail(where, "a placeholder cannot have inputs");
    if (node.mutated && node.kind != NodeKind::Placeholder) fail(where, "'mutated' is only meaningful on placeholders (use 'mutated_inputs' on the writing op)");
    graph.nodes.push_back(std::move(node));
  }

  auto model = document.find("model");
  if (model != document.end() && !model->is_null()) graph.model = parse_model(*model);

  graph.finalize();
  result.stats.nodes = graph.nodes.size();
  for (const auto& node : graph.nodes) (node.is_forward() ? result.stats.forward_nodes : result.stats.backward_nodes)++;
  result.stats.unique_stacks = graph.stacks.size();
  return result;
}

std::string graph_to_json(const Graph& graph) {
  json document;
  document["format"] = "hyper_ac.graph";
  document["version"] = kGraphFormatVersion;
  json nodes = json::array();
  for (const auto& node : graph.nodes) {
    json raw;
    raw["id"] = node.id;
    raw["name"] = node.name;
    raw["kind"] = to_string(node.kind);
    raw["target"] = node.target;
    json inputs = json::array();
    for (auto input : node.inputs) inputs.push_back(graph.nodes[static_cast<std::size_t>(input)].id);
    raw["inputs"] = inputs;
    raw["phase"] = to_string(node.phase);
    json outputs = json::array();
    for (const auto& fact : node.outputs) outputs.push_back({{"bytes", fact.bytes}, {"dtype", fact.dtype}, {"shape", fact.shape}});
    raw["outputs"] = outputs;
    raw["flops"] = node.flops;
    json stack = json::array();
    for (const auto& frame : graph.stack_of(node)) stack.push_back({{"fqn", frame.fqn}, {"type", frame.type}});
    raw["module_stack"] = stack;
    raw["rng"] = node.rng;
    raw["symint"] = node.symint;
    raw["collective"] = node.collective;
    raw["view"] = node.view;
    raw["subgraph"] = node.subgraph;
    raw["mutated"] = node.mutated;
    raw["mutated_inputs"] = node.mutated_inputs;
    raw["aliased_inputs"] = node.aliased_inputs;
    raw["role"] = to_string(node.role);
    raw["policy"] = node.policy == Policy::None ? json(nullptr) : json(to_string(node.policy));
    raw["ac_graph_id"] = node.ac_graph_id < 0 ? json(nullptr) : json(node.ac_graph_id);
    raw["recomputed_from"] = node.recomputed_from.empty() ? json(nullptr) : json(node.recomputed_from);
    nodes.push_back(std::move(raw));
  }
  document["nodes"] = std::move(nodes);
  if (graph.model.present) {
    json model;
    model["type"] = graph.model.type;
    if (graph.model.marked) model["marked"] = true;
    json modules = json::array();
    for (const auto& m : graph.model.modules) {
      json entry = {{"fqn", m.fqn}, {"type", m.type}};
      if (m.container) entry["container"] = true;
      if (m.marked) entry["marked"] = true;
      if (!m.same_as.empty()) entry["same_as"] = m.same_as;
      modules.push_back(std::move(entry));
    }
    model["modules"] = modules;
    document["model"] = model;
  }
  return document.dump();
}

std::string print_graph(const Graph& graph, const PrintOptions& options) {
  std::ostringstream out;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    out << (node.is_forward() ? "F " : "B ") << node.name << " = " << to_string(node.kind);
    if (!node.target.empty()) out << ' ' << node.target;
    out << '(';
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (k) out << ", ";
      out << graph.nodes[static_cast<std::size_t>(node.inputs[k])].name;
    }
    out << ')';
    if (options.show_sizes && !node.outputs.empty()) {
      out << " :";
      for (const auto& fact : node.outputs) {
        out << ' ' << (fact.dtype.empty() ? "?" : fact.dtype) << '[';
        for (std::size_t d = 0; d < fact.shape.size(); ++d) out << (d ? "," : "") << fact.shape[d];
        out << "] " << fact.bytes << 'B';
      }
    }
    std::string flags;
    auto flag = [&](bool on, const char* name) {
      if (on) flags += flags.empty() ? name : std::string(",") + name;
    };
    flag(node.rng, "rng");
    flag(node.symint, "symint");
    flag(node.collective, "collective");
    flag(node.view, "view");
    flag(node.subgraph, "subgraph");
    flag(!node.mutated_inputs.empty(), "mutates");
    flag(node.mutated, "mutated");
    if (node.role != Role::Activation) flags += (flags.empty() ? "" : ",") + std::string(to_string(node.role));
    if (!node.recomputed_from.empty()) flags += (flags.empty() ? "dup:" : ",dup:") + node.recomputed_from;
    if (!flags.empty()) out << " {" << flags << '}';
    if (options.show_module_stack && node.stack >= 0) out << " @" << graph.stack_of(node).front().fqn;
    if (i < options.annotations.size() && !options.annotations[i].empty()) out << "  # " << options.annotations[i];
    out << '\n';
  }
  return out.str();
}

GraphSummary summarize(const Graph& graph) {
  GraphSummary summary;
  const auto roots = storage_roots(graph);
  std::vector<char> counted(graph.nodes.size(), 0);
  summary.nodes = graph.nodes.size();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.is_forward()) {
      ++summary.forward_nodes;
      summary.forward_flops += node.flops;
    } else {
      ++summary.backward_nodes;
      summary.backward_flops += node.flops;
    }
    if (node.kind == NodeKind::Placeholder) {
      ++summary.placeholders;
      if (node.role == Role::Parameter) ++summary.parameters;
    }
    if (!node.is_forward() || node.kind == NodeKind::Placeholder || node.kind == NodeKind::GetAttr) continue;
    bool read_by_backward = false;
    for (auto user : graph.users[i]) {
      const Node& reader = graph.nodes[static_cast<std::size_t>(user)];
      if (reader.is_backward() && reader.kind != NodeKind::Output) read_by_backward = true;
    }
    if (read_by_backward) {
      ++summary.activations_read_by_backward;
      // Storage counts once however many views of it the backward reads.
      auto root = static_cast<std::size_t>(roots[i]);
      const Node& base = graph.nodes[root];
      bool activation = base.is_forward() && base.kind == NodeKind::CallFunction;
      if (activation && !counted[root]) {
        counted[root] = 1;
        summary.activation_bytes_read_by_backward += base.output_bytes();
      }
    }
  }
  return summary;
}

std::string format_summary(const GraphSummary& summary) {
  std::ostringstream out;
  out << "nodes: " << summary.nodes << " (forward " << summary.forward_nodes << ", backward "
      << summary.backward_nodes << ")\n";
  out << "placeholders: " << summary.placeholders << " (parameters " << summary.parameters << ")\n";
  out << "activations read by backward: " << summary.activations_read_by_backward << " ("
      << format_bytes(summary.activation_bytes_read_by_backward) << ")\n";
  char flops[128];
  std::snprintf(flops, sizeof flops, "flops: forward %.3g, backward %.3g\n", summary.forward_flops, summary.backward_flops);
  out << flops;
  return out.str();
}

}  // namespace hyper_ac
