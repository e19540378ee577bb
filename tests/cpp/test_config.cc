#include <catch2/catch.hpp>

#include "hyper_ac/config.h"

using namespace hyper_ac;

TEST_CASE("parses the nested activation_checkpoint section", "[config]") {
  Config c = parse_config(R"({"activation_checkpoint": {"mode": "selective",
      "selection": {"source": "blocks", "layer_count": 2},
      "regions": {"include": ["*.mlp"], "exclude": ["*.mlp.act"], "output_recompute": true},
      "save_forward_all_gather": true}})");
  CHECK(c.mode == Mode::Selective);
  CHECK(*c.scope.unit_count == 2);
  CHECK(c.scope.include == std::vector<std::string>{"*.mlp"});
  CHECK(c.scope.exclude == std::vector<std::string>{"*.mlp.act"});
  CHECK(c.scope.output_recompute == std::vector<std::string>{"*"});
  CHECK(c.save_forward_all_gather);
}

TEST_CASE("parses the flat pass-config form", "[config]") {
  Config c = parse_config(R"({"ac_mode": "full", "ac_layer_indices": [0, 2], "ac_save_forward_all_gather": false})");
  CHECK(c.mode == Mode::Full);
  CHECK(*c.scope.unit_indices == std::vector<std::int64_t>{0, 2});
}

TEST_CASE("reads YAML's unquoted off (false) as mode off", "[config]") {
  CHECK(parse_config(R"({"ac_mode": false})").mode == Mode::Off);
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": true})"), Catch::Contains("'on'/'yes'"));
}

TEST_CASE("config round-trips through canonical JSON", "[config]") {
  Config c = parse_config(R"({"activation_checkpoint": {"mode": "budget", "memory_budget": "6GiB", "hardware": "h100"}})");
  REQUIRE(std::holds_alternative<BudgetBytes>(c.mincut.memory_budget));
  CHECK(std::get<BudgetBytes>(c.mincut.memory_budget).bytes == 6.0 * 1073741824.0);
  CHECK(c.mincut.hardware.name == "h100");
  Config again = parse_config(config_to_json(c));
  CHECK(config_to_json(again) == config_to_json(c));
}

TEST_CASE("buffer_reuse: auto by default, written out in the canonical form", "[config]") {
  Config plain = parse_config(R"({"ac_mode": "auto"})");
  CHECK(plain.buffer_reuse == BufferReuse::Auto);
  CHECK(config_to_json(plain).find(R"("buffer_reuse":"auto")") != std::string::npos);
  Config nested = parse_config(R"({"activation_checkpoint": {"mode": "full", "buffer_reuse": "inductor"}})");
  CHECK(nested.buffer_reuse == BufferReuse::Inductor);
  Config flat = parse_config(R"({"ac_mode": "full", "ac_buffer_reuse": "none"})");
  CHECK(flat.buffer_reuse == BufferReuse::None);
  CHECK(parse_config(config_to_json(flat)).buffer_reuse == BufferReuse::None);
  CHECK_THROWS_WITH(parse_config(R"({"ac_buffer_reuse": "never"})"),
                    Catch::Contains("'ac_buffer_reuse'") && Catch::Contains("unknown buffer_reuse 'never'"));
  CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"buffer_reuse": false}})"),
                    Catch::Contains("activation_checkpoint.buffer_reuse") && Catch::Contains("must be a string"));
}

TEST_CASE("config errors name the key", "[config][errors]") {
  SECTION("unknown key with did-you-mean") {
    CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"mdoe": "full"}})"),
                      Catch::Contains("activation_checkpoint.mdoe") && Catch::Contains("did you mean 'mode'"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_cont": 2})"), Catch::Contains("did you mean 'ac_layer_count'"));
  }
  SECTION("wrong types") {
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": 3})"), Catch::Contains("'ac_mode'") && Catch::Contains("must be a string"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_count": true})"), Catch::Contains("got a boolean"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_count": "2"})"), Catch::Contains("must be an integer"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_save_forward_all_gather": "yes"})"), Catch::Contains("true or false"));
    CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"regions": {"include": [1]}}})"),
                      Catch::Contains("regions.include") && Catch::Contains("strings"));
  }
  SECTION("unknown values") {
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "fast"})"), Catch::Contains("unknown mode 'fast'"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_region_source": "magic"})"), Catch::Contains("unknown source 'magic'"));
    CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"hardware": "tpu"}})"), Catch::Contains("unknown hardware profile"));
  }
  SECTION("bad layer selections") {
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_count": -1})"), Catch::Contains(">= 0"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_indices": [1, 1]})"), Catch::Contains("duplicate unit index 1"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_indices": [true]})"), Catch::Contains("boolean"));
  }
  SECTION("conflicting options") {
    CHECK_THROWS_WITH(parse_config(R"({"ac_layer_count": 1, "ac_layer_indices": [0]})"), Catch::Contains("both layer_count and layer_indices"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "full", "activation_checkpoint": {}})"), Catch::Contains("mixes"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "budget"})"), Catch::Contains("needs a memory_budget"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "full", "ac_memory_budget": 0.5})"), Catch::Contains("only used by mode 'budget'"));
  }
  SECTION("bad sizes") {
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "budget", "ac_memory_budget": "6 parsecs"})"), Catch::Contains("unknown size unit"));
    CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "budget", "ac_memory_budget": -2})"), Catch::Contains("positive"));
  }
  SECTION("bad op policy") {
    CHECK_THROWS_WITH(parse_config(R"({"op_policy": {"must_saev": []}})"), Catch::Contains("did you mean 'must_save'"));
  }
  SECTION("not JSON") { CHECK_THROWS_AS(parse_config("{"), ConfigError); }
  SECTION("a number past double range names the key (issue 14)") {
    CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"mode": "auto", "lambda": 1e999}})"),
                      Catch::Contains("config key 'activation_checkpoint.lambda': number 1e999 is out of range"));
  }
  SECTION("a key given twice in one object is refused, not last-wins (issue 14)") {
    CHECK_THROWS_WITH(parse_config(R"({"activation_checkpoint": {"mode": "full", "mode": "off"}})"),
                      Catch::Contains("config key 'activation_checkpoint.mode': given twice"));
    CHECK_THROWS_WITH(parse_op_policy(R"({"must_save": [], "must_save": []})"),
                      Catch::Contains("config key 'must_save': given twice"));
  }
}

