#include "hyper_ac/scope.h"

#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "scope_indexed.h"
#include "string_ids.h"

namespace hyper_ac {

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  return ::fnmatch(pattern.c_str(), fqn.c_str(), 0) == 0;
}

bool at_or_under(const std::string& fqn, const std::string& root) {
  if (root.empty()) return true;
  return fqn.size() >= root.size() && fqn.compare(0, root.size(), root) == 0 &&
         (fqn.size() == root.size() || fqn[root.size()] == '.');
}

namespace {

std::string parent_of(const std::string& fqn) {
  auto dot = fqn.rfind('.');
  return dot == std::string::npos ? std::string() : fqn.substr(0, dot);
}

// The module FQNs the patterns are matched against: the live model's modules
// (each object once, as named_modules() lists them) when known, otherwise
// every frame seen on a module stack.
std::vector<ModuleFrame> module_universe(const Graph& graph) {
  if (graph.model.present && !graph.model.modules.empty()) {
    std::vector<ModuleFrame> frames;
    for (const auto& m : graph.model.modules)
      if (m.same_as.empty()) frames.push_back({m.fqn, m.type});
    return frames;
  }
  std::map<std::string, std::string> seen;
  std::unordered_set<std::string_view> listed;  // each distinct FQN enters the sorted map once
  for (const auto& stack : graph.stacks)
    for (const auto& frame : stack)
      if (listed.insert(std::string_view(frame.fqn)).second) seen.emplace(frame.fqn, frame.type);
  std::vector<ModuleFrame> frames;
  for (auto& [fqn, type] : seen) frames.push_back({fqn, type});
  return frames;
}

// Outermost FQNs of `universe` under any of `roots` that match any pattern.
// Records which patterns matched at all.
std::vector<std::string> outermost_matches(const std::vector<ModuleFrame>& universe, const std::vector<std::string>& roots,
                                           const std::vector<std::string>& patterns, std::vector<bool>& pattern_used) {
  std::vector<std::string> matched;
  for (const auto& frame : universe) {
    bool inside = roots.empty() || std::any_of(roots.begin(), roots.end(), [&](const std::string& r) { return at_or_under(frame.fqn, r); });
    if (!inside) continue;
    bool hit = false;
    for (std::size_t p = 0; p < patterns.size(); ++p)
      if (fqn_matches(patterns[p], frame.fqn)) {
        pattern_used[p] = true;
        hit = true;
      }
    if (hit) matched.push_back(frame.fqn);
  }
  std::sort(matched.begin(), matched.end());
  matched.erase(std::unique(matched.begin(), matched.end()), matched.end());
  std::vector<std::string> outermost;
  for (const auto& fqn : matched)  // sorted: an ancestor precedes its descendants
    if (outermost.empty() || !at_or_under(fqn, outermost.back())) outermost.push_back(fqn);
  return outermost;
}

std::string_view parent_view(std::string_view fqn) {
  auto dot = fqn.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : fqn.substr(0, dot);
}

// Index of the root containing an FQN (walking up its dotted prefixes: the
// FQN itself, its parent, ..., then the root module ""), or -1. Memoised per
// prefix: each distinct module prefix is looked up once however many module
// stacks name it. The roots and the FQNs asked about must outlive the finder
// (string views into them are kept).
class RootFinder {
 public:
  explicit RootFinder(const std::vector<std::string>& roots) : roots_(roots.size()) {
    for (std::size_t i = 0; i < roots.size(); ++i)
      if (roots_.insert(std::string_view(roots[i])).second) root_index_.push_back(static_cast<std::int32_t>(i));
  }
  bool empty() const { return roots_.size() == 0; }
  std::int32_t find(std::string_view fqn) {
    if (empty()) return -1;
    auto [id, fresh] = memo_.insert(fqn);
    if (!fresh) return memo_value_[static_cast<std::size_t>(id)];
    memo_value_.push_back(-1);
    std::int32_t found;
    const std::int32_t root = roots_.find(fqn);
    if (root >= 0) {
      found = root_index_[static_cast<std::size_t>(root)];
    } else if (fqn.empty()) {
      found = -1;
    } else {
      std::string_view parent = parent_view(fqn);
      if (parent.empty()) {
        const std::int32_t top = roots_.find(std::string_view());
        found = top < 0 ? -1 : root_index_[static_cast<std::size_t>(top)];
      } else {
        found = find(parent);
      }
    }
    memo_value_[static_cast<std::size_t>(id)] = found;
    return found;
  }

