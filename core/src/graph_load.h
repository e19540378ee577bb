// Private to the core: the two graph loaders behind load_graph (graph.h).
//
// The fast path (graph_fast.cc, simdjson On-Demand) reads well-formed
// documents straight into the IR. It only decides "valid, here is the graph"
// or "not mine": on anything it does not accept (malformed JSON, a repeated
// key, a number out of range, any validation failure, or merely a shape it
// does not read, such as an escaped string) it gives up and load_graph runs
// the reference loader (graph_reference.cc: a JSON tree validated node by
// node, naming the problem) on the same bytes. Both read node fields through
// the one field table (graph_fields.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hyper_ac/graph.h"

namespace hyper_ac {
namespace graph_load {

// Document node ids to node indices, for both loaders: a dense table for ids
// below 2^24 (what serialisers write), a hash map above.
class IdTable {
 public:
  // The index of `id`; -1 = not (yet) loaded.
  std::int32_t find(std::int64_t id) const {
    if (id < 0) return -1;
    if (id < static_cast<std::int64_t>(dense_.size())) return dense_[static_cast<std::size_t>(id)];
    if (id < kDenseLimit) return -1;
    auto it = sparse_.find(id);
    return it == sparse_.end() ? -1 : it->second;
  }
  // False: `id` is already taken (ids are checked >= 0 by the caller).
  bool add(std::int64_t id, std::int32_t index) {
    if (id < kDenseLimit) {
      const auto at = static_cast<std::size_t>(id);
      if (at >= dense_.size()) dense_.resize(std::max(at + 1, dense_.size() * 2), -1);
      if (dense_[at] >= 0) return false;
      dense_[at] = index;
      return true;
    }
    return sparse_.emplace(id, index).second;
  }

 private:
  static constexpr std::int64_t kDenseLimit = std::int64_t{1} << 24;
  std::vector<std::int32_t> dense_;
  std::unordered_map<std::int64_t, std::int32_t> sparse_;
};

// True: `result.graph` holds the document's graph (stats are left to the caller).
// False: not accepted; `result` is unspecified.
bool load_fast(const std::string& json_text, const LoadOptions& options, LoadResult& result);
// The same over bytes the caller keeps alive; `readable` bytes from `text.data()`
// may be read (the fast path reads up to 64 past the end; less: a padded copy).
bool load_fast(std::string_view text, std::size_t readable, const LoadOptions& options, LoadResult& result);

// The reference loader: builds the graph (users included; no copy elided) or
// throws GraphError naming the first problem.
LoadResult load_reference(const std::string& json_text, const LoadOptions& options);

// The `model` section given as its JSON text, read by the reference rules.
// Throws (GraphError or a json_reader error) on anything the reference rejects.
ModelFacts parse_model_text(std::string_view text);

}  // namespace graph_load
}  // namespace hyper_ac
