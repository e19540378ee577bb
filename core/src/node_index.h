// Internal to the core: compact per-node facts of a graph (one pass over the
// nodes, flat arrays). plan() builds the index once and every stage and
// evaluation (each frontier point) reads it, instead of walking the
// scattered Node structs again. The stages' entry points over it: each in
// its own <stage>_indexed.h (scope, tagging, cost, mincut, remat, simulate).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "hyper_ac/graph.h"

namespace hyper_ac {
namespace detail {

struct NodeIndex {
  explicit NodeIndex(const Graph& graph);

  enum Flag : std::uint32_t {
    kForward = 1,         // Node::is_forward()
    kCallFunction = 2,    // NodeKind::CallFunction
    kOutput = 4,          // NodeKind::Output
    kResident = 8,        // a placeholder or get_attr (simulate.h: resident)
    kProjects = 16,       // a getitem taking one element of an allocating multi-output producer
    kMultiAlias = 32,     // more than one alias position (alias.h): read them off the node
    kRng = 64,            // Node::rng
    kRecomputedFrom = 128, // a duplicate made by an earlier pass (Node::recomputed_from non-empty)
    kGetitem = 256,        // operator.getitem (alias.h is_getitem)
    kMutated = 512,        // Node::mutated
    kMutatesInputs = 1024, // Node::mutated_inputs non-empty
    kSymint = 2048,        // Node::symint
    kView = 4096,          // Node::view
    kNoOutputs = 8192,     // Node::outputs empty
    kBackwardOutput = 16384, // Node::backward_output
    kOpaque = 32768,       // Node::opaque
    // A call_function a fusing compiler (Inductor) can inline into the
    // kernels that read it: Node::fusible, and not random, symint, a view, a
    // getitem or an op that mutates or aliases (SimulateOptions::fuse_pointwise).
    kInlinable = 65536
  };

  std::size_t size() const { return flags.size(); }
  bool has(std::size_t i, Flag flag) const { return (flags[i] & flag) != 0; }
  bool forward(std::size_t i) const { return has(i, kForward); }
  // A backward node other than the output (remat.cc: backward_consumer).
  bool backward_consumer(std::size_t i) const { return !has(i, kForward) && !has(i, kOutput); }

  std::vector<std::uint32_t> flags;
  std::vector<std::int32_t> input_start;  // per node + 1: offsets into `inputs`
  std::vector<std::int32_t> inputs;       // Node::inputs, concatenated
  std::vector<std::int64_t> output_bytes; // Node::output_bytes()
  std::vector<std::int32_t> alias_first;  // alias.h first_alias_position; -1 = allocates its own storage
  std::vector<std::int32_t> storage_root; // alias.h storage_roots
  std::vector<std::int32_t> stack;        // Node::stack
  std::vector<Policy> policy;             // Node::policy (the model's own tag)
  std::vector<std::int32_t> target;       // per node: index into `targets`
  std::vector<std::string_view> targets;  // distinct Node::target values, first use order (views into the graph)
};

}  // namespace detail
}  // namespace hyper_ac
