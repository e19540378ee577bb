// Private to the core: the two graph loaders behind load_graph (graph.h).
//
// The fast path (graph_fast.cc, simdjson On-Demand) reads well-formed
// documents straight into the IR. It only decides "valid, here is the graph"
// or "not mine": on anything it does not accept (malformed JSON, a repeated
// key, a number out of range, any validation failure, or merely a shape it
// does not read, such as an escaped string) it gives up and load_graph runs
// the reference loader (graph.cc: nlohmann SAX, then the JSON-tree validator
// for the exact error) on the same bytes.
#pragma once

#include <string>
#include <string_view>

#include "hyper_ac/graph.h"

namespace hyper_ac {
namespace graph_load {

// True: `result.graph` holds the document's graph (stats are left to the caller).
// False: not accepted; `result` is unspecified.
bool load_fast(const std::string& json_text, const LoadOptions& options, LoadResult& result);

// The `model` section given as its JSON text, read by the reference rules.
// Throws (GraphError or a json_reader error) on anything the reference rejects.
ModelFacts parse_model_text(std::string_view text);

}  // namespace graph_load
}  // namespace hyper_ac
