#include <catch2/catch.hpp>

#include <map>

#include "hyper_ac/plan.h"
#include "hyper_ac/tagging.h"
#include "sample_graphs.h"

using namespace hyper_ac;
using namespace hyper_ac::testing;

namespace {

PlanResult run(const GraphBuilder& b, const std::string& config) {
  PlanOptions options;
  options.config = parse_config(config);
  options.op_policy = parse_op_policy(kTable);
  return plan(b.graph(), options);
}

std::map<std::string, std::string> policies(const GraphBuilder& b, const PlanResult& r) {
  std::map<std::string, std::string> out;
  Graph g = b.graph();
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (r.policies[i] != Policy::None) out[g.nodes[i].name] = to_string(r.policies[i]);
  return out;
}

std::string annotated(const GraphBuilder& b, const PlanResult& r) {
  Graph g = b.graph();
  PrintOptions print;
  print.show_sizes = false;
  print.annotations = policy_annotations(g, r);
  return print_graph(g, print);
}

}  // namespace

TEST_CASE("op_matches accepts names with and without overload", "[tagging]") {
  CHECK(op_matches({"aten::mm"}, "aten::mm.default"));
  CHECK(op_matches({"aten::mm.default"}, "aten::mm.default"));
  CHECK_FALSE(op_matches({"aten::mm"}, "aten::mm_.default"));
  CHECK_FALSE(op_matches({"aten::mm.out"}, "aten::mm.default"));
  CHECK(op_matches({"operator.getitem"}, "operator.getitem"));
}

TEST_CASE("mode off leaves the graph untouched", "[tagging][golden]") {
  auto b = two_units();
  auto r = run(b, R"({"ac_mode": "off"})");
  CHECK(policies(b, r).empty());
  CHECK(r.remat.duplicates.empty());
}

TEST_CASE("selective: op table saves matmuls, cross-unit values stay saved", "[tagging][golden]") {
  auto b = two_units();
  auto r = run(b, kSelective);
  auto p = policies(b, r);
  CHECK(p["mm0"] == "MUST_SAVE");
  CHECK(p["relu0"] == "PREFER_RECOMPUTE");
  CHECK(p["mul0"] == "MUST_SAVE");  // read by layers.1
  CHECK(p["mul1"] == "MUST_SAVE");  // read by the loss, outside every unit
  CHECK(p.count("loss") == 0);
  CHECK(r.tags.stats.saved_cross_unit == 2);
  CHECK(annotated(b, r).find("relu1 = call_function aten::relu.default(mm1) @layers.1.mlp  # PREFER_RECOMPUTE -> dup before g_mul1") != std::string::npos);
  CHECK(matches_golden("tag_selective", annotated(b, r)));
}

TEST_CASE("full: every scoped node must recompute", "[tagging][golden]") {
  auto b = two_units();
  auto r = run(b, kFull);
  auto p = policies(b, r);
  CHECK(p["mm0"] == "MUST_RECOMPUTE");
  CHECK(p["relu1"] == "MUST_RECOMPUTE");
  CHECK(p["mul0"] == "MUST_SAVE");
  CHECK(matches_golden("tag_full", annotated(b, r)));
}

TEST_CASE("layer selection narrows the tags", "[tagging][golden]") {
  auto b = two_units();
  auto count = policies(b, run(b, R"({"ac_mode": "full", "ac_layer_count": 1})"));
  CHECK(count.count("mm0") == 1);
  CHECK(count.count("mm1") == 0);
  auto indices = policies(b, run(b, R"({"ac_mode": "full", "ac_layer_indices": [1]})"));
  CHECK(indices.count("mm0") == 0);
  CHECK(indices["mm1"] == "MUST_RECOMPUTE");
  auto zero = run(b, R"({"ac_mode": "full", "ac_layer_count": 0})");
  CHECK(policies(b, zero).empty());
  CHECK(zero.diagnostics.at(0).message.find("zero units") != std::string::npos);
}

