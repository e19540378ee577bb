// The plan document (docs/graph-format.md, "Plan document") written straight
// to its output: no JSON tree is built. Bytes are those nlohmann's dump() of
// the same document gave (keys sorted at every level, numbers and strings
// rendered alike), so a plan is byte-identical to what earlier builds wrote;
// tests/cpp/test_plan_json.cc compares the two on every test graph.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>  // to_chars (its shortest round-trip doubles) and the rare escaped string

#include "hyper_ac/plan.h"
#include "hyper_ac/tagging.h"

namespace hyper_ac {

namespace {

// Buffered text sink: appends to a string, flushed to a stream in blocks when
// there is one (the CLI), or kept whole (the string a binding returns).
class Out {
 public:
  explicit Out(std::ostream& stream) : stream_(&stream), text_(&own_) { own_.reserve(kBlock + 4096); }
  explicit Out(std::string& text) : text_(&text) {}
  ~Out() = default;
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;

  void put(char c) { text_->push_back(c); }
  void put(const char* s) { text_->append(s); }
  void put(const char* s, std::size_t n) { text_->append(s, n); }
  void flush_if_full() {
    if (stream_ != nullptr && own_.size() >= kBlock) flush();
  }
  void flush() {
    if (stream_ == nullptr) return;
    stream_->write(own_.data(), static_cast<std::streamsize>(own_.size()));
    own_.clear();
  }

  // A JSON string. Names and messages are plain printable ASCII almost always:
  // copied as they are; anything else is escaped by nlohmann itself (the same
  // bytes as before, and the same error on invalid UTF-8).
  void string(const std::string& s) {
    bool escape = false;  // no early exit: the loop vectorises
    for (unsigned char c : s) escape |= (c < 0x20) | (c >= 0x7f) | (c == '"') | (c == '\\');
    if (escape) {
      text_->append(nlohmann::json(s).dump());
      return;
    }
    put('"');
    put(s.data(), s.size());
    put('"');
  }
  void integer(std::int64_t value) {
    char buffer[24];
    const int n = std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(value));
    put(buffer, static_cast<std::size_t>(n));
  }
  void unsigned_integer(std::uint64_t value) {
    char buffer[24];
    const int n = std::snprintf(buffer, sizeof buffer, "%llu", static_cast<unsigned long long>(value));
    put(buffer, static_cast<std::size_t>(n));
  }
  void number(double value) {
    if (!std::isfinite(value)) {
      put("null");
      return;
    }
    char buffer[64];
    char* end = nlohmann::detail::to_chars(buffer, buffer + sizeof buffer, value);
    put(buffer, static_cast<std::size_t>(end - buffer));
  }
  void boolean(bool value) { put(value ? "true" : "false"); }

 private:
  static constexpr std::size_t kBlock = std::size_t{1} << 16;
  std::ostream* stream_ = nullptr;
  std::string own_;
  std::string* text_;
};

// One member of an object: its key and what writes its value.
struct Field {
  std::string key;
  std::function<void(Out&)> value;
};

// An object with its keys in the canonical (byte-wise sorted) order, whatever
// order the fields were listed in.
void object(Out& out, std::vector<Field> fields) {
  std::sort(fields.begin(), fields.end(), [](const Field& a, const Field& b) { return a.key < b.key; });
  out.put('{');
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out.put(',');
    out.string(fields[i].key);
    out.put(':');
    fields[i].value(out);
    out.flush_if_full();
  }
  out.put('}');
}

template <typename Items, typename Write>
void array(Out& out, const Items& items, Write write) {
  out.put('[');
  bool first = true;
  for (const auto& item : items) {
    if (!first) out.put(',');
    first = false;
    write(out, item);
    out.flush_if_full();
  }
  out.put(']');
}

Field signed_field(const char* key, std::int64_t value) { return {key, [value](Out& o) { o.integer(value); }}; }
Field count_field(const char* key, std::uint64_t value) { return {key, [value](Out& o) { o.unsigned_integer(value); }}; }
Field number_field(const char* key, double value) { return {key, [value](Out& o) { o.number(value); }}; }
Field bool_field(const char* key, bool value) { return {key, [value](Out& o) { o.boolean(value); }}; }
Field string_field(const char* key, std::string value) {
  return {key, [value = std::move(value)](Out& o) { o.string(value); }};
}