TEST_CASE("op policy override replaces only the named categories", "[config]") {
  OpPolicyTable base = parse_op_policy(R"({"must_save": ["aten::mm"], "must_recompute": ["aten::topk"]})");
  Config c = parse_config(R"({"ac_mode": "selective", "op_policy": {"must_save": ["aten::bmm"]}})");
  OpPolicyTable table = effective_op_policy(c, base);
  CHECK(table.must_save == std::vector<std::string>{"aten::bmm"});
  CHECK(table.must_recompute == std::vector<std::string>{"aten::topk"});
}

// Issue 14: every float a config sets is finite and in its stated range
// (docs/config.md), and the message says what was read.
TEST_CASE("config floats: finite, in range, and the message says what was read", "[config][errors][numeric]") {
  auto hardware = [](const std::string& flops, const std::string& bandwidth) {
    return R"({"ac_mode": "auto", "ac_hardware": {"peak_flops": )" + flops + R"(, "memory_bandwidth": )" + bandwidth + "}}";
  };
  CHECK_THROWS_WITH(parse_config(hardware("1e-300", "1e12")),
                    Catch::Contains("ac_hardware.peak_flops") && Catch::Contains("[1, 1e+30]") && Catch::Contains("1e-300"));
  CHECK_THROWS_WITH(parse_config(hardware("1e14", "1e31")),
                    Catch::Contains("ac_hardware.memory_bandwidth") && Catch::Contains("1e+31"));
  CHECK_THROWS_WITH(parse_config(hardware("\"1e15\"", "1e12")),
                    Catch::Contains("the string \"1e15\"") && Catch::Contains("write 1.0e+15"));
  const Config edge = parse_config(hardware("1", "1e30"));
  CHECK(edge.mincut.hardware.peak_flops == kMinHardwareSpeed);
  CHECK(edge.mincut.hardware.memory_bandwidth == kMaxHardwareSpeed);

  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "auto", "ac_lambda": 1e31})"),
                    Catch::Contains("'ac_lambda'") && Catch::Contains("1e+31") && Catch::Contains("[0, 1e+30]"));
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "auto", "ac_lambda": -1})"), Catch::Contains("got -1"));
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "auto", "ac_lambda": "1e15"})"),
                    Catch::Contains("the string \"1e15\"") && Catch::Contains("1.0e+15"));
  CHECK(*parse_config(R"({"ac_mode": "auto", "ac_lambda": 1e30})").mincut.lambda == kMaxLambda);

  // A number past the double range is a ConfigError, not the JSON library's out_of_range.
  CHECK_THROWS_AS(parse_config(R"({"ac_mode": "auto", "ac_lambda": 1e309})"), ConfigError);
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "auto", "ac_lambda": 1e309})"), Catch::Contains("1e309"));

  // memory_budget: any finite positive size; one past 2^63 bytes is "no limit" (budget_target, plan_budget.cc).
  const Config huge = parse_config(R"({"ac_mode": "budget", "ac_memory_budget": 1e19})");
  REQUIRE(std::holds_alternative<BudgetBytes>(huge.mincut.memory_budget));
  CHECK(std::get<BudgetBytes>(huge.mincut.memory_budget).bytes == 1e19);
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "budget", "ac_memory_budget": "1e300TiB"})"),
                    Catch::Contains("past the double range"));
  CHECK_THROWS_AS(parse_config(R"({"ac_mode": "budget", "ac_memory_budget": "1e400"})"), ConfigError);
}