TEST_CASE("output_recompute exempts region outputs and chains adjacent replays", "[tagging][golden]") {
  auto b = two_units();
  auto off = run(b, kFull);
  auto on = run(b, R"({"activation_checkpoint": {"mode": "full", "regions": {"output_recompute": true}}})");
  CHECK(policies(b, on)["mul0"] == "MUST_RECOMPUTE");
  CHECK(policies(b, on)["mul1"] == "MUST_RECOMPUTE");
  // The boundary between the two units is no longer kept from the forward.
  auto saved_names = [&](const PlanResult& r) {
    std::vector<std::string> names;
    Graph g = b.graph();
    for (auto s : r.remat.saved) names.push_back(g.nodes[static_cast<std::size_t>(s)].name);
    return names;
  };
  auto off_saved = saved_names(off), on_saved = saved_names(on);
  CHECK(std::find(off_saved.begin(), off_saved.end(), "mul0") != off_saved.end());
  CHECK(std::find(on_saved.begin(), on_saved.end(), "mul0") == on_saved.end());
  CHECK(on.remat.stats.saved_bytes_after < off.remat.stats.saved_bytes_after);
  CHECK(matches_golden("tag_output_recompute", annotated(b, on)));
}

TEST_CASE("RNG, SymInt and collectives are saved in every mode", "[tagging][golden]") {
  GraphBuilder b;
  b.placeholder("x").placeholder("w", "parameter");
  b.op("drop", "aten::native_dropout.default", {"x"}, "layers.0", {{"rng", true}})
      .op("drop_out", "operator.getitem", {"drop"}, "layers.0", {{"aliased_inputs", {0}}})
      .op("size", "aten::sym_size.int", {"drop_out"}, "layers.0", {{"symint", true}})
      .op("a2a", "_c10d_functional::all_to_all_single.default", {"drop_out"}, "layers.0", {{"collective", true}})
      .op("wait", "_c10d_functional::wait_tensor.default", {"a2a"}, "layers.0", {{"collective", true}})
      .op("ag", "_c10d_functional::all_gather_into_tensor.default", {"wait"}, "layers.0", {{"collective", true}})
      .op("ag_wait", "_c10d_functional::wait_tensor.default", {"ag"}, "layers.0", {{"collective", true}})
      .op("relu", "aten::relu.default", {"ag_wait"}, "layers.0")
      .op("out", "aten::sum.default", {"relu"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
  b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
  for (const char* mode : {kFull, kSelective}) {
    auto p = policies(b, run(b, mode));
    CHECK(p["drop"] == "MUST_SAVE");
    CHECK(p["drop_out"] == "MUST_SAVE");  // getitem inherits
    CHECK(p["size"] == "MUST_SAVE");
    CHECK(p["a2a"] == "MUST_SAVE");
    CHECK(p["wait"] == "MUST_SAVE");     // wait_tensor inherits
    CHECK(is_recompute(run(b, mode).policies[static_cast<std::size_t>(b.index("ag"))]));  // all-gather follows the mode
  }
  auto with_ag = policies(b, run(b, R"({"ac_mode": "full", "ac_save_forward_all_gather": true})"));
  CHECK(with_ag["ag"] == "MUST_SAVE");
  CHECK(with_ag["ag_wait"] == "MUST_SAVE");
  CHECK(matches_golden("tag_structural", annotated(b, run(b, kFull))));
}

TEST_CASE("a collective the op table does not name is saved all the same, in every mode", "[tagging]") {
  // A broadcast and a symmetric-memory op (async TP's fused all-gather matmul): ops of a
  // communication namespace (graph field `collective`) outside saved_collectives / all_gathers.
  GraphBuilder b;
  b.placeholder("x").placeholder("w", "parameter");
  b.op("bcast", "_c10d_functional::broadcast.default", {"x"}, "layers.0", {{"collective", true}})
      .op("bcast_wait", "_c10d_functional::wait_tensor.default", {"bcast"}, "layers.0", {{"collective", true}})
      .op("fused", "symm_mem::fused_all_gather_matmul.default", {"bcast_wait", "w"}, "layers.0", {{"collective", true}})
      .op("relu", "aten::relu.default", {"fused"}, "layers.0")
      .op("out", "aten::sum.default", {"relu"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
  b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
  for (const char* mode : {kFull, kSelective, R"({"ac_mode": "budget", "ac_memory_budget": 0.1})"}) {
    INFO(mode);
    PlanResult r = run(b, mode);
    auto p = policies(b, r);
    CHECK(p["bcast"] == "MUST_SAVE");
    CHECK(p["bcast_wait"] == "MUST_SAVE");  // the wait inherits
    CHECK(p["fused"] == "MUST_SAVE");
    CHECK(r.tags.reasons[static_cast<std::size_t>(b.index("fused"))] == "collective");
    const Graph g = b.graph();
    for (const auto& dup : r.remat.duplicates) {
      const std::string& name = g.nodes[static_cast<std::size_t>(dup.of)].name;
      CHECK(name != "bcast");
      CHECK(name != "fused");
    }
  }
}

TEST_CASE("rng: replay tags a replayable random op by the mode; save pins it", "[tagging][rng]") {
  // 64-byte outputs (the builder's default): a 16-byte state is worth replaying,
  // a 5056-byte one is not, and 0 means not replayable at all.
  for (std::int64_t state : {std::int64_t{0}, std::int64_t{16}, std::int64_t{5056}}) {
    GraphBuilder b;
    b.placeholder("x").placeholder("w", "parameter");
    b.op("drop", "aten::native_dropout.default", {"x"}, "layers.0", {{"rng", true}, {"rng_state_bytes", state}})
        .op("drop_out", "operator.getitem", {"drop"}, "layers.0", {{"aliased_inputs", {0}}})
        .op("relu", "aten::relu.default", {"drop_out"}, "layers.0")
        .op("out", "aten::sum.default", {"relu"}, "layers.0");
    b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
    b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
    const auto drop = static_cast<std::size_t>(b.index("drop"));
    INFO("state bytes " << state);
    PlanResult replay = run(b, kFull);
    PlanResult save = run(b, R"({"ac_mode": "full", "ac_rng": "save"})");
    CHECK(save.policies[drop] == Policy::MustSave);
    CHECK(save.tags.reasons[drop] == "rng");
    CHECK(save.remat.rng_replays.empty());
    if (state == 16) {
      CHECK(replay.policies[drop] == Policy::MustRecompute);
      CHECK(replay.tags.reasons[drop] == "rng-replay");
      CHECK(replay.tags.stats.rng_replay_candidates == 1);
      REQUIRE(replay.remat.rng_replays.size() == 1);
      CHECK(replay.remat.rng_replays[0] == b.index("drop"));
      auto json_text = plan_to_json(b.graph(), replay);
      CHECK(json_text.find(R"("rng_replays":[{"of":"drop","state":"drop_rng_state","state_bytes":16}])") != std::string::npos);
      CHECK(json_text.find(R"("drop_rng_state")") != std::string::npos);
    } else {
      CHECK(replay.policies[drop] == Policy::MustSave);
      CHECK(replay.tags.reasons[drop] == "rng");
      CHECK(plan_to_json(b.graph(), replay).find("rng_replays") == std::string::npos);
    }
  }
  CHECK_THROWS_WITH(parse_config(R"({"ac_mode": "full", "ac_rng": "sometimes"})"),
                    Catch::Contains("ac_rng") && Catch::Contains("replay or save"));
}

TEST_CASE("in-place: the mutation, its users and readers of aliased storage are saved", "[tagging][golden]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("base", "aten::relu.default", {"x"}, "layers.0")
      .op("v1", "aten::view.default", {"base"}, "layers.0", {{"view", true}, {"aliased_inputs", {0}}})
      .op("v2", "aten::slice.Tensor", {"base"}, "layers.0", {{"view", true}, {"aliased_inputs", {0}}})
      .op("reader", "aten::exp.default", {"v2"}, "layers.0")
      .op("write", "aten::add_.Tensor", {"v1", "x"}, "layers.0", {{"mutated_inputs", {0}}, {"aliased_inputs", {0}}})
      .op("after", "aten::neg.default", {"write"}, "layers.0")
      .op("free", "aten::sin.default", {"x"}, "layers.0")
      .op("out", "aten::add.Tensor", {"after", "reader", "free"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward")
      .bwd("g1", "aten::mul.Tensor", {"t", "reader"})
      .bwd("g2", "aten::mul.Tensor", {"g1", "free"})
      .output({"out", "g2"});
  b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
  auto r = run(b, kFull);
  auto p = policies(b, r);
  CHECK(p["base"] == "MUST_SAVE");    // a replay would produce the value before the write
  CHECK(p["write"] == "MUST_SAVE");
  CHECK(p["after"] == "MUST_SAVE");
  CHECK(p["v1"] == "MUST_SAVE");      // reads the mutated base
  CHECK(p["v2"] == "MUST_SAVE");      // sibling view of the mutated base
  CHECK(p["reader"] == "MUST_SAVE");  // reads a sibling view: replay would see the write
  CHECK(p["free"] == "MUST_RECOMPUTE");
  CHECK(r.tags.reasons[static_cast<std::size_t>(b.index("reader"))] == "in-place");
  CHECK(matches_golden("tag_inplace", annotated(b, r)));
}

TEST_CASE("exclusions never recompute and rebuild their inputs in backward", "[tagging][golden]") {
  // layers.0: norm -> experts (excluded matmul) -> sq; the backward of the
  // excluded matmul reads its input, which is rebuilt rather than kept.
  GraphBuilder b;
  b.placeholder("x").placeholder("w", "parameter");
  b.op("norm", "aten::mul.Tensor", {"x"}, "layers.0.norm")
      .op("a2a", "_c10d_functional::all_to_all_single.default", {"norm"}, "layers.0.moe", {{"collective", true}})
      .op("gmm", "aten::_grouped_mm.default", {"a2a", "w"}, "layers.0.moe.experts")
      .op("act", "aten::silu.default", {"gmm"}, "layers.0.moe.experts")
      .op("sq", "aten::mul.Tensor", {"act"}, "layers.0.moe")
      .op("out", "aten::mean.default", {"sq"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward")
      .bwd("g_sq", "aten::mul.Tensor", {"t", "act"})
      .bwd("g_act", "aten::silu_backward.default", {"g_sq", "gmm"})
      .bwd("g_w", "aten::mm.default", {"a2a", "g_act"})
      .bwd("g_norm", "aten::mul.Tensor", {"g_act", "x"})
      .output({"out", "g_w", "g_norm"});
  b.model("Net", {{"layers.0", "Block"}, {"layers.0.norm", "Norm"}, {"layers.0.moe", "MoE"}, {"layers.0.moe.experts", "Experts"}},
          {{"layers.0", "Block"}});
  auto r = run(b, R"({"activation_checkpoint": {"mode": "full", "regions": {"exclude": ["*.experts"]}}})");
  auto p = policies(b, r);
  CHECK(p.count("gmm") == 0);
  CHECK(p.count("act") == 0);
  CHECK(p["a2a"] == "MUST_SAVE");
  CHECK(p["norm"] == "MUST_RECOMPUTE");
  CHECK(r.stats.rebuilt_for_exclude == 0);  // the excluded op reads a saved collective
  CHECK(matches_golden("tag_exclude", annotated(b, r)));

  // Without the collective in between, the excluded op's input is rebuilt.
  GraphBuilder c;
  c.placeholder("x").placeholder("w", "parameter");
  c.op("norm", "aten::mul.Tensor", {"x"}, "layers.0.norm")
      .op("mm", "aten::mm.default", {"norm", "w"}, "layers.0.proj")
      .op("mm2", "aten::mm.default", {"mm", "w"}, "layers.0.proj2")
      .op("out", "aten::mean.default", {"mm2"}, "layers.0");
  c.placeholder("t", "tangent", 4, "backward")
      .bwd("g_mm2", "aten::mm.default", {"t", "mm"})
      .bwd("g_w", "aten::mm.default", {"norm", "g_mm2"})
      .output({"out", "g_w"});
  c.model("Net", {{"layers.0", "Block"}, {"layers.0.norm", "Norm"}, {"layers.0.proj", "Linear"}, {"layers.0.proj2", "Linear"}},
          {{"layers.0", "Block"}});
  auto rc = run(c, R"({"activation_checkpoint": {"mode": "full", "regions": {"exclude": ["*.proj", "*.proj2"]}}})");
  CHECK(rc.stats.rebuilt_for_exclude == 1);
  Graph g = c.graph();
  REQUIRE(rc.remat.duplicates.size() == 1);
  CHECK(g.nodes[static_cast<std::size_t>(rc.remat.duplicates[0].of)].name == "norm");
  // The chain of excluded ops keeps what the backward reads (mm), not its input.
  std::vector<std::string> saved;
  for (auto s : rc.remat.saved) saved.push_back(g.nodes[static_cast<std::size_t>(s)].name);
  CHECK(std::find(saved.begin(), saved.end(), "norm") == saved.end());
  CHECK(std::find(saved.begin(), saved.end(), "mm") != saved.end());
}

TEST_CASE("readers of an input the step mutates are saved", "[tagging][golden]") {
  // AOTAutograd's buffer update: new = add(buf, 1) is a forward output copied
  // into buf after the forward; a replay of `scaled` would read the new value.
  GraphBuilder b;
  b.placeholder("x");
  GraphBuilder::NodeSpec buf;
  buf.kind = "placeholder";
  buf.target = "buf";
  buf.role = "buffer";
  buf.extra = {{"mutated", true}};
  b.add("buf", buf);
  b.op("new_buf", "aten::add.Tensor", {"buf"}, "layers.0")
      .op("scaled", "aten::mul.Tensor", {"x", "new_buf"}, "layers.0")
      .op("other", "aten::sin.default", {"x"}, "layers.0")
      .op("out", "aten::add.Tensor", {"scaled", "other"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward")
      .bwd("g", "aten::mul.Tensor", {"t", "new_buf"})
      .bwd("g2", "aten::mul.Tensor", {"g", "other"})
      .output({"new_buf", "out", "g2"});
  b.model("Net", {{"layers.0", "Block"}}, {{"layers.0", "Block"}});
  auto r = run(b, kFull);
  auto p = policies(b, r);
  CHECK(p["new_buf"] == "MUST_SAVE");
  CHECK(p["scaled"] == "MUST_RECOMPUTE");  // reads the saved new value, not the buffer
  CHECK(p["other"] == "MUST_RECOMPUTE");
  CHECK(matches_golden("tag_mutated_input", annotated(b, r)));
}

TEST_CASE("adapter regions narrow units and pull exclusions out", "[tagging]") {
  auto b = two_units();
  CHECK_THROWS_WITH(run(b, R"({"ac_mode": "full", "ac_region_source": "model_adapter_safe_regions"})"),
                    Catch::Contains("no model adapter"));
  auto r = run(b, R"({"ac_mode": "full", "ac_region_source": "model_adapter_safe_regions",
                      "adapter": {"include": ["*.mlp"], "exclude": []}})");
  auto p = policies(b, r);
  CHECK(p["mm0"] == "MUST_RECOMPUTE");
  CHECK(p.count("mul0") == 0);
  CHECK(r.scope.regions == std::vector<std::string>{"layers.0.mlp", "layers.1.mlp"});
}

// ---- cross-unit rule: every forward user counts, projections are walked ----

namespace {

// relu0 (layers.0) is read first by mul0 in its own unit, then by `reader`
// through `via` ("" = directly) in layers.1.
GraphBuilder cross_unit_late_reader(const std::string& via, bool reader_in_other_unit = true) {
  GraphBuilder b;
  b.placeholder("x", "input").placeholder("w0", "parameter").placeholder("w1", "parameter");
  b.op("mm0", "aten::mm.default", {"x", "w0"}, "layers.0.mlp")
      .op("relu0", "aten::relu.default", {"mm0"}, "layers.0.mlp")
      .op("mul0", "aten::mul.Tensor", {"relu0"}, "layers.0");  // first forward user: same unit
  std::string read = "relu0";
  if (!via.empty()) {
    b.op("proj", via, {"relu0"}, "layers.0.mlp");  // a projection inside layers.0
    read = "proj";
  }
  b.op("mm1", "aten::mm.default", {"mul0", "w1"}, "layers.1.mlp")
      .op("add1", "aten::add.Tensor", {"mm1", read}, reader_in_other_unit ? "layers.1" : "layers.0")
      .op("loss", "aten::sum.default", {"add1"});
  b.placeholder("tangent", "tangent", 4, "backward");
  b.bwd("g_add1", "aten::mul.Tensor", {"tangent", "add1"})
      .bwd("g_relu0", "aten::threshold_backward.default", {"g_add1", "relu0"})
      .bwd("g_w0", "aten::mm.default", {"x", "g_relu0"})
      .output({"loss", "g_w0"});
  b.model("Net", {{"layers.0", "Block"}, {"layers.0.mlp", "MLP"}, {"layers.1", "Block"}, {"layers.1.mlp", "MLP"}},
          {{"layers.0", "Block"}, {"layers.1", "Block"}});
  return b;
}

}  // namespace

TEST_CASE("cross-unit: a later reader in another unit saves the value, not only the first user",
          "[tagging][cross-unit]") {
  auto b = cross_unit_late_reader("");
  auto r = run(b, kSelective);
  CHECK(policies(b, r)["relu0"] == "MUST_SAVE");
  CHECK(r.tags.reasons[static_cast<std::size_t>(b.index("relu0"))] == std::string("cross-unit"));
  // Control: the same graph with the late reader inside layers.0 recomputes relu0.
  auto same = cross_unit_late_reader("", false);
  CHECK(policies(same, run(same, kSelective))["relu0"] == "PREFER_RECOMPUTE");
}

TEST_CASE("cross-unit: the check walks through getitem and wait_tensor projections", "[tagging][cross-unit]") {
  for (const char* via : {"operator.getitem", "_c10d_functional::wait_tensor.default"}) {
    INFO("projection " << via);
    auto b = cross_unit_late_reader(via);
    auto r = run(b, kSelective);
    auto p = policies(b, r);
    CHECK(p["relu0"] == "MUST_SAVE");
    CHECK(r.tags.reasons[static_cast<std::size_t>(b.index("relu0"))] == std::string("cross-unit"));
    auto same = cross_unit_late_reader(via, false);
    CHECK(policies(same, run(same, kSelective))["relu0"] == "PREFER_RECOMPUTE");
  }
}

TEST_CASE("the model's own tags seed the policies; the region boundary is saved", "[tagging]") {
  // Two user checkpoint regions (ac_graph_id 0 and 1) over the two units.
  GraphBuilder b;
  b.placeholder("x", "input").placeholder("w0", "parameter").placeholder("w1", "parameter");
  auto tag = [](const char* policy, int id) { return json{{"policy", policy}, {"ac_graph_id", id}}; };
  b.op("mm0", "aten::mm.default", {"x", "w0"}, "layers.0.mlp", tag("PREFER_RECOMPUTE", 0))
      .op("relu0", "aten::relu.default", {"mm0"}, "layers.0.mlp", tag("PREFER_RECOMPUTE", 0))
      .op("mul0", "aten::mul.Tensor", {"relu0"}, "layers.0", tag("PREFER_RECOMPUTE", 0))
      .op("mm1", "aten::mm.default", {"mul0", "w1"}, "layers.1.mlp", tag("PREFER_RECOMPUTE", 1))
      .op("relu1", "aten::relu.default", {"mm1"}, "layers.1.mlp", tag("MUST_SAVE", 1))
      .op("mul1", "aten::mul.Tensor", {"relu1"}, "layers.1")
      .op("loss", "aten::sum.default", {"mul1"});
  b.placeholder("tangent", "tangent", 4, "backward");
  b.bwd("g_mul1", "aten::mul.Tensor", {"tangent", "relu1"})
      .bwd("g_relu1", "aten::threshold_backward.default", {"g_mul1", "relu1"})
      .bwd("g_w1", "aten::mm.default", {"mul0", "g_relu1"})
      .bwd("g_mul0", "aten::mm.default", {"g_relu1", "w1"})
      .bwd("g_relu0", "aten::threshold_backward.default", {"g_mul0", "relu0"})
      .bwd("g_w0", "aten::mm.default", {"x", "g_relu0"})
      .output({"loss", "g_w0", "g_w1"});
  b.model("Net", {{"layers.0", "Block"}, {"layers.0.mlp", "MLP"}, {"layers.1", "Block"}, {"layers.1.mlp", "MLP"}},
          {{"layers.0", "Block"}, {"layers.1", "Block"}});
  for (const char* mode : {kSelective, kFull, R"({"ac_mode": "auto"})"}) {
    auto r = run(b, mode);
    auto p = policies(b, r);
    CAPTURE(mode);
    // selective's op table would save mm0; the model's PREFER_RECOMPUTE wins (never less checkpointed).
    CHECK(p["mm0"] == "MUST_RECOMPUTE");
    CHECK(p["relu0"] == "MUST_RECOMPUTE");
    CHECK(p["mul0"] == "MUST_SAVE");    // read by mm1 of the later region: PyTorch's boundary rule
    CHECK(p["relu1"] == "MUST_SAVE");   // the model's MUST_SAVE, even in full
    CHECK(r.tags.stats.user_tagged == 5);
    CHECK(r.tags.stats.saved_user_boundary == 1);
  }
  // off leaves the tags to PyTorch's partitioner.
  CHECK(policies(b, run(b, R"({"ac_mode": "off"})")).empty());
}

TEST_CASE("a model MUST_RECOMPUTE on an RNG op is a conflict naming the node", "[tagging]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("drop", "aten::native_dropout.default", {"x"}, "layers.0",
       {{"rng", true}, {"policy", "MUST_RECOMPUTE"}, {"ac_graph_id", 0}})
      .op("relu", "aten::relu.default", {"drop"}, "layers.0")
      .op("out", "aten::sum.default", {"relu"}, "layers.0");
  b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
  b.model("Net", {{"layers.0", "Block"}, {"layers.1", "Block"}}, {{"layers.0", "Block"}, {"layers.1", "Block"}});
  CHECK_THROWS_AS(run(b, R"({"ac_mode": "auto"})"), PolicyConflictError);
  CHECK_THROWS_WITH(run(b, R"({"ac_mode": "auto"})"),
                    Catch::Matchers::Contains("node 'drop'") && Catch::Matchers::Contains("RNG op"));
  // A preference loses to the RNG rule without an error.
  GraphBuilder soft;
  soft.placeholder("x");
  soft.op("drop", "aten::native_dropout.default", {"x"}, "", {{"rng", true}, {"policy", "PREFER_RECOMPUTE"}})
      .op("relu", "aten::relu.default", {"drop"})
      .op("out", "aten::sum.default", {"relu"});
  soft.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
  CHECK(policies(soft, run(soft, R"({"ac_mode": "auto"})"))["drop"] == "MUST_SAVE");
}

TEST_CASE("correctness pins: rng, in-place and collective saves, never the cost-driven ones", "[tagging]") {
  GraphBuilder b;
  b.placeholder("x");
  b.op("drop", "aten::native_dropout.default", {"x"}, "", {{"rng", true}})
      .op("relu", "aten::relu.default", {"drop"})
      .op("out", "aten::sum.default", {"relu"});
  b.placeholder("t", "tangent", 4, "backward").bwd("g", "aten::threshold_backward.default", {"t", "relu"}).output({"out", "g"});
  const Graph graph = b.graph();
  const PlanResult r = run(b, R"({"ac_mode": "full", "ac_scope": "whole_graph", "ac_rng": "save"})");
  std::size_t drop = 0;
  while (graph.nodes[drop].name != "drop") ++drop;
  REQUIRE(r.tags.reasons[drop] == "rng");
  CHECK(is_correctness_reason(r.tags.reasons[drop]));
  CHECK(is_correctness_reason("in-place"));
  CHECK(is_correctness_reason("collective"));
  for (const char* reason : {"cross-unit", "user", "user-boundary", "symint", "inherited", ""}) {
    INFO(reason);
    CHECK_FALSE(is_correctness_reason(reason));
  }
  CHECK(correctness_reasons().size() == 3);
}
