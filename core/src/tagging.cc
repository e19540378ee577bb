#include "hyper_ac/tagging.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "tagging_indexed.h"

namespace hyper_ac {

bool op_matches(const std::vector<std::string>& entries, const std::string& target) {
  for (const auto& entry : entries) {
    if (entry == target) return true;
    // "aten::mm" names every overload of mm.
    if (target.size() > entry.size() && target.compare(0, entry.size(), entry) == 0 && target[entry.size()] == '.' &&
        entry.find("::") != std::string::npos && target.find('.', entry.size() + 1) == std::string::npos)
      return true;
  }
  return false;
}

namespace {

struct Tagger {
  const Graph& graph;
  const detail::NodeIndex& index;  // compact node facts (flags, inputs, targets)
  const Scope& scope;
  const TagOptions& options;
  TagResult result;
  std::vector<char> user;  // policy seeded from the model's own tag

  // What the operator table says about a target, found once per distinct
  // target (op_matches scans the table; the index interns the targets).
  struct OpFacts {
    bool transparent, must_recompute, must_save, prefer_save, saved_collective, all_gather;
  };
  std::vector<OpFacts> op_facts;                 // per distinct target
  std::vector<char> op_facts_known;              // per distinct target

  const OpFacts& facts(std::size_t i) {
    const auto id = static_cast<std::size_t>(index.target[i]);
    if (op_facts.empty()) {
      op_facts.resize(index.targets.size());
      op_facts_known.assign(index.targets.size(), 0);
    }
    if (!op_facts_known[id]) {
      const std::string target(index.targets[id]);
      const OpPolicyTable& table = options.op_policy;
      op_facts[id] = {op_matches(table.transparent, target),      op_matches(table.must_recompute, target),
                      op_matches(table.must_save, target),        op_matches(table.prefer_save, target),
                      op_matches(table.saved_collectives, target), op_matches(table.all_gathers, target)};
      op_facts_known[id] = 1;
    }
    return op_facts[id];
  }

  // A collective hyper_ac always saves (a replay would communicate again): one the
  // table lists, and every other communication op (Node::collective: an op of a
  // collective namespace, say a broadcast or a symmetric-memory op the table does
  // not know) but a forward all-gather, which follows save_forward_all_gather.
  bool saved_collective(std::size_t i) {
    const OpFacts& op = facts(i);
    if (op.saved_collective) return true;
    if (op.all_gather) return options.save_forward_all_gather;
    return graph.nodes[i].collective && !op.transparent;
  }

  bool is_candidate(std::size_t i) const {
    using Flag = detail::NodeIndex::Flag;
    // Never candidates, so saved: an opaque value (a DeviceMesh, a ProcessGroup), which has no
    // bytes to win, and a value the backward returns as it is, which the forward hands over anyway.
    return index.forward(i) && index.has(i, Flag::kCallFunction) && !index.has(i, Flag::kRecomputedFrom) &&
           !index.has(i, Flag::kOpaque) && !index.has(i, Flag::kBackwardOutput);
  }

  bool transparent(std::size_t i) { return facts(i).transparent; }

  void set(std::size_t i, Policy policy, const char* reason) {
    result.policies[i] = policy;
    result.reasons[i] = reason;
  }

  std::string describe(std::size_t i) const {
    const Node& node = graph.nodes[i];
    std::string text = "node '" + node.name + "' (" + node.target;
    const auto& frames = graph.stack_of(node);
    if (!frames.empty()) text += ", in module '" + frames.front().fqn + "'";
    return text + ")";
  }

  [[noreturn]] void conflict(std::size_t i, const std::string& rule) const {
    throw PolicyConflictError(
        describe(i) + " is tagged MUST_RECOMPUTE by the model's own checkpointing (torch.utils.checkpoint or a "
        "selective-checkpoint policy), but " + rule + ", so it must be saved; make the policy function return "
        "MUST_SAVE or PREFER_RECOMPUTE for this op");
  }