 private:
  detail::StringIds roots_;             // the roots' names; the first listing of a name wins
  std::vector<std::int32_t> root_index_;  // per name id: its index in the roots
  detail::StringIds memo_;              // the FQNs looked up so far
  std::vector<std::int32_t> memo_value_;  // per FQN id: its root, -1 = none
};

}  // namespace

namespace {

// Without a live model: repeated children of one container with the same
// type. A container never runs a forward of its own, so it never shows up as a
// frame; nested repeats (experts inside a layer) are left to the outer unit.
// stack_of(i) is node i's Node::stack (off the graph or the node index).
template <typename StackOf>
std::vector<ModuleFrame> units_from_stacks_of(const Graph& graph, StackOf&& stack_of) {
  // Distinct FQNs get ids in order of first appearance (each interned stack
  // once, in the order nodes first use it); a FQN's type is its first listing's.
  // Linear in the node count; the per-FQN work is hashing and integer sorts.
  detail::StringIds fqn_ids;             // views into graph.stacks
  std::vector<std::string_view> types;   // per FQN id
  std::vector<char> stack_seen(graph.stacks.size(), 0);
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const std::int32_t stack = stack_of(i);
    if (stack < 0 || stack_seen[static_cast<std::size_t>(stack)]) continue;
    stack_seen[static_cast<std::size_t>(stack)] = 1;
    for (const auto& frame : graph.stacks[static_cast<std::size_t>(stack)])
      if (fqn_ids.insert(std::string_view(frame.fqn)).second) types.push_back(std::string_view(frame.type));
  }
  // Candidates: (parent, type, child) for every FQN whose parent is not a
  // frame of its own. A ModuleList/ModuleDict never runs a forward of its own,
  // so it is never a frame; a Sequential does, and is recognised by its type.
  // Any other parent that ran a forward is a module with fields, not a container.
  const std::size_t fqns = fqn_ids.size();
  detail::StringIds parent_ids(fqns), type_ids;
  std::vector<std::string_view> parents;  // per parent id
  struct Child {
    std::int32_t parent, type, fqn;
  };
  std::vector<Child> children;
  for (std::size_t f = 0; f < fqns; ++f) {
    const std::string_view parent = parent_view(fqn_ids.key(static_cast<std::int32_t>(f)));
    if (parent.empty()) continue;
    const std::int32_t parent_frame = fqn_ids.find(parent);
    if (parent_frame >= 0 && types[static_cast<std::size_t>(parent_frame)] != "Sequential") continue;
    auto [p, fresh] = parent_ids.insert(parent);
    if (fresh) parents.push_back(parent);
    children.push_back({p, type_ids.insert(types[f]).first, static_cast<std::int32_t>(f)});
  }
  // Groups: one (parent, type) with two or more children, children in order
  // of first appearance.
  std::stable_sort(children.begin(), children.end(), [](const Child& a, const Child& b) {
    return a.parent != b.parent ? a.parent < b.parent : a.type < b.type;
  });
  struct Group {
    std::size_t begin, end;  // into children
    std::size_t depth;       // dots in the parent's FQN
  };
  std::vector<Group> groups;
  for (std::size_t k = 0; k < children.size();) {
    std::size_t e = k + 1;
    while (e < children.size() && children[e].parent == children[k].parent && children[e].type == children[k].type) ++e;
    if (e - k >= 2) {
      const std::string_view parent = parents[static_cast<std::size_t>(children[k].parent)];
      groups.push_back({k, e, static_cast<std::size_t>(std::count(parent.begin(), parent.end(), '.'))});
    }
    k = e;
  }
  // Outer groups first so nested repeats are recognised as inside a unit
  // (groups of one depth cannot nest in each other, so their order is free).
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.depth < b.depth; });
  std::vector<char> is_unit(fqns, 0);
  std::vector<std::int32_t> unit_ids;
  for (const auto& group : groups) {
    // Inside a unit already found? Walk up the parent's own prefixes.
    bool nested = false;
    for (std::string_view up = parents[static_cast<std::size_t>(children[group.begin].parent)]; !up.empty() && !nested;
         up = parent_view(up)) {
      const std::int32_t f = fqn_ids.find(up);
      nested = f >= 0 && is_unit[static_cast<std::size_t>(f)];
    }
    if (nested) continue;
    for (std::size_t k = group.begin; k < group.end; ++k) {
      is_unit[static_cast<std::size_t>(children[k].fqn)] = 1;
      unit_ids.push_back(children[k].fqn);
    }
  }
  // Discovery order = order of first appearance in the graph = FQN id order.
  std::sort(unit_ids.begin(), unit_ids.end());
  std::vector<ModuleFrame> units;
  units.reserve(unit_ids.size());
  for (auto f : unit_ids)
    units.push_back({std::string(fqn_ids.key(f)), std::string(types[static_cast<std::size_t>(f)])});
  return units;
}

}  // namespace

