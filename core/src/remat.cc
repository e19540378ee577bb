#include "hyper_ac/remat.h"

#include <algorithm>

#include "hyper_ac/alias.h"
#include "hyper_ac/saturate.h"
#include "hyper_ac/simulate.h"
#include "remat_indexed.h"
#include "simulate_indexed.h"

namespace hyper_ac {

namespace {

bool recomputable(const Graph& graph, const std::vector<Policy>& policies, std::size_t i) {
  const Node& node = graph.nodes[i];
  return is_recompute(policies[i]) && node.is_forward() && node.kind == NodeKind::CallFunction &&
         node.recomputed_from.empty();
}

std::string name_of(const Graph& graph, std::int32_t index) {
  if (index < 0 || static_cast<std::size_t>(index) >= graph.nodes.size()) return "#" + std::to_string(index);
  return "'" + graph.nodes[static_cast<std::size_t>(index)].name + "'";
}

// Originals every reader of which is a redirected backward node or another
// erased original: reverse topological order, readers decided first.
std::vector<std::int32_t> erasable(const Graph& graph, const detail::NodeIndex& index, const RematPlan& plan) {
  const std::size_t n = graph.nodes.size();
  std::vector<char> duplicated(n, 0), erased(n, 0);
  for (const auto& dup : plan.duplicates) duplicated[static_cast<std::size_t>(dup.of)] = 1;
  std::vector<std::int32_t> erase;
  for (std::size_t k = n; k-- > 0;) {
    // A random op still draws in the forward: its replay needs that state.
    if (!duplicated[k] || index.has(k, detail::NodeIndex::kRng)) continue;
    bool read = false;
    for (auto user : graph.users[k]) {
      // A backward node that may take a recomputed copy (NodeIndex::backward_consumer).
      // The output node is not one: forward outputs must come from the forward itself.
      if (index.backward_consumer(static_cast<std::size_t>(user)) || erased[static_cast<std::size_t>(user)]) continue;
      read = true;
      break;
    }
    if (!read) {
      erased[k] = 1;
      erase.push_back(static_cast<std::int32_t>(k));
    }
  }
  return erase;
}

}  // namespace

std::size_t pin_tuple_projections(const Graph& graph, std::vector<Policy>& policies) {
  std::size_t changed = 0;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!is_getitem(node) || node.inputs.empty() || !recomputable(graph, policies, i)) continue;
    auto producer = static_cast<std::size_t>(node.inputs.front());
    if (recomputable(graph, policies, producer)) continue;
    policies[i] = Policy::MustSave;
    ++changed;
  }
  return changed;
}

std::size_t detail::pin_tuple_projections(const NodeIndex& index, std::vector<Policy>& policies) {
  // As the public one, off the index: recomputable() is the policy plus a forward
  // call_function node that is not a duplicate of an earlier pass.
  auto recomputable_at = [&](std::size_t i) {
    return is_recompute(policies[i]) && index.forward(i) && index.has(i, NodeIndex::kCallFunction) &&
           !index.has(i, NodeIndex::kRecomputedFrom);
  };
  std::size_t changed = 0;
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (!index.has(i, NodeIndex::kGetitem) || index.input_start[i] == index.input_start[i + 1] || !recomputable_at(i))
      continue;
    auto producer = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(index.input_start[i])]);
    if (recomputable_at(producer)) continue;
    policies[i] = Policy::MustSave;
    ++changed;
  }
  return changed;
}