std::vector<Field> stats_fields(const PlanResult& result) {
  const auto& rs = result.remat.stats;
  const auto& ts = result.tags.stats;
  const auto& ps = result.stats;
  std::vector<Field> fields = {
      count_field("nodes_duplicated", rs.nodes_duplicated),
      count_field("nodes_erased", rs.nodes_erased),
      signed_field("saved_bytes_before", rs.saved_bytes_before),
      signed_field("saved_bytes_after", rs.saved_bytes_after),
      count_field("saved_values_before", rs.saved_values_before),
      count_field("saved_values_after", rs.saved_values_after),
      number_field("recompute_flops", rs.recompute_flops),
      number_field("recompute_seconds", ps.recompute_seconds),
      count_field("tagged", ts.tagged),
      count_field("must_save", ts.must_save),
      count_field("prefer_save", ts.prefer_save),
      count_field("must_recompute", ts.must_recompute),
      count_field("prefer_recompute", ts.prefer_recompute),
      count_field("saved_rng", ts.saved_rng),
      count_field("saved_symint", ts.saved_symint),
      count_field("saved_collective", ts.saved_collective),
      count_field("saved_inplace", ts.saved_inplace),
      count_field("saved_cross_unit", ts.saved_cross_unit),
      count_field("rebuilt_for_exclude", ps.rebuilt_for_exclude),
      count_field("units", ps.units),
      count_field("selected_units", ps.selected_units),
      string_field("scope", ps.scope),
      count_field("user_tagged", ps.user_tagged),
      count_field("regions", ps.regions),
      number_field("lambda", ps.lambda),
      signed_field("simulated_peak_before", ps.simulated_peak_before),
      signed_field("simulated_peak_after", ps.simulated_peak_after),
      signed_field("simulated_activation_peak_before", ps.simulated_activation_peak_before),
      signed_field("simulated_activation_peak_after", ps.simulated_activation_peak_after),
      signed_field("simulated_activation_peak_autograd", ps.simulated_activation_peak_autograd),
      signed_field("budget_bytes", ps.budget_bytes),
      bool_field("budget_met", ps.budget_met),
  };
  if (ps.stock_simulated_peak >= 0) {
    fields.push_back(signed_field("stock_simulated_peak", ps.stock_simulated_peak));
    fields.push_back(bool_field("stock_fallback", ps.stock_fallback));
  }
  if (ps.oracle_calls > 0) {
    fields.push_back(signed_field("measured_peak_after", ps.measured_peak_after));
    fields.push_back(signed_field("measured_stock_peak", ps.measured_stock_peak));
    fields.push_back(signed_field("measured_stock_lower_bound", ps.measured_stock_lower_bound));
    fields.push_back(signed_field("measured_nearest_over", ps.measured_nearest_over));
    fields.push_back(count_field("oracle_calls", ps.oracle_calls));
    fields.push_back(bool_field("measured_fallback", ps.measured_fallback));
    fields.push_back(bool_field("output_recompute_refused", ps.output_recompute_refused));
  }
  if (ps.step_seconds >= 0.0) {
    fields.push_back(number_field("step_seconds", ps.step_seconds));
    fields.push_back(number_field("knee_allowance_seconds", ps.knee_allowance_seconds));
    fields.push_back(count_field("knee_points", ps.knee_points));
  }
  if (rs.rng_replayed > 0 || ts.rng_replay_candidates > 0) {
    fields.push_back(count_field("rng_replayed", rs.rng_replayed));
    fields.push_back(signed_field("rng_state_bytes", rs.rng_state_bytes));
    fields.push_back(count_field("rng_replay_candidates", ts.rng_replay_candidates));
  }
  return fields;
}

// Node names by index.
struct Names {
  const Graph& graph;
  const std::string& operator()(std::int32_t index) const { return graph.nodes[static_cast<std::size_t>(index)].name; }
};

// Names in graph order as one array.
template <typename Take>
void names_where(Out& out, const Graph& graph, Take take) {
  out.put('[');
  bool first = true;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!take(i)) continue;
    if (!first) out.put(',');
    first = false;
    out.string(graph.nodes[i].name);
    out.flush_if_full();
  }
  out.put(']');
}

