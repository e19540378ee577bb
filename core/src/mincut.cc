#include "hyper_ac/mincut.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include <boost/graph/boykov_kolmogorov_max_flow.hpp>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <boost/property_map/property_map.hpp>

#include "hyper_ac/alias.h"
#include "hyper_ac/cost.h"
#include "hyper_ac/saturate.h"
#include "cost_indexed.h"
#include "mincut_indexed.h"

namespace hyper_ac {

const char* to_string(MaxFlowAlgorithm algorithm) {
  switch (algorithm) {
    case MaxFlowAlgorithm::BoykovKolmogorov: return "boykov_kolmogorov";
    case MaxFlowAlgorithm::PushRelabel: return "push_relabel";
  }
  return "?";
}

namespace {

constexpr std::int32_t kSource = 0;
constexpr std::int32_t kSink = 1;
constexpr std::int32_t kNone = -1;
// Finite capacities are scaled so that their sum stays below this many units:
// INF = sum + 1 then fits an int64 with room for the solvers' arithmetic.
constexpr double kMaxTotalUnits = 1125899906842624.0;  // 2^50

std::string quoted(const Graph& graph, std::int32_t index) {
  return "'" + graph.nodes[static_cast<std::size_t>(index)].name + "'";
}

std::string format_double(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

// Why a network value is never recomputed / never saved (Solver::never_recompute_,
// never_save_): one byte per node, the text only for messages.
enum Reason : std::uint8_t {
  kNoReason = 0,
  kGraphInput,
  kEarlierDuplicate,
  kTaggedMustSave,
  kUntagged,
  kRngOp,
  kTaggedMustRecompute,
  kView,
  kNotTensor
};

const char* reason_text(std::uint8_t reason) {
  switch (reason) {
    case kGraphInput: return "a graph input";
    case kEarlierDuplicate: return "a duplicate made by an earlier pass";
    case kTaggedMustSave: return "tagged MUST_SAVE";
    case kUntagged: return "untagged (outside every recompute region)";
    case kRngOp: return "an RNG op";
    case kTaggedMustRecompute: return "tagged MUST_RECOMPUTE";
    case kView: return "a view (recomputed from its base, never saved on its own)";
    case kNotTensor: return "not a tensor";
  }
  return "";
}

// Per-lambda outcome of one cut, before it becomes a public result.
struct Cut {
  double lambda = 0.0;
  std::vector<std::int32_t> saved;
  std::vector<std::int32_t> recomputed;
  std::vector<Policy> policies;
  std::int64_t saved_bytes = 0;
  double recompute_seconds = 0.0;
  double recompute_flops = 0.0;
  double biased_bytes = 0.0;    // objective = biased_bytes + lambda * biased_seconds
  double biased_seconds = 0.0;
  MinCutStats stats;
  std::vector<Diagnostic> diagnostics;

  double objective_at(double l) const { return biased_bytes + l * biased_seconds; }
};

// Everything about the graph that does not depend on lambda: classification,
// the candidate set, feasibility. Built once, solved for many lambdas.
class Solver {
 public:
  // `index` is the graph's node index (node_index.h), built by the caller.
  Solver(const Graph& graph, const detail::NodeIndex& index, const std::vector<Policy>& tags,
         const MinCutOptions& options)
      : graph_(graph), tags_(tags), options_(options), index_(index) {
    check_options();
    classify();
    collect_candidates();
    check_feasible();
  }

  Cut solve(double lambda) const;
  FlowNetwork export_network(double lambda) const;

 private:
  using CsrGraph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, boost::no_property,
                                                      boost::no_property, std::uint32_t, std::uint32_t>;
  using EdgeDescriptor = boost::graph_traits<CsrGraph>::edge_descriptor;
  using VertexDescriptor = boost::graph_traits<CsrGraph>::vertex_descriptor;

  struct Arc {
    std::int32_t tail;
    std::int32_t head;
    double capacity;  // bytes; ignored when infinite
    bool infinite;
  };
  // The s-t network for one lambda, before integer scaling.
  struct Network {
    std::int32_t vertices = 2;  // source and sink included
    std::vector<Arc> arcs;
    std::vector<std::int32_t> in_vertex, out_vertex;  // per node; kNone outside the network
  };
  // The integer capacities the solver uses.
  struct Capacities {
    std::vector<std::int64_t> capacity;  // per arc
    std::int64_t infinite = 0;           // sum of the finite capacities + 1
    double unit = 1.0;                   // bytes per capacity unit
  };

  Network build_network(double lambda) const;
  void add_group_reads(std::int32_t v, std::int32_t in, double lambda, Network& network,
                       std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t>& read_vertex,
                       std::vector<std::int32_t>& inputs) const;
  // Recompute seconds of a set as the network prices it.
  double set_seconds(const std::vector<std::int32_t>& recomputed, bool biased) const;
  static Capacities scale(const std::vector<Arc>& arcs);

  void check_options() const;
  void classify();
  void collect_candidates();
  void check_feasible() const;
  // Max flow over the network; returns the minimal source side and sets `flow`.
  std::vector<char> run_max_flow(std::int32_t vertices, const std::vector<Arc>& arcs, const Capacities& capacities,
                                 std::int64_t& flow) const;

  // Bytes of generator state a replay of node i saves (rng ops; 0 otherwise).
  std::int64_t state_bytes(std::size_t i) const {
    return index_.has(i, detail::NodeIndex::kRng) ? graph_.nodes[i].rng_state_bytes : 0;
  }
  bool forward_value(std::int32_t i) const {
    const auto x = static_cast<std::size_t>(i);
    return index_.forward(x) && !index_.has(x, detail::NodeIndex::kOutput);
  }
  // A getitem whose producer is a view (split, chunk, unbind): an alias of the producer's base.
  bool getitem_of_view(std::size_t i) const {
    using Flag = detail::NodeIndex::Flag;
    if (!index_.has(i, Flag::kGetitem) || index_.input_start[i] == index_.input_start[i + 1]) return false;
    const auto producer = static_cast<std::size_t>(index_.inputs[static_cast<std::size_t>(index_.input_start[i])]);
    return index_.has(producer, Flag::kView);
  }
  // Node i's inputs (Node::inputs order), off the compact index.
  template <typename F>
  void for_inputs(std::size_t i, F&& f) const {
    for (auto e = index_.input_start[i]; e < index_.input_start[i + 1]; ++e) f(index_.inputs[static_cast<std::size_t>(e)]);
  }
  // Inputs of node i that are in the network (non-free forward values).
  template <typename F>
  void for_network_inputs(std::size_t i, F&& f) const {
    for_inputs(i, [&](std::int32_t input) {
      if (forward_value(input) && !free_[static_cast<std::size_t>(input)]) f(input);
    });
  }

  const Graph& graph_;
  const std::vector<Policy>& tags_;
  const MinCutOptions& options_;
  const detail::NodeIndex& index_;                // compact node facts (flags, inputs, bytes)

  std::vector<char> free_;                        // saved at no cost, never recomputed
  std::vector<std::uint8_t> never_recompute_;     // Reason, kNoReason = may be recomputed
  std::vector<std::uint8_t> never_save_;          // Reason, kNoReason = may be saved
  std::vector<double> save_bytes_;                // bytes a save keeps alive (bias applied)
  std::vector<double> seconds_;                   // roofline recompute time (bias applied); for a
                                                  // fusion-group member: member_seconds (reads apart)
  FusionGroups groups_;                           // empty under the eager compiler
  std::vector<char> read_by_backward_;            // network values some backward node reads
  std::vector<char> candidate_;                   // may end on the sink side of the cut
  std::vector<std::int32_t> candidates_;          // ascending
  std::vector<std::int32_t> free_backward_reads_; // free forward values some backward node reads, ascending
  std::size_t forward_nodes_ = 0;
  std::size_t free_nodes_ = 0;
};

void Solver::check_options() const {
  const std::size_t n = graph_.nodes.size();
  if (tags_.size() != n)
    throw std::invalid_argument("solve_min_cut: " + std::to_string(tags_.size()) + " tags for " + std::to_string(n) +
                                " nodes");
  if (graph_.users.size() != n)
    throw std::invalid_argument("solve_min_cut: graph.users is not built; call Graph::finalize()");
  auto positive = [](double value) { return std::isfinite(value) && value > 0.0; };
  // The ranges keep every capacity finite (scale()): lambda <= 1e30 times
  // recompute seconds <= 1e30 (cost.h) times a factor <= 1e6.
  if (!(options_.lambda >= 0.0 && options_.lambda <= kMaxLambda))
    throw std::invalid_argument("solve_min_cut: lambda must be finite and in [0, " + format_double(kMaxLambda) +
                                "], got " + format_double(options_.lambda));
  auto speed = [](double value) { return value >= kMinHardwareSpeed && value <= kMaxHardwareSpeed; };
  if (!speed(options_.cost.hardware.peak_flops) || !speed(options_.cost.hardware.memory_bandwidth))
    throw std::invalid_argument("solve_min_cut: hardware profile '" + options_.cost.hardware.name +
                                "' needs peak_flops and memory_bandwidth in [" + format_double(kMinHardwareSpeed) +
                                ", " + format_double(kMaxHardwareSpeed) + "], got " +
                                format_double(options_.cost.hardware.peak_flops) + " and " +
                                format_double(options_.cost.hardware.memory_bandwidth));
  auto factor = [&](double value) { return positive(value) && value >= kMinPreferFactor && value <= kMaxPreferFactor; };
  if (!factor(options_.prefer_save_factor) || !factor(options_.prefer_recompute_factor))
    throw std::invalid_argument("solve_min_cut: prefer_save_factor and prefer_recompute_factor must be in [" +
                                format_double(kMinPreferFactor) + ", " + format_double(kMaxPreferFactor) + "], got " +
                                format_double(options_.prefer_save_factor) + " and " +
                                format_double(options_.prefer_recompute_factor));
  if (options_.symint_bytes < 0) throw std::invalid_argument("solve_min_cut: symint_bytes must be >= 0");
}

void Solver::classify() {
  const std::size_t n = graph_.nodes.size();
  free_.assign(n, 0);
  never_recompute_.assign(n, kNoReason);
  never_save_.assign(n, kNoReason);
  save_bytes_.assign(n, 0.0);
  seconds_.assign(n, 0.0);
  groups_ = fusion_groups(graph_, options_.cost);

  std::vector<char> output_read(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    if (index_.has(i, detail::NodeIndex::kOutput))
      for_inputs(i, [&](std::int32_t input) { output_read[static_cast<std::size_t>(input)] = 1; });

  using Flag = detail::NodeIndex::Flag;
  for (std::size_t i = 0; i < n; ++i) {
    const auto index = static_cast<std::int32_t>(i);
    if (!forward_value(index)) continue;
    ++forward_nodes_;
    // The node's own struct is read only for the rare facts the index lacks.
    const bool call = index_.has(i, Flag::kCallFunction);
    const bool symint = index_.has(i, Flag::kSymint);
    // Free: resident anyway (placeholders, constants), kept as a graph output,
    // or an alias of such storage; a MUST_RECOMPUTE tag is honoured even so.
    const bool must_recompute = tags_[i] == Policy::MustRecompute && call;
    // A graph input that is not a parameter or buffer (an activation handed in
    // by the caller) is charged its bytes when the backward keeps it, as in
    // PyTorch's min-cut: keeping it is not free once the caller drops it.
    const bool charged_input = options_.charge_inputs && !call && !symint &&
                               graph_.nodes[i].kind == NodeKind::Placeholder && graph_.nodes[i].role == Role::Input;
    bool is_free = (!call && !charged_input) || (output_read[i] && !must_recompute);
    if (!is_free && index_.alias_first[i] >= 0) {
      bool all_free = true;
      auto check_base = [&](std::int32_t base) {
        if (forward_value(base) && !free_[static_cast<std::size_t>(base)]) all_free = false;
      };
      if (index_.has(i, Flag::kMultiAlias)) {
        const Node& node = graph_.nodes[i];
        for_each_alias_position(node, [&](std::int32_t position) { check_base(node.inputs[static_cast<std::size_t>(position)]); });
      } else {
        check_base(index_.inputs[static_cast<std::size_t>(index_.input_start[i] + index_.alias_first[i])]);
      }
      is_free = all_free && !must_recompute;
    }
    if (is_free) {
      free_[i] = 1;
      ++free_nodes_;
      continue;
    }

    const Policy tag = tags_[i];
    if (charged_input)
      never_recompute_[i] = kGraphInput;
    else if (index_.has(i, Flag::kRecomputedFrom))
      never_recompute_[i] = kEarlierDuplicate;
    else if (tag == Policy::MustSave)
      never_recompute_[i] = kTaggedMustSave;
    else if (tag == Policy::None)
      never_recompute_[i] = kUntagged;
    else if (index_.has(i, Flag::kRng) && graph_.nodes[i].rng_state_bytes == 0 && options_.never_recompute_rng)
      never_recompute_[i] = kRngOp;

    if (tag == Policy::MustRecompute)
      never_save_[i] = kTaggedMustRecompute;
    else if (!never_recompute_[i] && index_.has(i, Flag::kView) && !index_.has(i, Flag::kGetitem))
      never_save_[i] = kView;
    else if (!never_recompute_[i] && getitem_of_view(i))
      // An element of split/chunk/unbind shares its base's storage: saving it
      // would keep the whole base alive at the price of the element's bytes.
      never_save_[i] = kView;
    else if (!never_recompute_[i] && index_.has(i, Flag::kNoOutputs) && !symint)
      never_save_[i] = kNotTensor;

    double bytes = symint ? static_cast<double>(options_.symint_bytes) : static_cast<double>(index_.output_bytes[i]);
    if (tag == Policy::PreferRecompute) bytes *= options_.prefer_recompute_factor;
    save_bytes_[i] = bytes;
    double seconds = groups_.group[i] >= 0 ? member_seconds(graph_, groups_, index, options_.cost)
                                           : detail::recompute_seconds(graph_, index_, index, options_.cost);
    if (tag == Policy::PreferSave) seconds *= options_.prefer_save_factor;
    seconds_[i] = seconds;
  }
}

void Solver::collect_candidates() {
  // Only ancestors of what the backward reads can matter, and only through
  // nodes that may be recomputed: everything else stays on the source side at
  // no cost and is left out of the network.
  const std::size_t n = graph_.nodes.size();
  read_by_backward_.assign(n, 0);
  candidate_.assign(n, 0);
  std::vector<std::int32_t> stack;
  std::vector<char> free_read(n, 0);
  for (std::size_t b = 0; b < n; ++b) {
    if (!index_.backward_consumer(b)) continue;
    for_inputs(b, [&](std::int32_t input) {
      if (forward_value(input) && free_[static_cast<std::size_t>(input)]) free_read[static_cast<std::size_t>(input)] = 1;
    });
    for_network_inputs(b, [&](std::int32_t input) {
      auto x = static_cast<std::size_t>(input);
      read_by_backward_[x] = 1;
      if (!candidate_[x]) {
        candidate_[x] = 1;
        stack.push_back(input);
      }
    });
  }
  while (!stack.empty()) {
    auto v = static_cast<std::size_t>(stack.back());
    stack.pop_back();
    if (never_recompute_[v]) continue;
    for_network_inputs(v, [&](std::int32_t input) {
      auto x = static_cast<std::size_t>(input);
      if (!candidate_[x]) {
        candidate_[x] = 1;
        stack.push_back(input);
      }
    });
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (free_read[i]) free_backward_reads_.push_back(static_cast<std::int32_t>(i));
    if (candidate_[i]) candidates_.push_back(static_cast<std::int32_t>(i));
  }
}

void Solver::check_feasible() const {
  // The cut is infinite exactly when infinite arcs lead from the source to the
  // sink: a value that can be neither recomputed nor saved (its output is tied
  // to the source) feeds, through nodes that cannot be saved, a backward read.
  const std::size_t n = graph_.nodes.size();
  std::vector<std::int32_t> forced_by(n, kNone);  // for forced outputs: the input that forced it, or itself
  std::vector<char> forced(n, 0);
  for (auto v : candidates_) {
    auto i = static_cast<std::size_t>(v);
    std::int32_t cause = kNone;
    if (never_recompute_[i]) {
      cause = v;
    } else {
      for (auto e = index_.input_start[i]; e < index_.input_start[i + 1]; ++e) {
        const auto input = index_.inputs[static_cast<std::size_t>(e)];
        if (forced[static_cast<std::size_t>(input)]) {
          cause = input;
          break;
        }
      }
    }
    if (cause == kNone || !never_save_[i]) continue;
    forced[i] = 1;
    forced_by[i] = cause;
  }
  for (std::size_t b = 0; b < n; ++b) {
    if (!index_.backward_consumer(b)) continue;
    for (auto e = index_.input_start[b]; e < index_.input_start[b + 1]; ++e) {
      const auto input = index_.inputs[static_cast<std::size_t>(e)];
      auto x = static_cast<std::size_t>(input);
      if (!forced[x]) continue;
      const Node& node = graph_.nodes[b];
      std::string message = "min-cut: the recompute constraints cannot be met: backward node '" + node.name +
                            "' reads " + quoted(graph_, input);
      std::int32_t current = input;
      while (true) {
        auto c = static_cast<std::size_t>(current);
        message += ", which is never saved (" + std::string(reason_text(never_save_[c])) + ")";
        if (forced_by[c] == current) {
          message += " and never recomputed (" + std::string(reason_text(never_recompute_[c])) + ")";
          break;
        }
        message += " and can only be recomputed from " + quoted(graph_, forced_by[c]);
        current = forced_by[c];
      }
      throw MinCutError(message);
    }
  }
}

Solver::Capacities Solver::scale(const std::vector<Arc>& arcs) {
  // Integer capacities in units of `unit` bytes. Every finite capacity is
  // finite and >= 0 (check_options() bounds lambda, speeds and factors; cost.h
  // bounds recompute seconds), so the total is too; it is summed in long
  // double and rounded up so that no rounding makes the integer total pass
  // kMaxTotalUnits + the number of arcs (each llround adds at most 1/2 unit,
  // each zero-to-one bump 1). With unit 1 (totals below 2^50 bytes) the
  // integers are the capacities rounded to whole bytes.
  long double finite_total = 0.0L;
  for (const auto& arc : arcs) {
    if (arc.infinite) continue;
    if (!(arc.capacity >= 0.0 && arc.capacity <= std::numeric_limits<double>::max()))
      throw std::logic_error("min-cut: capacity " + format_double(arc.capacity) +
                             " is not a finite number >= 0 (the option checks should have rejected the input)");
    finite_total += arc.capacity;
  }
  const double total_bytes = static_cast<double>(finite_total);
  const double unit = total_bytes > kMaxTotalUnits ? std::nextafter(total_bytes / kMaxTotalUnits, HUGE_VAL) : 1.0;
  std::vector<std::int64_t> capacity(arcs.size());
  std::int64_t total = 0;
  for (std::size_t k = 0; k < arcs.size(); ++k) {
    if (arcs[k].infinite) continue;
    const double scaled = arcs[k].capacity / unit;  // <= kMaxTotalUnits
    auto units = static_cast<std::int64_t>(std::llround(scaled));
    if (units == 0 && scaled > 0.0) units = 1;
    capacity[k] = units;
    total += units;
  }
  const std::int64_t infinite = total + 1;
  for (std::size_t k = 0; k < arcs.size(); ++k)
    if (arcs[k].infinite) capacity[k] = infinite;
  return {std::move(capacity), infinite, unit};
}

std::vector<char> Solver::run_max_flow(std::int32_t vertices, const std::vector<Arc>& arcs, const Capacities& capacities,
                                       std::int64_t& flow) const {
  const auto& capacity = capacities.capacity;
  const std::int64_t infinite = capacities.infinite;

  // CSR arrays: every arc k is followed by its reverse; sorted by tail with a
  // stable counting sort so positions (edge indices) are known.
  const auto nv = static_cast<std::size_t>(vertices);
  const std::size_t ne = arcs.size() * 2;
  std::vector<std::uint32_t> start(nv + 1, 0);
  for (const auto& arc : arcs) {
    ++start[static_cast<std::size_t>(arc.tail) + 1];
    ++start[static_cast<std::size_t>(arc.head) + 1];
  }
  for (std::size_t v = 0; v < nv; ++v) start[v + 1] += start[v];
  std::vector<std::uint32_t> fill(start.begin(), start.end() - 1);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> sorted(ne);
  std::vector<std::uint32_t> forward_pos(arcs.size()), reverse_pos(arcs.size());
  for (std::size_t k = 0; k < arcs.size(); ++k) {
    auto t = static_cast<std::uint32_t>(arcs[k].tail), h = static_cast<std::uint32_t>(arcs[k].head);
    forward_pos[k] = fill[t]++;
    sorted[forward_pos[k]] = {t, h};
    reverse_pos[k] = fill[h]++;
    sorted[reverse_pos[k]] = {h, t};
  }
  CsrGraph g(boost::edges_are_sorted, sorted.begin(), sorted.end(), static_cast<CsrGraph::vertices_size_type>(nv));
  std::vector<std::pair<std::uint32_t, std::uint32_t>>().swap(sorted);

  std::vector<std::int64_t> cap(ne, 0), residual(ne, 0);
  std::vector<EdgeDescriptor> reverse(ne);
  for (std::size_t k = 0; k < arcs.size(); ++k) {
    auto f = forward_pos[k], r = reverse_pos[k];
    cap[f] = capacity[k];
    reverse[f] = EdgeDescriptor(static_cast<std::uint32_t>(arcs[k].head), r);
    reverse[r] = EdgeDescriptor(static_cast<std::uint32_t>(arcs[k].tail), f);
  }
  auto edge_index = boost::get(boost::edge_index, g);
  auto cap_map = boost::make_iterator_property_map(cap.begin(), edge_index);
  auto residual_map = boost::make_iterator_property_map(residual.begin(), edge_index);
  auto reverse_map = boost::make_iterator_property_map(reverse.begin(), edge_index);
  auto vertex_index = boost::get(boost::vertex_index, g);

  flow = 0;
  const auto source = static_cast<VertexDescriptor>(kSource), sink = static_cast<VertexDescriptor>(kSink);
  if (options_.algorithm == MaxFlowAlgorithm::BoykovKolmogorov) {
    std::vector<EdgeDescriptor> predecessor(nv);
    std::vector<boost::default_color_type> color(nv);
    std::vector<long> distance(nv);
    flow = boost::boykov_kolmogorov_max_flow(g, cap_map, residual_map, reverse_map,
                                             boost::make_iterator_property_map(predecessor.begin(), vertex_index),
                                             boost::make_iterator_property_map(color.begin(), vertex_index),
                                             boost::make_iterator_property_map(distance.begin(), vertex_index),
                                             vertex_index, source, sink);
  } else {
    flow = boost::push_relabel_max_flow(g, source, sink, cap_map, residual_map, reverse_map, vertex_index);
  }
  if (flow >= infinite)
    throw std::logic_error("min-cut: max flow reached the infinite capacity although the feasibility check passed");

  // Minimal source side: what the source still reaches in the residual
  // network. It is the same for every maximum flow, hence for both solvers.
  std::vector<char> reached(nv, 0);
  std::vector<std::uint32_t> queue{static_cast<std::uint32_t>(kSource)};
  reached[kSource] = 1;
  for (std::size_t head = 0; head < queue.size(); ++head) {
    for (auto [e, end] = boost::out_edges(queue[head], g); e != end; ++e) {
      if (residual[e->idx] <= 0) continue;
      auto t = boost::target(*e, g);
      if (reached[t]) continue;
      reached[t] = 1;
      queue.push_back(t);
    }
  }
  // The integer cut is exact: the arcs leaving the source side carry exactly
  // the max flow (max-flow min-cut), summed without overflow.
  __int128 cut_units = 0;
  for (std::size_t k = 0; k < arcs.size(); ++k)
    if (reached[static_cast<std::size_t>(arcs[k].tail)] && !reached[static_cast<std::size_t>(arcs[k].head)])
      cut_units += capacity[k];
  if (cut_units != static_cast<__int128>(flow))
    throw std::logic_error("min-cut: the cut's integer capacity differs from the max flow " + std::to_string(flow));
  return reached;
}

Solver::Network Solver::build_network(double lambda) const {
  const std::size_t n = graph_.nodes.size();
  // Vertices: source, sink, then in/out vertices of candidates. Exact merges:
  // a node never recomputed has its in-vertex at the source; one never saved
  // has out = in; one with zero recompute cost and a single network input
  // shares that input's out-vertex (a view chain collapses onto its base);
  // zero cost with no network input, or zero save bytes, sits at the sink.
  Network network;
  auto& in_vertex = network.in_vertex;
  auto& out_vertex = network.out_vertex;
  auto& arcs = network.arcs;
  auto& vertices = network.vertices;
  in_vertex.assign(n, kNone);
  out_vertex.assign(n, kNone);
  arcs.reserve(candidates_.size() * 4);
  std::vector<std::int32_t> input_vertices;
  // Deduplicates input vertices per node in O(inputs): stamp[x] = last node that saw x.
  std::size_t read_bound = 0;  // read vertices (fusion groups) are at most the members' input counts
  if (groups_.count > 0)
    for (auto v : candidates_) read_bound += graph_.nodes[static_cast<std::size_t>(v)].inputs.size();
  std::vector<std::int32_t> stamp(2 + 2 * candidates_.size() + read_bound, kNone);
  // Fusion groups (inductor): one read vertex per (input, group) pair, created
  // on first use in graph order (docs/mincut.md, "Fusion groups").
  std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t> read_vertex;
  std::vector<std::int32_t> read_inputs;
  for (auto v : candidates_) {
    auto i = static_cast<std::size_t>(v);
    input_vertices.clear();
    if (!never_recompute_[i])
      for_network_inputs(i, [&](std::int32_t input) {
        auto x = out_vertex[static_cast<std::size_t>(input)];
        if (stamp[static_cast<std::size_t>(x)] == v) return;
        stamp[static_cast<std::size_t>(x)] = v;
        input_vertices.push_back(x);
      });
    // A replayed random op also keeps its generator state for the backward.
    const double cost = lambda * seconds_[i] + static_cast<double>(state_bytes(i));
    std::int32_t in = kNone;
    bool own_in = false;
    if (never_recompute_[i]) {
      in = kSource;
    } else if (groups_.group[i] < 0 && cost <= 0.0 && input_vertices.size() <= 1) {
      in = input_vertices.empty() ? kSink : input_vertices.front();
    } else {
      in = vertices++;
      own_in = true;
    }
    std::int32_t out = kNone;
    if (never_save_[i] || in == kSink) {
      out = in;
    } else if (save_bytes_[i] <= 0.0) {
      out = kSink;
    } else {
      out = vertices++;
      arcs.push_back({in, out, save_bytes_[i], false});
    }
    if (own_in) {
      if (cost > 0.0) arcs.push_back({kSource, in, cost, false});
      for (auto x : input_vertices)
        if (x != kSink && x != in) arcs.push_back({x, in, 0.0, true});
      if (groups_.group[i] >= 0) add_group_reads(v, in, lambda, network, read_vertex, read_inputs);
    }
    in_vertex[i] = in;
    out_vertex[i] = out;
    if (read_by_backward_[i] && out != kSink) arcs.push_back({out, kSink, 0.0, true});
  }
  return network;
}

void Solver::add_group_reads(std::int32_t v, std::int32_t in, double lambda, Network& network,
                             std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t>& read_vertex,
                             std::vector<std::int32_t>& inputs) const {
  // Member v reads each distinct input u through r(u, G): r -> v_in is
  // infinite (recomputing v puts r on the sink side), and the read is paid by
  // the arc into r: from u_in when u is a recomputable member of the same
  // group (free when u is replayed in the same kernel), else from the source.
  // A view reads nothing; its readers read through it (group_member_reads):
  // a view member with its own vertex is on the sink side whenever a reader is
  // (the infinite input arc), so looking through it matches the set cost.
  const auto i = static_cast<std::size_t>(v);
  const std::int32_t g = groups_.group[i];
  const auto replayed_view = [&](std::int32_t x) {
    const std::int32_t x_in = network.in_vertex[static_cast<std::size_t>(x)];
    return candidate_[static_cast<std::size_t>(x)] && x_in != kNone && x_in != kSource && x_in != kSink;
  };
  inputs = group_member_reads(graph_, groups_, v, replayed_view);
  for (auto u : inputs) {
    const double read = lambda * read_seconds(graph_, u, options_.cost);
    if (read <= 0.0) continue;
    auto [it, inserted] = read_vertex.emplace(std::make_pair(u, g), kNone);
    if (inserted) {
      it->second = network.vertices++;
      const auto x = static_cast<std::size_t>(u);
      const std::int32_t u_in = network.in_vertex[x];
      const bool same_kernel = groups_.group[x] == g && candidate_[x] && u_in != kNone && u_in != kSource;
      network.arcs.push_back({same_kernel ? u_in : kSource, it->second, read, false});
    }
    network.arcs.push_back({it->second, in, 0.0, true});
  }
}

double Solver::set_seconds(const std::vector<std::int32_t>& recomputed, bool biased) const {
  // The cost the network charges for this recompute set (group reads once per
  // (input, group) pair); `biased` uses seconds_ (PREFER_SAVE factor applied).
  double total = 0.0;
  std::vector<char> in_set(graph_.nodes.size(), 0);
  for (auto v : recomputed) in_set[static_cast<std::size_t>(v)] = 1;
  std::set<std::pair<std::int32_t, std::int32_t>> reads;
  for (auto v : recomputed) {
    const auto i = static_cast<std::size_t>(v);
    const std::int32_t g = groups_.group[i];
    total += biased ? seconds_[i]
                    : (g >= 0 ? member_seconds(graph_, groups_, v, options_.cost)
                              : recompute_seconds(graph_, v, options_.cost));
    if (g < 0) continue;
    const auto replayed = [&](std::int32_t x) { return in_set[static_cast<std::size_t>(x)] != 0; };
    for (auto u : group_member_reads(graph_, groups_, v, replayed)) {
      const auto x = static_cast<std::size_t>(u);
      if (in_set[x] && groups_.group[x] == g) continue;
      if (reads.emplace(u, g).second) total += read_seconds(graph_, u, options_.cost);
    }
  }
  return total;
}

Cut Solver::solve(double lambda) const {
  const std::size_t n = graph_.nodes.size();
  Cut cut;
  cut.lambda = lambda;
  cut.policies = tags_;
  cut.stats.forward_nodes = forward_nodes_;
  cut.stats.free_nodes = free_nodes_;
  cut.stats.candidate_nodes = candidates_.size();
  const Network network = build_network(lambda);
  const auto& in_vertex = network.in_vertex;
  cut.stats.network_vertices = static_cast<std::size_t>(network.vertices);
  cut.stats.network_edges = network.arcs.size();
  const Capacities capacities = scale(network.arcs);
  cut.stats.capacity_unit = capacities.unit;
  std::vector<char> source_side = run_max_flow(network.vertices, network.arcs, capacities, cut.stats.max_flow);
  auto on_sink_side = [&](std::int32_t vertex) { return !source_side[static_cast<std::size_t>(vertex)]; };

  // What the backward actually needs: its reads, then the inputs of every
  // needed node the cut recomputes. A needed node on the source side is saved.
  std::vector<char> needed(read_by_backward_.begin(), read_by_backward_.end());
  std::vector<char> recomputed(n, 0), saved(n, 0);
  for (auto it = candidates_.rbegin(); it != candidates_.rend(); ++it) {
    auto i = static_cast<std::size_t>(*it);
    if (!needed[i]) continue;
    if (!never_recompute_[i] && on_sink_side(in_vertex[i])) {
      recomputed[i] = 1;
      for_network_inputs(i, [&](std::int32_t input) { needed[static_cast<std::size_t>(input)] = 1; });
    } else {
      if (never_save_[i])
        throw std::logic_error("min-cut: node '" + graph_.nodes[i].name + "' is needed, saved and never saved");
      saved[i] = 1;
    }
  }
  for (auto v : candidates_) {
    auto i = static_cast<std::size_t>(v);
    const Policy tag = tags_[i];
    if (recomputed[i]) {
      cut.recomputed.push_back(v);
      double seconds = detail::recompute_seconds(graph_, index_, v, options_.cost);  // cost.h, unbiased
      cut.recompute_seconds += seconds;  // each <= 1e30 s (cost.h): finite
      cut.recompute_flops = add_finite(cut.recompute_flops, graph_.nodes[i].flops);
      cut.biased_seconds += seconds_[i];
      cut.policies[i] = tag == Policy::MustRecompute ? Policy::MustRecompute : Policy::PreferRecompute;
    } else if (saved[i]) {
      cut.saved.push_back(v);
      cut.saved_bytes = add_bytes(cut.saved_bytes, index_.output_bytes[i]);
      cut.biased_bytes += save_bytes_[i];
      if (tag != Policy::None) cut.policies[i] = never_recompute_[i] ? Policy::MustSave : Policy::PreferSave;
    }
  }
  if (groups_.count > 0) {  // fusion groups: the set cost (reads once per group), as the network charged it
    cut.recompute_seconds = set_seconds(cut.recomputed, false);
    cut.biased_seconds = set_seconds(cut.recomputed, true);
  }
  // Free values the rewritten backward reads stay where they are: a
  // PREFER_RECOMPUTE on one becomes PREFER_SAVE so plan_remat copies nothing
  // the cut did not choose.
  auto keep_free = [&](std::int32_t input) {
    auto x = static_cast<std::size_t>(input);
    if (forward_value(input) && free_[x] && cut.policies[x] == Policy::PreferRecompute)
      cut.policies[x] = Policy::PreferSave;
  };
  for (auto x : free_backward_reads_) keep_free(x);  // what backward nodes read (each once: keep_free is idempotent)
  for (auto v : cut.recomputed) for_inputs(static_cast<std::size_t>(v), keep_free);
  cut.stats.saved_values = cut.saved.size();
  cut.stats.recomputed_nodes = cut.recomputed.size();
  if (cut.stats.capacity_unit > 1.0)
    cut.diagnostics.push_back({Severity::Info, -1,
                               "min-cut: capacities scaled to units of " + format_double(cut.stats.capacity_unit) +
                                   " bytes to fit 64-bit integers"});
  cut.diagnostics.push_back({Severity::Info, -1,
                             "min-cut (lambda " + format_double(lambda) + " B/s): saved " +
                                 std::to_string(cut.saved.size()) + " values (" + format_bytes(cut.saved_bytes) +
                                 "), recompute " + std::to_string(cut.recomputed.size()) + " nodes (" +
                                 format_double(cut.recompute_seconds) + " s, " + format_double(cut.recompute_flops) +
                                 " FLOPs)"});
  return cut;
}

FlowNetwork Solver::export_network(double lambda) const {
  const Network network = build_network(lambda);
  const Capacities capacities = scale(network.arcs);
  FlowNetwork out;
  out.vertices = static_cast<std::size_t>(network.vertices);
  out.arcs = network.arcs.size();
  out.capacity_unit = capacities.unit;
  out.infinite_capacity = capacities.infinite;
  out.lambda = lambda;
  run_max_flow(network.vertices, network.arcs, capacities, out.max_flow);
  // DIMACS numbers vertices from 1: the core's vertex v is v + 1 (source 1, sink 2).
  std::string text;
  text += "c hyper_ac min-cut flow network (docs/mincut.md), lambda " + format_double(lambda) + " B/s\n";
  text += "c capacities in units of " + format_double(capacities.unit) + " bytes (saved bytes + lambda * recompute seconds)\n";
  text += "c infinite arcs are written with capacity " + std::to_string(capacities.infinite) +
          " (the sum of all finite capacities + 1)\n";
  text += "p max " + std::to_string(network.vertices) + " " + std::to_string(network.arcs.size()) + "\n";
  text += "n " + std::to_string(kSource + 1) + " s\n";
  text += "n " + std::to_string(kSink + 1) + " t\n";
  for (auto v : candidates_) {
    auto i = static_cast<std::size_t>(v);
    text += "c vertex " + std::to_string(network.in_vertex[i] + 1) + " " + graph_.nodes[i].name + " in\n";
    text += "c vertex " + std::to_string(network.out_vertex[i] + 1) + " " + graph_.nodes[i].name + " out\n";
  }
  for (std::size_t k = 0; k < network.arcs.size(); ++k)
    text += "a " + std::to_string(network.arcs[k].tail + 1) + " " + std::to_string(network.arcs[k].head + 1) + " " +
            std::to_string(capacities.capacity[k]) + "\n";
  text += "c max_flow " + std::to_string(out.max_flow) + "\n";
  out.dimacs = std::move(text);
  return out;
}

MinCutResult to_result(Cut&& cut) {
  MinCutResult result;
  result.policies = std::move(cut.policies);
  result.saved = std::move(cut.saved);
  result.recomputed = std::move(cut.recomputed);
  result.saved_bytes = cut.saved_bytes;
  result.recompute_seconds = cut.recompute_seconds;
  result.recompute_flops = cut.recompute_flops;
  result.objective = cut.objective_at(cut.lambda);
  result.lambda = cut.lambda;
  result.stats = cut.stats;
  result.diagnostics = std::move(cut.diagnostics);
  return result;
}

bool same_cut(const Cut& a, const Cut& b) { return a.saved == b.saved && a.recomputed == b.recomputed; }

}  // namespace

MinCutResult solve_min_cut(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options) {
  return detail::solve_min_cut(graph, detail::NodeIndex(graph), tags, options);
}

MinCutResult detail::solve_min_cut(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                                   const MinCutOptions& options) {
  auto start = std::chrono::steady_clock::now();
  Solver solver(graph, index, tags, options);
  MinCutResult result = to_result(solver.solve(options.lambda));
  result.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

FlowNetwork flow_network(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options) {
  const detail::NodeIndex index(graph);
  Solver solver(graph, index, tags, options);
  return solver.export_network(options.lambda);
}

FrontierResult frontier_cuts(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options,
                    const FrontierOptions& sweep) {
  return detail::frontier_cuts(graph, detail::NodeIndex(graph), tags, options, sweep);
}

FrontierResult detail::frontier_cuts(const Graph& graph, const NodeIndex& index, const std::vector<Policy>& tags,
                            const MinCutOptions& options, const FrontierOptions& sweep) {
  auto start = std::chrono::steady_clock::now();
  if (!(std::isfinite(sweep.lambda_min) && std::isfinite(sweep.lambda_max) && sweep.lambda_min >= 0.0 &&
        sweep.lambda_min <= sweep.lambda_max))
    throw std::invalid_argument("frontier_cuts: need 0 <= lambda_min <= lambda_max, got " +
                                format_double(sweep.lambda_min) + " and " + format_double(sweep.lambda_max));
  if (sweep.max_solves < 2) throw std::invalid_argument("frontier_cuts: max_solves must be >= 2");
  Solver solver(graph, index, tags, options);
  std::vector<Cut> cuts;
  cuts.push_back(solver.solve(sweep.lambda_min));
  std::size_t solves = 1;
  if (sweep.lambda_max > sweep.lambda_min) {
    cuts.push_back(solver.solve(sweep.lambda_max));
    ++solves;
  }
  // Eisner-Severance: the optimal objective is concave and piecewise linear in
  // lambda. Between two cuts A (lower lambda, more recompute) and B, either
  // the cut found where their lines cross lies on both lines (no further
  // breakpoint in between) or it is a new cut and both halves are searched.
  // Breadth first, so a search stopped by max_solves still spans the range.
  std::deque<std::pair<std::size_t, std::size_t>> work;
  if (cuts.size() == 2 && !same_cut(cuts[0], cuts[1])) work.emplace_back(0, 1);
  while (!work.empty() && solves < sweep.max_solves) {
    auto [a, b] = work.front();
    work.pop_front();
    const Cut& lo = cuts[a];
    const Cut& hi = cuts[b];
    double dseconds = lo.biased_seconds - hi.biased_seconds;
    if (dseconds <= 0.0) continue;
    double crossing = (hi.biased_bytes - lo.biased_bytes) / dseconds;
    if (!(crossing > lo.lambda && crossing < hi.lambda)) continue;
    Cut middle = solver.solve(crossing);
    ++solves;
    double line = lo.objective_at(crossing);
    double tolerance = 1e-9 * std::abs(line) + 2.0 * middle.stats.capacity_unit *
                                                   static_cast<double>(middle.stats.saved_values + middle.stats.recomputed_nodes + 1);
    if (same_cut(middle, lo) || same_cut(middle, hi) || middle.objective_at(crossing) >= line - tolerance) continue;
    cuts.push_back(std::move(middle));
    std::size_t c = cuts.size() - 1;
    work.emplace_back(a, c);
    work.emplace_back(c, b);
  }
  FrontierResult result;
  result.solves = solves;
  result.complete = work.empty();
  std::sort(cuts.begin(), cuts.end(), [](const Cut& x, const Cut& y) { return x.lambda > y.lambda; });
  std::vector<MinCutResult>& points = result.points;
  for (auto& cut : cuts) {
    if (!points.empty() && points.back().saved == cut.saved && points.back().recomputed == cut.recomputed) continue;
    points.push_back(to_result(std::move(cut)));
  }
  result.solve_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace hyper_ac