std::vector<ModuleFrame> units_from_stacks(const Graph& graph) {
  return units_from_stacks_of(graph, [&](std::size_t i) { return graph.nodes[i].stack; });
}

std::vector<ModuleFrame> detail::units_from_stacks(const Graph& graph, const NodeIndex& index) {
  return units_from_stacks_of(graph, [&](std::size_t i) { return index.stack[i]; });
}

std::vector<ModuleFrame> units_from_model(const ModelFacts& model) {
  const auto& modules = model.modules;
  const std::size_t n = modules.size();
  // Module "" is the root; entries are identified by the FQN of their first listing.
  auto identity = [&](std::size_t i) { return modules[i].same_as.empty() ? modules[i].fqn : modules[i].same_as; };
  std::unordered_map<std::string, std::vector<std::size_t>> children;  // parent FQN -> direct children, listing order
  for (std::size_t i = 0; i < n; ++i) children[parent_of(modules[i].fqn)].push_back(i);
  auto children_of = [&](const std::string& fqn) -> const std::vector<std::size_t>& {
    static const std::vector<std::size_t> none;
    auto it = children.find(fqn);
    return it == children.end() ? none : it->second;
  };
  // A parent's children, each object once (as nn.Module.named_children gives them).
  auto distinct_children = [&](const std::string& fqn) {
    std::vector<std::size_t> out;
    std::unordered_set<std::string> seen;
    for (auto c : children_of(fqn))
      if (seen.insert(identity(c)).second) out.push_back(c);
    return out;
  };
  // The first non-empty containers under `fqn`, through non-container children up to `depth` levels down.
  std::function<void(const std::string&, int, std::vector<std::string>&)> containers_below =
      [&](const std::string& fqn, int depth, std::vector<std::string>& found) {
        for (auto c : distinct_children(fqn)) {
          if (modules[c].container) {
            if (!children_of(modules[c].fqn).empty()) found.push_back(modules[c].fqn);
          } else if (depth > 0) {
            containers_below(modules[c].fqn, depth - 1, found);
          }
        }
      };
  std::vector<ModuleFrame> units;
  std::unordered_set<std::string> seen;  // identities of the units
  std::vector<std::string> unit_fqns;
  auto add_children = [&](const std::string& container) {
    for (auto c : distinct_children(container))
      if (seen.insert(identity(c)).second) {
        units.push_back({modules[c].fqn, modules[c].type});
        unit_fqns.push_back(modules[c].fqn);
      }
  };
  std::vector<std::string> marked;  // named_modules() order: the root first, each object once
  if (model.marked) marked.push_back("");
  for (const auto& m : modules)
    if (m.marked && m.same_as.empty()) marked.push_back(m.fqn);
  auto strictly_under = [](const std::string& fqn, const std::string& root) {
    return fqn.size() > root.size() + 1 && fqn.compare(0, root.size(), root) == 0 && fqn[root.size()] == '.';
  };
  auto at_or_inside_a_unit = [&](const std::string& fqn) {
    return std::any_of(unit_fqns.begin(), unit_fqns.end(),
                       [&](const std::string& u) { return fqn == u || strictly_under(fqn, u); });
  };
  std::vector<std::string> pending;
  for (const auto& fqn : marked) {
    // A marked block that is itself a unit (T5Block, with its own `layer` list) is
    // not searched again: units never nest.
    if (at_or_inside_a_unit(fqn)) continue;
    std::vector<std::string> containers;
    containers_below(fqn, 0, containers);
    if (containers.empty()) pending.push_back(fqn);
    for (const auto& container : containers) add_children(container);
  }
  for (const auto& fqn : pending) {
    if (at_or_inside_a_unit(fqn)) continue;
    std::vector<std::string> containers;
    containers_below(fqn, 8, containers);
    for (const auto& container : containers) {
      if (std::any_of(unit_fqns.begin(), unit_fqns.end(), [&](const std::string& u) { return strictly_under(container, u); }))
        continue;
      add_children(container);
    }
  }
  return units;
}

