// The core's intermediate representation of a joint forward+backward graph,
// its JSON loader (with full validation) and its stable text printer.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hyper_ac {

// Malformed graph input. The message names the node (or JSON path) and the problem.
class GraphError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr int kGraphFormatVersion = 1;

enum class NodeKind { Placeholder, CallFunction, GetAttr, Output };
enum class Phase { Forward, Backward };
enum class Role { Activation, Parameter, Buffer, Input, Tangent };

// Values of torch.utils.checkpoint.CheckpointPolicy; None = untagged.
enum class Policy : std::uint8_t { None, MustSave, PreferSave, MustRecompute, PreferRecompute };

const char* to_string(NodeKind kind);
const char* to_string(Phase phase);
const char* to_string(Role role);
const char* to_string(Policy policy);  // "MUST_SAVE", ... ; "" for None
bool is_recompute(Policy policy);       // MUST_RECOMPUTE or PREFER_RECOMPUTE

struct TensorFact {
  std::int64_t bytes = 0;
  std::string dtype;
  std::vector<std::int64_t> shape;
};

struct ModuleFrame {
  std::string fqn;
  std::string type;
};

struct Node {
  std::int64_t id = 0;
  std::string name;
  NodeKind kind = NodeKind::CallFunction;
  std::string target;
  std::vector<std::int32_t> inputs;  // indices into Graph::nodes, FX all_input_nodes order
  Phase phase = Phase::Forward;
  std::vector<TensorFact> outputs;
  double flops = 0.0;
  // Seconds one run of this node took on the planning machine, measured by
  // the serialiser when the config says `hardware: measured` (cost.h prices
  // a replay by it); -1 = not measured (the roofline prices it).
  double measured_seconds = -1.0;
  std::int32_t stack = -1;  // index into Graph::stacks; -1 = no enclosing module
  bool rng = false;
  // Bytes of the generator state a replay of this random op saves (the
  // forward runs it under run_and_save_rng_state); 0 = not replayable.
  std::int64_t rng_state_bytes = 0;
  bool symint = false;
  bool collective = false;
  bool view = false;
  // Inductor fuses it with neighbouring fusible ops into one kernel (pointwise,
  // broadcast, reduction, view, factory, convert/clone; set by the serialiser).
  bool fusible = false;
  // The output equals input 0 bit for bit: same dtype, shape and strides (a
  // clone; set by the serialiser). load_graph elides such copies (elide_copies).
  bool copy = false;
  bool subgraph = false;
  // The value is an opaque object, not a tensor (a DTensor's DeviceMesh, a
  // ProcessGroup, a script object): no bytes, never recomputed; a saved one
  // travels apart from the saved tensors (aot_autograd's calling convention).
  bool opaque = false;
  // A forward value the backward returns as it is, as one of the step's
  // gradient outputs (a DTensor gradient's mesh is the forward's own mesh
  // placeholder): the forward saves it for the backward to return.
  bool backward_output = false;
  // A placeholder the step writes (an AOTAutograd input mutation: the new
  // value is a forward output, copied into the input after the forward), so a
  // backward replay would read the written value.
  bool mutated = false;
  std::vector<std::int32_t> mutated_inputs;  // positions into `inputs`
  std::vector<std::int32_t> aliased_inputs;  // positions into `inputs`
  Role role = Role::Activation;
  Policy policy = Policy::None;   // a tag already on the FX node (the model's own checkpointing)
  std::int64_t ac_graph_id = -1;  // the checkpoint region of that tag (meta["ac_graph_id"]); -1 = none
  // The eager autograd node a backward op runs in (meta["seq_nr"] of the
  // forward op it differentiates); -1 = unknown. Eager autograd frees what a
  // node reads only when the node returns, not after each of its ops
  // (SimulateOptions::autograd_lifetimes).
  std::int64_t autograd_node = -1;
  std::string recomputed_from;    // non-empty on duplicates of an earlier pass

  std::int64_t output_bytes() const;  // sum over outputs
  bool is_forward() const { return phase == Phase::Forward; }
  bool is_backward() const { return phase == Phase::Backward; }
};

// One submodule of the live model, as named_modules(remove_duplicate=False)
// lists it (the root excluded).
struct ModuleFact {
  std::string fqn;
  std::string type;
  bool container = false;  // a ModuleList / ModuleDict / Sequential
  bool marked = false;     // carries a `gradient_checkpointing` attribute (the HuggingFace marker)
  std::string same_as;     // FQN of the first listing of the same module object; "" = this is the first
};

// Facts only the live nn.Module can tell (optional in the JSON): its module
// tree. Unit discovery (scope.h) applies its rule to these facts.
struct ModelFacts {
  bool present = false;
  std::string type;
  bool marked = false;               // the root module carries the marker
  std::vector<ModuleFact> modules;   // named_modules(remove_duplicate=False) order, root excluded
};

// An exact copy load_graph removed: its readers read `source` instead.
struct ElidedCopy {
  std::string node;    // the copy's name (no longer in Graph::nodes)
  std::string source;  // the name of the node it copied
};

struct Graph {
  std::vector<Node> nodes;                        // topological order
  std::vector<std::vector<ModuleFrame>> stacks;   // interned module stacks, innermost first
  ModelFacts model;
  // Copies removed at load, in graph order; the plan lists them so the FX
  // graph gets the same rewrite (docs/graph-format.md, "Plan document", `elided_copies`).
  std::vector<ElidedCopy> elided_copies;

