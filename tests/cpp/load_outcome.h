// What a graph load gave, for tests that compare the fast and the reference
// loader: the graph and the path that read it, or the error message.
#pragma once

#include <string>
#include <utility>

#include "hyper_ac/graph.h"

namespace hyper_ac::testing {

inline LoadOptions reference() {
  LoadOptions options;
  options.reference_loader = true;
  return options;
}

struct Outcome {
  bool ok = false;
  bool fast = false;
  std::string error;
  Graph graph;
};

// What one loader call gives: its graph and path, or its error message.
template <typename LoadCall>
Outcome outcome_of(LoadCall&& load_call) {
  Outcome out;
  try {
    auto loaded = load_call();
    out.ok = true;
    out.fast = loaded.stats.fast_path;
    out.graph = std::move(loaded.graph);
  } catch (const GraphError& error) {
    out.error = error.what();
  }
  return out;
}

inline Outcome load(const std::string& text, const LoadOptions& options) {
  return outcome_of([&] { return load_graph(text, options); });
}

}  // namespace hyper_ac::testing