// The canonical form carries every resolved value (issue 23): the defaults a
// caller would otherwise restate are written out, from the option table.
TEST_CASE("the canonical form writes every option with its default resolved", "[config][canonical]") {
  const std::string text = config_to_json(parse_config(R"({"ac_mode": "auto"})"));
  for (const char* field : {R"("mode":"auto")", R"("compiler":"eager")", R"("split":"native")", R"("buffer_reuse":"auto")",
                            R"("rng":"replay")", R"("scope":"auto")", R"("source":"blocks")",
                            R"("save_forward_all_gather":false)", R"("hardware":{)", R"("regions":{)"})
    CHECK(text.find(field) != std::string::npos);
  // Unset optional values stay out: lambda is derived (config_facts), the rest have no default.
  for (const char* field : {"lambda", "layer_count", "layer_indices", "memory_budget"})
    CHECK(text.find(std::string("\"") + field + "\"") == std::string::npos);
}

TEST_CASE("config_facts derives what callers act on", "[config][facts]") {
  const ConfigFacts off = config_facts(parse_config(R"({"ac_mode": "off"})"));
  CHECK_FALSE(off.plans);
  CHECK(off.inductor_buffer_reuse);  // auto: stock's reuse in mode off
  CHECK(off.inductor_backward_horizontal_fusion);  // mode off: stock's backward, fused as stock fuses it
  const ConfigFacts automatic = config_facts(parse_config(R"({"ac_mode": "auto", "ac_hardware": "h100"})"));
  CHECK(automatic.plans);
  CHECK(automatic.compare_with_stock);
  CHECK_FALSE(automatic.inductor_buffer_reuse);
  CHECK_FALSE(automatic.inductor_backward_horizontal_fusion);  // no replay fused into an earlier backward
  CHECK_FALSE(config_facts(parse_config(R"({"ac_mode": "full"})")).inductor_backward_horizontal_fusion);
  CHECK_FALSE(automatic.lambda_configured);
  CHECK(automatic.lambda == 3.35e12 / 4.0);
  CHECK_FALSE(config_facts(parse_config(R"({"ac_mode": "full"})")).compare_with_stock);
  // A byte budget bounds the step's peak, except under unit_graph (each planned graph's saved bytes).
  CHECK(automatic.budget_bounds_step_peak);
  CHECK(config_facts(parse_config(R"({"ac_mode": "budget", "ac_scope": "whole_graph", "ac_memory_budget": 0.5})"))
            .budget_bounds_step_peak);
  CHECK_FALSE(config_facts(parse_config(R"({"ac_mode": "budget", "ac_scope": "unit_graph", "ac_memory_budget": 0.5})"))
                  .budget_bounds_step_peak);
  CHECK(config_facts(parse_config(R"({"ac_mode": "full", "ac_buffer_reuse": "inductor"})")).inductor_buffer_reuse);
  // A graph routed to stock compiles as mode off would: stock's reuse and fusion, bar an explicit buffer_reuse.
  CHECK(automatic.stock_route_inductor_buffer_reuse);
  CHECK(automatic.stock_route_inductor_backward_horizontal_fusion);
  const ConfigFacts no_reuse = config_facts(parse_config(R"({"ac_mode": "full", "ac_buffer_reuse": "none"})"));
  CHECK_FALSE(no_reuse.stock_route_inductor_buffer_reuse);
  CHECK(no_reuse.stock_route_inductor_backward_horizontal_fusion);
  // Every mode that plans compares each block with stock under unit_graph (keep_unit_under_stock).
  CHECK(config_facts(parse_config(R"({"ac_mode": "full", "ac_scope": "unit_graph"})")).compare_with_stock);
  CHECK(config_facts(parse_config(R"({"ac_mode": "budget", "ac_scope": "unit_graph", "ac_memory_budget": 0.9})"))
            .compare_with_stock);
  CHECK_FALSE(config_facts(parse_config(R"({"ac_mode": "off", "ac_scope": "unit_graph"})")).compare_with_stock);
  // The runner: an eager config planned for Inductor takes it; buffer_reuse under eager is a warning.
  ConfigFactsOptions inductor;
  inductor.runner = Compiler::Inductor;
  CHECK(config_facts(parse_config(R"({"ac_mode": "auto"})"), inductor).compiler == Compiler::Inductor);
  ConfigFactsOptions eager;
  eager.runner = Compiler::Eager;
  CHECK(config_facts(parse_config(R"({"ac_mode": "auto", "ac_compiler": "inductor"})"), eager).compiler ==
        Compiler::Inductor);
  const ConfigFacts warned = config_facts(parse_config(R"({"ac_mode": "auto", "ac_buffer_reuse": "none"})"), eager);
  REQUIRE(warned.warnings.size() == 1);
  CHECK(warned.warnings[0].find("buffer_reuse: none applies to compiler='inductor' only") != std::string::npos);
  CHECK(config_facts(parse_config(R"({"ac_mode": "auto", "ac_buffer_reuse": "none"})"), inductor).warnings.empty());
  CHECK_THROWS_WITH(parse_compiler_name("tvm"), Catch::Contains("compiler must be") && Catch::Contains("'tvm'"));
}
