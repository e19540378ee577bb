// Private to the core: the node fields of the graph document, declared once.
//
// HYPER_AC_NODE_FIELDS is the one table of a node's JSON fields. From it come
// the key dispatch of both loaders (the reference loader in graph.cc, the
// simdjson fast path in graph_fast.cc), which fields are required, each
// field's own check, identical(), graph_to_json, print_graph's flags and the
// public field list (graph_fields(): docs/graph-format.md's table, the Python
// encoder's defaults, the fuzz dictionary). Cross-field rules are check_node's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "hyper_ac/graph.h"

namespace hyper_ac {
namespace field_table {

// How a field's JSON value is read into its Node member.
enum class Kind : std::uint8_t {
  Int,        // an integer (std::int64_t member)
  Number,     // any number (double member)
  Bool,       // true / false
  String,     // a string
  Enum,       // a string naming one value (the to_string spelling)
  Ids,        // an array of node ids: indices of earlier nodes (inputs)
  Positions,  // an array of positions into `inputs`: sorted, each once
  Outputs,    // an array of tensor facts {bytes, dtype, shape}
  Frames,     // an array of module frames {fqn, type}, interned into Graph::stacks
  StackRef,   // an index into the document's module_stacks table
};

// X(Field, "json name", Kind, required, "default as JSON", Node member,
//   always written by graph_to_json, "print_graph flag", "its own check")
// Order: the order the reference loader reads (and names problems) in, and
// print_graph's flag order. A flag "a=%" prints the value in place of %.
// `stack` and `module_stack` are two spellings of Node::stack (one per node).
#define HYPER_AC_NODE_FIELDS(X)                                                                                        \
  X(Id, "id", Int, true, "", id, true, "", "an integer >= 0, unique in the graph")                                    \
  X(Name, "name", String, true, "", name, true, "", "non-empty, unique in the graph")                                 \
  X(Kind, "kind", Enum, true, "", kind, true, "", "placeholder, call_function, get_attr or output")                    \
  X(Target, "target", String, true, "", target, true, "", "the operator or attribute name")                           \
  X(Phase, "phase", Enum, true, "", phase, true, "", "forward or backward")                                           \
  X(Inputs, "inputs", Ids, true, "", inputs, true, "",                                                                \
    "ids of earlier nodes, each once, in FX all_input_nodes order; none on a placeholder")                            \
  X(Outputs, "outputs", Outputs, false, "[]", outputs, true, "",                                                      \
    "tensor facts {bytes >= 0, dtype, shape of sizes >= 0}")                                                          \
  X(Flops, "flops", Number, false, "0", flops, true, "", ">= 0")                                                      \
  X(Stack, "stack", StackRef, false, "null", stack, false, "",                                                        \
    "an index into module_stacks; not together with module_stack")                                                    \
  X(ModuleStack, "module_stack", Frames, false, "[]", stack, true, "",                                                \
    "frames {fqn, type}, innermost first; not together with stack")                                                   \
  X(Rng, "rng", Bool, false, "false", rng, true, "rng", "a random op (saved in every mode)")                          \
  X(RngStateBytes, "rng_state_bytes", Int, false, "0", rng_state_bytes, false, "rng_state_bytes=%",                   \
    "an integer >= 0; > 0 only with rng")                                                                             \
  X(Symint, "symint", Bool, false, "false", symint, true, "symint", "a SymInt / SymFloat / SymBool value")            \
  X(Collective, "collective", Bool, false, "false", collective, true, "collective", "a communication op")             \
  X(View, "view", Bool, false, "false", view, true, "view", "its output is a view of an input")                       \
  X(Fusible, "fusible", Bool, false, "false", fusible, false, "fusible", "Inductor fuses it with its neighbours")      \
  X(Copy, "copy", Bool, false, "false", copy, false, "copy",                                                          \
    "an exact copy of input 0: only on a call_function with exactly one input")                                       \
  X(Subgraph, "subgraph", Bool, false, "false", subgraph, true, "subgraph", "a get_attr of a GraphModule")            \
  X(Mutated, "mutated", Bool, false, "false", mutated, true, "mutated", "an input the step writes: only on placeholders") \
  X(MutatedInputs, "mutated_inputs", Positions, false, "[]", mutated_inputs, true, "mutates",                         \
    "positions into inputs, each in range")                                                                           \
  X(AliasedInputs, "aliased_inputs", Positions, false, "[]", aliased_inputs, true, "",                                \
    "positions into inputs, each in range")                                                                           \
  X(Role, "role", Enum, false, "\"activation\"", role, true, "%", "activation, parameter, buffer, input or tangent")   \
  X(Policy, "policy", Enum, false, "null", policy, true, "policy=%",                                                  \
    "MUST_SAVE, PREFER_SAVE, MUST_RECOMPUTE or PREFER_RECOMPUTE")                                                     \
  X(AcGraphId, "ac_graph_id", Int, false, "null", ac_graph_id, true, "ac_graph_id=%",                                 \
    "an integer >= 0; only with a policy")                                                                            \
  X(RecomputedFrom, "recomputed_from", String, false, "null", recomputed_from, true, "dup:%",                         \
    "the name of the node an earlier pass duplicated")                                                                \
  X(MeasuredSeconds, "measured_seconds", Number, false, "null", measured_seconds, false, "measured",                  \
    "finite, >= 0: one run measured on the planning machine (hardware: measured)")                                   \
  X(Opaque, "opaque", Bool, false, "false", opaque, false, "opaque",                                                  \
    "a non-tensor object (DeviceMesh, ProcessGroup): no bytes, never recomputed")                                    \
  X(BackwardOutput, "backward_output", Bool, false, "false", backward_output, false, "backward_output",               \
    "the backward returns this forward value as it is: only on a forward node other than the output")                 \
  X(AutogradNode, "autograd_node", Int, false, "null", autograd_node, false, "",                                      \
    "an integer >= 0: the eager autograd node (seq_nr) a backward op runs in; only on backward nodes")

enum Field : int {
#define HYPER_AC_FIELD_ENUM(field, ...) f##field,
  HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_ENUM)
#undef HYPER_AC_FIELD_ENUM
  kFieldCount
};
static_assert(kFieldCount <= 32, "a node's fields are bits of a std::uint32_t");

struct FieldSpec {
  const char* name;
  Kind kind;
  bool required;
  const char* default_json;
  const char* member;
  bool always;  // graph_to_json writes it even at its default
  const char* flag;
  const char* check;
  std::size_t length;  // strlen(name)
};

extern const FieldSpec kFields[kFieldCount];

constexpr std::uint32_t bit(int field) { return std::uint32_t{1} << field; }

// Fields a node must carry (non-null).
constexpr std::uint32_t kRequired = [] {
  std::uint32_t mask = 0;
  int at = 0;
#define HYPER_AC_FIELD_REQUIRED(field, name, kind, required, ...) mask |= (required) ? bit(at) : 0u, ++at;
  HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_REQUIRED)
#undef HYPER_AC_FIELD_REQUIRED
  return mask;
}();

