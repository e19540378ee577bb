// Small helpers for building graph documents in tests and comparing golden text.
#pragma once

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "hyper_ac/graph.h"

namespace hyper_ac::testing {

using json = nlohmann::json;

// Builds a version-1 graph document node by node; inputs are named.
class GraphBuilder {
 public:
  struct NodeSpec {
    std::string target;
    std::vector<std::string> inputs;
    std::string phase = "forward";
    std::int64_t bytes = 64;
    std::string fqn;           // innermost module; "" = none
    std::string type = "Block";
    double flops = 0;
    std::string kind = "call_function";
    std::string role;
    json extra = json::object();  // any further fields (rng, view, aliased_inputs, ...)
  };

  GraphBuilder& add(const std::string& name, NodeSpec spec) {
    json node;
    node["id"] = next_id_;
    node["name"] = name;
    node["kind"] = spec.kind;
    node["target"] = spec.target;
    json inputs = json::array();
    for (const auto& input : spec.inputs) inputs.push_back(ids_.at(input));
    node["inputs"] = inputs;
    node["phase"] = spec.phase;
    if (spec.kind != "output") node["outputs"] = json::array({{{"bytes", spec.bytes}, {"dtype", "float32"}, {"shape", {spec.bytes / 4}}}});
    if (spec.flops) node["flops"] = spec.flops;
    if (!spec.fqn.empty()) node["module_stack"] = module_stack(spec.fqn, spec.type);
    if (!spec.role.empty()) node["role"] = spec.role;
    for (auto& item : spec.extra.items()) node[item.key()] = item.value();
    ids_[name] = next_id_++;
    nodes_.push_back(node);
    return *this;
  }
  GraphBuilder& placeholder(const std::string& name, const std::string& role = "input", std::int64_t bytes = 64,
                            const std::string& phase = "forward") {
    NodeSpec spec;
    spec.kind = "placeholder";
    spec.target = name;
    spec.role = role;
    spec.bytes = bytes;
    spec.phase = phase;
    return add(name, spec);
  }
  GraphBuilder& op(const std::string& name, const std::string& target, std::vector<std::string> inputs,
                   const std::string& fqn = "", json extra = json::object()) {
    NodeSpec spec;
    spec.target = target;
    spec.inputs = std::move(inputs);
    spec.fqn = fqn;
    spec.extra = std::move(extra);
    return add(name, spec);
  }
  // A node with explicit output bytes, FLOPs and phase (size-sensitive tests).
  GraphBuilder& sized(const std::string& name, const std::string& target, std::vector<std::string> inputs,
                      const std::string& fqn, std::int64_t bytes, double flops = 0,
                      const std::string& phase = "forward") {
    NodeSpec spec;
    spec.target = target;
    spec.inputs = std::move(inputs);
    spec.fqn = fqn;
    spec.bytes = bytes;
    spec.flops = flops;
    spec.phase = phase;
    return add(name, spec);
  }
  GraphBuilder& bwd(const std::string& name, const std::string& target, std::vector<std::string> inputs,
                    json extra = json::object()) {
    NodeSpec spec;
    spec.target = target;
    spec.inputs = std::move(inputs);
    spec.phase = "backward";
    spec.extra = std::move(extra);
    return add(name, spec);
  }
  GraphBuilder& output(std::vector<std::string> inputs) {
    NodeSpec spec;
    spec.kind = "output";
    spec.target = "";
    spec.inputs = std::move(inputs);
    spec.phase = "backward";
    return add("output", spec);
  }
  // Live-model facts (docs/graph-format.md) in which `units` are what the
  // core's marker rule finds: each unit is listed as a child of a container
  // (its parent FQN, a ModuleList) whose own parent (or the root) carries the
  // gradient_checkpointing marker; then the other `modules` in order.
  GraphBuilder& model(const std::string& type, std::vector<std::pair<std::string, std::string>> modules,
                      std::vector<std::pair<std::string, std::string>> units) {
    auto parent_of = [](const std::string& fqn) {
      auto dot = fqn.rfind('.');
      return dot == std::string::npos ? std::string() : fqn.substr(0, dot);
    };
    json m;
    m["type"] = type;
    json list = json::array();
    std::map<std::string, std::size_t> listed;
    auto add = [&](const std::string& fqn, const std::string& t) -> json& {
      auto it = listed.find(fqn);
      if (it != listed.end()) return list[it->second];
      listed.emplace(fqn, list.size());
      list.push_back({{"fqn", fqn}, {"type", t}});
      return list[list.size() - 1];
    };
    for (auto& [fqn, t] : units) {
      std::string container = parent_of(fqn);
      std::string owner = parent_of(container);
      if (owner.empty()) m["marked"] = true;
      else add(owner, "Module")["marked"] = true;
      if (!container.empty()) add(container, "ModuleList")["container"] = true;
      add(fqn, t);
    }
    for (auto& [fqn, t] : modules) add(fqn, t);
    m["modules"] = list;
    model_ = m;
    return *this;
  }
  // The `model` section verbatim.
  GraphBuilder& model_section(json section) {
    model_ = std::move(section);
    return *this;
  }

