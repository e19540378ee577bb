#include "hyper_ac/cost.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "hyper_ac/alias.h"
#include "hyper_ac/saturate.h"
#include "cost_indexed.h"

namespace hyper_ac {

namespace {

bool in_group_candidate(const Node& node) {
  return node.fusible && node.is_forward() && node.kind == NodeKind::CallFunction && !node.rng && !node.symint;
}

// A time in [0, kMaxRecomputeSeconds]: past the range (NaN too: a negative
// speed) clamps to the maximum.
double clamped(double seconds) {
  if (!(seconds < kMaxRecomputeSeconds)) return kMaxRecomputeSeconds;
  return seconds > 0.0 ? seconds : 0.0;
}

// The roofline time of `flops` and `bytes` of memory traffic.
double roofline_seconds(double flops, double bytes, const CostOptions& options) {
  // 0 / 0 (no work on a zero-speed profile) is no time; x / 0 clamps.
  auto part = [](double work, double speed) { return work > 0.0 ? work / speed : 0.0; };
  return clamped(std::max(part(flops, options.hardware.peak_flops), part(bytes, options.hardware.memory_bandwidth)));
}

}  // namespace

bool uses_measured_time(const Node& node, const CostOptions& options) {
  return options.hardware.measured && node.measured_seconds >= 0.0 &&
         !(options.compiler == Compiler::Inductor && node.fusible);
}

double step_seconds(const Graph& graph, const CostOptions& options) {
  std::vector<std::int32_t> forward;
  double total = 0.0;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.kind != NodeKind::CallFunction) continue;
    if (node.is_forward())
      forward.push_back(static_cast<std::int32_t>(i));
    else
      total = add_finite(total, recompute_seconds(graph, static_cast<std::int32_t>(i), options));
  }
  return add_finite(total, recompute_seconds(graph, forward, options));
}

