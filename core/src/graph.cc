#include "hyper_ac/graph.h"
#include "hyper_ac/saturate.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hyper_ac/alias.h"
#include "graph_load.h"
#include "json_reader.h"

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
  std::int64_t total = 0;  // saturates at kMaxBytes (saturate.h)
  for (const auto& fact : outputs) total = add_bytes(total, fact.bytes);
  return total;
}

const std::vector<ModuleFrame>& Graph::stack_of(const Node& node) const {
  static const std::vector<ModuleFrame> kEmpty;
  return node.stack < 0 ? kEmpty : stacks[static_cast<std::size_t>(node.stack)];
}

void Graph::finalize() {
  // Counted first, so each list is allocated once at its size.
  std::vector<std::int32_t> count(nodes.size(), 0);
  for (const auto& node : nodes)
    for (std::int32_t input : node.inputs) ++count[static_cast<std::size_t>(input)];
  users.assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i) users[i].reserve(static_cast<std::size_t>(count[i]));
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::int32_t input : nodes[i].inputs) users[static_cast<std::size_t>(input)].push_back(static_cast<std::int32_t>(i));
}

namespace {

bool same_frames(const std::vector<ModuleFrame>& a, const std::vector<ModuleFrame>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].fqn != b[i].fqn || a[i].type != b[i].type) return false;
  return true;
}

bool same_node(const Node& a, const Node& b) {
  if (a.outputs.size() != b.outputs.size()) return false;
  for (std::size_t i = 0; i < a.outputs.size(); ++i)
    if (a.outputs[i].bytes != b.outputs[i].bytes || a.outputs[i].dtype != b.outputs[i].dtype ||
        a.outputs[i].shape != b.outputs[i].shape)
      return false;
  return a.id == b.id && a.name == b.name && a.kind == b.kind && a.target == b.target && a.inputs == b.inputs &&
         a.phase == b.phase && std::memcmp(&a.flops, &b.flops, sizeof a.flops) == 0 && a.stack == b.stack &&
         a.rng == b.rng && a.rng_state_bytes == b.rng_state_bytes && a.symint == b.symint &&
         a.collective == b.collective && a.view == b.view && a.fusible == b.fusible && a.copy == b.copy &&
         a.subgraph == b.subgraph &&
         a.mutated == b.mutated && a.mutated_inputs == b.mutated_inputs && a.aliased_inputs == b.aliased_inputs &&
         a.role == b.role && a.policy == b.policy && a.ac_graph_id == b.ac_graph_id &&
         a.recomputed_from == b.recomputed_from;
}

}  // namespace

#if defined(__GLIBCXX__) && defined(__x86_64__)
// A reminder, not a rule of the language: a field added to Node must be
// compared in same_node and read by both loaders (graph.cc, graph_fast.cc).
static_assert(sizeof(Node) == 264, "Node changed: update same_node, the SAX and DOM loaders and graph_fast.cc");
#endif