  void force_save(std::size_t i, const char* reason, std::size_t& counter) {
    if (!is_recompute(result.policies[i]) && result.policies[i] != Policy::PreferSave) return;
    if (user[i]) {
      // A hyper_ac preference (cross-unit) never overrides the model's tag;
      // a correctness rule wins over PREFER_* and conflicts with MUST_RECOMPUTE.
      if (std::string(reason) == "cross-unit") return;
      if (graph.nodes[i].policy == Policy::MustRecompute) {
        std::string rule = "it is in-place-pinned: it or an input is storage a forward in-place write touches "
                           "(a replay would read the value at the wrong point in time)";
        for (auto input : graph.nodes[i].inputs) {
          const Node& producer = graph.nodes[static_cast<std::size_t>(input)];
          if (!producer.mutated_inputs.empty() || producer.mutated)
            rule += "; chain: " + describe(i) + " reads " + describe(static_cast<std::size_t>(input)) + ", written in place";
        }
        conflict(i, rule);
      }
    }
    set(i, Policy::MustSave, reason);
    ++counter;
  }

  // The structural saves, whatever a tag says: an RNG op not replayed, a
  // collective hyper_ac always saves, a SymInt. True when node i took one.
  bool save_structural(std::size_t i, bool collective) {
    if (index.has(i, detail::NodeIndex::kRng)) {
      set(i, Policy::MustSave, "rng");
      ++result.stats.saved_rng;
    } else if (collective) {
      set(i, Policy::MustSave, "collective");
      ++result.stats.saved_collective;
    } else if (index.has(i, detail::NodeIndex::kSymint)) {
      set(i, Policy::MustSave, "symint");
      ++result.stats.saved_symint;
    } else {
      return false;
    }
    return true;
  }

  Policy mode_policy(std::size_t i) {
    if (options.mode == Mode::Full) return Policy::MustRecompute;
    const OpFacts& op = facts(i);
    if (op.must_recompute) return Policy::MustRecompute;
    if (op.must_save)
      // Under the min-cut modes the table is a bias, not a rule.
      return options.mode == Mode::Selective ? Policy::MustSave : Policy::PreferSave;
    if (op.prefer_save) return Policy::PreferSave;
    return Policy::PreferRecompute;
  }

