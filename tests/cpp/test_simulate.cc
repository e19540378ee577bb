// Memory simulator: exact timelines on small hand-built graphs.
#include <catch2/catch.hpp>

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "hyper_ac/remat.h"
#include "hyper_ac/simulate.h"

using namespace hyper_ac;

namespace {

using Bytes = std::vector<std::int64_t>;

// The timeline is off by default; these tests read it.
SimulateOptions timeline() {
  SimulateOptions options;
  options.record_timeline = true;
  return options;
}

class Net {
 public:
  void placeholder(const std::string& name, std::int64_t bytes, Role role, Phase phase = Phase::Forward) {
    Node node;
    node.kind = NodeKind::Placeholder;
    node.target = name;
    node.role = role;
    node.phase = phase;
    node.outputs = {{bytes, "float32", {bytes / 4}}};
    push(name, std::move(node));
  }
  Node& op(const std::string& name, const std::vector<std::string>& inputs, std::int64_t bytes,
           Phase phase = Phase::Forward) {
    Node node;
    node.target = "aten::op.default";
    node.phase = phase;
    node.outputs = {{bytes, "float32", {bytes / 4}}};
    for (const auto& input : inputs) node.inputs.push_back(ids_.at(input));
    return push(name, std::move(node));
  }
  Node& view(const std::string& name, const std::string& base, std::int64_t bytes) {
    Node& node = op(name, {base}, bytes);
    node.target = "aten::view.default";
    node.view = true;
    node.aliased_inputs = {0};
    return node;
  }
  void output(const std::vector<std::string>& inputs) {
    Node node;
    node.kind = NodeKind::Output;
    node.phase = Phase::Backward;
    for (const auto& input : inputs) node.inputs.push_back(ids_.at(input));
    push("output", std::move(node));
  }
  std::int32_t at(const std::string& name) const { return ids_.at(name); }
  Graph graph() const {
    Graph g = graph_;
    g.finalize();
    return g;
  }

 private:
  Node& push(const std::string& name, Node node) {
    node.name = name;
    node.id = static_cast<std::int64_t>(graph_.nodes.size());
    ids_[name] = static_cast<std::int32_t>(graph_.nodes.size());
    graph_.nodes.push_back(std::move(node));
    return graph_.nodes.back();
  }
  Graph graph_;
  std::map<std::string, std::int32_t> ids_;
};

}  // namespace

TEST_CASE("simulates a plain chain exactly", "[simulate]") {
  Net net;
  net.placeholder("x", 100, Role::Input);
  net.placeholder("w", 50, Role::Parameter);
  net.op("a", {"x", "w"}, 10);
  net.op("b", {"a"}, 20);
  net.op("c", {"b"}, 30);
  net.placeholder("t", 5, Role::Tangent, Phase::Backward);
  net.op("g", {"t", "a"}, 40, Phase::Backward);
  net.output({"c", "g"});
  Graph g = net.graph();
  SimulateResult r = simulate_memory(g, nullptr, timeline());
  CHECK(r.resident_bytes == 155);
  CHECK(r.timeline == Bytes{0, 0, 10, 30, 60, 40, 80, 70});
  CHECK(r.peak_bytes == 80);
  CHECK(r.peak_bytes_with_resident == 235);
  CHECK(r.peak_step == 6);
  CHECK(r.peak_node == net.at("g"));
  CHECK(r.boundary_step == 4);     // c, the last forward node
  CHECK(r.boundary_bytes == 40);   // a (read by g) and c (an output); b is dead
  CHECK(r.final_bytes == 70);
  CHECK(r.stats.steps == 8);
  CHECK(r.stats.storages == 4);
  CHECK(r.stats.resident_values == 3);
}

TEST_CASE("views and in-place results share their base's storage", "[simulate]") {
  Net net;
  net.placeholder("x", 100, Role::Input);
  net.op("a", {"x"}, 64);
  net.view("v", "a", 64);
  net.op("d", {"v"}, 32);
  Node& inplace = net.op("i", {"a", "d"}, 64);  // a.add_(d)
  inplace.target = "aten::add_.Tensor";
  inplace.mutated_inputs = {0};
  inplace.aliased_inputs = {0};
  net.op("e", {"i"}, 16);
  net.op("g", {"v"}, 8, Phase::Backward);  // reads the view: a's storage lives until here
  net.output({"e", "g"});
  Graph g = net.graph();
  SimulateResult r = simulate_memory(g, nullptr, timeline());
  CHECK(r.timeline == Bytes{0, 64, 64, 96, 96, 80, 88, 24});
  CHECK(r.peak_bytes == 96);
  CHECK(r.peak_step == 3);
  CHECK(r.boundary_bytes == 80);
  CHECK(r.final_bytes == 24);
  CHECK(r.stats.aliasing_steps == 2);
  CHECK(r.stats.storages == 4);  // a (with v, i), d, e, g
}