bool identical(const Graph& a, const Graph& b) {
  if (a.nodes.size() != b.nodes.size() || a.stacks.size() != b.stacks.size() || a.users != b.users) return false;
  if (a.elided_copies.size() != b.elided_copies.size()) return false;
  for (std::size_t i = 0; i < a.elided_copies.size(); ++i)
    if (a.elided_copies[i].node != b.elided_copies[i].node || a.elided_copies[i].source != b.elided_copies[i].source)
      return false;
  for (std::size_t i = 0; i < a.nodes.size(); ++i)
    if (!same_node(a.nodes[i], b.nodes[i])) return false;
  for (std::size_t i = 0; i < a.stacks.size(); ++i)
    if (!same_frames(a.stacks[i], b.stacks[i])) return false;
  const ModelFacts& m = a.model;
  const ModelFacts& n = b.model;
  if (m.present != n.present || m.type != n.type || m.marked != n.marked || m.modules.size() != n.modules.size())
    return false;
  for (std::size_t i = 0; i < m.modules.size(); ++i) {
    const ModuleFact& x = m.modules[i];
    const ModuleFact& y = n.modules[i];
    if (x.fqn != y.fqn || x.type != y.type || x.container != y.container || x.marked != y.marked ||
        x.same_as != y.same_as)
      return false;
  }
  return true;
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

// The wire names are to_string's: one spelling for reading and writing.
constexpr std::array<Role, 5> kRoles{Role::Activation, Role::Parameter, Role::Buffer, Role::Input, Role::Tangent};
constexpr std::array<Policy, 4> kPolicies{Policy::MustSave, Policy::PreferSave, Policy::MustRecompute,
                                          Policy::PreferRecompute};

template <typename Enum, std::size_t N>
std::optional<Enum> named(std::string_view text, const std::array<Enum, N>& values) {
  for (Enum value : values)
    if (text == to_string(value)) return value;
  return std::nullopt;
}

Role parse_role(const std::string& text, const std::string& where) {
  if (auto role = named(text, kRoles)) return *role;
  fail(where, "unknown role '" + text + "' (expected activation, parameter, buffer, input or tangent)");
}

Policy parse_policy(const std::string& text, const std::string& where) {
  if (auto policy = named(text, kPolicies)) return *policy;
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
    "id", "name", "kind", "target", "inputs", "phase", "outputs", "flops", "module_stack", "rng", "rng_state_bytes", "symint",
    "collective", "view", "fusible", "copy", "subgraph", "mutated", "mutated_inputs", "stack", "aliased_inputs", "role", "policy", "ac_graph_id", "recomputed_from"};

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

[[noreturn]] void fail_read(const json_reader::ReadError& error) {
  if (error.kind == json_reader::ReadError::Kind::Malformed)
    throw GraphError(std::string("graph JSON is malformed: ") + error.what());
  throw GraphError(std::string("graph JSON: ") + error.what());
}

// The reference loader: parses a DOM and validates it node by node. The
// streaming loader (load_graph) hands any document it finds fault with to this
// one, so the first problem is named exactly as here.
static LoadResult load_graph_dom(const std::string& json_text, const LoadOptions& options) {
  json document;
  try {
    document = json_reader::parse_strict(json_text);
  } catch (const json_reader::ReadError& error) {
    fail_read(error);
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
      if (std::find(node.inputs.begin(), node.inputs.end(), found->second) != node.inputs.end())
        fail(where, "lists input id " + std::to_string(input_id) +
                        " twice (each distinct input appears once in 'inputs', in FX all_input_nodes order)");
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
    auto state = raw.find("rng_state_bytes");
    if (state != raw.end() && !state->is_null()) {
      node.rng_state_bytes = get_int(*state, "field 'rng_state_bytes'", where);
      if (node.rng_state_bytes < 0) fail(where, "field 'rng_state_bytes' must be >= 0");
      if (node.rng_state_bytes > 0 && !node.rng) fail(where, "'rng_state_bytes' is only meaningful with 'rng': true");
    }
    node.symint = get_bool(raw, "symint", where);
    node.collective = get_bool(raw, "collective", where);
    node.view = get_bool(raw, "view", where);
    node.fusible = get_bool(raw, "fusible", where);
    node.copy = get_bool(raw, "copy", where);
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
    if (node.copy && (node.kind != NodeKind::CallFunction || node.inputs.size() != 1))
      fail(where, "'copy' marks an exact copy of one input: only on a call_function node with exactly one input");
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

namespace {

// Every key the streaming loader tells apart, for duplicate-key checks without
// strings and for dispatch. Node fields first (bit positions in a mask).
enum Key : int {
  kId, kName, kKind, kTarget, kInputs, kPhase, kOutputs, kFlops, kModuleStack, kRng, kSymint, kCollective,
  kView, kSubgraph, kMutated, kMutatedInputs, kStack, kAliasedInputs, kRole, kPolicy, kRecomputedFrom,
  kFusible, kRngStateBytes, kAcGraphId, kCopy,
  kNodeFieldCount,
  kBytes = kNodeFieldCount, kDtype, kShape, kFqn, kType, kFormat, kVersion, kModel, kNodes, kModuleStacks,
  kKnownKeyCount,
  kOther = -1
};

Key key_of(const std::string& k) {
  auto is = [&](const char* literal) { return k == literal; };
  switch (k.size()) {
    case 2: return is("id") ? kId : kOther;
    case 3: return is("rng") ? kRng : is("fqn") ? kFqn : kOther;
    case 4:
      return is("name") ? kName : is("kind") ? kKind : is("view") ? kView : is("role") ? kRole : is("type") ? kType : is("copy") ? kCopy : kOther;
    case 5: return is("phase") ? kPhase : is("flops") ? kFlops : is("stack") ? kStack : is("bytes") ? kBytes : is("dtype") ? kDtype : is("shape") ? kShape : is("model") ? kModel : is("nodes") ? kNodes : kOther;
    case 6: return is("target") ? kTarget : is("inputs") ? kInputs : is("symint") ? kSymint : is("policy") ? kPolicy : is("format") ? kFormat : kOther;
    case 7: return is("outputs") ? kOutputs : is("mutated") ? kMutated : is("version") ? kVersion : is("fusible") ? kFusible : kOther;
    case 8: return is("subgraph") ? kSubgraph : kOther;
    case 10: return is("collective") ? kCollective : kOther;
    case 11: return is("ac_graph_id") ? kAcGraphId : kOther;
    case 12: return is("module_stack") ? kModuleStack : kOther;
    case 13: return is("module_stacks") ? kModuleStacks : kOther;
    case 14: return is("mutated_inputs") ? kMutatedInputs : is("aliased_inputs") ? kAliasedInputs : kOther;
    case 15: return is("recomputed_from") ? kRecomputedFrom : is("rng_state_bytes") ? kRngStateBytes : kOther;
    default: return kOther;
  }
}

bool parse_kind_fast(const std::string& text, NodeKind& out) {
  if (text == "call_function") out = NodeKind::CallFunction;
  else if (text == "placeholder") out = NodeKind::Placeholder;
  else if (text == "get_attr") out = NodeKind::GetAttr;
  else if (text == "output") out = NodeKind::Output;
  else return false;
  return true;
}

// What the value being read belongs to.
enum class Ctx : std::uint8_t {
  Top,          // the document object
  Nodes,        // the 'nodes' array
  Node,         // one node object
  Ints,         // inputs / mutated_inputs / aliased_inputs
  Outputs,      // a node's 'outputs' array
  Fact,         // one tensor fact
  Shape,        // a fact's 'shape'
  Frames,       // a node's inline 'module_stack'
  Frame,        // one {fqn, type}
  Capture,      // 'model' and 'module_stacks': small, read into a DOM
  Skip,         // anything else inside a document already found faulty, or ignored fields
};

// A streaming (SAX) loader: reads the document once, straight into the IR,
// with the checks of load_graph_dom. It only decides valid or not: the first
// fault found makes the caller re-read the document with load_graph_dom, which
// names it exactly (errors are the slow path, valid graphs never build a DOM).
// Faults of the JSON itself (malformed, a repeated key, a number past double
// range) are thrown here at once, as the reference loader throws them first.
class StreamLoader {
 public:
  StreamLoader(Graph& graph, std::size_t text_size) : graph_(graph) {
    graph_.nodes.reserve(text_size / 160 + 16);
  }

  bool faulty() const { return faulty_; }
  bool top_is_object() const { return top_object_; }
  bool format_present() const { return format_present_; }
  bool format_ok() const { return format_ok_; }
  bool version_ok(const LoadOptions& options) const {
    return version_present_ && version_int_ && (!options.strict_version || version_ == kGraphFormatVersion);
  }
  bool nodes_ok() const { return nodes_array_; }
  json& model() { return model_; }
  bool model_present() const { return model_present_; }

  // ---- SAX interface ----
  bool null() { return scalar(Scalar::Null); }
  bool boolean(bool v) {
    bool_ = v;
    return scalar(Scalar::Bool);
  }
  bool number_integer(json::number_integer_t v) {
    int_ = v;
    double_ = static_cast<double>(v);
    return scalar(Scalar::Int);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    double_ = static_cast<double>(v);
    if (v > static_cast<json::number_unsigned_t>(INT64_MAX)) return scalar(Scalar::BigUnsigned);
    int_ = static_cast<std::int64_t>(v);
    return scalar(Scalar::Int);
  }
  bool number_float(json::number_float_t v, const json::string_t&) {
    double_ = v;
    return scalar(Scalar::Float);
  }
  bool string(json::string_t& v) {
    string_ = &v;
    return scalar(Scalar::String);
  }
  bool binary(json::binary_t&) { return scalar(Scalar::Other); }

  bool key(json::string_t& k) {
    path_.set_key(k);
    const Key id = key_of(k);
    Keys& seen = keys_.back();
    if (id != kOther) {
      const std::uint64_t bit = std::uint64_t{1} << id;
      if (seen.mask & bit) json_reader::raise_duplicate_key(k, path_);
      seen.mask |= bit;
    } else {
      if (std::find(seen.other.begin(), seen.other.end(), k) != seen.other.end())
        json_reader::raise_duplicate_key(k, path_);
      seen.other.push_back(k);
    }
    key_ = id;
    if (ctx_.back() == Ctx::Capture) capture_key_ = k;
    if (ctx_.back() == Ctx::Node && !faulty_) {
      if (id == kOther || id >= kNodeFieldCount) fault();
    }
    return true;
  }

  bool start_object(std::size_t) {
    const Ctx parent = ctx_.empty() ? Ctx::Top : ctx_.back();
    Ctx next = Ctx::Skip;
    if (ctx_.empty()) {
      top_object_ = true;
      next = Ctx::Top;
    } else if (!faulty_ || parent == Ctx::Capture || parent == Ctx::Top) {
      switch (parent) {
        case Ctx::Top: next = begin_top_container(json::object()); break;
        case Ctx::Nodes: begin_node(); next = Ctx::Node; break;
        case Ctx::Outputs: fact_ = TensorFact(); fact_bytes_ = false; next = Ctx::Fact; break;
        case Ctx::Frames: frame_ = ModuleFrame(); frame_fields_ = 0; next = Ctx::Frame; break;
        case Ctx::Capture: capture_push(json::object()); next = Ctx::Capture; break;
        case Ctx::Fact:
          if (key_ == kBytes || key_ == kDtype || key_ == kShape) fault();
          break;  // unknown fields of a fact are ignored
        case Ctx::Frame:
          if (key_ == kFqn || key_ == kType) fault();
          break;  // unknown fields of a frame are ignored
        case Ctx::Skip: break;
        default: fault(); break;
      }
    }
    open(next, /*array=*/false);
    return true;
  }
  bool end_object() {
    const Ctx done = ctx_.back();
    close();
    keys_.pop_back();
    if (!faulty_) {
      if (done == Ctx::Node) finish_node();
      else if (done == Ctx::Fact) finish_fact();
      else if (done == Ctx::Frame) finish_frame();
    }
    if (done == Ctx::Capture) capture_pop();
    return true;
  }
  bool start_array(std::size_t) {
    const Ctx parent = ctx_.empty() ? Ctx::Top : ctx_.back();
    Ctx next = Ctx::Skip;
    if (ctx_.empty()) {
      fault();  // the document must be an object
    } else if (!faulty_ || parent == Ctx::Capture || parent == Ctx::Top) {
      switch (parent) {
        case Ctx::Top:
          if (key_ == kNodes) {
            nodes_seen_ = true;
            nodes_array_ = true;
            next = faulty_ ? Ctx::Skip : Ctx::Nodes;
          } else {
            next = begin_top_container(json::array());
          }
          break;
        case Ctx::Node:
          switch (key_) {
            case kInputs: next = Ctx::Ints; ints_ = &inputs_; break;
            case kMutatedInputs: next = Ctx::Ints; ints_ = &mutated_; break;
            case kAliasedInputs: next = Ctx::Ints; ints_ = &aliased_; break;
            case kOutputs: next = Ctx::Outputs; break;
            case kModuleStack: next = Ctx::Frames; frames_.clear(); break;
            default: fault(); break;
          }
          if (next != Ctx::Skip) have_ |= std::uint32_t{1} << key_;
          break;
        case Ctx::Fact:
          if (key_ == kShape) next = Ctx::Shape;
          else if (key_ == kBytes || key_ == kDtype) fault();
          break;  // other fields of a fact are ignored
        case Ctx::Frame:
          if (key_ == kFqn || key_ == kType) fault();
          break;  // other fields of a frame are ignored
        case Ctx::Skip: break;
        case Ctx::Capture: capture_push(json::array()); next = Ctx::Capture; break;
        default: fault(); break;
      }
    }
    open(next, /*array=*/true);
    return true;
  }
  bool end_array() {
    const Ctx done = ctx_.back();
    close();
    if (done == Ctx::Capture) capture_pop();
    return true;
  }

  bool parse_error(std::size_t, const std::string& token, const json::exception& error) {
    json_reader::raise_parse_error(error, token, path_);
  }

  // After the parse: checks that need the whole document.
  void finish_document() {
    if (faulty_) return;
    std::unordered_set<std::string_view> names;
    names.reserve(graph_.nodes.size() * 2);
    for (const auto& node : graph_.nodes)
      if (!names.insert(node.name).second) return fault();
  }

 private:
  enum class Scalar { Null, Bool, Int, BigUnsigned, Float, String, Other };
  struct Keys {
    std::uint64_t mask = 0;
    std::vector<std::string> other;
  };

  void fault() { faulty_ = true; }

  void open(Ctx ctx, bool array) {
    ctx_.push_back(ctx);
    if (array) {
      path_.enter_array();
    } else {
      path_.enter_object();
      keys_.emplace_back();
    }
  }
  void close() {
    ctx_.pop_back();
    path_.leave();
  }

  // A container value of a top-level field other than 'nodes'.
  Ctx begin_top_container(json&& empty) {
    if (key_ == kModel) {
      model_present_ = true;
      model_ = std::move(empty);
      capture_.assign(1, &model_);
      return Ctx::Capture;
    }
    if (key_ == kModuleStacks) {
      table_seen_ = true;
      if (nodes_seen_) fault();  // the wire form puts the table first; anything else takes the reference path
      table_ = std::move(empty);
      capture_.assign(1, &table_);
      table_open_ = true;
      return Ctx::Capture;
    }
    if (key_ == kNodes) nodes_seen_ = true;
    if (key_ == kFormat) format_present_ = true;
    if (key_ == kVersion) version_present_ = true;
    fault();  // a container for format/version/nodes(object), or an unknown field
    return Ctx::Skip;
  }

  void capture_push(json&& value) {
    json& parent = *capture_.back();
    json* slot;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      slot = &parent.back();
    } else {
      slot = &(parent[capture_key_] = std::move(value));
    }
    capture_.push_back(slot);
  }
  void capture_pop() {
    capture_.pop_back();
    if (capture_.empty() && table_open_) {
      table_open_ = false;
      read_table();
    }
  }
  void capture_scalar(json&& value) {
    json& parent = *capture_.back();
    if (parent.is_array()) parent.push_back(std::move(value));
    else parent[capture_key_] = std::move(value);
  }

  void read_table() {
    if (faulty_) return;
    if (!table_.is_array()) return fault();
    try {
      for (std::size_t t = 0; t < table_.size(); ++t) {
        auto frames = parse_frames(table_[t], "module_stacks", "module_stacks");
        if (frames.empty()) {
          table_index_.push_back(-1);
          continue;
        }
        table_index_.push_back(static_cast<std::int32_t>(graph_.stacks.size()));
        graph_.stacks.push_back(std::move(frames));
      }
    } catch (const GraphError&) {
      fault();
    }
    table_ = json();
  }

  bool scalar(Scalar type) {
    if (ctx_.empty()) {
      fault();  // a bare scalar document
      return true;
    }
    const Ctx ctx = ctx_.back();
    if (ctx == Ctx::Capture) {
      capture_scalar(scalar_json(type));
    } else if (ctx == Ctx::Top) {
      top_scalar(type);
    } else if (!faulty_ && ctx != Ctx::Skip) {
      value(ctx, type);
    }
    path_.value_done();
    return true;
  }

  json scalar_json(Scalar type) {
    switch (type) {
      case Scalar::Bool: return json(bool_);
      case Scalar::Int: return json(int_);
      case Scalar::BigUnsigned: return json(static_cast<json::number_unsigned_t>(double_));
      case Scalar::Float: return json(double_);
      case Scalar::String: return json(std::move(*string_));
      default: return json(nullptr);
    }
  }

  void top_scalar(Scalar type) {
    switch (key_) {
      case kFormat:
        format_present_ = true;
        format_ok_ = type == Scalar::String && *string_ == "hyper_ac.graph";
        break;
      case kVersion:
        version_present_ = true;
        version_int_ = type == Scalar::Int;
        if (type == Scalar::BigUnsigned) version_int_ = true, version_ = -1;  // wraps negative in the DOM
        else version_ = int_;
        break;
      case kModel:
        model_present_ = true;
        model_ = scalar_json(type);  // anything but null: parse_model names its type
        break;
      case kModuleStacks:
        table_seen_ = true;
        if (type != Scalar::Null) fault();
        else if (nodes_seen_) fault();
        break;
      case kNodes:
        nodes_seen_ = true;
        fault();  // not an array
        break;
      default: fault(); break;
    }
  }

  void value(Ctx ctx, Scalar type) {
    switch (ctx) {
      case Ctx::Node: return node_field(type);
      case Ctx::Ints:
        if (type != Scalar::Int) return fault();
        ints_->push_back(int_);
        return;
      case Ctx::Shape:
        if (type != Scalar::Int || int_ < 0) return fault();
        fact_.shape.push_back(int_);
        return;
      case Ctx::Fact:
        if (key_ == kBytes) {
          if (type != Scalar::Int || int_ < 0) return fault();
          fact_.bytes = int_;
          fact_bytes_ = true;
        } else if (key_ == kDtype) {
          if (type == Scalar::String) fact_.dtype = std::move(*string_);
          else if (type != Scalar::Null) fault();
        } else if (key_ == kShape) {
          if (type != Scalar::Null) fault();
        }
        return;  // other fields are ignored
      case Ctx::Frame:
        if (key_ == kFqn || key_ == kType) {
          if (type != Scalar::String) return fault();
          (key_ == kFqn ? frame_.fqn : frame_.type) = std::move(*string_);
          frame_fields_ |= key_ == kFqn ? 1 : 2;
        }
        return;
      default: return fault();  // Nodes, Outputs, Frames: scalars where objects belong
    }
  }

  void begin_node() {
    node_ = Node();
    have_ = 0;
    stack_ref_ = -1;
    stack_given_ = false;
    inputs_.clear();
    frames_.clear();
    mutated_.clear();
    aliased_.clear();
  }

  void node_field(Scalar type) {
    const Key key = key_;
    if (type == Scalar::Null) {
      // Optional fields may be null (= default); required ones may not.
      switch (key) {
        case kId: case kName: case kKind: case kTarget: case kInputs: case kPhase: return fault();
        default: have_ |= std::uint32_t{1} << key; return;  // marks module_stack present for the 'both' check
      }
    }
    have_ |= std::uint32_t{1} << key;
    switch (key) {
      case kId:
        if (type != Scalar::Int || int_ < 0) return fault();
        node_.id = int_;
        return;
      case kName:
        if (type != Scalar::String || string_->empty()) return fault();
        node_.name = std::move(*string_);
        return;
      case kKind:
        if (type != Scalar::String || !parse_kind_fast(*string_, node_.kind)) return fault();
        return;
      case kTarget:
        if (type != Scalar::String) return fault();
        node_.target = std::move(*string_);
        return;
      case kPhase:
        if (type != Scalar::String) return fault();
        if (*string_ == "forward") node_.phase = Phase::Forward;
        else if (*string_ == "backward") node_.phase = Phase::Backward;
        else fault();
        return;
      case kFlops:
        if (type != Scalar::Int && type != Scalar::Float && type != Scalar::BigUnsigned) return fault();
        if (!(double_ >= 0.0)) return fault();
        node_.flops = double_;
        return;
      case kStack:
        if (type != Scalar::Int) return fault();
        stack_ref_ = int_;
        stack_given_ = true;
        return;
      case kRng: case kSymint: case kCollective: case kView: case kSubgraph: case kMutated: case kFusible: case kCopy: {
        if (type != Scalar::Bool) return fault();
        bool* flag = key == kRng ? &node_.rng : key == kSymint ? &node_.symint : key == kCollective ? &node_.collective
                   : key == kView ? &node_.view : key == kSubgraph ? &node_.subgraph
                   : key == kFusible ? &node_.fusible : key == kCopy ? &node_.copy : &node_.mutated;
        *flag = bool_;
        return;
      }
      case kRole:
        if (type != Scalar::String) return fault();
        if (auto role = named(*string_, kRoles)) node_.role = *role;
        else fault();
        return;
      case kPolicy:
        if (type != Scalar::String) return fault();
        if (auto policy = named(*string_, kPolicies)) node_.policy = *policy;
        else fault();
        return;
      case kRecomputedFrom:
        if (type != Scalar::String) return fault();
        node_.recomputed_from = std::move(*string_);
        return;
      case kRngStateBytes:
        if (type != Scalar::Int || int_ < 0) return fault();
        node_.rng_state_bytes = int_;
        return;
      case kAcGraphId:
        if (type != Scalar::Int || int_ < 0) return fault();
        node_.ac_graph_id = int_;
        return;
      default: return fault();  // an array field given a scalar
    }
  }

  void finish_fact() {
    if (!fact_bytes_) return fault();
    node_.outputs.push_back(std::move(fact_));
  }
  void finish_frame() {
    if (frame_fields_ != 3) return fault();
    frames_.push_back(std::move(frame_));
  }

  bool positions(const std::vector<std::int64_t>& raw, std::vector<std::int32_t>& out) {
    out.clear();
    for (auto p : raw) {
      if (p < 0 || static_cast<std::size_t>(p) >= node_.inputs.size()) return false;
      out.push_back(static_cast<std::int32_t>(p));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return true;
  }


  void finish_node() {
    constexpr std::uint32_t required = (1u << kId) | (1u << kName) | (1u << kKind) | (1u << kTarget) |
                                       (1u << kInputs) | (1u << kPhase);
    if ((have_ & required) != required) return fault();
    if (node_.rng_state_bytes > 0 && !node_.rng) return fault();  // the DOM loader names it
    if (node_.ac_graph_id >= 0 && node_.policy == Policy::None) return fault();
    const auto index = static_cast<std::int32_t>(graph_.nodes.size());
    if (!ids_.add(node_.id, index)) return fault();
    node_.inputs.reserve(inputs_.size());
    for (auto input_id : inputs_) {
      if (input_id == node_.id) return fault();
      const std::int32_t found = ids_.find(input_id);
      if (found < 0) return fault();
      node_.inputs.push_back(found);
    }
    if (node_.inputs.size() > 1) {  // each distinct input once
      if (node_.inputs.size() <= 16) {
        for (std::size_t a = 1; a < node_.inputs.size(); ++a)
          for (std::size_t b = 0; b < a; ++b)
            if (node_.inputs[a] == node_.inputs[b]) return fault();
      } else {
        std::vector<std::int32_t> sorted = node_.inputs;
        std::sort(sorted.begin(), sorted.end());
        if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return fault();
      }
    }
    if (stack_given_) {
      if (have_ & (1u << kModuleStack)) return fault();
      if (stack_ref_ < 0 || static_cast<std::size_t>(stack_ref_) >= table_index_.size()) return fault();
      node_.stack = table_index_[static_cast<std::size_t>(stack_ref_)];
    }
    if (!frames_.empty()) {
      auto [it, inserted] = stack_index_.emplace(stack_key(frames_), static_cast<std::int32_t>(graph_.stacks.size()));
      if (inserted) graph_.stacks.push_back(std::move(frames_));
      node_.stack = it->second;
      frames_.clear();
    }
    if (!positions(mutated_, node_.mutated_inputs) || !positions(aliased_, node_.aliased_inputs)) return fault();
    if (node_.kind == NodeKind::Placeholder && !node_.inputs.empty()) return fault();
    if (node_.mutated && node_.kind != NodeKind::Placeholder) return fault();
    if (node_.copy && (node_.kind != NodeKind::CallFunction || node_.inputs.size() != 1)) return fault();
    graph_.nodes.push_back(std::move(node_));
  }


  Graph& graph_;
  bool faulty_ = false;
  std::vector<Ctx> ctx_;
  json_reader::Path path_;
  std::vector<Keys> keys_;
  Key key_ = kOther;

  // scalar just read
  bool bool_ = false;
  std::int64_t int_ = 0;
  double double_ = 0.0;
  std::string* string_ = nullptr;

  // top level
  bool top_object_ = false, format_present_ = false, format_ok_ = false;
  bool version_present_ = false, version_int_ = false;
  std::int64_t version_ = 0;
  bool nodes_seen_ = false, nodes_array_ = false, table_seen_ = false, table_open_ = false;
  bool model_present_ = false;
  json model_, table_;
  std::vector<json*> capture_;
  std::string capture_key_;
  std::vector<std::int32_t> table_index_;

  // the node being read
  Node node_;
  std::uint32_t have_ = 0;
  std::int64_t stack_ref_ = -1;
  bool stack_given_ = false;
  std::vector<std::int64_t> inputs_, mutated_, aliased_;
  std::vector<std::int64_t>* ints_ = nullptr;
  TensorFact fact_;
  bool fact_bytes_ = false;
  ModuleFrame frame_;
  int frame_fields_ = 0;
  std::vector<ModuleFrame> frames_;

  graph_load::IdTable ids_;
  std::unordered_map<std::string, std::int32_t> stack_index_;
};

// The reference loader: the streaming SAX loader, which hands any document it
// finds fault with to load_graph_dom (the named errors).
LoadResult load_graph_reference(const std::string& json_text, const LoadOptions& options) {
  LoadResult result;
  bool valid = false;
  {
    StreamLoader loader(result.graph, json_text.size());
    try {
      json::sax_parse(json_text, &loader);
    } catch (const json_reader::ReadError& error) {
      fail_read(error);
    }
    loader.finish_document();
    valid = !loader.faulty() && loader.top_is_object() && (!loader.format_present() || loader.format_ok()) &&
            loader.version_ok(options) && loader.nodes_ok();
    if (valid && loader.model_present() && !loader.model().is_null()) {
      result.graph.model = parse_model(loader.model());  // its own errors, named as in the reference loader
    }
  }
  if (!valid) return load_graph_dom(json_text, options);
  result.graph.finalize();
  return result;
}

// Exact copies are elided after either loader (both read the graph as
// written); the stats count the graph the core plans.
void finish_load(LoadResult& result, const LoadOptions& options) {
  Graph& graph = result.graph;
  if (options.elide_copies) graph.elided_copies = elide_copies(graph);
  result.stats.elided_copies = graph.elided_copies.size();
  result.stats.nodes = graph.nodes.size();
  result.stats.forward_nodes = result.stats.backward_nodes = 0;
  for (const auto& node : graph.nodes) (node.is_forward() ? result.stats.forward_nodes : result.stats.backward_nodes)++;
  result.stats.unique_stacks = graph.stacks.size();
}

}  // namespace

namespace graph_load {

ModelFacts parse_model_text(std::string_view text) { return parse_model(json_reader::parse_strict(std::string(text))); }

}  // namespace graph_load

LoadResult load_graph(const std::string& json_text, const LoadOptions& options) {
  if (!options.reference_loader) {
    LoadResult result;
    if (graph_load::load_fast(json_text, options, result)) {
      result.graph.finalize();
      finish_load(result, options);
      result.stats.fast_path = true;
      return result;
    }
  }  // a partial graph is freed before the reference loader starts
  LoadResult result = load_graph_reference(json_text, options);
  finish_load(result, options);
  return result;
}

namespace {

// The whole of an open file descriptor, read with read(2) (a pipe, a FIFO).
std::string read_all(int fd, const std::string& path, std::size_t expected) {
  std::string text;
  text.reserve(expected + 64);  // the fast path's padding: no copy in load_graph
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got == 0) return text;
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read '" + path + "'");
    }
    text.append(buffer, static_cast<std::size_t>(got));
  }
}

// A read-only private mapping of a whole file followed by at least `padding`
// readable zero bytes: an anonymous zero mapping is laid down first and the
// file mapped over its start (the rest of the file's last page reads as zeros,
// the pages after it are the anonymous mapping's).
class MappedFile {
 public:
  MappedFile(int fd, std::size_t size, std::size_t padding) : size_(size) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    length_ = (size + padding + page - 1) / page * page;
    void* area = ::mmap(nullptr, length_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return;
    void* file = ::mmap(area, size, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_POPULATE, fd, 0);
    if (file == MAP_FAILED) {
      ::munmap(area, length_);
      return;
    }
    data_ = static_cast<const char*>(area);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), length_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  bool ok() const { return data_ != nullptr; }
  std::string_view text() const { return {data_, size_}; }
  std::size_t readable() const { return length_; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0, length_ = 0;
};

struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

LoadResult load_graph_file(const std::string& path, const LoadOptions& options) {
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw std::runtime_error("cannot open '" + path + "'");
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) throw std::runtime_error("cannot read '" + path + "'");
  if (S_ISREG(info.st_mode) && info.st_size > 0 && !options.reference_loader) {
    const auto size = static_cast<std::size_t>(info.st_size);
    std::optional<MappedFile> mapped;
    mapped.emplace(file.fd, size, std::size_t{64});
    if (mapped->ok()) {
      {
        LoadResult result;
        if (graph_load::load_fast(mapped->text(), mapped->readable(), options, result)) {
          mapped.reset();  // the document is no longer needed: unmapped before the finishing passes
          result.graph.finalize();
          finish_load(result, options);
          result.stats.fast_path = true;
          return result;
        }
      }  // a partial graph is freed before the reference loader starts
      std::string text(mapped->text());
      mapped.reset();
      return load_graph(text, options);
    }
  }
  const std::size_t expected = S_ISREG(info.st_mode) && info.st_size > 0 ? static_cast<std::size_t>(info.st_size) : 0;
  return load_graph(read_all(file.fd, path, expected), options);
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
    if (node.rng_state_bytes > 0) raw["rng_state_bytes"] = node.rng_state_bytes;
    raw["symint"] = node.symint;
    raw["collective"] = node.collective;
    raw["view"] = node.view;
    if (node.fusible) raw["fusible"] = true;  // absent = false (keeps eager-era documents identical)
    if (node.copy) raw["copy"] = true;
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
    flag(node.copy, "copy");
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
  summary.elided_copies = graph.elided_copies.size();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.is_forward()) {
      ++summary.forward_nodes;
      summary.forward_flops = add_finite(summary.forward_flops, node.flops);
    } else {
      ++summary.backward_nodes;
      summary.backward_flops = add_finite(summary.backward_flops, node.flops);
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
        summary.activation_bytes_read_by_backward = add_bytes(summary.activation_bytes_read_by_backward, base.output_bytes());
      }
    }
  }
  return summary;
}

std::string format_summary(const GraphSummary& summary) {
  std::ostringstream out;
  out << "nodes: " << summary.nodes << " (forward " << summary.forward_nodes << ", backward "
      << summary.backward_nodes << ")\n";
  if (summary.elided_copies)
    out << "elided copies: " << summary.elided_copies << " (exact clones; readers read the source)\n";
  out << "placeholders: " << summary.placeholders << " (parameters " << summary.parameters << ")\n";
  out << "activations read by backward: " << summary.activations_read_by_backward << " ("
      << format_bytes(summary.activation_bytes_read_by_backward) << ")\n";
  char flops[128];
  std::snprintf(flops, sizeof flops, "flops: forward %.3g, backward %.3g\n", summary.forward_flops, summary.backward_flops);
  out << flops;
  return out.str();
}

}  // namespace hyper_ac