  // Pass 0: the model's own tags (torch.utils.checkpoint, selective-checkpoint
  // contexts), in every region or none; then PyTorch's boundary rule.
  void tag_user() {
    for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!is_candidate(i) || index.policy[i] == Policy::None) continue;
      const Node& node = graph.nodes[i];
      const bool collective = saved_collective(i);
      switch (node.policy) {
        case Policy::None: continue;
        case Policy::MustSave: set(i, Policy::MustSave, "user"); break;
        case Policy::PreferSave: set(i, Policy::PreferSave, "user"); break;
        case Policy::MustRecompute:
          if (node.rng) conflict(i, "it is an RNG op (a replay would draw different random numbers)");
          if (collective) conflict(i, "it is a collective hyper_ac always saves (a replay would communicate again)");
          if (node.symint) {
            // A SymInt costs no memory: saved, as every SymInt.
            set(i, Policy::MustSave, "symint");
            ++result.stats.saved_symint;
            break;
          }
          set(i, Policy::MustRecompute, "user");
          break;
        case Policy::PreferRecompute:
          // As PyTorch's min-cut: never saved, unless a structural rule must save it.
          if (!save_structural(i, collective)) set(i, Policy::MustRecompute, "user");
          break;
      }
      user[i] = 1;
      if (i < scope.node_region.size() && scope.node_region[i] >= 0) result.graph_id[i] = scope.node_region[i];
      ++result.stats.user_tagged;
    }
    // PyTorch's cleanup_recompute_tags: the boundary between two checkpointed
    // regions (a recompute node read by a recompute node of a later region) is saved.
    for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!user[i] || !is_recompute(graph.nodes[i].policy) || graph.nodes[i].ac_graph_id < 0) continue;
      if (result.policies[i] != Policy::MustRecompute || graph.nodes[i].policy == Policy::MustRecompute) continue;
      for (auto u : graph.users[i]) {
        const Node& reader = graph.nodes[static_cast<std::size_t>(u)];
        if (reader.is_forward() && is_recompute(reader.policy) && reader.ac_graph_id > graph.nodes[i].ac_graph_id) {
          set(i, Policy::MustSave, "user-boundary");
          ++result.stats.saved_user_boundary;
          break;
        }
      }
    }
  }

  // Pass 1: mode policy plus the structural saves (RNG, SymInt, collectives).
  void tag_by_policy() {
    for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!is_candidate(i) || user[i]) continue;
      if (transparent(i)) {
        if (index.input_start[i] != index.input_start[i + 1]) {
          auto parent = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(index.input_start[i])]);
          if (result.policies[parent] != Policy::None) {
            result.policies[i] = result.policies[parent];
            result.reasons[i] = "inherited";
            result.graph_id[i] = result.graph_id[parent];
          }
        }
        continue;
      }
      if (scope.node_region[i] < 0 || scope.node_excluded[i]) continue;
      result.graph_id[i] = scope.node_region[i];
      if (index.has(i, detail::NodeIndex::kRng) && graph.nodes[i].rng_state_bytes > 0 && options.rng == RngPolicy::Replay &&
          index.output_bytes[i] > graph.nodes[i].rng_state_bytes) {
        // Replayed from its saved generator state if recomputed: that costs the
        // state's bytes (charged by the min-cut and the remat plan), not its
        // output's. A random op no larger than its state stays saved ("rng").
        set(i, mode_policy(i), "rng-replay");
        ++result.stats.rng_replay_candidates;
      } else if (!save_structural(i, saved_collective(i))) {
        Policy policy = mode_policy(i);
        set(i, policy, policy == Policy::MustSave ? "op-table" : "");
      }
    }
  }

  // Pass 2: a mutation runs exactly once, so it and its forward users stay
  // saved, and so does every forward reader of storage a mutation touched: a
  // replay would read the value at the wrong point in time.
  void tag_inplace() {
    const std::size_t n = graph.nodes.size();
    std::vector<std::int32_t> mutated_bases;
    for (std::size_t i = 0; i < n; ++i) {
      // An input the step writes back after the forward: a replay would read the new value.
      if (index.has(i, detail::NodeIndex::kMutated)) mutated_bases.push_back(static_cast<std::int32_t>(i));
      if (!index.forward(i) || !index.has(i, detail::NodeIndex::kMutatesInputs)) continue;
      const Node& node = graph.nodes[i];
      for (auto position : node.mutated_inputs) mutated_bases.push_back(node.inputs[static_cast<std::size_t>(position)]);
      if (result.policies[i] == Policy::None) continue;
      force_save(i, "in-place", result.stats.saved_inplace);
      for (auto user : graph.users[i])
        if (graph.nodes[static_cast<std::size_t>(user)].is_forward())
          force_save(static_cast<std::size_t>(user), "in-place", result.stats.saved_inplace);
    }
    if (mutated_bases.empty()) return;
    // Undirected shared-storage graph over forward nodes: a write through one
    // view reaches the base and from there the sibling views.
    std::vector<std::vector<std::int32_t>> neighbours(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = graph.nodes[i];
      if (!node.is_forward()) continue;
      auto link = [&](std::int32_t position) {
        auto input = node.inputs[static_cast<std::size_t>(position)];
        if (!graph.nodes[static_cast<std::size_t>(input)].is_forward()) return;
        neighbours[i].push_back(input);
        neighbours[static_cast<std::size_t>(input)].push_back(static_cast<std::int32_t>(i));
      };
      for (auto position : node.aliased_inputs) link(position);
      for (auto position : node.mutated_inputs) link(position);
    }
    std::vector<char> in_closure(n, 0);
    std::vector<std::int32_t> stack;
    for (auto base : mutated_bases)
      if (!in_closure[static_cast<std::size_t>(base)]) {
        in_closure[static_cast<std::size_t>(base)] = 1;
        stack.push_back(base);
      }
    while (!stack.empty()) {
      auto current = static_cast<std::size_t>(stack.back());
      stack.pop_back();
      for (auto next : neighbours[current])
        if (!in_closure[static_cast<std::size_t>(next)]) {
          in_closure[static_cast<std::size_t>(next)] = 1;
          stack.push_back(next);
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (!is_recompute(result.policies[i]) || !graph.nodes[i].is_forward()) continue;
      // A replayed producer of mutated storage would yield the value before the write.
      if (in_closure[i]) {
        force_save(i, "in-place", result.stats.saved_inplace);
        continue;
      }
      for (auto input : graph.nodes[i].inputs)
        if (in_closure[static_cast<std::size_t>(input)]) {
          force_save(i, "in-place", result.stats.saved_inplace);
          break;
        }
    }
  }

  // Pass 3: a value read in forward by another unit stays alive for that
  // reader anyway, so recomputing it would only cost time; unless its region
  // has output_recompute, where the backward rebuilds it and chains replays.
  void tag_cross_unit() {
    std::vector<std::int32_t> stack;
    std::vector<std::int32_t> seen_mark(graph.nodes.size(), -1);
    for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
      if (!is_recompute(result.policies[i]) || !is_candidate(i) || user[i]) continue;
      std::int32_t region = scope.node_region[i];
      if (region >= 0 && scope.region_output_recompute[static_cast<std::size_t>(region)]) continue;
      std::int32_t unit = scope.node_unit[i];
      Policy policy = result.policies[i];
      bool crosses = false;
      stack.assign(1, static_cast<std::int32_t>(i));
      seen_mark[i] = static_cast<std::int32_t>(i);
      while (!stack.empty() && !crosses) {
        auto current = static_cast<std::size_t>(stack.back());
        stack.pop_back();
        for (auto user_index : graph.users[current]) {
          auto u = static_cast<std::size_t>(user_index);
          if (seen_mark[u] == static_cast<std::int32_t>(i)) continue;
          seen_mark[u] = static_cast<std::int32_t>(i);
          // The user's kind and phase, off the index.
          if (index.has(u, detail::NodeIndex::kOutput) || !index.forward(u)) continue;
          if (index.has(u, detail::NodeIndex::kCallFunction) && transparent(u) && result.policies[u] == policy) {
            stack.push_back(user_index);
            continue;
          }
          if (scope.node_unit[u] != unit) {
            crosses = true;
            break;
          }
        }
      }
      if (crosses) force_save(i, "cross-unit", result.stats.saved_cross_unit);
    }
  }

  void count() {
    for (auto policy : result.policies) {
      switch (policy) {
        case Policy::None: continue;
        case Policy::MustSave: ++result.stats.must_save; break;
        case Policy::PreferSave: ++result.stats.prefer_save; break;
        case Policy::MustRecompute: ++result.stats.must_recompute; break;
        case Policy::PreferRecompute: ++result.stats.prefer_recompute; break;
      }
      ++result.stats.tagged;
    }
  }
};

}  // namespace

