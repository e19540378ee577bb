// The pass configuration: parsed from JSON (the Python side turns YAML into
// JSON; the CLI reads JSON directly), validated with errors that name the key.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "hyper_ac/scope.h"

namespace hyper_ac {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class Mode { Off, Full, Selective, Auto, Budget };
const char* to_string(Mode mode);

// What happens to a replayable random op (Node::rng_state_bytes > 0) inside a
// region: `replay` makes it a recompute candidate whose duplicate reruns it
// under the generator state saved before the forward draw; `save` keeps its
// output (MUST_SAVE), as for random ops that cannot be replayed.
enum class RngPolicy { Replay, Save };
const char* to_string(RngPolicy rng);

// Operator policy table for `selective` (configs/op_policy.yaml). Entries are
// operator names with or without overload ("aten::mm" matches "aten::mm.default").
struct OpPolicyTable {
  std::vector<std::string> must_save;
  std::vector<std::string> must_recompute;
  std::vector<std::string> prefer_save;
  // Collectives always saved (all-to-all, reduce-scatter, in-place allreduce, MoE dispatch/combine).
  std::vector<std::string> saved_collectives;
  // Forward all-gathers, saved only with save_forward_all_gather.
  std::vector<std::string> all_gathers;
  // Ops whose policy is inherited from their producer (getitem, wait_tensor).
  std::vector<std::string> transparent;
};

// The compiler that will run the planned graph: it decides which ops share a
// kernel, hence what a replay costs (cost.h). `eager` runs every FX node as its
// own kernel; `inductor` fuses connected pointwise/reduction/view chains.
enum class Compiler { Eager, Inductor };
const char* to_string(Compiler compiler);

// How the backend splits the rewritten joint graph into its forward and
// backward modules (config key `split`): `native` builds them from the core's
// split (split.h), `torch` with PyTorch's _extract_fwd_bwd_modules, for
// comparison. The plan does not depend on it.
enum class SplitMethod { Native, Torch };
const char* to_string(SplitMethod split);

// Inductor's buffer reuse in the graphs hyper_ac.backend(compiler="inductor")
// compiles (config key `buffer_reuse`). Inductor may keep a dead buffer
// allocated until a later buffer of the same size takes it over, trusting its
// own peak estimate; the plan's simulated lifetimes free it at its last use.
// `auto`: Inductor's reuse in mode off (stock), none in every other mode;
// `inductor`: Inductor's reuse in every mode; `none`: no reuse in any mode.
enum class BufferReuse { Auto, Inductor, None };
const char* to_string(BufferReuse reuse);

// Where a plan's step peak comes from besides the core's simulation (config
// key `peak_oracle`): `auto` asks the compiler that runs the graph, where the
// caller can (hyper_ac.backend(compiler="inductor") on CPU: Inductor's dry
// run, PlanOptions::peak_oracle), for the budget's search and the
// never-above-stock guard; `off`: the simulation alone (no extra compiles).
enum class PeakOracle { Auto, Off };
const char* to_string(PeakOracle oracle);

// Roofline hardware profile for recompute cost (min-cut modes).
// Accepted ranges of the floats a config sets (docs/config.md): anything else,
// and any non-finite value, is a ConfigError naming the key.
constexpr double kMinHardwareSpeed = 1.0;     // peak_flops (FLOP/s), memory_bandwidth (bytes/s)
constexpr double kMaxHardwareSpeed = 1.0e30;
constexpr double kMaxLambda = 1.0e30;         // lambda in [0, kMaxLambda] bytes per second

struct HardwareProfile {
  std::string name = "cpu";
  double peak_flops = 1.0e11;         // FLOP/s, in [kMinHardwareSpeed, kMaxHardwareSpeed]
  double memory_bandwidth = 2.0e10;   // bytes/s, same range
  // `hardware: measured` (the name "measured", as a string or an object's
  // name): replays are priced by each node's measured_seconds (graph.h), the
  // roofline above only where a node has none (cost.h), and `auto` aims at
  // the knee "least peak at <= 1.02x step time" (plan.h, kKneeSlowdown).
  bool measured = false;
};

// The `budget` mode target. A number in (0, 1] is a fraction of the
// all-saved activation bytes; a larger number or a size string ("6GiB") is bytes.
struct BudgetFraction {
  double fraction = 0.0;  // 0 < fraction <= 1
};
struct BudgetBytes {
  double bytes = 0.0;  // > 0 and finite; at or past 2^63 (more than any peak) it means no limit
};
// std::monostate = no budget (every mode but `budget`).
using MemoryBudget = std::variant<std::monostate, BudgetFraction, BudgetBytes>;
bool has_budget(const MemoryBudget& budget);

struct MinCutConfig {
  // Weight of recompute time against saved bytes: the cut minimises
  // saved bytes + lambda * recompute seconds. Unset = memory_bandwidth / 4 of
  // the hardware profile: a pointwise op (cost ~ bytes moved / bandwidth) is
  // then recomputed when its output is larger than a quarter of what it reads
  // and writes, and a matmul only when its K is below ~8 x peak_flops /
  // bandwidth (see docs/config.md).
  std::optional<double> lambda;
  HardwareProfile hardware;
  // Fusion assumption of the recompute cost (config key `compiler`).
  Compiler compiler = Compiler::Eager;
  // `budget` mode only: the simulated-peak target (see MemoryBudget).
  MemoryBudget memory_budget;
};

// The lambda in force: the configured one, else memory_bandwidth / 4.
double effective_lambda(const MinCutConfig& mincut);

struct Config {
  Mode mode = Mode::Off;
  std::string region_source = "blocks";  // or "model_adapter_safe_regions"
  ScopeOptions scope;
  bool save_forward_all_gather = false;
  RngPolicy rng = RngPolicy::Replay;  // `rng: replay | save`
  SplitMethod split = SplitMethod::Native;  // `split: native | torch` (read by the Python backend)
  BufferReuse buffer_reuse = BufferReuse::Auto;  // `buffer_reuse: auto | inductor | none` (read by the Python backend)
  PeakOracle peak_oracle = PeakOracle::Auto;     // `peak_oracle: auto | off` (read by the Python backend)
  // The config's op_policy section (canonical JSON), empty when absent: the
  // categories it names replace those of the default table.
  std::string op_policy_override;
  MinCutConfig mincut;
  // Region patterns from a registered ModelAdapter (hyper_ac.config
  // fills them from the live model's type). Used when selection.source is
  // model_adapter_safe_regions, or when no regions.include is configured.
  std::vector<std::string> adapter_include;
  std::vector<std::string> adapter_exclude;
  bool adapter_given = false;
};

// Accepts the nested form ({"activation_checkpoint": {...}}) or the flat
// pass-config form (ac_mode, ac_layer_count, ...). Throws ConfigError with a
// did-you-mean for unknown keys.
Config parse_config(const std::string& json_text);

// Parses an op policy table; throws ConfigError.
OpPolicyTable parse_op_policy(const std::string& json_text);
// Later-listed categories of `override_table` replace those of `base`.
OpPolicyTable merge_op_policy(const OpPolicyTable& base, const std::string& override_json);

// The table in force: `base` with the config's op_policy categories replacing its own.
OpPolicyTable effective_op_policy(const Config& config, const OpPolicyTable& base);

// Canonical JSON of a config: every option with its resolved value (defaults
// written out), from the same option table that parses it; an optional value
// left unset (layer_count / layer_indices, memory_budget, lambda) is omitted.
std::string config_to_json(const Config& config);

// Parses a compiler name ("eager" | "inductor"); throws ConfigError naming `key`.
// The one check of a compiler name, for the config key and for a backend's argument.
Compiler parse_compiler_name(const std::string& name, const std::string& key = "compiler");

// `config` planned for the compiler that will run its graph (a backend's
// `compiler` argument): a config on the default (eager) takes `runner`, one
// that names inductor keeps it.
Config with_runner(Config config, Compiler runner);

// The `buffer_reuse` rule: whether Inductor may reuse buffers in the graphs it
// compiles for `config`. auto: only in mode off (stock), because elsewhere a
// reused buffer can outlive the plan's simulated lifetimes.
bool inductor_buffer_reuse(const Config& config);

// Whether Inductor may fuse independent kernels side by side (horizontal
// fusion) in the backward graphs it compiles for `config`: only in mode off.
// A horizontally fused kernel runs where its earliest part would, so a unit's
// replay fused with the next unit's (they read the same weights or rotary
// tables) runs before that unit's backward and stays live through it: on the
// bench models that raised `full`'s measured peak by 20-25% (docs/floor.md).
bool inductor_backward_horizontal_fusion(const Config& config);

// What a config resolves to, derived once here so that callers (the Python
// backend, the CLI) only read it.
struct ConfigFactsOptions {
  // The compiler that will run the graph, when the caller knows it (a
  // backend's `compiler`): the facts are then those of with_runner(config, runner).
  std::optional<Compiler> runner;
};

struct ConfigFacts {
  Mode mode = Mode::Off;
  // mode != off: the caller plans each graph; off: it hands every graph to
  // stock without planning (the plan's route would be stock, reason "off").
  bool plans = false;
  // auto, and every mode that plans under scope unit_graph: the caller
  // measures the stock partition's recompute set and passes it as
  // PlanOptions::stock_recomputed ("never worse than stock").
  bool compare_with_stock = false;
  // A byte budget bounds the step's simulated peak (every scope but
  // unit_graph, whose budget bounds the bytes each planned graph saves): a
  // caller that calibrates a budget on the measured step's peak (hyper_ac.fit)
  // needs this.
  bool budget_bounds_step_peak = true;
  Compiler compiler = Compiler::Eager;  // the fusion assumption of the recompute cost (with the runner applied)
  SplitMethod split = SplitMethod::Native;
  BufferReuse buffer_reuse = BufferReuse::Auto;
  bool inductor_buffer_reuse = true;  // inductor_buffer_reuse(config)
  bool inductor_backward_horizontal_fusion = true;  // inductor_backward_horizontal_fusion(config)
  // The same two rules for a graph the plan routes to the stock partition
  // (PlanResult::route): it compiles as mode off would (stock torch.compile's
  // own settings, bar an explicit buffer_reuse), so a graph hyper_ac leaves
  // alone is compiled, not only partitioned, as stock's.
  bool stock_route_inductor_buffer_reuse = true;
  bool stock_route_inductor_backward_horizontal_fusion = true;
  // The caller that compiles with Inductor passes its dry run as
  // PlanOptions::peak_oracle: peak_oracle auto and a mode that plans.
  bool peak_oracle = false;
  double lambda = 0.0;                // effective_lambda
  bool lambda_configured = false;     // the config sets lambda (else derived from the hardware)
  HardwareProfile hardware;           // with `compiler`: the recompute cost options (CostOptions)
  // hardware: measured: a caller that serialises a graph for the plan (or
  // the frontier) times each op and writes it in (Node::measured_seconds).
  bool measure_op_times = false;
  RngPolicy rng = RngPolicy::Replay;
  // Notes for the runner: a setting that has no effect with it (buffer_reuse
  // under the eager compiler).
  std::vector<std::string> warnings;
};

ConfigFacts config_facts(const Config& config, const ConfigFactsOptions& options = {});
std::string config_facts_to_json(const ConfigFacts& facts);

// Parses "6GiB", "512MB", "1.5e9" into bytes; throws ConfigError naming `key`.
double parse_byte_size(const std::string& text, const std::string& key);

}  // namespace hyper_ac
