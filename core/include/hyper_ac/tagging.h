// Policy tagging: decide MUST_SAVE / PREFER_RECOMPUTE / ... for every scoped
// forward node, applying the mode, the operator table and the structural
// rules (RNG, SymInt, collectives, in-place alias closure, cross-unit saves,
// output_recompute, exclusions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_ac/config.h"
#include "hyper_ac/graph.h"
#include "hyper_ac/scope.h"

namespace hyper_ac {

struct TagOptions {
  // off: no tags; full: every scoped node MUST_RECOMPUTE; selective: the op
  // table; auto/budget: the op table as PREFER_* biases for the min-cut.
  // Off by default, as Config.
  Mode mode = Mode::Off;
  // Operator categories (configs/op_policy.yaml merged with the config's own).
  OpPolicyTable op_policy;
  // Also pin forward all-gathers to MUST_SAVE (otherwise they follow the mode).
  bool save_forward_all_gather = false;
  // Random ops with a replayable state (Node::rng_state_bytes > 0): `replay`
  // tags them by the mode like any op ("rng-replay"), unless their output is
  // no larger than the state (then MUST_SAVE "rng"); `save` pins them MUST_SAVE.
  RngPolicy rng = RngPolicy::Replay;
};

struct TagStats {
  std::size_t tagged = 0;
  std::size_t must_save = 0;
  std::size_t prefer_save = 0;
  std::size_t must_recompute = 0;
  std::size_t prefer_recompute = 0;
  std::size_t saved_rng = 0;
  std::size_t rng_replay_candidates = 0;  // random ops tagged by the mode, to be replayed if recomputed
  std::size_t saved_symint = 0;
  std::size_t saved_collective = 0;
  std::size_t saved_inplace = 0;
  std::size_t saved_cross_unit = 0;
};

struct TagResult {
  std::vector<Policy> policies;       // per node; None = untagged
  std::vector<std::int32_t> graph_id; // per node region index (ac_graph_id); -1 = none
  // Why each MUST_SAVE was forced ("rng", "in-place", "cross-unit", ...); "" otherwise.
  std::vector<std::string> reasons;
  TagStats stats;
};

TagResult tag_policies(const Graph& graph, const Scope& scope, const TagOptions& options);

// Whether `target` ("aten::mm.default") is named by an entry ("aten::mm" or "aten::mm.default").
bool op_matches(const std::vector<std::string>& entries, const std::string& target);

}  // namespace hyper_ac
