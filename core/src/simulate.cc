#include "hyper_ac/simulate.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "hyper_ac/alias.h"
#include "hyper_ac/saturate.h"
#include "simulate_indexed.h"

namespace hyper_ac {

namespace {

constexpr std::int32_t kNone = -1;

class UnionFind {
 public:
  explicit UnionFind(std::size_t n) : parent_(n) {
    for (std::size_t i = 0; i < n; ++i) parent_[i] = static_cast<std::int32_t>(i);
  }
  std::int32_t find(std::int32_t x) {
    while (parent_[static_cast<std::size_t>(x)] != x) {
      auto& p = parent_[static_cast<std::size_t>(x)];
      p = parent_[static_cast<std::size_t>(p)];  // path halving
      x = p;
    }
    return x;
  }
  // The earlier step stays the representative (deterministic).
  void unite(std::int32_t a, std::int32_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    if (b < a) std::swap(a, b);
    parent_[static_cast<std::size_t>(b)] = a;
  }

 private:
  std::vector<std::int32_t> parent_;
};

// The steps simulated, as read-only arrays: a FlatSchedule's, or the original
// graph's straight off the node index (step i runs node i; nothing copied).
struct Steps {
  const std::int32_t* node = nullptr;  // per step; nullptr = step i runs node i
  const char* duplicate = nullptr;     // per step; nullptr = no duplicates
  const std::int32_t* start = nullptr; // per step + 1: offsets into `inputs`
  const std::int32_t* inputs = nullptr;
  std::size_t steps = 0;
  std::size_t size() const { return steps; }
  std::int32_t node_at(std::size_t s) const { return node ? node[s] : static_cast<std::int32_t>(s); }
  bool duplicate_at(std::size_t s) const { return duplicate && duplicate[s]; }
};

std::string step_name(const Graph& graph, const Steps& schedule, std::size_t index) {
  std::string name = "step " + std::to_string(index);
  const std::int32_t node = schedule.node_at(index);
  if (node >= 0 && static_cast<std::size_t>(node) < graph.nodes.size())
    name += (schedule.duplicate_at(index) ? " (duplicate of '" : " ('") + graph.nodes[static_cast<std::size_t>(node)].name + "')";
  return name;
}

SimulateResult simulate_steps(const Graph& graph, const detail::NodeIndex& index, const Steps& schedule,
                              const SimulateOptions& options);

}  // namespace

SimulateResult simulate_memory(const Graph& graph, const RematPlan* plan, const SimulateOptions& options) {
  return detail::simulate_memory(graph, detail::NodeIndex(graph), plan, options);
}

SimulateResult detail::simulate_memory(const Graph& graph, const NodeIndex& index, const RematPlan* plan,
                                       const SimulateOptions& options) {
  if (plan) return simulate_memory(graph, index, detail::flat_schedule(graph, index, *plan), options);
  return simulate_steps(graph, index, {nullptr, nullptr, index.input_start.data(), index.inputs.data(), index.size()},
                        options);
}

SimulateResult detail::simulate_memory(const Graph& graph, const NodeIndex& index, const FlatSchedule& schedule,
                                       const SimulateOptions& options) {
  return simulate_steps(graph, index,
                        {schedule.node.data(), schedule.duplicate.data(), schedule.start.data(), schedule.inputs.data(),
                         schedule.size()},
                        options);
}

namespace {

// Per step: the bytes it allocates, or (kTransfer) takes over from its
// producer's storage; a step does one or the other, never both. kInlined: a
// step the compiler inlines into its readers (SimulateOptions::fuse_pointwise);
// it allocates nothing.
enum StepKind : char { kPlain = 0, kResident = 1, kTransfer = 2, kInlined = 3 };

// What the three passes share: the storage each step's value lives in and
// what each step allocates.
struct StepStorage {
  explicit StepStorage(std::size_t steps) : storage(steps), allocation(steps, 0), kind(steps, kPlain) {}
  UnionFind storage;
  std::vector<std::int64_t> allocation;
  std::vector<char> kind;
  __int128 resident_total = 0;  // 128-bit sums: no int64 byte count overflows them (saturate.h)
  std::int32_t last_forward = kNone;
};

void check_step(const Graph& graph, const detail::NodeIndex& index, const Steps& schedule, std::size_t s) {
  const std::int32_t step_node = schedule.node_at(s);
  const std::int32_t* step_inputs = schedule.inputs + schedule.start[s];
  const auto input_count = static_cast<std::size_t>(schedule.start[s + 1] - schedule.start[s]);
  if (step_node < 0 || static_cast<std::size_t>(step_node) >= graph.nodes.size())
    throw std::invalid_argument("simulate_memory: " + step_name(graph, schedule, s) + " names no graph node");
  const auto i = static_cast<std::size_t>(step_node);
  const auto node_inputs = static_cast<std::size_t>(index.input_start[i + 1] - index.input_start[i]);
  if (input_count != node_inputs)
    throw std::invalid_argument("simulate_memory: " + step_name(graph, schedule, s) + " has " +
                                std::to_string(input_count) + " inputs, node has " + std::to_string(node_inputs));
  for (std::size_t k = 0; k < input_count; ++k)
    if (step_inputs[k] < 0 || static_cast<std::size_t>(step_inputs[k]) >= s)
      throw std::invalid_argument("simulate_memory: " + step_name(graph, schedule, s) + " reads '" +
                                  graph.nodes[static_cast<std::size_t>(graph.nodes[i].inputs[k])].name +
                                  "' before any step computes it");
}

// SimulateOptions::fuse_pointwise: a step of an inlinable node that is read,
// and only by inlinable steps of its own graph (a forward original by forward
// originals; a replay or backward step by replays and backward steps),
// allocates nothing. A value a view, getitem, extern kernel or the output
// reads, or one the other graph reads (a saved activation), keeps its buffer.
void mark_inlined(const detail::NodeIndex& index, const Steps& schedule, StepStorage& out) {
  using Flag = detail::NodeIndex::Flag;
  const std::size_t steps = schedule.size();
  auto forward_original = [&](std::size_t s) {
    return index.forward(static_cast<std::size_t>(schedule.node_at(s))) && !schedule.duplicate_at(s);
  };
  std::vector<char> read(steps, 0), kept(steps, 0);
  for (std::size_t s = 0; s < steps; ++s) {
    const bool inlinable = index.has(static_cast<std::size_t>(schedule.node_at(s)), Flag::kInlinable);
    const bool forward = forward_original(s);
    for (auto k = schedule.start[s]; k < schedule.start[s + 1]; ++k) {
      const auto producer = static_cast<std::size_t>(schedule.inputs[static_cast<std::size_t>(k)]);
      read[producer] = 1;
      if (!inlinable || forward_original(producer) != forward) kept[producer] = 1;
    }
  }
  for (std::size_t s = 0; s < steps; ++s)
    if (out.kind[s] == kPlain && read[s] && !kept[s] &&
        index.has(static_cast<std::size_t>(schedule.node_at(s)), Flag::kInlinable)) {
      out.kind[s] = kInlined;
      out.allocation[s] = 0;
    }
}

// Pass 1: check the schedule, build the alias union-find, allocations.
void scan_steps(const Graph& graph, const detail::NodeIndex& index, const Steps& schedule, StepStorage& out,
                const SimulateOptions& options, SimulateStats& stats) {
  using Flag = detail::NodeIndex::Flag;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    check_step(graph, index, schedule, s);
    const auto i = static_cast<std::size_t>(schedule.node_at(s));
    const std::int32_t* step_inputs = schedule.inputs + schedule.start[s];
    const bool duplicate = schedule.duplicate_at(s) != 0;
    if (duplicate) ++stats.duplicate_steps;
    if (index.forward(i) && !duplicate && !index.has(i, Flag::kOutput)) out.last_forward = static_cast<std::int32_t>(s);
    if (index.has(i, Flag::kResident)) {
      out.kind[s] = kResident;
      out.resident_total += index.output_bytes[i];
      ++stats.resident_values;
      continue;
    }
    if (index.has(i, Flag::kOutput)) continue;
    if (index.has(i, Flag::kProjects)) {
      // One element of a multi-output producer (a getitem of a producer that
      // allocates several outputs; not split / chunk / unbind and other
      // multi-output views, whose elements share the input's storage): it
      // takes that element's bytes over from the producer's storage (pass 3)
      // and is freed on its own, as the allocator frees each tensor of a tuple
      // separately.
      out.kind[s] = kTransfer;
      out.allocation[s] = index.output_bytes[i];
      ++stats.aliasing_steps;
      continue;
    }
    const std::int32_t first = index.alias_first[i];
    if (first < 0) {
      out.allocation[s] = index.output_bytes[i];
      continue;
    }
    ++stats.aliasing_steps;
    if (!index.has(i, Flag::kMultiAlias)) {
      out.storage.unite(static_cast<std::int32_t>(s), step_inputs[static_cast<std::size_t>(first)]);
      continue;
    }
    for_each_alias_position(graph.nodes[i], [&](std::int32_t p) {
      out.storage.unite(static_cast<std::int32_t>(s), step_inputs[static_cast<std::size_t>(p)]);
    });
  }
  if (options.fuse_pointwise) mark_inlined(index, schedule, out);
}

// Storages freed after each step, as intrusive lists (O(steps)).
struct FreeLists {
  std::vector<std::int32_t> head, next;
};

// Per step: the first and last step of the autograd node it runs in (a run
// of consecutive backward steps with one Node::autograd_node); a step outside
// every such node is a run of its own.
struct AutogradRuns {
  std::vector<std::int32_t> first, last;
};

AutogradRuns autograd_runs(const Graph& graph, const Steps& schedule) {
  const std::size_t steps = schedule.size();
  AutogradRuns runs{std::vector<std::int32_t>(steps), std::vector<std::int32_t>(steps)};
  auto group = [&](std::size_t s) -> std::int64_t {
    const Node& node = graph.nodes[static_cast<std::size_t>(schedule.node_at(s))];
    return node.is_backward() ? node.autograd_node : -1;
  };
  for (std::size_t s = 0; s < steps;) {
    std::size_t end = s + 1;
    if (group(s) >= 0)
      while (end < steps && group(end) == group(s)) ++end;
    for (std::size_t t = s; t < end; ++t) {
      runs.first[t] = static_cast<std::int32_t>(s);
      runs.last[t] = static_cast<std::int32_t>(end - 1);
    }
    s = end;
  }
  return runs;
}

// Pass 2: per storage, residency and the last step that touches any alias.
FreeLists plan_frees(const Graph& graph, const detail::NodeIndex& index, const Steps& schedule,
                     StepStorage& steps_storage, const SimulateOptions& options) {
  const std::size_t steps = schedule.size();
  const auto end_of_time = static_cast<std::int32_t>(steps);
  UnionFind& storage = steps_storage.storage;
  std::vector<char> root_resident(steps, 0);
  std::vector<std::int32_t> last_use(steps, kNone);
  const AutogradRuns runs = options.autograd_lifetimes ? autograd_runs(graph, schedule) : AutogradRuns{};
  for (std::size_t s = 0; s < steps; ++s) {
    const auto here = static_cast<std::int32_t>(s);
    auto root = static_cast<std::size_t>(storage.find(here));
    if (steps_storage.kind[s] == kResident) root_resident[root] = 1;
    last_use[root] = std::max(last_use[root], here);
    const bool is_output = index.has(static_cast<std::size_t>(schedule.node_at(s)), detail::NodeIndex::Flag::kOutput);
    for (auto k = schedule.start[s]; k < schedule.start[s + 1]; ++k) {
      const std::int32_t producer = schedule.inputs[static_cast<std::size_t>(k)];
      auto r = static_cast<std::size_t>(storage.find(producer));
      std::int32_t released = is_output ? end_of_time : here;
      // Read from outside its autograd node: held until the node returns.
      if (!is_output && options.autograd_lifetimes && producer < runs.first[s]) released = runs.last[s];
      last_use[r] = std::max(last_use[r], released);
    }
  }
  // An inlined step runs inside its readers' kernels: what it reads lives until they have run
  // (latest first, so a chain of inlined steps passes its readers' time down).
  for (std::size_t s = steps; s-- > 0;) {
    if (steps_storage.kind[s] != kInlined) continue;
    const std::int32_t until = last_use[static_cast<std::size_t>(storage.find(static_cast<std::int32_t>(s)))];
    for (auto k = schedule.start[s]; k < schedule.start[s + 1]; ++k) {
      auto r = static_cast<std::size_t>(storage.find(schedule.inputs[static_cast<std::size_t>(k)]));
      last_use[r] = std::max(last_use[r], until);
    }
  }
  FreeLists frees{std::vector<std::int32_t>(steps, kNone), std::vector<std::int32_t>(steps, kNone)};
  for (std::size_t r = 0; r < steps; ++r) {
    if (storage.find(static_cast<std::int32_t>(r)) != static_cast<std::int32_t>(r) || root_resident[r]) continue;
    if (last_use[r] >= end_of_time) continue;
    auto at = static_cast<std::size_t>(last_use[r]);
    frees.next[r] = frees.head[at];
    frees.head[at] = static_cast<std::int32_t>(r);
  }
  return frees;
}

// Pass 3: walk the steps, allocating and freeing; record the peak.
void walk_steps(const Steps& schedule, StepStorage& steps_storage, const FreeLists& frees,
                const SimulateOptions& options, SimulateResult& result) {
  const std::size_t steps = schedule.size();
  UnionFind& storage = steps_storage.storage;
  std::vector<__int128> held(steps, 0);  // bytes allocated so far per storage root
  std::vector<char> counted(steps, 0);
  auto count_storage = [&](std::size_t root) {
    if (counted[root]) return;
    counted[root] = 1;
    ++result.stats.storages;
  };
  __int128 live = 0, peak = 0;
  if (options.record_timeline) {
    result.timeline.reserve(steps);
    result.timeline_nodes.reserve(steps);
  }
  for (std::size_t s = 0; s < steps; ++s) {
    const std::int64_t allocation = steps_storage.allocation[s];
    if (steps_storage.kind[s] == kTransfer && allocation > 0) {
      auto from = static_cast<std::size_t>(storage.find(schedule.inputs[static_cast<std::size_t>(schedule.start[s])]));
      auto to = static_cast<std::size_t>(storage.find(static_cast<std::int32_t>(s)));
      __int128 moved = std::min(static_cast<__int128>(allocation), held[from]);
      held[from] -= moved;
      held[to] += moved;
      if (moved > 0) count_storage(to);
    }
    if (steps_storage.kind[s] != kTransfer && allocation > 0) {
      auto root = static_cast<std::size_t>(storage.find(static_cast<std::int32_t>(s)));
      held[root] += allocation;
      live += allocation;
      count_storage(root);
    }
    if (options.record_timeline) {
      result.timeline.push_back(clamp_bytes(live));
      result.timeline_nodes.push_back(schedule.node_at(s));
    }
    if (result.peak_step < 0 || live > peak) {
      peak = live;
      result.peak_step = static_cast<std::int32_t>(s);
      result.peak_node = schedule.node_at(s);
    }
    for (auto r = frees.head[s]; r != kNone; r = frees.next[static_cast<std::size_t>(r)]) {
      live -= held[static_cast<std::size_t>(r)];
      held[static_cast<std::size_t>(r)] = 0;
    }
    if (static_cast<std::int32_t>(s) == steps_storage.last_forward) {
      result.boundary_bytes = clamp_bytes(live);
      result.boundary_step = steps_storage.last_forward;
    }
  }
  result.final_bytes = clamp_bytes(live);
  result.peak_bytes = clamp_bytes(peak);
  result.resident_bytes = clamp_bytes(steps_storage.resident_total);
  result.peak_bytes_with_resident = clamp_bytes(peak + steps_storage.resident_total);
}

SimulateResult simulate_steps(const Graph& graph, const detail::NodeIndex& index, const Steps& schedule,
                              const SimulateOptions& options) {
  SimulateResult result;
  result.stats.steps = schedule.size();
  StepStorage steps_storage(schedule.size());
  scan_steps(graph, index, schedule, steps_storage, options, result.stats);
  const FreeLists frees = plan_frees(graph, index, schedule, steps_storage, options);
  walk_steps(schedule, steps_storage, frees, options, result);
  return result;
}

}  // namespace

}  // namespace hyper_ac