TEST_CASE("aliases of parameters stay resident; unread values die at once", "[simulate]") {
  Net net;
  net.placeholder("w", 50, Role::Parameter);
  net.placeholder("buf", 8, Role::Buffer);
  net.placeholder("x", 20, Role::Input);
  net.view("wt", "w", 50);
  Node& update = net.op("upd", {"buf", "x"}, 8);  // buf.add_(x): in-place on a buffer
  update.mutated_inputs = {0};
  update.aliased_inputs = {0};
  net.op("dead", {"x"}, 1000);  // nobody reads it
  net.op("m", {"x", "wt"}, 12);
  net.output({"m"});
  Graph g = net.graph();
  SimulateResult r = simulate_memory(g, nullptr, timeline());
  CHECK(r.resident_bytes == 78);
  CHECK(r.timeline == Bytes{0, 0, 0, 0, 0, 1000, 12, 12});
  CHECK(r.peak_bytes == 1000);
  CHECK(r.peak_node == net.at("dead"));
  CHECK(r.final_bytes == 12);
}

TEST_CASE("getitems take their element over from a multi-output producer and are freed on their own", "[simulate]") {
  Net net;
  net.placeholder("x", 10, Role::Input);
  Node& pair = net.op("pair", {"x"}, 60);
  pair.outputs.push_back({40, "float32", {10}});
  for (const char* name : {"g0", "g1"}) {
    Node& item = net.op(name, {"pair"}, std::string(name) == "g0" ? 60 : 40);
    item.target = "operator.getitem";
    item.aliased_inputs = {0};
  }
  net.op("u", {"g0"}, 5);
  net.op("w", {"g1", "u"}, 7);
  net.output({"w"});
  Graph g = net.graph();
  SimulateResult r = simulate_memory(g, nullptr, timeline());
  // g0's 60 bytes are freed once u has read them, before w runs (as the
  // allocator frees each tensor of a tuple on its own).
  CHECK(r.timeline == Bytes{0, 100, 100, 100, 105, 52, 7});
  CHECK(r.peak_bytes == 105);
}

namespace {

// x → a → b → c → loss; the backward reads c, b and a.
Net chain_net() {
  Net net;
  net.placeholder("x", 1000, Role::Input);
  net.op("a", {"x"}, 1000);
  net.op("b", {"a"}, 1000);
  net.op("c", {"b"}, 1000);
  net.op("loss", {"c"}, 4);
  net.placeholder("t", 4, Role::Tangent, Phase::Backward);
  net.op("g1", {"t", "c"}, 16, Phase::Backward);
  net.op("g2", {"g1", "b"}, 16, Phase::Backward);
  net.op("g3", {"g2", "a"}, 16, Phase::Backward);
  net.output({"loss", "g3"});
  return net;
}

// chain_net's plan that keeps a and the loss and replays b and c for the backward.
RematPlan replay_b_and_c(const Net& net, const Graph& g) {
  std::vector<Policy> policies(g.nodes.size(), Policy::None);
  policies[static_cast<std::size_t>(net.at("a"))] = Policy::MustSave;
  policies[static_cast<std::size_t>(net.at("b"))] = Policy::PreferRecompute;
  policies[static_cast<std::size_t>(net.at("c"))] = Policy::PreferRecompute;
  policies[static_cast<std::size_t>(net.at("loss"))] = Policy::PreferSave;
  return plan_remat(g, policies);
}

}  // namespace