// The fields both forms share: what a caller needs to apply the plan and to
// report on it. Per-node lists are written by the form itself.
void common_fields(const Graph& graph, const PlanResult& result, const PlanJsonOptions& options,
                   std::vector<Field>& fields) {
  const Names name{graph};
  fields.push_back(string_field("format", "hyper_ac.plan"));
  fields.push_back(signed_field("version", kPlanFormatVersion));
  fields.push_back(string_field("mode", to_string(result.mode)));
  // Rewrite the graph or hand it to stock, and why (RouteDecision, plan.h).
  fields.push_back(string_field("route", to_string(result.route.route)));
  fields.push_back(string_field("route_reason", result.route.reason));
  fields.push_back({"erase", [&, name](Out& o) { array(o, result.remat.erase, [&](Out& w, std::int32_t e) { w.string(name(e)); }); }});
  // saved: the forward values, then each replayed random op's state ("<R>_rng_state").
  fields.push_back({"saved", [&, name](Out& o) {
                      o.put('[');
                      bool first = true;
                      auto next = [&] {
                        if (!first) o.put(',');
                        first = false;
                      };
                      for (auto s : result.remat.saved) {
                        next();
                        o.string(name(s));
                        o.flush_if_full();
                      }
                      for (auto r : result.remat.rng_replays) {
                        next();
                        o.string(name(r) + "_rng_state");
                      }
                      o.put(']');
                    }});
  // kept: the saved forward values the plan decided (a policy of its own, not
  // replayed), graph order: what a caller that hands the decisions to
  // PyTorch's min-cut tags MUST_SAVE. A saved value without a policy (outside
  // every region: a causal mask, rotary tables) is not the plan's to pin.
  fields.push_back({"kept", [&](Out& o) {
                      std::vector<char> replayed(graph.nodes.size(), 0);
                      for (const auto& d : result.remat.duplicates) replayed[static_cast<std::size_t>(d.of)] = 1;
                      std::vector<char> saved(graph.nodes.size(), 0);
                      for (auto v : result.remat.saved) saved[static_cast<std::size_t>(v)] = 1;
                      names_where(o, graph, [&](std::size_t i) {
                        return saved[i] && !replayed[i] && i < result.policies.size() &&
                               result.policies[i] != Policy::None && graph.nodes[i].kind == NodeKind::CallFunction;
                      });
                    }});
  fields.push_back({"stats", [&](Out& o) { object(o, stats_fields(result)); }});
  // Rendered as {level, message}; a diagnostic about one node also names it.
  fields.push_back({"diagnostics", [&, name](Out& o) {
                      array(o, result.diagnostics, [&](Out& w, const Diagnostic& d) {
                        w.put("{\"level\":");
                        w.string(to_string(d.severity));
                        w.put(",\"message\":");
                        w.string(d.message);
                        if (d.node >= 0 && static_cast<std::size_t>(d.node) < graph.nodes.size()) {
                          w.put(",\"node\":");
                          w.string(name(d.node));
                        }
                        w.put('}');
                      });
                    }});
  if (result.timeline.recorded) fields.push_back({"timeline", [&](Out& o) {
    const auto& tl = result.timeline;
    auto bytes = [](Out& w, std::int64_t b) { w.integer(b); };
    o.put("{\"after\":");
    array(o, tl.after, bytes);
    o.put(",\"before\":");
    array(o, tl.before, bytes);
    o.put(",\"boundary_after\":");
    o.integer(tl.boundary_after);
    o.put(",\"boundary_before\":");
    o.integer(tl.boundary_before);
    o.put(",\"units\":[");
    for (std::size_t u = 0; u < result.scope.units.size(); ++u) {
      if (u) o.put(',');
      o.put("{\"backward_peak_after\":");
      o.integer(tl.unit_backward_peak_after[u]);
      o.put(",\"backward_peak_before\":");
      o.integer(tl.unit_backward_peak_before[u]);
      o.put(",\"fqn\":");
      o.string(result.scope.units[u].fqn);
      o.put('}');
    }
    o.put("]}");
  }});
  if (options.timings) {
    const auto& t = result.timings;
    fields.push_back({"timings", [&t](Out& o) {
                        object(o, {number_field("scope_seconds", t.scope_seconds), number_field("tag_seconds", t.tag_seconds),
                                   number_field("mincut_seconds", t.mincut_seconds),
                                   number_field("remat_seconds", t.remat_seconds),
                                   number_field("simulate_seconds", t.simulate_seconds),
                                   number_field("total_seconds", t.total_seconds),
                                   number_field("load_seconds", t.load_seconds)});
                      }});
  }
}