FusionGroups fusion_groups(const Graph& graph, const CostOptions& options) {
  const std::size_t n = graph.nodes.size();
  FusionGroups groups;
  groups.group.assign(n, -1);
  groups.materialized.assign(n, 0);
  if (options.compiler == Compiler::Eager) return groups;
  // Union-find over fusible -> fusible edges (inputs precede users in graph order).
  std::vector<std::int32_t> parent(n);
  for (std::size_t i = 0; i < n; ++i) parent[i] = static_cast<std::int32_t>(i);
  auto find = [&](std::int32_t x) {
    while (parent[static_cast<std::size_t>(x)] != x) {
      parent[static_cast<std::size_t>(x)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
      x = parent[static_cast<std::size_t>(x)];
    }
    return x;
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (!in_group_candidate(graph.nodes[i])) continue;
    for (auto input : graph.nodes[i].inputs) {
      if (!in_group_candidate(graph.nodes[static_cast<std::size_t>(input)])) continue;
      auto a = find(input), b = find(static_cast<std::int32_t>(i));
      if (a != b) parent[static_cast<std::size_t>(std::max(a, b))] = std::min(a, b);
    }
  }
  std::vector<std::int32_t> id_of_root(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    if (!in_group_candidate(graph.nodes[i])) continue;
    auto root = static_cast<std::size_t>(find(static_cast<std::int32_t>(i)));
    if (id_of_root[root] < 0) id_of_root[root] = static_cast<std::int32_t>(groups.count++);
    groups.group[i] = id_of_root[root];
  }
  // Materialized: some user outside the group (users are built by Graph::finalize;
  // without them, read the inputs of every node).
  for (std::size_t u = 0; u < n; ++u)
    for (auto input : graph.nodes[u].inputs) {
      auto x = static_cast<std::size_t>(input);
      if (groups.group[x] >= 0 && groups.group[u] != groups.group[x]) groups.materialized[x] = 1;
    }
  // ... or through a view or getitem of it that leaves: the kernel writes the
  // base the alias points into. Users follow their inputs, so one backward pass.
  for (std::size_t u = n; u-- > 0;) {
    const Node& node = graph.nodes[u];
    if (groups.group[u] < 0 || !groups.materialized[u] || !(is_view_like(node) || is_getitem(node))) continue;
    for (auto input : node.inputs) {
      auto x = static_cast<std::size_t>(input);
      if (groups.group[x] == groups.group[u]) groups.materialized[x] = 1;
    }
  }
  return groups;
}

bool compute_unknown(const Node& node) {
  if (node.kind != NodeKind::CallFunction || node.flops > 0.0 || node.fusible || node.collective || node.symint ||
      is_view_like(node) || is_getitem(node) || node.outputs.empty())
    return false;
  const auto colon = node.target.find("::");
  if (colon == std::string::npos) return false;  // operator.getitem, higher-order ops: not custom ops
  const std::string ns = node.target.substr(0, colon);
  return ns != "aten" && ns != "prims";
}

double recompute_seconds(const Graph& graph, std::int32_t index, const CostOptions& options) {
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  if (node.kind != NodeKind::CallFunction || is_view_like(node) || is_getitem(node) || node.symint) return 0.0;
  if (uses_measured_time(node, options)) return clamped(node.measured_seconds);
  double bytes = static_cast<double>(node.output_bytes());
  for (auto input : node.inputs) bytes += static_cast<double>(graph.nodes[static_cast<std::size_t>(input)].output_bytes());
  return roofline_seconds(node.flops, bytes, options);
}

double detail::recompute_seconds(const Graph& graph, const NodeIndex& index, std::int32_t node_index,
                                 const CostOptions& options) {
  using Flag = NodeIndex::Flag;
  const auto i = static_cast<std::size_t>(node_index);
  if (i >= index.size()) throw std::out_of_range("recompute_seconds: node index " + std::to_string(node_index) + " is outside the graph");
  // As recompute_seconds(graph, node, options): not a call_function, a view
  // (not a getitem), a getitem or a SymInt costs nothing.
  if (!index.has(i, Flag::kCallFunction) || index.has(i, Flag::kView) || index.has(i, Flag::kGetitem) ||
      index.has(i, Flag::kSymint))
    return 0.0;
  if (uses_measured_time(graph.nodes[i], options)) return clamped(graph.nodes[i].measured_seconds);
  double bytes = static_cast<double>(index.output_bytes[i]);
  for (auto e = index.input_start[i]; e < index.input_start[i + 1]; ++e)
    bytes += static_cast<double>(index.output_bytes[static_cast<std::size_t>(index.inputs[static_cast<std::size_t>(e)])]);
  return roofline_seconds(graph.nodes[i].flops, bytes, options);
}

double member_seconds(const Graph& graph, const FusionGroups& groups, std::int32_t index, const CostOptions& options) {
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  double seconds = node.flops > 0.0 ? node.flops / options.hardware.peak_flops : 0.0;
  if (groups.materialized.at(static_cast<std::size_t>(index)) && !is_view_like(node) && !is_getitem(node) &&
      node.output_bytes() > 0)
    seconds += static_cast<double>(node.output_bytes()) / options.hardware.memory_bandwidth;
  // Same clamp as recompute_seconds: finite, never NaN.
  if (!(seconds < kMaxRecomputeSeconds)) return kMaxRecomputeSeconds;
  return seconds > 0.0 ? seconds : 0.0;
}

std::vector<std::int32_t> group_member_reads(const Graph& graph, const FusionGroups& groups, std::int32_t index,
                                             const std::function<bool(std::int32_t)>& replayed_view) {
  std::vector<std::int32_t> reads;
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  if (is_view_like(node)) return reads;
  const std::int32_t g = groups.group.at(static_cast<std::size_t>(index));
  std::vector<std::int32_t> pending(node.inputs.begin(), node.inputs.end());
  while (!pending.empty()) {
    const std::int32_t x = pending.back();
    pending.pop_back();
    const Node& input = graph.nodes[static_cast<std::size_t>(x)];
    if (g >= 0 && groups.group[static_cast<std::size_t>(x)] == g && is_view_like(input) && replayed_view(x))
      pending.insert(pending.end(), input.inputs.begin(), input.inputs.end());
    else
      reads.push_back(x);
  }
  std::sort(reads.begin(), reads.end());
  reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
  return reads;
}

double read_seconds(const Graph& graph, std::int32_t index, const CostOptions& options) {
  const Node& node = graph.nodes.at(static_cast<std::size_t>(index));
  if (node.symint || node.output_bytes() <= 0) return 0.0;
  const double seconds = static_cast<double>(node.output_bytes()) / options.hardware.memory_bandwidth;
  if (!(seconds < kMaxRecomputeSeconds)) return kMaxRecomputeSeconds;
  return seconds > 0.0 ? seconds : 0.0;
}

double recompute_seconds(const Graph& graph, const std::vector<std::int32_t>& nodes, const CostOptions& options) {
  double total = 0.0;
  if (options.compiler == Compiler::Eager) {
    for (auto node : nodes) total = add_finite(total, recompute_seconds(graph, node, options));
    return total;
  }
  const FusionGroups groups = fusion_groups(graph, options);
  std::vector<char> in_set(graph.nodes.size(), 0);
  for (auto node : nodes) in_set.at(static_cast<std::size_t>(node)) = 1;
  std::set<std::pair<std::int32_t, std::int32_t>> reads;  // (input, group)
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!in_set[i]) continue;
    const auto index = static_cast<std::int32_t>(i);
    const std::int32_t g = groups.group[i];
    if (g < 0) {
      total = add_finite(total, recompute_seconds(graph, index, options));
      continue;
    }
    total = add_finite(total, member_seconds(graph, groups, index, options));
    const auto replayed = [&](std::int32_t x) { return in_set[static_cast<std::size_t>(x)] != 0; };
    for (auto input : group_member_reads(graph, groups, index, replayed)) {
      auto x = static_cast<std::size_t>(input);
      if (in_set[x] && groups.group[x] == g) continue;  // produced inside the replayed kernel
      if (reads.emplace(input, g).second) total = add_finite(total, read_seconds(graph, input, options));
    }
  }
  return total;
}

}  // namespace hyper_ac