TEST_CASE("a remat plan lowers the bytes held across the boundary", "[simulate]") {
  Net net = chain_net();
  Graph g = net.graph();
  SimulateResult before = simulate_memory(g, nullptr, timeline());
  CHECK(before.timeline == Bytes{0, 1000, 2000, 3000, 3004, 3004, 3020, 2036, 1036, 20});
  CHECK(before.boundary_bytes == 3004);
  CHECK(before.peak_bytes == 3020);

  RematPlan plan = replay_b_and_c(net, g);
  REQUIRE(plan.duplicates.size() == 2);
  SimulateResult after = simulate_memory(g, &plan, timeline());
  // x a b c loss t b' c' g1 g2 g3 output
  CHECK(after.timeline == Bytes{0, 1000, 2000, 3000, 2004, 1004, 2004, 3004, 3020, 2036, 1036, 20});
  CHECK(after.boundary_bytes == 1004);  // a and loss
  CHECK(after.boundary_step == 4);
  CHECK(after.peak_bytes == 3020);
  CHECK(after.stats.duplicate_steps == 2);
  CHECK(after.stats.steps == 12);

  SECTION("deterministic") {
    SimulateResult again = simulate_memory(g, &plan, timeline());
    CHECK(again.timeline == after.timeline);
    CHECK(again.peak_step == after.peak_step);
    CHECK(again.boundary_bytes == after.boundary_bytes);
  }
  SECTION("timeline is off by default") {
    SimulateResult quiet = simulate_memory(g, &plan);
    CHECK(quiet.timeline.empty());
    CHECK(quiet.peak_bytes == after.peak_bytes);
  }
}

// Under a fusing compiler an op inlined into its readers' kernels is never
// written to memory: only the values whose buffers exist are counted.
TEST_CASE("inlined pointwise ops allocate nothing; saved values and replays read by extern ops still do",
          "[simulate]") {
  Net net = chain_net();
  Graph g = net.graph();
  for (const char* name : {"b", "c", "g2"}) g.nodes[static_cast<std::size_t>(net.at(name))].fusible = true;
  SimulateOptions options = timeline();
  options.fuse_pointwise = true;
  // Unplanned, b and c are saved (the backward reads them): nothing is inlined.
  CHECK(simulate_memory(g, nullptr, options).timeline == simulate_memory(g, nullptr, timeline()).timeline);

  RematPlan plan = replay_b_and_c(net, g);
  REQUIRE(plan.duplicates.size() == 2);
  SimulateResult after = simulate_memory(g, &plan, options);
  // x a b c loss t b' c' g1 g2 g3 output. b is read only by c in the forward
  // and b' only by c' and g2, all fusible: neither holds a buffer. c is read
  // by the loss and c' by g1, neither fusible: both keep theirs.
  CHECK(after.timeline == Bytes{0, 1000, 1000, 2000, 2004, 1004, 1004, 2004, 2020, 1036, 1036, 20});
  CHECK(after.peak_bytes == 2020);
  // Off (eager, the default), every value allocates.
  CHECK(simulate_memory(g, &plan, timeline()).timeline ==
        Bytes{0, 1000, 2000, 3000, 2004, 1004, 2004, 3004, 3020, 2036, 1036, 20});

  SECTION("a reader that is not fusible keeps the buffer") {
    g.nodes[static_cast<std::size_t>(net.at("c"))].fusible = false;  // b's forward reader
    g.nodes[static_cast<std::size_t>(net.at("g2"))].fusible = false;  // one of b's backward readers
    CHECK(simulate_memory(g, &plan, options).timeline == simulate_memory(g, &plan, timeline()).timeline);
  }
  SECTION("a random op keeps its buffer") {
    g.nodes[static_cast<std::size_t>(net.at("b"))].rng = true;
    CHECK(simulate_memory(g, &plan, options).timeline ==
          Bytes{0, 1000, 2000, 3000, 2004, 1004, 2004, 3004, 3020, 2036, 1036, 20});
  }
}

// The inlined op runs inside its reader's kernel, so what it reads is alive
// until that reader has run.
TEST_CASE("an inlined op's inputs live until its readers run", "[simulate]") {
  Net net;
  net.placeholder("x", 10, Role::Input);
  net.op("p", {"x"}, 1000);
  net.op("q", {"p"}, 1000);  // fusible, read only by r
  net.op("r", {"q"}, 10);    // fusible
  net.op("m", {"r"}, 10);    // an extern kernel: r keeps its buffer
  net.output({"m"});
  Graph g = net.graph();
  for (const char* name : {"q", "r"}) g.nodes[static_cast<std::size_t>(net.at(name))].fusible = true;
  SimulateOptions options = timeline();
  options.fuse_pointwise = true;
  // x p q r m output: q holds nothing, p lives until r has read q (through it).
  CHECK(simulate_memory(g, nullptr, options).timeline == Bytes{0, 1000, 1000, 1010, 20, 10});
  CHECK(simulate_memory(g, nullptr, timeline()).timeline == Bytes{0, 1000, 2000, 1010, 20, 10});
}