namespace {

// One candidate replay schedule: the duplicates (schedule order) and, per
// (backward consumer, recomputed input), the copy it reads.
struct Schedule {
  std::vector<Duplicate> duplicates;
  std::vector<Redirect> redirects;
  std::size_t segments = 0;
  std::size_t kept = 0;
  double flops = 0.0;
};

class ReplayScheduler {
 public:
  ReplayScheduler(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& policies,
                  const std::vector<std::int32_t>& node_unit)
      : graph_(graph), index_(index), n_(graph.nodes.size()), recomputable_(n_, 0), unit_(node_unit) {
    if (!unit_.empty() && unit_.size() != n_)
      throw std::invalid_argument("plan_remat: node_unit has " + std::to_string(unit_.size()) + " entries for " +
                                  std::to_string(n_) + " nodes");
    using Flag = detail::NodeIndex::Flag;
    for (std::size_t i = 0; i < n_; ++i)  // recomputable(), off the index
      recomputable_[i] = is_recompute(policies[i]) && index.forward(i) && index.has(i, Flag::kCallFunction) &&
                                 !index.has(i, Flag::kRecomputedFrom)
                             ? 1
                             : 0;
    // Consumers and their segments.
    std::int32_t current = -2;
    for (std::size_t b = 0; b < n_; ++b) {
      if (!index.backward_consumer(b)) continue;
      std::int32_t first_unit = -1;
      bool reads = false;
      for (auto e = index.input_start[b]; e < index.input_start[b + 1]; ++e)
        if (const auto input = index.inputs[static_cast<std::size_t>(e)]; recomputable_[static_cast<std::size_t>(input)]) {
          reads = true;
          if (first_unit < 0) first_unit = unit_of(input);
        }
      if (!reads) continue;
      std::int32_t group = unit_of(static_cast<std::int32_t>(b));
      if (group < 0) group = first_unit;
      if (segment_start_.empty() || group != current) {
        segment_start_.push_back(consumers_.size());
        current = group;
      }
      consumers_.push_back(static_cast<std::int32_t>(b));
    }
    segment_start_.push_back(consumers_.size());
    // Chained outputs: recomputed values read in forward by another unit.
    std::vector<std::int32_t> owners;
    chained_.assign(n_, 0);
    if (!unit_.empty())
      for (std::size_t v = 0; v < n_; ++v) {
        if (!recomputable_[v]) continue;
        for (auto user : graph.users[v]) {
          const auto reader = static_cast<std::size_t>(user);
          if (!index.forward(reader) || index.has(reader, Flag::kOutput)) continue;
          if (unit_[static_cast<std::size_t>(user)] == unit_[v]) continue;
          chained_[v] = 1;
          owners.push_back(unit_[v]);
          break;
        }
      }
    std::sort(owners.begin(), owners.end());
    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
    owners_ = owners;
  }

  const std::vector<std::int32_t>& owners() const { return owners_; }

  // keep[k]: whether the chained outputs of owners()[k] are kept across segments.
  Schedule build(const std::vector<char>& keep) const {
    Schedule out;
    std::vector<char> keep_node(n_, 0);
    for (std::size_t v = 0; v < n_; ++v) {
      if (!chained_[v]) continue;
      auto at = std::lower_bound(owners_.begin(), owners_.end(), unit_[v]) - owners_.begin();
      keep_node[v] = keep[static_cast<std::size_t>(at)];
    }
    std::vector<std::int32_t> kept_copy(n_, -1);     // index into `pending` of a kept copy
    std::vector<std::int32_t> segment_copy(n_, -1);  // index into `pending` of this segment's copy
    std::vector<std::int32_t> copy_segment(n_, -1);
    struct Pending {
      std::int32_t of, before;
    };
    std::vector<Pending> pending;
    std::vector<std::pair<std::int32_t, std::int32_t>> reads;  // (consumer, input) -> copy later
    std::vector<std::int32_t> read_copy;
    std::vector<std::int32_t> stack;
    for (std::size_t s = 0; s + 1 < segment_start_.size(); ++s) {
      const auto seg = static_cast<std::int32_t>(s);
      std::vector<std::int32_t> made;
      for (std::size_t c = segment_start_[s]; c < segment_start_[s + 1]; ++c) {
        const std::int32_t b = consumers_[c];
        for (auto e = index_.input_start[static_cast<std::size_t>(b)]; e < index_.input_start[static_cast<std::size_t>(b) + 1]; ++e) {
          const auto input = index_.inputs[static_cast<std::size_t>(e)];
          auto x = static_cast<std::size_t>(input);
          if (!recomputable_[x]) continue;
          stack.push_back(input);
          while (!stack.empty()) {
            auto v = static_cast<std::size_t>(stack.back());
            stack.pop_back();
            if (!recomputable_[v]) continue;
            if (copy_segment[v] == seg || kept_copy[v] >= 0) continue;
            copy_segment[v] = seg;
            segment_copy[v] = static_cast<std::int32_t>(pending.size());
            pending.push_back({static_cast<std::int32_t>(v), b});
            made.push_back(static_cast<std::int32_t>(v));
            for (auto k = index_.input_start[v]; k < index_.input_start[v + 1]; ++k)
              stack.push_back(index_.inputs[static_cast<std::size_t>(k)]);
          }
          reads.emplace_back(b, input);
          read_copy.push_back(copy_segment[x] == seg ? segment_copy[x] : kept_copy[x]);
        }
      }
      for (auto v : made)
        if (keep_node[static_cast<std::size_t>(v)] && kept_copy[static_cast<std::size_t>(v)] < 0) {
          kept_copy[static_cast<std::size_t>(v)] = segment_copy[static_cast<std::size_t>(v)];
          ++out.kept;
        }
      ++out.segments;
    }
    // Schedule order: by insertion point, then forward order.
    std::vector<std::int32_t> order(pending.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
      const Pending& x = pending[static_cast<std::size_t>(a)];
      const Pending& y = pending[static_cast<std::size_t>(b)];
      return x.before != y.before ? x.before < y.before : x.of < y.of;
    });
    std::vector<std::int32_t> position(pending.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      position[static_cast<std::size_t>(order[i])] = static_cast<std::int32_t>(i);
      const Pending& p = pending[static_cast<std::size_t>(order[i])];
      out.duplicates.push_back({p.of, p.before});
      out.flops = add_finite(out.flops, graph_.nodes[static_cast<std::size_t>(p.of)].flops);
    }
    for (std::size_t r = 0; r < reads.size(); ++r)
      out.redirects.push_back({reads[r].first, reads[r].second, position[static_cast<std::size_t>(read_copy[r])]});
    std::sort(out.redirects.begin(), out.redirects.end(), [](const Redirect& a, const Redirect& b) {
      return a.node != b.node ? a.node < b.node : a.input < b.input;
    });
    out.redirects.erase(std::unique(out.redirects.begin(), out.redirects.end(),
                                    [](const Redirect& a, const Redirect& b) { return a.node == b.node && a.input == b.input; }),
                        out.redirects.end());
    return out;
  }

