// Scope resolution: which forward nodes may recompute (regions), which never
// do (exclusions) and which repeated block (unit) each node belongs to.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hyper_ac/diagnostic.h"
#include "hyper_ac/graph.h"

namespace hyper_ac {

// A scope request that cannot be satisfied (no units, a pattern matching nothing, ...).
class ScopeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// No unit could be found at all (neither live-model facts nor repeated blocks
// on the module stacks). A compile backend may skip such a graph with a warning.
class NoUnitsError : public ScopeError {
 public:
  using ScopeError::ScopeError;
};

// Which forward the recompute regions cover.
//  auto:        the units (repeated blocks); a graph without units is one
//               whole-graph region when `whole_graph_when_no_units` is set
//               (the min-cut modes), otherwise NoUnitsError.
//  units:       the units only; a graph without units raises NoUnitsError.
//  whole_graph: one region, every forward node (no units, no cross-unit rule);
//               with `include`, the modules it matches anywhere in the graph.
//  unit_graph:  the graph is itself one unit of a model compiled unit by unit
//               (per-block compile): one region as whole_graph, and the plan
//               is scored by the bytes its forward saves for the backward,
//               since those stack up over the model's units while the graph's
//               own transient peak occurs once (plan.h, PlanStats::scope).
enum class ScopeRule { Auto, Units, WholeGraph, UnitGraph };

const char* to_string(ScopeRule rule);  // "auto", "units", "whole_graph", "unit_graph"

struct ScopeOptions {
  // See ScopeRule; config key `scope`.
  ScopeRule rule = ScopeRule::Auto;
  // Under ScopeRule::Auto, a graph without units is planned as the whole graph
  // (one region, or the modules regions.include names) instead of raising
  // NoUnitsError. Set by the plan for auto/budget.
  bool whole_graph_when_no_units = false;
  // Leading prefix of the flattened unit list to select; unset = all units
  // (config key selection.layer_count).
  std::optional<std::int64_t> unit_count;
  // Exact flattened unit indices to select; unset = all. Never both
  // (config key selection.layer_indices).
  std::optional<std::vector<std::int64_t>> unit_indices;
  // fnmatch patterns over module FQNs; the outermost matches inside selected
  // units become regions. Empty = each selected unit is one region.
  std::vector<std::string> include;
  // fnmatch patterns over module FQNs whose nodes never recompute.
  std::vector<std::string> exclude;
  // Regions (fnmatch over region FQNs) whose outputs may be recomputed by a
  // consumer in another recompute region; empty = none.
  std::vector<std::string> output_recompute;
};

struct Scope {
  std::vector<ModuleFrame> units;          // all discovered units, flattened
  std::vector<std::int32_t> selected_units;
  std::vector<std::string> regions;        // region root FQNs, in unit order
  std::vector<bool> region_output_recompute;
  std::vector<std::string> excluded;       // exclusion root FQNs
  // Per graph node (sized like graph.nodes); -1 = none.
  std::vector<std::int32_t> node_region;
  std::vector<std::int32_t> node_unit;
  std::vector<bool> node_excluded;
  bool units_from_model = false;  // live-model facts vs module-stack discovery
  // One region over the whole forward (no units were found, or the config asked for it).
  bool whole_graph = false;
  // ScopeRule::UnitGraph: the graph is one unit of a model compiled unit by
  // unit (whole_graph is set too).
  bool unit_graph = false;
  std::vector<Diagnostic> diagnostics;  // e.g. "unit selection matched zero units"
};

// The units of a graph and which rule found them.
struct UnitDiscovery {
  std::vector<ModuleFrame> units;  // flattened, discovery order
  bool from_model = false;         // the live-model marker rule (else the module-stack rule)
};

// Marker rule, over the live model's module tree (graph.model): for every
// module carrying the `gradient_checkpointing` marker (the root first, then
// the modules in listing order, each object once), each direct child of each
// of its non-empty container children (ModuleList / ModuleDict / Sequential)
// is a unit, flattened in discovery order and deduplicated by identity
// (`same_as`). A marked module where this finds no container is searched
// further down, through non-container children (8 levels), for the first
// containers on each path (BertModel's encoder.layer), skipping anything
// inside a unit already found (a marked decoder layer's expert list is not a
// list of units). Empty when no module is marked.
std::vector<ModuleFrame> units_from_model(const ModelFacts& model);

// Module-stack rule, without live-model facts: repeated children of one
// container with the same type, read off the module stacks, in order of first
// appearance; nested repeats are left to the outer unit.
std::vector<ModuleFrame> units_from_stacks(const Graph& graph);

// The marker rule when it finds units, otherwise the module-stack rule. Never
// throws; empty when neither rule finds any.
UnitDiscovery discover_units(const Graph& graph);

// Throws ScopeError naming the pattern / FQN / limit at fault.
Scope resolve_scope(const Graph& graph, const ScopeOptions& options);

// fnmatch(3) semantics without flags ('*' matches dots too), as Python's fnmatchcase.
bool fqn_matches(const std::string& pattern, const std::string& fqn);
// fqn == root or fqn lies below root.
bool at_or_under(const std::string& fqn, const std::string& root);

}  // namespace hyper_ac