  json document() const {
    json doc;
    doc["format"] = "hyper_ac.graph";
    doc["version"] = 1;
    doc["nodes"] = nodes_;
    if (!model_.is_null()) doc["model"] = model_;
    return doc;
  }
  std::string text() const { return document().dump(); }
  // Loaded through both loaders: every graph a test builds also checks that
  // the simdjson fast path reads it, into the same Graph as the reference.
  Graph graph() const {
    const std::string t = text();
    auto fast = load_graph(t);
    LoadOptions reference;
    reference.reference_loader = true;
    if (!fast.stats.fast_path || !identical(fast.graph, load_graph(t, reference).graph))
      throw std::logic_error("the fast loader " + std::string(fast.stats.fast_path ? "disagrees with" : "declined") +
                             " the reference loader on " + t.substr(0, 300));
    return std::move(fast.graph);
  }
  std::int32_t index(const std::string& name) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i]["name"] == name) return static_cast<std::int32_t>(i);
    return -1;
  }

  // "layers.0.mlp" with type T → frames [layers.0.mlp:T, layers.0:Block]; the
  // innermost frame gets `type`, outer ones a type named after their last key.
  static json module_stack(const std::string& fqn, const std::string& type) {
    json frames = json::array();
    std::string current = fqn;
    bool first = true;
    while (!current.empty()) {
      std::string outer_type = first ? type : "Module";
      auto dot = current.rfind('.');
      // A numeric key sits in a container: its module is a block.
      std::string key = dot == std::string::npos ? current : current.substr(dot + 1);
      if (!first && !key.empty() && std::isdigit(static_cast<unsigned char>(key[0]))) outer_type = "Block";
      frames.push_back({{"fqn", current}, {"type", outer_type}});
      first = false;
      if (dot == std::string::npos) break;
      current = current.substr(0, dot);
      // Containers (ModuleList) never run a forward, so they are not frames.
      auto dot2 = current.rfind('.');
      std::string key2 = dot2 == std::string::npos ? current : current.substr(dot2 + 1);
      if (key2 == "layers") {
        if (dot2 == std::string::npos) break;
        current = current.substr(0, dot2);
      }
    }
    return frames;
  }

 private:
  json nodes_ = json::array();
  json model_;
  std::map<std::string, std::int64_t> ids_;
  std::int64_t next_id_ = 0;
};

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// HYPER_AC_UPDATE_GOLDEN=1 (exactly "1", as in tests/python/test_tagging_golden.py;
// "0" or any other value does not rewrite).
inline bool update_golden() {
  const char* value = std::getenv("HYPER_AC_UPDATE_GOLDEN");
  return value != nullptr && std::string(value) == "1";
}

// Compares `text` with tests/data/golden/<name>.txt; HYPER_AC_UPDATE_GOLDEN=1 rewrites it.
inline bool matches_golden(const std::string& name, const std::string& text) {
  std::string path = std::string(HYPER_AC_TEST_DATA) + "/golden/" + name + ".txt";
  if (update_golden()) {
    std::ofstream(path) << text;
    return true;
  }
  return read_text(path) == text;
}

}  // namespace hyper_ac::testing