 private:
  std::int32_t unit_of(std::int32_t i) const { return unit_.empty() ? -1 : unit_[static_cast<std::size_t>(i)]; }

  const Graph& graph_;
  const detail::NodeIndex& index_;
  std::size_t n_;
  std::vector<char> recomputable_;
  const std::vector<std::int32_t>& unit_;  // RematOptions::node_unit (outlives the scheduler)
  std::vector<std::int32_t> consumers_;
  std::vector<std::size_t> segment_start_;
  std::vector<char> chained_;
  std::vector<std::int32_t> owners_;
};

}  // namespace

RematPlan plan_remat(const Graph& graph, const std::vector<Policy>& requested, const RematOptions& options) {
  if (requested.size() != graph.nodes.size())
    throw std::invalid_argument("plan_remat: " + std::to_string(requested.size()) + " policies for " +
                                std::to_string(graph.nodes.size()) + " nodes");
  return detail::plan_remat(graph, detail::NodeIndex(graph), requested, options);
}

RematPlan detail::plan_remat(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& requested,
                             const RematOptions& options, FlatSchedule* validated) {
  const std::size_t n = graph.nodes.size();
  if (requested.size() != n)
    throw std::invalid_argument("plan_remat: " + std::to_string(requested.size()) + " policies for " + std::to_string(n) +
                                " nodes");
  RematPlan plan;
  plan.policies = requested;
  plan.stats.pinned_projections = detail::pin_tuple_projections(index, plan.policies);
  const std::vector<Policy>& policies = plan.policies;

  const ReplayScheduler scheduler(graph, index, policies, options.node_unit);
  const std::size_t owners = scheduler.owners().size();
  std::vector<std::vector<char>> choices;
  if (owners == 0) {
    choices.emplace_back();
  } else if (owners <= options.exact_keep_units) {
    for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << owners); ++mask) {
      std::vector<char> keep(owners, 0);
      for (std::size_t k = 0; k < owners; ++k) keep[k] = (mask >> k) & 1U ? 1 : 0;
      choices.push_back(std::move(keep));
    }
  } else {
    choices.emplace_back(owners, 0);
    for (std::size_t p = 1; p <= owners; ++p) {
      std::vector<char> keep(owners, 0);
      for (std::size_t k = 0; k < owners; ++k) keep[k] = ((k + 1) % p == 0) ? 1 : 0;
      choices.push_back(std::move(keep));
    }
  }
  Schedule best;
  if (choices.size() == 1) {
    best = scheduler.build(choices.front());
  } else {
    std::int64_t best_peak = 0;
    bool have = false;
    for (const auto& keep : choices) {
      Schedule candidate = scheduler.build(keep);
      RematPlan trial;
      trial.duplicates = candidate.duplicates;
      trial.redirects = candidate.redirects;
      trial.erase = erasable(graph, index, trial);
      const std::int64_t peak = detail::simulate_memory(graph, index, &trial, {}).peak_bytes;
      if (!have || peak < best_peak || (peak == best_peak && candidate.flops < best.flops)) {
        best = std::move(candidate);
        best_peak = peak;
        have = true;
      }
    }
  }
  plan.stats.schedules_tried = choices.size() > 1 ? choices.size() : 0;
  plan.stats.replay_segments = best.segments;
  plan.stats.kept_outputs = best.kept;
  plan.duplicates = std::move(best.duplicates);
  plan.redirects = std::move(best.redirects);
  plan.stats.recompute_flops = best.flops;
  plan.stats.nodes_duplicated = plan.duplicates.size();
  plan.erase = erasable(graph, index, plan);
  plan.stats.nodes_erased = plan.erase.size();

  std::vector<char> duplicated(n, 0);
  for (const auto& dup : plan.duplicates) duplicated[static_cast<std::size_t>(dup.of)] = 1;

  // What the backward reads from the forward, before and after the rewrite.
  std::vector<char> saved_before(n, 0), saved_after(n, 0);
  using Flag = NodeIndex::Flag;
  // An activation: a forward call_function node.
  auto activation = [&](std::size_t i) { return index.forward(i) && index.has(i, Flag::kCallFunction); };
  for (std::size_t b = 0; b < n; ++b) {
    if (!index.backward_consumer(b)) continue;
    for (auto e = index.input_start[b]; e < index.input_start[b + 1]; ++e) {
      auto x = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)]);
      if (!index.forward(x)) continue;
      saved_before[x] = 1;
      if (!duplicated[x]) saved_after[x] = 1;
    }
  }
  // A value the backward returns as it is (a DTensor gradient's mesh): the
  // output node reads it, so the forward hands it over whatever the plan.
  for (std::size_t x = 0; x < n; ++x)
    if (index.has(x, Flag::kBackwardOutput) && index.forward(x)) saved_before[x] = saved_after[x] = 1;
  for (const auto& dup : plan.duplicates) {
    const auto of = static_cast<std::size_t>(dup.of);
    for (auto e = index.input_start[of]; e < index.input_start[of + 1]; ++e) {
      auto x = static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)]);
      if (index.forward(x) && !duplicated[x]) saved_after[x] = 1;
    }
  }
  // Bytes by storage: a saved view keeps its base alive, and a base counts once.
  const auto& roots = index.storage_root;
  std::vector<char> counted_before(n, 0), counted_after(n, 0);
  auto count = [&](std::size_t i, std::vector<char>& counted, std::size_t& values, std::int64_t& bytes) {
    ++values;
    auto root = static_cast<std::size_t>(roots[i]);
    if (!activation(root) || counted[root]) return;
    counted[root] = 1;
    bytes = add_bytes(bytes, index.output_bytes[root]);
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (saved_after[i]) plan.saved.push_back(static_cast<std::int32_t>(i));
    if (!activation(i)) continue;
    if (saved_before[i]) count(i, counted_before, plan.stats.saved_values_before, plan.stats.saved_bytes_before);
    if (saved_after[i]) count(i, counted_after, plan.stats.saved_values_after, plan.stats.saved_bytes_after);
  }

  for (std::size_t i = 0; i < n; ++i) {
    // One saved state per random op, however many replay segments copy it.
    const Node& node = graph.nodes[i];
    if (!duplicated[i] || !node.rng || node.rng_state_bytes <= 0) continue;
    plan.rng_replays.push_back(static_cast<std::int32_t>(i));
    ++plan.stats.rng_replayed;
    plan.stats.rng_state_bytes += node.rng_state_bytes;
    ++plan.stats.saved_values_after;
    plan.stats.saved_bytes_after += node.rng_state_bytes;
  }

  if (options.validate) detail::validate_plan(graph, index, plan, validated);
  return plan;
}