TagResult tag_policies(const Graph& graph, const Scope& scope, const TagOptions& options) {
  return detail::tag_policies(graph, detail::NodeIndex(graph), scope, options);
}

TagResult detail::tag_policies(const Graph& graph, const NodeIndex& index, const Scope& scope, const TagOptions& options) {
  Tagger tagger{graph, index, scope, options, {}, {}, {}, {}};
  tagger.result.policies.assign(graph.nodes.size(), Policy::None);
  tagger.result.graph_id.assign(graph.nodes.size(), -1);
  tagger.result.reasons.assign(graph.nodes.size(), "");
  tagger.user.assign(graph.nodes.size(), 0);
  if (options.mode == Mode::Off) return tagger.result;
  tagger.tag_user();
  if (scope.regions.empty() && tagger.result.stats.user_tagged == 0) return tagger.result;
  tagger.tag_by_policy();
  tagger.tag_inplace();
  tagger.tag_cross_unit();
  tagger.count();
  return std::move(tagger.result);
}

const std::vector<std::string>& correctness_reasons() {
  static const std::vector<std::string> reasons = {"in-place", "rng", "collective"};
  return reasons;
}

bool is_correctness_reason(const std::string& reason) {
  const auto& reasons = correctness_reasons();
  return std::find(reasons.begin(), reasons.end(), reason) != reasons.end();
}

}  // namespace hyper_ac