// The field a key names; -1 = none.
int field_of(std::string_view key);
// The same for a key read in place: `raw` points just past its opening quote
// and the key is followed by its closing quote (an escaped key matches nothing).
int field_of_raw(const char* raw);

// An Enum field's value from its name; false = not a name of the field.
bool set_enum(int field, std::string_view text, Node& node);
// "unknown kind 'x' (expected placeholder, call_function, get_attr or output)".
std::string enum_error(int field, std::string_view text);

// A field's own check of the value the loader stored (Int, Number, String
// fields); "" = passes, else the message (without the node's label).
inline bool value_ok(int field, const Node& node) {
  switch (field) {
    case fId: return node.id >= 0;
    case fName: return !node.name.empty();
    case fFlops: return node.flops >= 0.0;  // false for NaN too
    case fMeasuredSeconds: return node.measured_seconds >= 0.0 && node.measured_seconds <= 1.0e300;  // finite
    case fRngStateBytes: return node.rng_state_bytes >= 0;
    case fAcGraphId: return node.ac_graph_id >= 0;
    case fAutogradNode: return node.autograd_node >= 0;
    default: return true;
  }
}
std::string value_error(int field, const Node& node);

// The cross-field rules, over the whole node: "" = passes, else the message.
// `given`: bits of the fields with a non-null value; `keys`: bits of every
// key present (null included).
std::string check_node(const Node& node, std::uint32_t given, std::uint32_t keys);

// The Node member a field fills, as a T; nullptr when the member is not a T.
template <typename T, typename M>
T* as(M& member) {
  if constexpr (std::is_same_v<T, M>) return &member;
  else return nullptr;
}
template <typename T>
T* slot(int field, Node& node) {
  switch (field) {
#define HYPER_AC_FIELD_SLOT(field, name, kind, required, default_json, member, ...) \
  case f##field: return as<T>(node.member);
    HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_SLOT)
#undef HYPER_AC_FIELD_SLOT
    default: return nullptr;
  }
}
template <typename T>
const T* slot(int field, const Node& node) {
  return slot<T>(field, const_cast<Node&>(node));
}

// The field's member holds its default (a default-constructed Node's value).
bool at_default(int field, const Node& node);
// The value as print_graph shows it (integers, names, strings); "" for others.
std::string value_text(int field, const Node& node);

// Every member of two nodes equal (flops bit for bit).
bool same_node(const Node& a, const Node& b);

}  // namespace field_table
}  // namespace hyper_ac
