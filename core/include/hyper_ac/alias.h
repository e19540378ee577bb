// The alias rule, in one place: which inputs a node's output shares storage
// with. Used by storage accounting (graph summary, remat saved bytes), the
// min-cut's free-value analysis and the memory simulator.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_ac/graph.h"

namespace hyper_ac {

// Positions (into node.inputs) of the inputs whose storage a call_function
// node's output shares: its valid aliased_inputs, else {0} for a view without
// positions ("a view without positions aliases input 0"); empty = the node
// allocates its own storage. Always empty for placeholders, get_attr, output.
std::vector<std::int32_t> alias_positions(const Node& node);

// Calls f(position) for each entry of alias_positions(node), in order, without
// allocating (the hot loops of the simulator and the storage accounting).
template <typename F>
void for_each_alias_position(const Node& node, F&& f) {
  if (node.kind != NodeKind::CallFunction) return;
  bool any = false;
  for (auto p : node.aliased_inputs)
    if (p >= 0 && static_cast<std::size_t>(p) < node.inputs.size()) {
      any = true;
      f(p);
    }
  if (!any && node.view && !node.inputs.empty()) f(std::int32_t{0});
}

// The first entry of alias_positions(node); -1 when it is empty.
std::int32_t first_alias_position(const Node& node);

// The node aliases some input (alias_positions is not empty).
bool is_aliasing(const Node& node);

bool is_getitem(const Node& node);  // operator.getitem (picks a tuple element)

// A view in the saving sense: free to recompute from its base and never worth
// saving on its own (a getitem picks a tuple element and is saved by itself).
bool is_view_like(const Node& node);

// For every node, the node whose output storage it shares: itself, or for a
// view / in-place result / getitem, the root of its first aliased input.
// Values that share a root occupy memory once.
std::vector<std::int32_t> storage_roots(const Graph& graph);

// Removes every exact forward copy C = copy(S) (Node::copy) whose elision
// cannot change a value, rewiring C's readers to S, and returns what it
// removed (graph order; `finalize()` done). Eligible when nothing can tell C
// and S apart afterwards: C runs in the forward with S as its one input; no
// node writes the storage of C or of S (in-place ops, a written placeholder);
// the output node does not read C (a returned tensor must not alias a saved
// one); C carries the same checkpoint tag as S (a user's tag on the copy is
// kept). Chains resolve to the first source.
std::vector<ElidedCopy> elide_copies(Graph& graph);

}  // namespace hyper_ac
