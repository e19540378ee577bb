#include "hyper_ac/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "json_reader.h"

namespace hyper_ac {

using json = nlohmann::json;

const char* to_string(RngPolicy rng) { return rng == RngPolicy::Replay ? "replay" : "save"; }

const char* to_string(Mode mode) {
  switch (mode) {
    case Mode::Off: return "off";
    case Mode::Full: return "full";
    case Mode::Selective: return "selective";
    case Mode::Auto: return "auto";
    case Mode::Budget: return "budget";
  }
  return "?";
}

namespace {

[[noreturn]] void fail(const std::string& key, const std::string& what) {
  throw ConfigError("config key '" + key + "': " + what);
}

std::string format_number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

// What was read, for a message: its type and its value. A string that reads
// as a number says so: YAML 1.1 (PyYAML) reads 1e15 without a '.' as a string.
std::string described(const json& value) {
  if (!value.is_string()) return std::string(value.type_name()) + " " + value.dump();
  std::string out = "the string " + value.dump();
  const std::string text = value.get<std::string>();
  std::size_t consumed = 0;
  try {
    (void)std::stod(text, &consumed);
  } catch (const std::exception&) {
    consumed = 0;
  }
  if (consumed > 0 && consumed == text.size())
    out += " (a number in quotes, or one YAML reads as a string: write 1.0e+15, not 1e15)";
  return out;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Rejects keys outside `known`, suggesting the closest one.
void check_keys(const json& object, const std::vector<std::string>& known, const std::string& section) {
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string best;
    std::size_t best_distance = 4;
    for (const auto& candidate : known) {
      std::size_t distance = edit_distance(key, candidate);
      if (distance < best_distance) {
        best_distance = distance;
        best = candidate;
      }
    }
    std::string where = section.empty() ? key : section + "." + key;
    std::string message = "unknown key";
    if (!best.empty()) message += " (did you mean '" + best + "'?)";
    std::string list;
    for (const auto& candidate : known) list += (list.empty() ? "" : ", ") + candidate;
    fail(where, message + "; known keys here: " + list);
  }
}

bool get_bool(const json& value, const std::string& key) {
  if (!value.is_boolean()) fail(key, std::string("must be true or false, got ") + value.type_name());
  return value.get<bool>();
}

std::int64_t get_unit_int(const json& value, const std::string& key) {
  // YAML `true` must not pass as 1.
  if (value.is_boolean()) fail(key, "must be an integer, got a boolean");
  if (!value.is_number_integer()) fail(key, std::string("must be an integer, got ") + value.type_name());
  std::int64_t number = value.get<std::int64_t>();
  if (number < 0) fail(key, "must be >= 0, got " + std::to_string(number));
  return number;
}

std::vector<std::string> get_strings(const json& value, const std::string& key) {
  std::vector<std::string> out;
  if (value.is_null()) return out;
  if (value.is_string()) return {value.get<std::string>()};
  if (!value.is_array()) fail(key, std::string("must be a list of strings, got ") + value.type_name());
  for (const auto& entry : value) {
    if (!entry.is_string()) fail(key, std::string("entries must be strings, got ") + entry.type_name());
    if (entry.get<std::string>().empty()) fail(key, "entries must not be empty");
    out.push_back(entry.get<std::string>());
  }
  return out;
}

RngPolicy parse_rng(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string, got ") + value.type_name());
  std::string text = value.get<std::string>();
  if (text == "replay") return RngPolicy::Replay;
  if (text == "save") return RngPolicy::Save;
  fail(key, "unknown rng policy '" + text + "'; use replay or save");
}

Mode parse_mode(const json& value, const std::string& key) {
  // YAML 1.1 reads an unquoted `off` as false.
  if (value.is_boolean()) {
    if (!value.get<bool>()) return Mode::Off;
    fail(key, "got true (YAML reads an unquoted 'on'/'yes' as true); use one of off, full, selective, auto, budget");
  }
  if (!value.is_string()) fail(key, std::string("must be a string, got ") + value.type_name());
  std::string text = value.get<std::string>();
  if (text == "off") return Mode::Off;
  if (text == "full") return Mode::Full;
  if (text == "selective") return Mode::Selective;
  if (text == "auto") return Mode::Auto;
  if (text == "budget") return Mode::Budget;
  fail(key, "unknown mode '" + text + "'; use one of off, full, selective, auto, budget");
}

void parse_unit_indices(const json& value, const std::string& key, Config& config) {
  if (value.is_null()) return;
  if (!value.is_array()) fail(key, std::string("must be a list of integers, got ") + value.type_name());
  std::vector<std::int64_t> indices;
  std::set<std::int64_t> seen;
  for (const auto& entry : value) {
    std::int64_t index = get_unit_int(entry, key);
    if (!seen.insert(index).second) fail(key, "duplicate unit index " + std::to_string(index));
    indices.push_back(index);
  }
  config.scope.unit_indices = indices;
}

void parse_source(const json& value, const std::string& key, Config& config) {
  if (value.is_null()) return;
  if (!value.is_string()) fail(key, std::string("must be a string, got ") + value.type_name());
  std::string source = value.get<std::string>();
  if (source != "blocks" && source != "model_adapter_safe_regions")
    fail(key, "unknown source '" + source + "'; use 'blocks' or 'model_adapter_safe_regions'");
  config.region_source = source;
}

MemoryBudget parse_budget(const json& value, const std::string& key) {
  if (value.is_boolean()) fail(key, "must be a byte size (\"6GiB\") or a fraction in (0, 1], got a boolean");
  if (value.is_string()) {
    double bytes = parse_byte_size(value.get<std::string>(), key);
    if (bytes <= 0) fail(key, "must be positive");
    return BudgetBytes{bytes};
  }
  if (!value.is_number())
    fail(key, std::string("must be a byte size (\"6GiB\") or a fraction in (0, 1], got ") + value.type_name());
  double number = value.get<double>();
  if (!(number > 0) || !std::isfinite(number)) fail(key, "must be a positive finite number, got " + value.dump());
  if (number <= 1.0) return BudgetFraction{number};
  return BudgetBytes{number};
}

HardwareProfile parse_hardware(const json& value, const std::string& key) {
  static const std::map<std::string, HardwareProfile> kProfiles = {
      {"cpu", {"cpu", 1.0e11, 2.0e10}},
      {"a100", {"a100", 312.0e12, 2.0e12}},
      {"h100", {"h100", 989.0e12, 3.35e12}},
      {"h200", {"h200", 989.0e12, 4.8e12}},
      // Measured op times; the cpu roofline prices the nodes measured without a time.
      {"measured", {"measured", 1.0e11, 2.0e10, true}},
  };
  if (value.is_string()) {
    std::string name = value.get<std::string>();
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    auto it = kProfiles.find(name);
    if (it == kProfiles.end()) fail(key, "unknown hardware profile '" + name + "'; use cpu, a100, h100, h200, measured or {peak_flops, memory_bandwidth}");
    return it->second;
  }
  if (!value.is_object()) fail(key, std::string("must be a profile name or an object, got ") + value.type_name());
  check_keys(value, {"name", "peak_flops", "memory_bandwidth"}, key);
  HardwareProfile profile;
  profile.name = "custom";
  if (value.contains("name")) {
    if (!value["name"].is_string()) fail(key + ".name", "must be a string");
    profile.name = value["name"].get<std::string>();
  }
  // {name: measured, peak_flops, memory_bandwidth}: measured times with this
  // roofline for the nodes without one (also the canonical form's round trip).
  profile.measured = profile.name == "measured";
  for (const char* field : {"peak_flops", "memory_bandwidth"}) {
    if (!value.contains(field)) fail(key + "." + field, "missing (FLOP/s and bytes/s of the target hardware)");
    const json& number = value[field];
    if (!number.is_number() || number.is_boolean())
      fail(key + "." + field, std::string("must be a number, got ") + described(number));
    const double speed = number.get<double>();
    if (!(speed >= kMinHardwareSpeed && speed <= kMaxHardwareSpeed))
      fail(key + "." + field, "must be a finite number in [" + format_number(kMinHardwareSpeed) + ", " +
                                  format_number(kMaxHardwareSpeed) + "], got " + number.dump());
    (std::string(field) == "peak_flops" ? profile.peak_flops : profile.memory_bandwidth) = speed;
  }
  return profile;
}

SplitMethod parse_split(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string (native or torch), got ") + value.type_name());
  const auto name = value.get<std::string>();
  if (name == "native") return SplitMethod::Native;
  if (name == "torch") return SplitMethod::Torch;
  fail(key, "unknown split '" + name + "'; use native (the core's split) or torch (PyTorch's _extract_fwd_bwd_modules)");
  return SplitMethod::Native;
}

BufferReuse parse_buffer_reuse(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string (auto, inductor or none), got ") + value.type_name());
  const auto name = value.get<std::string>();
  if (name == "auto") return BufferReuse::Auto;
  if (name == "inductor") return BufferReuse::Inductor;
  if (name == "none") return BufferReuse::None;
  fail(key, "unknown buffer_reuse '" + name +
                "'; use auto (Inductor's reuse in mode off only), inductor (Inductor's reuse in every mode) or none");
  return BufferReuse::Auto;
}

PeakOracle parse_peak_oracle(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string (auto or off), got ") + value.type_name());
  const auto name = value.get<std::string>();
  if (name == "auto") return PeakOracle::Auto;
  if (name == "off") return PeakOracle::Off;
  fail(key, "unknown peak_oracle '" + name +
                "'; use auto (the compiler's own account of a plan's peak where it can give one: Inductor's dry run) "
                "or off (the core's simulation alone)");
  return PeakOracle::Auto;
}

Compiler parse_compiler(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string (eager or inductor), got ") + value.type_name());
  return parse_compiler_name(value.get<std::string>(), key);
}

void parse_lambda(const json& value, const std::string& key, Config& config) {
  if (!value.is_number() || value.is_boolean()) fail(key, std::string("must be a number, got ") + described(value));
  double lambda = value.get<double>();
  if (!(lambda >= 0 && lambda <= kMaxLambda))
    fail(key, "must be a finite number in [0, " + format_number(kMaxLambda) + "] (bytes per second), got " + value.dump());
  config.mincut.lambda = lambda;
}

ScopeRule parse_scope_rule(const json& value, const std::string& key) {
  if (!value.is_string()) fail(key, std::string("must be a string (auto, units, whole_graph or unit_graph), got ") + value.type_name());
  const std::string text = value.get<std::string>();
  if (text == "auto") return ScopeRule::Auto;
  if (text == "units") return ScopeRule::Units;
  if (text == "whole_graph") return ScopeRule::WholeGraph;
  if (text == "unit_graph") return ScopeRule::UnitGraph;
  fail(key, "unknown scope '" + text + "' (expected auto, units, whole_graph or unit_graph)");
  return ScopeRule::Auto;
}

void parse_regions(const json& value, const std::string& key, Config& config) {
  if (value.is_null()) return;
  if (!value.is_object()) fail(key, std::string("must be a mapping, got ") + value.type_name());
  check_keys(value, {"include", "exclude", "output_recompute"}, key);
  if (value.contains("include")) config.scope.include = get_strings(value["include"], key + ".include");
  if (value.contains("exclude")) config.scope.exclude = get_strings(value["exclude"], key + ".exclude");
  if (value.contains("output_recompute")) {
    const json& output = value["output_recompute"];
    // true = every region; a list = the regions whose FQN matches a pattern.
    if (output.is_boolean())
      config.scope.output_recompute = output.get<bool>() ? std::vector<std::string>{"*"} : std::vector<std::string>{};
    else
      config.scope.output_recompute = get_strings(output, key + ".output_recompute");
  }
}

void parse_adapter(const json& value, Config& config) {
  // Filled by hyper_ac.config from a registered ModelAdapter.
  if (!value.is_object()) fail("adapter", "must be a mapping");
  check_keys(value, {"include", "exclude"}, "adapter");
  config.adapter_include = get_strings(value.value("include", json()), "adapter.include");
  config.adapter_exclude = get_strings(value.value("exclude", json()), "adapter.exclude");
  config.adapter_given = true;
}

// The canonical value of one option, or null when it is unset (an optional
// value without a default: layer_count, layer_indices, memory_budget, lambda).
json budget_value(const MemoryBudget& budget) {
  if (const auto* fraction = std::get_if<BudgetFraction>(&budget)) return fraction->fraction;
  if (const auto* bytes = std::get_if<BudgetBytes>(&budget)) return bytes->bytes;
  return nullptr;
}

// Every option once: its flat key, its group in the nested form ("" = the
// activation_checkpoint section itself, or "selection") with its name there,
// its parser and its writer (the canonical value, every default resolved;
// null = unset). Both forms, their key checks and the canonical form
// (config_to_json) are derived from this table.
struct OptionKey {
  const char* flat;
  const char* group;
  const char* nested;
  void (*parse)(const json& value, const std::string& key, Config& config);
  json (*write)(const Config& config);
};

const std::vector<OptionKey>& option_keys() {
  static const std::vector<OptionKey> keys = {
      {"ac_mode", "", "mode", [](const json& v, const std::string& k, Config& c) { c.mode = parse_mode(v, k); },
       [](const Config& c) -> json { return to_string(c.mode); }},
      {"ac_region_source", "selection", "source", [](const json& v, const std::string& k, Config& c) { parse_source(v, k, c); },
       [](const Config& c) -> json { return c.region_source; }},
      {"ac_layer_count", "selection", "layer_count",
       [](const json& v, const std::string& k, Config& c) {
         if (!v.is_null()) c.scope.unit_count = get_unit_int(v, k);
       },
       [](const Config& c) -> json { return c.scope.unit_count ? json(*c.scope.unit_count) : json(nullptr); }},
      {"ac_layer_indices", "selection", "layer_indices",
       [](const json& v, const std::string& k, Config& c) { parse_unit_indices(v, k, c); },
       [](const Config& c) -> json { return c.scope.unit_indices ? json(*c.scope.unit_indices) : json(nullptr); }},
      {"ac_scope", "", "scope", [](const json& v, const std::string& k, Config& c) { c.scope.rule = parse_scope_rule(v, k); },
       [](const Config& c) -> json { return to_string(c.scope.rule); }},
      {"ac_regions", "", "regions", [](const json& v, const std::string& k, Config& c) { parse_regions(v, k, c); },
       [](const Config& c) -> json {
         return {{"include", c.scope.include}, {"exclude", c.scope.exclude}, {"output_recompute", c.scope.output_recompute}};
       }},
      {"ac_save_forward_all_gather", "", "save_forward_all_gather",
       [](const json& v, const std::string& k, Config& c) { c.save_forward_all_gather = get_bool(v, k); },
       [](const Config& c) -> json { return c.save_forward_all_gather; }},
      {"ac_rng", "", "rng", [](const json& v, const std::string& k, Config& c) { c.rng = parse_rng(v, k); },
       [](const Config& c) -> json { return to_string(c.rng); }},
      {"ac_memory_budget", "", "memory_budget",
       [](const json& v, const std::string& k, Config& c) { c.mincut.memory_budget = parse_budget(v, k); },
       [](const Config& c) -> json { return budget_value(c.mincut.memory_budget); }},
      // Unset = derived from the hardware (effective_lambda, in ConfigFacts): left out, so a
      // config that changes its hardware keeps deriving it.
      {"ac_lambda", "", "lambda", [](const json& v, const std::string& k, Config& c) { parse_lambda(v, k, c); },
       [](const Config& c) -> json { return c.mincut.lambda ? json(*c.mincut.lambda) : json(nullptr); }},
      {"ac_hardware", "", "hardware",
       [](const json& v, const std::string& k, Config& c) { c.mincut.hardware = parse_hardware(v, k); },
       [](const Config& c) -> json {
         const auto& h = c.mincut.hardware;
         return {{"name", h.name}, {"peak_flops", h.peak_flops}, {"memory_bandwidth", h.memory_bandwidth}};
       }},
      {"ac_compiler", "", "compiler",
       [](const json& v, const std::string& k, Config& c) { c.mincut.compiler = parse_compiler(v, k); },
       [](const Config& c) -> json { return to_string(c.mincut.compiler); }},
      {"ac_split", "", "split", [](const json& v, const std::string& k, Config& c) { c.split = parse_split(v, k); },
       [](const Config& c) -> json { return to_string(c.split); }},
      {"ac_buffer_reuse", "", "buffer_reuse",
       [](const json& v, const std::string& k, Config& c) { c.buffer_reuse = parse_buffer_reuse(v, k); },
       [](const Config& c) -> json { return to_string(c.buffer_reuse); }},
      {"ac_peak_oracle", "", "peak_oracle",
       [](const json& v, const std::string& k, Config& c) { c.peak_oracle = parse_peak_oracle(v, k); },
       [](const Config& c) -> json { return to_string(c.peak_oracle); }},
  };
  return keys;
}

std::vector<std::string> flat_keys() {
  std::vector<std::string> keys;
  for (const auto& option : option_keys()) keys.push_back(option.flat);
  return keys;
}

// Nested names in `group`, in table order.
std::vector<std::string> nested_keys(const std::string& group) {
  std::vector<std::string> keys;
  for (const auto& option : option_keys())
    if (option.group == group) keys.push_back(option.nested);
  return keys;
}

void parse_nested(const json& section, Config& config) {
  const std::string prefix = "activation_checkpoint";
  if (!section.is_object()) fail(prefix, std::string("must be a mapping, got ") + section.type_name());
  std::vector<std::string> known = nested_keys("");
  known.push_back("selection");
  known.push_back("op_policy");
  check_keys(section, known, prefix);
  const std::string selection_key = prefix + ".selection";
  if (section.contains("selection")) {
    const json& selection = section["selection"];
    if (!selection.is_object()) fail(selection_key, std::string("must be a mapping, got ") + selection.type_name());
    check_keys(selection, nested_keys("selection"), selection_key);
  }
  for (const auto& option : option_keys()) {
    const bool in_selection = std::string(option.group) == "selection";
    const json& holder = in_selection ? section.value("selection", json::object()) : section;
    if (holder.is_object() && holder.contains(option.nested))
      option.parse(holder[option.nested], (in_selection ? selection_key : prefix) + "." + option.nested, config);
  }
}

void parse_flat(const json& document, Config& config) {
  for (const auto& option : option_keys())
    if (document.contains(option.flat)) option.parse(document[option.flat], option.flat, config);
}

OpPolicyTable table_from_json(const json& value, const std::string& key, const OpPolicyTable* base) {
  if (!value.is_object()) fail(key, std::string("must be a mapping of category to operator list, got ") + value.type_name());
  check_keys(value, {"must_save", "must_recompute", "prefer_save", "saved_collectives", "all_gathers", "transparent"},
             key);
  OpPolicyTable table = base ? *base : OpPolicyTable{};
  auto take = [&](const char* name, std::vector<std::string>& field) {
    if (value.contains(name)) field = get_strings(value[name], key + "." + name);
  };
  take("must_save", table.must_save);
  take("must_recompute", table.must_recompute);
  take("prefer_save", table.prefer_save);
  take("saved_collectives", table.saved_collectives);
  take("all_gathers", table.all_gathers);
  take("transparent", table.transparent);
  return table;
}

json parse_json(const std::string& text, const std::string& what) {
  try {
    return json_reader::parse_strict(text);
  } catch (const json_reader::ReadError& error) {
    if (error.kind == json_reader::ReadError::Kind::Malformed)
      throw ConfigError(what + " is not valid JSON: " + error.what());
    if (error.key.empty()) throw ConfigError(what + ": " + error.what());
    fail(error.path, error.detail);  // config key 'activation_checkpoint.lambda': number 1e999 is out of range ...
  }
}

}  // namespace

Compiler parse_compiler_name(const std::string& name, const std::string& key) {
  if (name == "eager") return Compiler::Eager;
  if (name == "inductor") return Compiler::Inductor;
  fail(key, "compiler must be eager (FX code, one kernel per node) or inductor (fused kernels), got '" + name + "'");
}

Config with_runner(Config config, Compiler runner) {
  if (config.mincut.compiler == Compiler::Eager) config.mincut.compiler = runner;
  return config;
}

bool inductor_buffer_reuse(const Config& config) {
  if (config.buffer_reuse == BufferReuse::Auto) return config.mode == Mode::Off;
  return config.buffer_reuse == BufferReuse::Inductor;
}

bool inductor_backward_horizontal_fusion(const Config& config) { return config.mode == Mode::Off; }

ConfigFacts config_facts(const Config& given, const ConfigFactsOptions& options) {
  const Config config = options.runner ? with_runner(given, *options.runner) : given;
  ConfigFacts facts;
  facts.mode = config.mode;
  facts.plans = config.mode != Mode::Off;
  // auto compares with stock everywhere; under unit_graph every mode that plans keeps each block's
  // saved bytes at or under stock's (keep_unit_under_stock, plan_search.h).
  facts.compare_with_stock =
      config.mode == Mode::Auto || (config.mode != Mode::Off && config.scope.rule == ScopeRule::UnitGraph);
  facts.budget_bounds_step_peak = config.scope.rule != ScopeRule::UnitGraph;
  facts.compiler = config.mincut.compiler;
  facts.split = config.split;
  facts.buffer_reuse = config.buffer_reuse;
  facts.inductor_buffer_reuse = inductor_buffer_reuse(config);
  facts.inductor_backward_horizontal_fusion = inductor_backward_horizontal_fusion(config);
  Config as_off = config;
  as_off.mode = Mode::Off;
  facts.stock_route_inductor_buffer_reuse = inductor_buffer_reuse(as_off);
  facts.stock_route_inductor_backward_horizontal_fusion = inductor_backward_horizontal_fusion(as_off);
  facts.peak_oracle = config.peak_oracle == PeakOracle::Auto && facts.plans;
  facts.lambda = effective_lambda(config.mincut);
  facts.lambda_configured = config.mincut.lambda.has_value();
  facts.hardware = config.mincut.hardware;
  facts.measure_op_times = config.mincut.hardware.measured;
  facts.rng = config.rng;
  if (options.runner == Compiler::Eager && config.buffer_reuse != BufferReuse::Auto)
    facts.warnings.push_back(std::string("buffer_reuse: ") + to_string(config.buffer_reuse) +
                             " applies to compiler='inductor' only; the eager compiler runs FX code, which reuses no "
                             "buffers");
  return facts;
}

std::string config_facts_to_json(const ConfigFacts& facts) {
  json out = {{"mode", to_string(facts.mode)},
              {"plans", facts.plans},
              {"compare_with_stock", facts.compare_with_stock},
              {"budget_bounds_step_peak", facts.budget_bounds_step_peak},
              {"compiler", to_string(facts.compiler)},
              {"split", to_string(facts.split)},
              {"buffer_reuse", to_string(facts.buffer_reuse)},
              {"inductor_buffer_reuse", facts.inductor_buffer_reuse},
              {"inductor_backward_horizontal_fusion", facts.inductor_backward_horizontal_fusion},
              {"stock_route_inductor_buffer_reuse", facts.stock_route_inductor_buffer_reuse},
              {"stock_route_inductor_backward_horizontal_fusion",
               facts.stock_route_inductor_backward_horizontal_fusion},
              {"peak_oracle", facts.peak_oracle},
              {"lambda", facts.lambda},
              {"lambda_configured", facts.lambda_configured},
              {"hardware", {{"name", facts.hardware.name},
                            {"peak_flops", facts.hardware.peak_flops},
                            {"memory_bandwidth", facts.hardware.memory_bandwidth}}},
              {"rng", to_string(facts.rng)},
              {"measure_op_times", facts.measure_op_times},
              {"warnings", facts.warnings}};
  return out.dump();
}

double parse_byte_size(const std::string& text, const std::string& key) {
  std::size_t consumed = 0;
  double number = 0;
  try {
    number = std::stod(text, &consumed);
  } catch (const std::exception&) {
    fail(key, "cannot read '" + text + "' as a byte size (examples: \"6GiB\", \"512MB\", \"1.5e9\")");
  }
  std::string unit = text.substr(consumed);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  std::string lower = unit;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, double> kUnits = {
      {"", 1.0},          {"b", 1.0},           {"kb", 1e3},          {"mb", 1e6},         {"gb", 1e9},
      {"tb", 1e12},       {"kib", 1024.0},      {"mib", 1048576.0},   {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"k", 1024.0},  {"m", 1048576.0},     {"g", 1073741824.0}};
  auto it = kUnits.find(lower);
  if (it == kUnits.end()) fail(key, "unknown size unit '" + unit + "' in '" + text + "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  if (!(number > 0) || !std::isfinite(number)) fail(key, "size must be positive, got '" + text + "'");
  const double bytes = number * it->second;
  if (!std::isfinite(bytes)) fail(key, "size '" + text + "' is past the double range");
  return bytes;
}

Config parse_config(const std::string& json_text) {
  json document = parse_json(json_text, "config");
  if (document.is_null()) return Config{};
  if (!document.is_object()) throw ConfigError(std::string("config must be a mapping, got ") + document.type_name());
  Config config;
  const std::vector<std::string> flat = flat_keys();
  std::vector<std::string> known = flat;
  known.push_back("activation_checkpoint");
  known.push_back("op_policy");
  known.push_back("adapter");
  check_keys(document, known, "");
  bool nested = document.contains("activation_checkpoint");
  bool any_flat = std::any_of(flat.begin(), flat.end(), [&](const std::string& k) { return document.contains(k); });
  if (nested && any_flat)
    throw ConfigError(
        "config mixes the 'activation_checkpoint:' section with flat 'ac_*' keys; use one form (they name the same options)");
  if (nested)
    parse_nested(document["activation_checkpoint"], config);
  else
    parse_flat(document, config);

  // op_policy may sit at top level (flat form) or inside the section (nested form).
  const json* op_policy = nullptr;
  if (document.contains("op_policy")) op_policy = &document["op_policy"];
  if (nested && document["activation_checkpoint"].contains("op_policy")) {
    if (op_policy) throw ConfigError("config key 'op_policy' given twice (top level and in activation_checkpoint)");
    op_policy = &document["activation_checkpoint"]["op_policy"];
  }
  if (op_policy && !op_policy->is_null()) {
    table_from_json(*op_policy, "op_policy", nullptr);  // validate now, merge at plan time
    config.op_policy_override = op_policy->dump();
  }
  if (document.contains("adapter") && !document["adapter"].is_null()) parse_adapter(document["adapter"], config);

  if (config.scope.unit_count && config.scope.unit_indices)
    throw ConfigError("config sets both layer_count and layer_indices; they select units in two different ways, keep one");
  if (config.mode == Mode::Budget && !has_budget(config.mincut.memory_budget))
    throw ConfigError("config key 'memory_budget': mode 'budget' needs a memory_budget (bytes like \"6GiB\" or a fraction like 0.5)");
  if (config.mode != Mode::Budget && has_budget(config.mincut.memory_budget))
    throw ConfigError(std::string("config key 'memory_budget': only used by mode 'budget', but mode is '") +
                      to_string(config.mode) + "'");
  return config;
}

OpPolicyTable parse_op_policy(const std::string& json_text) {
  return table_from_json(parse_json(json_text, "op policy table"), "op_policy", nullptr);
}

OpPolicyTable merge_op_policy(const OpPolicyTable& base, const std::string& override_json) {
  return table_from_json(parse_json(override_json, "op policy override"), "op_policy", &base);
}
bool has_budget(const MemoryBudget& budget) { return !std::holds_alternative<std::monostate>(budget); }

const char* to_string(SplitMethod split) { return split == SplitMethod::Native ? "native" : "torch"; }

const char* to_string(PeakOracle oracle) { return oracle == PeakOracle::Auto ? "auto" : "off"; }

const char* to_string(BufferReuse reuse) {
  switch (reuse) {
    case BufferReuse::Auto: return "auto";
    case BufferReuse::Inductor: return "inductor";
    case BufferReuse::None: return "none";
  }
  return "?";
}

const char* to_string(Compiler compiler) {
  switch (compiler) {
    case Compiler::Eager: return "eager";
    case Compiler::Inductor: return "inductor";
  }
  return "?";
}

double effective_lambda(const MinCutConfig& mincut) {
  return mincut.lambda ? *mincut.lambda : mincut.hardware.memory_bandwidth / 4.0;
}

OpPolicyTable effective_op_policy(const Config& config, const OpPolicyTable& base) {
  if (config.op_policy_override.empty()) return base;
  return merge_op_policy(base, config.op_policy_override);
}

std::string config_to_json(const Config& config) {
  json section = json::object();
  json selection = json::object();
  for (const auto& option : option_keys()) {
    json value = option.write(config);
    if (value.is_null()) continue;
    (std::string(option.group) == "selection" ? selection : section)[option.nested] = std::move(value);
  }
  section["selection"] = selection;
  json document;
  document["activation_checkpoint"] = section;
  if (!config.op_policy_override.empty()) document["op_policy"] = json::parse(config.op_policy_override);
  if (config.adapter_given) document["adapter"] = {{"include", config.adapter_include}, {"exclude", config.adapter_exclude}};
  return document.dump();
}

}  // namespace hyper_ac
