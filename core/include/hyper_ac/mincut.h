// Cost-aware min-cut: choose which forward values the backward keeps (saved)
// and which it recomputes, minimising  saved bytes + lambda * recompute seconds
// under the hard rules the tags impose. One s-t max-flow (Boost.Graph) per
// solve; docs/mincut.md describes the network.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "hyper_ac/config.h"
#include "hyper_ac/cost.h"
#include "hyper_ac/diagnostic.h"
#include "hyper_ac/graph.h"

namespace hyper_ac {

// The tags cannot be satisfied together (a value the backward reads can be
// neither saved nor recomputed). The message names the chain of nodes and the
// rule pinning each one.
class MinCutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class MaxFlowAlgorithm { BoykovKolmogorov, PushRelabel };
const char* to_string(MaxFlowAlgorithm algorithm);

// Accepted range of prefer_save_factor and prefer_recompute_factor.
constexpr double kMinPreferFactor = 1.0e-6;
constexpr double kMaxPreferFactor = 1.0e6;

struct MinCutOptions {
  // Bytes per second of recompute time: objective = saved bytes + lambda *
  // recompute seconds. plan() passes effective_lambda(config) (memory
  // bandwidth / 4 unless configured); 1e10 for options built by hand.
  // In [0, kMaxLambda] (config.h); cost.hardware speeds in
  // [kMinHardwareSpeed, kMaxHardwareSpeed], both factors in
  // [kMinPreferFactor, kMaxPreferFactor]: std::invalid_argument otherwise.
  double lambda = 1.0e10;
  // The recompute cost model (cost.h): roofline seconds per replayed node.
  CostOptions cost;
  // Max-flow solver. Both give the same cut (the minimal source side is
  // unique); Boykov-Kolmogorov was faster on every graph measured (docs/mincut.md).
  MaxFlowAlgorithm algorithm = MaxFlowAlgorithm::BoykovKolmogorov;
  // PREFER_SAVE: the recompute cost is multiplied by this (>= 1 biases towards saving).
  double prefer_save_factor = 2.0;
  // PREFER_RECOMPUTE: the saved bytes are multiplied by this (>= 1 biases
  // towards recomputing). 1 = neutral: under auto/budget most candidates carry
  // this tag, so a factor here would only rescale lambda.
  double prefer_recompute_factor = 1.0;
  // Bytes charged for saving a SymInt / symbolic scalar (tiny but not free, so
  // a cut never prefers a symbol for no reason).
  std::int64_t symint_bytes = 1;
  // RNG ops without a replayable state (Node::rng_state_bytes == 0) are never
  // recomputed, whatever their tag (a rerun would draw different numbers). A
  // MUST_RECOMPUTE one the backward needs is then reported as infeasible.
  // Replayable ones may be recomputed; their recompute arc also carries the
  // state's bytes, which the backward then keeps instead of the output.
  bool never_recompute_rng = true;
  // Charge a graph input that is not a parameter or buffer its bytes when the
  // backward keeps it (never recomputed), as PyTorch's min-cut does. plan()
  // sets it for a whole-graph scope, where a piece of a step is compared with
  // stock; inside units the caller's batch is resident anyway (free).
  bool charge_inputs = false;
};

struct MinCutStats {
  std::size_t forward_nodes = 0;     // forward, non-output nodes of the graph
  std::size_t candidate_nodes = 0;   // nodes the cut could put on the recompute side
  std::size_t free_nodes = 0;        // parameters, inputs, constants, forward outputs, aliases of them
  std::size_t network_vertices = 0;  // after shrinking, source and sink included
  std::size_t network_edges = 0;     // forward arcs (Boost adds one reverse arc each)
  std::int64_t max_flow = 0;         // in capacity units = the cut's objective / capacity_unit
  double capacity_unit = 1.0;        // bytes per integer capacity unit (1 unless the network is huge)
  std::size_t saved_values = 0;      // activations the backward reads from the forward
  std::size_t recomputed_nodes = 0;  // forward nodes copied into the backward
};

struct MinCutResult {
  // Per node (sized like graph.nodes): the tags with the cut applied. A node
  // the backward needs becomes PREFER_RECOMPUTE / PREFER_SAVE (MUST_* when its
  // tag or a structural rule pins it); other nodes keep their tag.
  std::vector<Policy> policies;
  std::vector<std::int32_t> saved;       // forward activations the backward reads, graph order
  std::vector<std::int32_t> recomputed;  // forward nodes recomputed in the backward, graph order
  std::int64_t saved_bytes = 0;          // sum of output bytes over `saved`
  double recompute_seconds = 0.0;        // roofline time of `recomputed`
  double recompute_flops = 0.0;
  // saved bytes + lambda * recompute seconds with the PREFER_* factors applied
  // (what the cut minimised), in bytes.
  double objective = 0.0;
  double lambda = 0.0;                   // the lambda solved for
  MinCutStats stats;                     // deterministic
  double solve_seconds = 0.0;            // wall time of the whole call (not deterministic)
  std::vector<Diagnostic> diagnostics;   // deterministic
};

// `tags` comes from tag_policies (sized like graph.nodes): None = not eligible
// (never recomputed; saving it costs its bytes), MUST_SAVE = never recomputed,
// MUST_RECOMPUTE = never saved, PREFER_* = either, with a soft bias. Throws
// std::invalid_argument on a size mismatch or a bad option, MinCutError when
// the tags are infeasible.
MinCutResult solve_min_cut(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options = {});

// Lambda sweep for the memory/recompute trade-off (budget mode).
struct FrontierOptions {
  // Range of lambda searched (bytes per second of recompute). At lambda_min
  // recomputing is almost free (least memory); at lambda_max it is almost
  // never worth it (least recompute).
  double lambda_min = 1.0e3;
  double lambda_max = 1.0e16;
  // Upper bound on max-flow solves; the sweep is exact (finds every distinct
  // cut between the ends) when the bound is not hit.
  std::size_t max_solves = 64;
};

struct FrontierResult {
  // Distinct optimal cuts, sorted by lambda descending: recompute seconds
  // ascending, saved bytes descending (the first point recomputes least).
  // Each point is one cut, as solve_min_cut returns it at that point's lambda
  // (solve_seconds 0: the sweep's wall time is FrontierResult::solve_seconds).
  std::vector<MinCutResult> points;
  std::size_t solves = 0;      // max-flow solves made
  bool complete = true;        // false when max_solves stopped the search early
  double solve_seconds = 0.0;  // wall time (not deterministic)
};

// Every distinct optimal cut for lambda in [lambda_min, lambda_max] (Eisner-
// Severance breakpoint search: solve at both ends, then at the lambda where the
// two cuts' objectives cross, breadth first). For a memory budget, walk the
// points in order and take the first whose simulated peak fits (evaluate()
// in plan.h); plan() then descends from it towards less recompute within the
// budget (docs/mincut.md). Throws as
// solve_min_cut, and std::invalid_argument on a bad range.
FrontierResult frontier_cuts(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options = {},
                    const FrontierOptions& sweep = {});

// The exact s-t network solve_min_cut builds for options.lambda, with the
// integer capacities its max-flow solver uses, as DIMACS max-flow text
// (docs/mincut.md): "p max N M", "n 1 s", "n 2 t", one "a U V CAP" per arc
// (vertices numbered from 1), "c vertex V NAME in|out" for each candidate
// node's two sides (merged sides name the shared vertex, 1 = source,
// 2 = sink), and "c max_flow F" with the flow the core's solver finds.
struct FlowNetwork {
  std::string dimacs;
  std::size_t vertices = 0;            // source and sink included
  std::size_t arcs = 0;                // forward arcs
  std::int64_t max_flow = 0;           // in capacity units
  std::int64_t infinite_capacity = 0;  // what an infinite arc is written with: sum of finite capacities + 1
  double capacity_unit = 1.0;          // bytes per capacity unit
  double lambda = 0.0;
};

// Throws as solve_min_cut.
FlowNetwork flow_network(const Graph& graph, const std::vector<Policy>& tags, const MinCutOptions& options = {});

}  // namespace hyper_ac