UnitDiscovery discover_units(const Graph& graph) {
  UnitDiscovery found;
  if (graph.model.present) found.units = units_from_model(graph.model);
  found.from_model = !found.units.empty();
  if (!found.from_model) found.units = units_from_stacks(graph);
  return found;
}

namespace {

// discover_units over the node index.
UnitDiscovery discover_units(const Graph& graph, const detail::NodeIndex& index) {
  UnitDiscovery found;
  if (graph.model.present) found.units = units_from_model(graph.model);
  found.from_model = !found.units.empty();
  if (!found.from_model) found.units = detail::units_from_stacks(graph, index);
  return found;
}

}  // namespace

const char* to_string(ScopeRule rule) {
  switch (rule) {
    case ScopeRule::Auto: return "auto";
    case ScopeRule::Units: return "units";
    case ScopeRule::WholeGraph: return "whole_graph";
    case ScopeRule::UnitGraph: return "unit_graph";
  }
  return "auto";
}

namespace {

// The exclusion roots (outermost matches of options.exclude), checked against
// the regions: an exclusion must lie inside a region, never be one or hold one.
void resolve_exclusions(const std::vector<ModuleFrame>& universe, const ScopeOptions& options, Scope& scope) {
  if (options.exclude.empty()) return;
  std::vector<bool> used(options.exclude.size(), false);
  scope.excluded = outermost_matches(universe, {}, options.exclude, used);
  for (std::size_t p = 0; p < used.size(); ++p)
    if (!used[p]) throw ScopeError("exclude pattern '" + options.exclude[p] + "' matches no module");
  for (const auto& root : scope.regions)
    for (const auto& excluded : scope.excluded) {
      if (root == excluded)
        throw ScopeError("region root '" + root + "' is also excluded; drop it from the exclude patterns or the regions");
      if (at_or_under(root, excluded))
        throw ScopeError("exclusion '" + excluded + "' contains region root '" + root +
                         "'; an exclusion must lie inside a region");
    }
}

// Per region: whether options.output_recompute names it. The whole-graph
// region "" has no consumer outside it, so never.
void mark_output_recompute(const ScopeOptions& options, Scope& scope) {
  for (const auto& root : scope.regions) {
    bool on = !root.empty() && std::any_of(options.output_recompute.begin(), options.output_recompute.end(),
                                           [&](const std::string& pattern) { return fqn_matches(pattern, root); });
    scope.region_output_recompute.push_back(on);
  }
}

// What a module stack puts a node in: its innermost enclosing region, unit
// and exclusion.
struct StackScope {
  std::int32_t region = -1, unit = -1;
  bool excluded = false;
};

// Every node's region, unit and exclusion, read off its interned module stack
// once per stack (many nodes share one). `fallback` is what a node without a
// stack gets, and each stack's starting point: a region it sets is kept (the
// whole-graph region), not looked up. `forward_only`: backward nodes stay in
// no region. A stack's frames are read only when some root needs them.
void assign_nodes(const Graph& graph, const detail::NodeIndex& index, const std::vector<std::string>& unit_fqns,
                  bool forward_only, const StackScope& fallback, Scope& scope) {
  RootFinder region_root(scope.regions), unit_root(unit_fqns), excluded_root(scope.excluded);
  std::vector<StackScope> per_stack(graph.stacks.size(), fallback);
  if (fallback.region < 0 || !unit_root.empty() || !excluded_root.empty()) {
    for (std::size_t s = 0; s < graph.stacks.size(); ++s) {
      for (const auto& frame : graph.stacks[s]) {  // innermost first
        if (per_stack[s].region < 0) per_stack[s].region = region_root.find(frame.fqn);
        if (per_stack[s].unit < 0) per_stack[s].unit = unit_root.find(frame.fqn);
        if (!per_stack[s].excluded) per_stack[s].excluded = excluded_root.find(frame.fqn) >= 0;
      }
    }
  }
  scope.node_region.assign(graph.nodes.size(), -1);
  scope.node_unit.assign(graph.nodes.size(), -1);
  scope.node_excluded.assign(graph.nodes.size(), false);
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (forward_only && !index.forward(i)) continue;
    const std::int32_t stack = index.stack[i];
    const StackScope& s = stack < 0 ? fallback : per_stack[static_cast<std::size_t>(stack)];
    scope.node_region[i] = s.region;
    scope.node_unit[i] = s.unit;
    scope.node_excluded[i] = s.excluded;
  }
}