// Indices of the nodes with a policy, in name order (the full form's
// per-node objects are keyed by name).
std::vector<std::int32_t> tagged_by_name(const Graph& graph, const PlanResult& result) {
  std::vector<std::pair<std::string_view, std::int32_t>> keyed;  // names side by side: a cache-friendly sort
  for (std::size_t i = 0; i < graph.nodes.size(); ++i)
    if (result.policies[i] != Policy::None) keyed.emplace_back(graph.nodes[i].name, static_cast<std::int32_t>(i));
  // Byte-wise, as std::map<std::string, ...> orders its keys; names are unique (the loader checks).
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::int32_t> tagged;
  tagged.reserve(keyed.size());
  for (const auto& entry : keyed) tagged.push_back(entry.second);
  return tagged;
}

// An object keyed by node name over `nodes` (name order), for those `has` accepts.
template <typename Has, typename Write>
void by_name(Out& out, const Graph& graph, const std::vector<std::int32_t>& nodes, Has has, Write write) {
  out.put('{');
  bool first = true;
  for (auto i : nodes) {
    if (!has(static_cast<std::size_t>(i))) continue;
    if (!first) out.put(',');
    first = false;
    out.string(graph.nodes[static_cast<std::size_t>(i)].name);
    out.put(':');
    write(out, static_cast<std::size_t>(i));
    out.flush_if_full();
  }
  out.put('}');
}

// The full form's per-node detail: every tagged node's policy, region id and
// reason, in objects keyed by name. With the shared fields, byte-identical to
// the plan of format version 1 but for the version.
void full_fields(const Graph& graph, const PlanResult& result, std::vector<Field>& fields,
                 const std::vector<std::int32_t>& tagged) {
  const auto& tags = result.tags;
  fields.push_back({"policies", [&](Out& o) {
                      by_name(o, graph, tagged, [](std::size_t) { return true; },
                              [&](Out& w, std::size_t i) { w.string(to_string(result.policies[i])); });
                    }});
  fields.push_back({"graph_ids", [&](Out& o) {
                      by_name(o, graph, tagged, [&](std::size_t i) { return i < tags.graph_id.size() && tags.graph_id[i] >= 0; },
                              [&](Out& w, std::size_t i) { w.integer(tags.graph_id[i]); });
                    }});
  fields.push_back({"reasons", [&](Out& o) {
                      by_name(o, graph, tagged, [&](std::size_t i) { return i < tags.reasons.size() && !tags.reasons[i].empty(); },
                              [&](Out& w, std::size_t i) { w.string(tags.reasons[i]); });
                    }});
}

// Both forms: the rewrite, entry by entry (duplicates, redirects, replays,
// elided copies), and the scope per region.
void entry_fields(const Graph& graph, const PlanResult& result, std::vector<Field>& fields) {
  const Names name{graph};
  fields.push_back({"duplicates", [&, name](Out& o) {
                      array(o, result.remat.duplicates, [&](Out& w, const Duplicate& dup) {
                        w.put("{\"before\":");
                        w.string(name(dup.before));
                        w.put(",\"of\":");
                        w.string(name(dup.of));
                        w.put(",\"private_get_attrs\":[");
                        bool first = true;
                        for (auto input : graph.nodes[static_cast<std::size_t>(dup.of)].inputs)
                          if (graph.nodes[static_cast<std::size_t>(input)].subgraph) {
                            if (!first) w.put(',');
                            first = false;
                            w.string(name(input));
                          }
                        w.put("]}");
                      });
                    }});
  fields.push_back({"redirects", [&, name](Out& o) {
                      array(o, result.remat.redirects, [&](Out& w, const Redirect& r) {
                        w.put("{\"duplicate\":");
                        w.integer(r.duplicate);
                        w.put(",\"input\":");
                        w.string(name(r.input));
                        w.put(",\"node\":");
                        w.string(name(r.node));
                        w.put('}');
                      });
                    }});
  // A replayed random op R: the forward runs it under run_and_save_rng_state
  // and saves the state, its duplicate reruns it from that state. Present
  // only when there are some.
  if (!result.remat.rng_replays.empty())
    fields.push_back({"rng_replays", [&, name](Out& o) {
                        array(o, result.remat.rng_replays, [&](Out& w, std::int32_t r) {
                          w.put("{\"of\":");
                          w.string(name(r));
                          w.put(",\"state\":");
                          w.string(name(r) + "_rng_state");
                          w.put(",\"state_bytes\":");
                          w.integer(graph.nodes[static_cast<std::size_t>(r)].rng_state_bytes);
                          w.put('}');
                        });
                      }});
  // Copies the loader elided (alias.h): present only when there are some.
  if (!graph.elided_copies.empty())
    fields.push_back({"elided_copies", [&](Out& o) {
                        array(o, graph.elided_copies, [](Out& w, const ElidedCopy& copy) {
                          w.put("{\"node\":");
                          w.string(copy.node);
                          w.put(",\"source\":");
                          w.string(copy.source);
                          w.put('}');
                        });
                      }});
  fields.push_back({"regions", [&](Out& o) {
                      const auto& scope = result.scope;
                      o.put('[');
                      for (std::size_t r = 0; r < scope.regions.size(); ++r) {
                        if (r) o.put(',');
                        o.put("{\"fqn\":");
                        o.string(scope.regions[r]);
                        o.put(",\"output_recompute\":");
                        o.boolean(r < scope.region_output_recompute.size() && scope.region_output_recompute[r]);
                        o.put('}');
                      }
                      o.put(']');
                    }});
  fields.push_back({"excluded", [&](Out& o) {
                      array(o, result.scope.excluded, [](Out& w, const std::string& fqn) { w.string(fqn); });
                    }});
}