// Issue 38: eager autograd frees a saved input only when the autograd node
// that reads it returns, not after the first backward op of that node.
TEST_CASE("autograd lifetimes hold a value read from outside its autograd node to the node's end", "[simulate]") {
  Net net;
  net.placeholder("x", 100, Role::Input);
  net.op("a", {"x"}, 10);
  net.placeholder("t", 5, Role::Tangent, Phase::Backward);
  net.op("g1", {"t", "a"}, 20, Phase::Backward).autograd_node = 7;
  net.op("g2", {"g1"}, 30, Phase::Backward).autograd_node = 7;  // same node: a is held to here
  net.op("g3", {"g2"}, 4, Phase::Backward).autograd_node = 3;   // a node of its own
  net.output({"g3"});
  Graph g = net.graph();

  SimulateResult plain = simulate_memory(g, nullptr, timeline());
  CHECK(plain.timeline == Bytes{0, 10, 10, 30, 50, 34, 4});  // a dies after g1
  CHECK(plain.peak_bytes == 50);

  SimulateOptions held = timeline();
  held.autograd_lifetimes = true;
  SimulateResult eager = simulate_memory(g, nullptr, held);
  CHECK(eager.timeline == Bytes{0, 10, 10, 30, 60, 34, 4});  // a lives through g2; g2 still dies at g3
  CHECK(eager.peak_bytes == 60);
  CHECK(eager.peak_node == net.at("g2"));

  SECTION("without autograd nodes the option changes nothing") {
    Net bare = chain_net();
    Graph chain = bare.graph();
    SimulateOptions on = timeline();
    on.autograd_lifetimes = true;
    CHECK(simulate_memory(chain, nullptr, on).timeline == simulate_memory(chain, nullptr, timeline()).timeline);
  }
}

TEST_CASE("a schedule that reads a value before it exists is rejected", "[simulate][errors]") {
  Net net = chain_net();
  Graph g = net.graph();
  RematPlan plan;
  plan.duplicates.push_back({net.at("c"), net.at("a")});  // c's copy before a: reads b, not yet computed
  try {
    simulate_memory(g, &plan, timeline());
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& error) {
    std::string message = error.what();
    INFO(message);
    CHECK(message.find("duplicate of 'c'") != std::string::npos);
    CHECK(message.find("reads 'b'") != std::string::npos);
  }
}

// Issue 14: byte sums near 2^62 (fuzz reproducer tests/fuzz/regressions/fixed/
// bytes_2pow62_overflow) saturate at INT64_MAX instead of wrapping negative.
TEST_CASE("byte sums past int64 saturate instead of wrapping", "[simulate][numeric]") {
  const std::int64_t big = std::int64_t{1} << 62;
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  Net net;
  net.placeholder("x", big, Role::Input);
  net.placeholder("w", big, Role::Parameter);
  net.op("a", {"x", "w"}, big);
  net.op("b", {"a"}, big);
  net.op("c", {"a", "b"}, big);
  net.placeholder("t", 4, Role::Tangent, Phase::Backward);
  net.op("g", {"t", "a", "c"}, 4, Phase::Backward);
  net.output({"c", "g"});
  Graph g = net.graph();
  SimulateResult r = simulate_memory(g, nullptr, timeline());
  CHECK(r.resident_bytes == max);          // 2^62 + 2^62 (+ 4)
  CHECK(r.peak_bytes == max);              // a, b and c alive together: 3 * 2^62
  CHECK(r.peak_bytes_with_resident == max);
  CHECK(r.boundary_bytes >= 0);
  CHECK(r.final_bytes >= 0);
  for (auto live : r.timeline) CHECK(live >= 0);
  // One node with two outputs of 2^62 bytes each.
  Node two;
  two.outputs = {{big, "float32", {}}, {big, "float32", {}}};
  CHECK(two.output_bytes() == max);
  two.outputs.pop_back();
  CHECK(two.output_bytes() == big);
}