  // Filled by load_graph / finalize(): users of each node, ascending order.
  std::vector<std::vector<std::int32_t>> users;

  const std::vector<ModuleFrame>& stack_of(const Node& node) const;
  // Rebuilds `users` from `inputs`; call after constructing a graph by hand.
  void finalize();
};

struct LoadOptions {
  // Reject graphs whose version differs from kGraphFormatVersion (always on;
  // kept as an option so tools may print a friendlier hint).
  bool strict_version = true;
  // Remove exact forward copies (Node::copy) whose elision cannot change a
  // value: their readers read the source. A decomposed graph clones where eager
  // PyTorch aliases (dropout with p = 0 is a clone), and a saved or replayed
  // clone holds a second copy of its source's bytes. Rule: alias.h.
  bool elide_copies = true;
  // Read with the reference loader only (a JSON tree validated node by node,
  // naming every problem) instead of trying the simdjson fast path first.
  // Same graph, same errors, several times slower: for comparison and for
  // checking the fast path. CLI: --reference-loader.
  bool reference_loader = false;
};

struct LoadStats {
  std::size_t nodes = 0;
  std::size_t forward_nodes = 0;
  std::size_t backward_nodes = 0;
  std::size_t unique_stacks = 0;
  std::size_t elided_copies = 0;
  // The simdjson fast path read the document (false: the reference loader did,
  // because it was asked for or because the fast path did not accept the bytes).
  bool fast_path = false;
};

struct LoadResult {
  Graph graph;
  LoadStats stats;
};

// Parses and validates a graph document (docs/graph-format.md). Throws GraphError.
// The simdjson fast path reads well-formed documents; anything it does not
// accept is read again by the reference loader, which names the problem
// (docs/graph-format.md, "How loading works").
LoadResult load_graph(const std::string& json_text, const LoadOptions& options = {});

// load_graph of a file's bytes: the same graph, stats and errors. A regular
// file is mapped read-only and read in place by the fast path (no copy of
// the document in memory, nothing zero-filled); anything else (a pipe, an
// empty file, the reference loader asked for or the fast path declining the
// bytes) is read into a string for load_graph. Throws std::runtime_error
// "cannot open 'PATH'" / "cannot read 'PATH'" when the file cannot be read.
LoadResult load_graph_file(const std::string& path, const LoadOptions& options = {});

// One field of the graph document: the one table the loaders' key dispatch
// and checks, identical(), graph_to_json, print_graph's flags, the field
// table in docs/graph-format.md and the Python encoder's defaults come from
// (hyper_ac._core.graph_fields()). Node fields: core/src/graph_fields.h.
struct GraphField {
  std::string section;       // "document", "node", "output" (a tensor fact), "frame", "model", "module"
  std::string name;          // the JSON key
  std::string kind;          // its JSON kind, in words
  bool required = false;     // absent (or null) is an error; else it means default_json
  std::string default_json;  // the value an absent field stands for, as JSON ("" when required)
  std::string member;        // the C++ member it fills ("Node::flops"; "" for none)
  bool always = true;        // graph_to_json writes it even at its default (node fields)
  std::string flag;          // print_graph's flag when off its default ("%" = the value; "" = not printed)
  std::string check;         // its own check, in words (cross-field rules: graph_fields.h check_node)
};

// Every field, by section in document order, node fields in the table's order.
const std::vector<GraphField>& graph_fields();

// The field table as docs/graph-format.md shows it (Markdown; tested equal).
// Python: hyper_ac._core.graph_fields_markdown().
std::string graph_fields_markdown();

// Every field of both graphs equal: nodes (each field; flops bit for bit),
// interned stacks, model facts and users. What the fast and the reference
// loader must agree on (tests, fuzz_plan).
bool identical(const Graph& a, const Graph& b);

// Canonical JSON form of a graph (load_graph(graph_to_json(g)) == g).
std::string graph_to_json(const Graph& graph);

struct PrintOptions {
  bool show_module_stack = true;  // innermost FQN per node
  bool show_sizes = true;         // output bytes, dtype and shape
  // Optional per-node annotation (e.g. a policy); empty or sized like nodes.
  std::vector<std::string> annotations;
};

// Stable, human-readable text: one line per node, no pointers or hashes.
std::string print_graph(const Graph& graph, const PrintOptions& options = {});

struct GraphSummary {
  std::size_t nodes = 0;
  std::size_t forward_nodes = 0;
  std::size_t backward_nodes = 0;
  std::size_t placeholders = 0;
  std::size_t parameters = 0;
  // Bytes of forward values (not parameters/inputs) that some backward node reads.
  std::int64_t activation_bytes_read_by_backward = 0;
  std::size_t activations_read_by_backward = 0;
  double forward_flops = 0.0;
  double backward_flops = 0.0;
  std::size_t elided_copies = 0;  // exact copies removed at load (not in `nodes`)
};

GraphSummary summarize(const Graph& graph);

std::string format_summary(const GraphSummary& summary);

// Human-readable byte count ("1.5 MiB").
std::string format_bytes(std::int64_t bytes);

}  // namespace hyper_ac