// The compact form's per-node facts: policies and region ids as name lists
// grouped by value (graph order, nothing sorted by name) and the nodes pinned
// for correctness instead of every reason.
void compact_fields(const Graph& graph, const PlanResult& result, std::vector<Field>& fields) {
  const Names name{graph};
  const auto& tags = result.tags;
  fields.push_back(string_field("form", "compact"));
  // Node indices per policy and per region id, graph order: one pass over the nodes.
  auto by_policy = std::make_shared<std::map<std::string, std::vector<std::int32_t>>>();
  auto by_graph_id = std::make_shared<std::map<std::string, std::vector<std::int32_t>>>();
  {
    std::map<std::int32_t, std::vector<std::int32_t>> ids;
    for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
      if (result.policies[i] == Policy::None) continue;
      (*by_policy)[to_string(result.policies[i])].push_back(static_cast<std::int32_t>(i));
      if (i < tags.graph_id.size() && tags.graph_id[i] >= 0) ids[tags.graph_id[i]].push_back(static_cast<std::int32_t>(i));
    }
    for (auto& [id, nodes] : ids) (*by_graph_id)[std::to_string(id)] = std::move(nodes);
  }
  // Keyed by policy / by region id (as a string: a JSON key), each a list of names.
  auto groups = [name](const std::map<std::string, std::vector<std::int32_t>>& buckets) {
    return [&buckets, name](Out& o) {
      o.put('{');
      bool first = true;
      for (const auto& [key, nodes] : buckets) {  // std::map: keys already in canonical order
        if (!first) o.put(',');
        first = false;
        o.string(key);
        o.put(':');
        array(o, nodes, [&](Out& w, std::int32_t i) { w.string(name(i)); });
      }
      o.put('}');
    };
  };
  fields.push_back({"policies", [by_policy, groups](Out& o) { groups(*by_policy)(o); }});
  fields.push_back({"graph_ids", [by_graph_id, groups](Out& o) { groups(*by_graph_id)(o); }});
  // The nodes pinned for correctness (in-place, rng, collective): a stock
  // partition must keep them saved too.
  fields.push_back({"pinned", [&](Out& o) {
                      names_where(o, graph, [&](std::size_t i) {
                        return result.policies[i] != Policy::None && i < tags.reasons.size() &&
                               is_correctness_reason(tags.reasons[i]);
                      });
                    }});
}

void write_plan(Out& out, const Graph& graph, const PlanResult& result, const PlanJsonOptions& options) {
  std::vector<Field> fields;
  common_fields(graph, result, options, fields);
  entry_fields(graph, result, fields);
  std::vector<std::int32_t> tagged;
  if (options.detail) {
    tagged = tagged_by_name(graph, result);
    full_fields(graph, result, fields, tagged);
  } else {
    compact_fields(graph, result, fields);
  }
  object(out, std::move(fields));
}

}  // namespace

void write_plan_json(std::ostream& out, const Graph& graph, const PlanResult& result, const PlanJsonOptions& options) {
  Out sink(out);
  write_plan(sink, graph, result, options);
  sink.flush();
}

std::string plan_to_json(const Graph& graph, const PlanResult& result, const PlanJsonOptions& options) {
  std::string text;
  Out sink(text);
  write_plan(sink, graph, result, options);
  return text;
}

std::string plan_to_json(const Graph& graph, const PlanResult& result, bool include_timings) {
  PlanJsonOptions options;
  options.timings = include_timings;
  return plan_to_json(graph, result, options);
}

}  // namespace hyper_ac