// The whole graph as the scope: one region, named "" (the root), over every
// forward node, or, with regions.include, the modules it matches anywhere in
// the graph; exclusions apply either way.
Scope whole_graph_scope(const Graph& graph, const detail::NodeIndex& index, const ScopeOptions& options,
                        const std::string& why) {
  if (options.unit_count || options.unit_indices)
    throw ScopeError("selection.layer_count / layer_indices select units, but the scope is the whole graph (" + why +
                     "); drop the selection or use scope: units");
  Scope scope;
  scope.whole_graph = true;
  scope.unit_graph = options.rule == ScopeRule::UnitGraph;
  std::vector<ModuleFrame> universe;
  if (!options.include.empty() || !options.exclude.empty()) universe = module_universe(graph);
  if (options.include.empty()) {
    scope.regions.push_back("");
  } else {
    std::vector<bool> used(options.include.size(), false);
    scope.regions = outermost_matches(universe, {}, options.include, used);
    for (std::size_t p = 0; p < used.size(); ++p)
      if (!used[p]) throw ScopeError("region pattern '" + options.include[p] + "' matches no module in the graph");
  }
  resolve_exclusions(universe, options, scope);
  mark_output_recompute(options, scope);
  // Without regions.include every forward node is in the one region (0); with it, in the match enclosing it.
  StackScope fallback;
  if (options.include.empty()) fallback.region = 0;
  assign_nodes(graph, index, {}, /*forward_only=*/true, fallback, scope);
  const std::string name = scope.unit_graph ? "unit_graph" : "whole_graph";
  scope.diagnostics.push_back(
      {Severity::Info, -1,
       "scope: " + name + " (" + why + "): " +
           (options.include.empty() ? std::string("one region over the whole forward")
                                    : std::to_string(scope.regions.size()) + " region(s) regions.include matched in the graph") +
           (scope.unit_graph ? ", scored by the bytes it saves for the backward" : "")});
  return scope;
}

}  // namespace

Scope resolve_scope(const Graph& graph, const ScopeOptions& options) {
  return detail::resolve_scope(graph, detail::NodeIndex(graph), options);
}