std::vector<ScheduleStep> rewritten_schedule(const Graph& graph, const RematPlan& plan) {
  const detail::FlatSchedule flat = detail::flat_schedule(graph, detail::NodeIndex(graph), plan);
  std::vector<ScheduleStep> schedule(flat.size());
  for (std::size_t s = 0; s < flat.size(); ++s) {
    schedule[s].node = flat.node[s];
    schedule[s].duplicate = flat.duplicate[s] != 0;
    schedule[s].inputs.assign(flat.inputs.begin() + flat.start[s], flat.inputs.begin() + flat.start[s + 1]);
  }
  return schedule;
}

void validate_plan(const Graph& graph, const RematPlan& plan) { detail::validate_plan(graph, detail::NodeIndex(graph), plan); }

void detail::validate_plan(const Graph& graph, const NodeIndex& index, const RematPlan& plan, FlatSchedule* schedule_out) {
  const std::size_t n = graph.nodes.size();
  std::vector<char> has_dup(n, 0);
  // repeated[d]: an earlier duplicate has the same (of, before). Found per
  // insertion point (a counting sort keeps list order) with a stamp per `of`.
  const std::size_t dups = plan.duplicates.size();
  auto in_graph = [&](const Duplicate& dup) {
    return dup.of >= 0 && static_cast<std::size_t>(dup.of) < n && dup.before >= 0 && static_cast<std::size_t>(dup.before) < n;
  };
  std::vector<char> repeated(dups, 0);
  {
    std::vector<std::int32_t> start(n + 1, 0);
    for (const auto& dup : plan.duplicates)
      if (in_graph(dup)) ++start[static_cast<std::size_t>(dup.before) + 1];
    for (std::size_t i = 0; i < n; ++i) start[i + 1] += start[i];
    std::vector<std::int32_t> by_before(static_cast<std::size_t>(start[n]));
    for (std::size_t d = 0; d < dups; ++d)
      if (in_graph(plan.duplicates[d]))
        by_before[static_cast<std::size_t>(start[static_cast<std::size_t>(plan.duplicates[d].before)]++)] = static_cast<std::int32_t>(d);
    std::vector<std::int32_t> stamp(n, -1);
    for (auto d : by_before) {
      const Duplicate& dup = plan.duplicates[static_cast<std::size_t>(d)];
      auto& mark = stamp[static_cast<std::size_t>(dup.of)];
      if (mark == dup.before) repeated[static_cast<std::size_t>(d)] = 1;
      mark = dup.before;
    }
  }
  for (std::size_t d = 0; d < dups; ++d) {
    const Duplicate& dup = plan.duplicates[d];
    if (!in_graph(dup)) throw PlanError("a duplicate names a node outside the graph");
    const Node& original = graph.nodes[static_cast<std::size_t>(dup.of)];
    const Node& before = graph.nodes[static_cast<std::size_t>(dup.before)];
    if (repeated[d])
      throw PlanError("node " + name_of(graph, dup.of) + " is duplicated twice before " + name_of(graph, dup.before));
    has_dup[static_cast<std::size_t>(dup.of)] = 1;
    if (!original.is_forward() || original.kind != NodeKind::CallFunction)
      throw PlanError("duplicate of " + name_of(graph, dup.of) + ": only forward call_function nodes can be recomputed");
    if (!before.is_backward())
      throw PlanError("duplicate of " + name_of(graph, dup.of) + " is inserted before " + name_of(graph, dup.before) +
                      ", which is not a backward node");
    if (dup.before <= dup.of)
      throw PlanError("duplicate of " + name_of(graph, dup.of) + " is inserted before " + name_of(graph, dup.before) +
                      ", which precedes the original");
  }
  for (const auto& r : plan.redirects) {
    if (r.node < 0 || static_cast<std::size_t>(r.node) >= n || r.input < 0 || static_cast<std::size_t>(r.input) >= n)
      throw PlanError("a redirect names a node outside the graph");
    if (!has_dup[static_cast<std::size_t>(r.input)])
      throw PlanError("redirect of " + name_of(graph, r.node) + " to the duplicate of " + name_of(graph, r.input) +
                      ", which has none");
    const auto& inputs = graph.nodes[static_cast<std::size_t>(r.node)].inputs;
    if (std::find(inputs.begin(), inputs.end(), r.input) == inputs.end())
      throw PlanError("redirect of " + name_of(graph, r.node) + " names " + name_of(graph, r.input) + ", which it does not read");
  }
  detail::FlatSchedule schedule = detail::flat_schedule(graph, index, plan);
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    const auto first = static_cast<std::size_t>(schedule.start[s]), last = static_cast<std::size_t>(schedule.start[s + 1]);
    for (std::size_t k = first; k < last; ++k) {
      if (schedule.inputs[k] >= 0 && static_cast<std::size_t>(schedule.inputs[k]) < s) continue;
      const std::int32_t step_node = schedule.node[s];
      const Node& node = graph.nodes[static_cast<std::size_t>(step_node)];
      std::string who = schedule.duplicate[s] ? "the duplicate of " + name_of(graph, step_node) : name_of(graph, step_node);
      throw PlanError(who + " reads " + name_of(graph, node.inputs[k - first]) + " before it is available in the rewritten graph");
    }
  }
  if (schedule_out != nullptr) *schedule_out = std::move(schedule);
}

}  // namespace hyper_ac
