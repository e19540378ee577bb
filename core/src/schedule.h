// Internal to the core: the rewritten step as flat arrays, shared by the
// remat plan's validation and the memory simulator. remat.h's
// rewritten_schedule is the public form of the schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_ac/graph.h"
#include "hyper_ac/remat.h"
#include "node_index.h"

namespace hyper_ac {
namespace detail {

struct FlatSchedule {
  std::vector<std::int32_t> node;       // per step: the graph node it runs (a duplicate: its original)
  std::vector<char> duplicate;          // per step
  std::vector<std::int32_t> start;      // per step + 1: offsets into `inputs`
  std::vector<std::int32_t> inputs;     // schedule indices read, node.inputs order; -1 = not available
  std::size_t size() const { return node.size(); }
};

// As rewritten_schedule (same steps, same inputs, same PlanError messages).
FlatSchedule flat_schedule(const Graph& graph, const NodeIndex& index, const RematPlan& plan);

}  // namespace detail
}  // namespace hyper_ac