Scope detail::resolve_scope(const Graph& graph, const NodeIndex& index, const ScopeOptions& options) {
  if (options.rule == ScopeRule::WholeGraph)
    return whole_graph_scope(graph, index, options, "scope: whole_graph in the config");
  if (options.rule == ScopeRule::UnitGraph)
    return whole_graph_scope(graph, index, options, "scope: unit_graph in the config");
  Scope scope;
  {
    // No live model, or one without the gradient_checkpointing marker: the
    // repeated blocks are read off the module stacks.
    UnitDiscovery found = discover_units(graph, index);
    scope.units = std::move(found.units);
    scope.units_from_model = found.from_model;
    if (scope.units.empty() && options.rule == ScopeRule::Auto && options.whole_graph_when_no_units)
      return whole_graph_scope(graph, index, options, "no units found");
    if (scope.units.empty()) {
      std::string model = graph.model.present
                              ? "model " + (graph.model.type.empty() ? std::string("(unnamed)") : graph.model.type) +
                                    " has no module with a 'gradient_checkpointing' attribute holding a non-empty "
                                    "container of blocks (ModuleList/ModuleDict/Sequential), and "
                              : "the graph carries no live-model facts (serialise with model=...) and ";
      throw NoUnitsError("no units found: " + model +
                       "its module stacks show no container with two or more children of one module type; "
                       "activation checkpointing cannot find the units (repeated blocks) to checkpoint; "
                       "when the compiled graph is itself one block (per-block compile), set ac_scope: unit_graph; "
                       "for a model without repeated blocks, ac_mode auto or budget plans the graph as one region");
    }
  }

  const auto unit_count = static_cast<std::int64_t>(scope.units.size());
  if (options.unit_count && options.unit_indices)
    throw ScopeError("layer_count and layer_indices are both set; keep one");
  if (options.unit_count) {
    if (*options.unit_count < 0) throw ScopeError("layer_count must be >= 0, got " + std::to_string(*options.unit_count));
    if (*options.unit_count > unit_count)
      throw ScopeError("layer_count " + std::to_string(*options.unit_count) + " exceeds the " +
                       std::to_string(unit_count) + " units found (at most " + std::to_string(unit_count) + ")");
    for (std::int64_t i = 0; i < *options.unit_count; ++i) scope.selected_units.push_back(static_cast<std::int32_t>(i));
  } else if (options.unit_indices) {
    std::set<std::int64_t> seen;
    for (std::int64_t index : *options.unit_indices) {
      if (index < 0 || index >= unit_count)
        throw ScopeError("layer_indices: unit index " + std::to_string(index) + " is out of range: " + std::to_string(unit_count) +
                         " units found, valid indices are 0.." + std::to_string(unit_count - 1));
      if (!seen.insert(index).second) throw ScopeError("layer_indices: unit index " + std::to_string(index) + " is listed twice");
      scope.selected_units.push_back(static_cast<std::int32_t>(index));
    }
    std::sort(scope.selected_units.begin(), scope.selected_units.end());
  } else {
    for (std::int64_t i = 0; i < unit_count; ++i) scope.selected_units.push_back(static_cast<std::int32_t>(i));
  }

  std::vector<std::string> selected_fqns;
  for (auto index : scope.selected_units) selected_fqns.push_back(scope.units[static_cast<std::size_t>(index)].fqn);

  // The patterns' universe, built only when some pattern needs it.
  std::vector<ModuleFrame> universe;
  if (!options.include.empty() || !options.exclude.empty()) universe = module_universe(graph);
  if (selected_fqns.empty()) {
    scope.diagnostics.push_back({Severity::Info, -1, "activation checkpoint unit selection matched zero units; nothing is recomputed"});
  } else if (options.include.empty()) {
    scope.regions = selected_fqns;
  } else {
    std::vector<bool> used(options.include.size(), false);
    scope.regions = outermost_matches(universe, selected_fqns, options.include, used);
    for (std::size_t p = 0; p < used.size(); ++p)
      if (!used[p])
        throw ScopeError("region pattern '" + options.include[p] + "' matches no module inside the selected units");
  }

  resolve_exclusions(universe, options, scope);
  mark_output_recompute(options, scope);

  std::vector<std::string> unit_fqns;
  unit_fqns.reserve(scope.units.size());
  for (const auto& unit : scope.units) unit_fqns.push_back(unit.fqn);
  assign_nodes(graph, index, unit_fqns, /*forward_only=*/false, StackScope{}, scope);
  return scope;
}

}  // namespace hyper_ac
