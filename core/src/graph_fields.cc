// The graph document's field table (graph_fields.h) and what is derived from
// it without a JSON library: key dispatch, each field's check, the
// cross-field rules, identical() per node and the public field list.
#include "graph_fields.h"

#include <array>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

namespace hyper_ac {
namespace field_table {

const FieldSpec kFields[kFieldCount] = {
#define HYPER_AC_FIELD_SPEC(field, name, kind, required, default_json, member, always, flag, check) \
  {name, Kind::kind, required, default_json, #member, always, flag, check, sizeof(name) - 1},
    HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_SPEC)
#undef HYPER_AC_FIELD_SPEC
};

namespace {

// Fields by the first byte of their name, in table order: at most a few per byte.
struct Dispatch {
  std::array<std::vector<std::int8_t>, 256> by_first;
  Dispatch() {
    for (int f = 0; f < kFieldCount; ++f)
      by_first[static_cast<unsigned char>(kFields[f].name[0])].push_back(static_cast<std::int8_t>(f));
  }
};
const Dispatch kDispatch;

// The values of each Enum field, in the order its message lists them.
constexpr std::array<NodeKind, 4> kKinds{NodeKind::Placeholder, NodeKind::CallFunction, NodeKind::GetAttr,
                                         NodeKind::Output};
constexpr std::array<Phase, 2> kPhases{Phase::Forward, Phase::Backward};
constexpr std::array<Role, 5> kRoles{Role::Activation, Role::Parameter, Role::Buffer, Role::Input, Role::Tangent};
constexpr std::array<Policy, 4> kPolicies{Policy::MustSave, Policy::PreferSave, Policy::MustRecompute,
                                          Policy::PreferRecompute};

template <typename Enum, std::size_t N>
bool named(std::string_view text, const std::array<Enum, N>& values, Enum& out) {
  for (Enum value : values)
    if (text == to_string(value)) {
      out = value;
      return true;
    }
  return false;
}

template <typename Enum, std::size_t N>
std::string listed(const std::array<Enum, N>& values) {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    if (i) text += i + 1 == N ? " or " : ", ";
    text += to_string(values[i]);
  }
  return text;
}

// ---- identical(): every member, by the table --------------------------------

template <typename T>
bool same(const T& a, const T& b) { return a == b; }
bool same(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same(const std::vector<TensorFact>& a, const std::vector<TensorFact>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].bytes != b[i].bytes || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) return false;
  return true;
}

// The table names every data member of Node: Node is an aggregate, and
// Node{v1, ..., vN} compiles exactly when N <= its member count.
struct AnyValue {
  template <typename T>
  operator T() const;
};
template <typename T, typename... A>
constexpr auto braces(int) -> decltype(T{std::declval<A>()...}, true) { return true; }
template <typename T, typename... A>
constexpr bool braces(long) { return false; }
template <typename T, std::size_t... I>
constexpr bool brace_init(std::index_sequence<I...>) {
  return braces<T, decltype((void)I, AnyValue{})...>(0);
}
template <typename T, std::size_t N>
constexpr bool has_members() { return brace_init<T>(std::make_index_sequence<N>{}); }

constexpr std::size_t kNodeMembers = kFieldCount - 1;  // `stack` and `module_stack` share Node::stack
static_assert(has_members<Node, kNodeMembers>() && !has_members<Node, kNodeMembers + 1>(),
              "Node's members and HYPER_AC_NODE_FIELDS (graph_fields.h) differ: add the new member to the table");

}  // namespace

int field_of(std::string_view key) {
  if (key.empty()) return -1;
  for (std::int8_t f : kDispatch.by_first[static_cast<unsigned char>(key[0])])
    if (key == std::string_view(kFields[f].name, kFields[f].length)) return f;
  return -1;
}

int field_of_raw(const char* raw) {
  for (std::int8_t f : kDispatch.by_first[static_cast<unsigned char>(raw[0])]) {
    const FieldSpec& spec = kFields[f];
    if (std::memcmp(raw, spec.name, spec.length) == 0 && raw[spec.length] == '"') return f;
  }
  return -1;
}

bool set_enum(int field, std::string_view text, Node& node) {
  switch (field) {
    case fKind: return named(text, kKinds, node.kind);
    case fPhase: return named(text, kPhases, node.phase);
    case fRole: return named(text, kRoles, node.role);
    case fPolicy: return named(text, kPolicies, node.policy);
    default: return false;
  }
}

std::string enum_error(int field, std::string_view text) {
  std::string expected;
  switch (field) {
    case fKind: expected = listed(kKinds); break;
    case fPhase: expected = listed(kPhases); break;
    case fRole: expected = listed(kRoles); break;
    case fPolicy: expected = listed(kPolicies); break;
    default: break;
  }
  return std::string("unknown ") + kFields[field].name + " '" + std::string(text) + "' (expected " + expected + ")";
}

std::string value_error(int field, const Node& node) {
  switch (field) {
    case fId: return "field 'id' is negative (" + std::to_string(node.id) + ")";
    case fName: return "field 'name' is empty";
    case fFlops: return "field 'flops' must be >= 0";
    case fMeasuredSeconds: return "field 'measured_seconds' must be a finite number >= 0 (or null)";
    case fRngStateBytes: return "field 'rng_state_bytes' must be >= 0";
    case fAcGraphId: return "'ac_graph_id' must be >= 0 (or null)";
    case fAutogradNode: return "'autograd_node' must be >= 0 (or null)";
    default: return "";
  }
}

std::string check_node(const Node& node, std::uint32_t given, std::uint32_t keys) {
  if ((given & bit(fStack)) && (keys & bit(fModuleStack))) return "has both 'stack' and 'module_stack'; give one";
  if (node.rng_state_bytes > 0 && !node.rng) return "'rng_state_bytes' is only meaningful with 'rng': true";
  if (node.ac_graph_id >= 0 && node.policy == Policy::None) return "'ac_graph_id' is set without a 'policy'";
  if (node.kind == NodeKind::Placeholder && !node.inputs.empty()) return "a placeholder cannot have inputs";
  if (node.mutated && node.kind != NodeKind::Placeholder)
    return "'mutated' is only meaningful on placeholders (use 'mutated_inputs' on the writing op)";
  if (node.copy && (node.kind != NodeKind::CallFunction || node.inputs.size() != 1))
    return "'copy' marks an exact copy of one input: only on a call_function node with exactly one input";
  if (node.backward_output && (node.phase != Phase::Forward || node.kind == NodeKind::Output))
    return "'backward_output' marks a forward value the backward returns: only on a forward node other than the output";
  if (node.autograd_node >= 0 && (node.phase != Phase::Backward || node.kind != NodeKind::CallFunction))
    return "'autograd_node' names the eager autograd node a backward op runs in: only on a backward call_function";
  return "";
}

namespace {

const Node kDefault{};

template <typename T>
std::string text_of(const T& value) {
  if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(value);
  else if constexpr (std::is_enum_v<T>) return to_string(value);
  else if constexpr (std::is_same_v<T, std::string>) return value;
  else return "";
}

}  // namespace

bool at_default(int field, const Node& node) {
  switch (field) {
#define HYPER_AC_FIELD_DEFAULT(field, name, kind, required, default_json, member, ...) \
  case f##field: return same(node.member, kDefault.member);
    HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_DEFAULT)
#undef HYPER_AC_FIELD_DEFAULT
    default: return false;
  }
}

std::string value_text(int field, const Node& node) {
  switch (field) {
#define HYPER_AC_FIELD_TEXT(field, name, kind, required, default_json, member, ...) \
  case f##field: return text_of(node.member);
    HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_TEXT)
#undef HYPER_AC_FIELD_TEXT
    default: return "";
  }
}

bool same_node(const Node& a, const Node& b) {
#define HYPER_AC_FIELD_SAME(field, name, kind, required, default_json, member, ...) \
  if (!same(a.member, b.member)) return false;
  HYPER_AC_NODE_FIELDS(HYPER_AC_FIELD_SAME)
#undef HYPER_AC_FIELD_SAME
  return true;
}

}  // namespace field_table

namespace {

const char* kind_words(field_table::Kind kind) {
  using field_table::Kind;
  switch (kind) {
    case Kind::Int: return "integer";
    case Kind::Number: return "number";
    case Kind::Bool: return "boolean";
    case Kind::String: return "string";
    case Kind::Enum: return "string (a name)";
    case Kind::Ids: return "array of node ids";
    case Kind::Positions: return "array of input positions";
    case Kind::Outputs: return "array of tensor facts";
    case Kind::Frames: return "array of module frames";
    case Kind::StackRef: return "integer (index)";
  }
  return "?";
}

std::vector<GraphField> build_fields() {
  std::vector<GraphField> fields;
  auto add = [&](const char* section, const char* name, const char* kind, bool required, const char* default_json,
                 const char* member, const char* check) {
    GraphField field;
    field.section = section;
    field.name = name;
    field.kind = kind;
    field.required = required;
    field.default_json = default_json;
    field.member = member;
    field.check = check;
    fields.push_back(std::move(field));
  };
  add("document", "format", "string", false, "\"hyper_ac.graph\"", "", "exactly \"hyper_ac.graph\"");
  add("document", "version", "integer", true, "", "", "the format version this build reads (kGraphFormatVersion)");
  add("document", "model", "object", false, "null", "Graph::model", "the live module tree (section model)");
  add("document", "module_stacks", "array of arrays of module frames", false, "null", "Graph::stacks",
      "the interned stacks nodes name by stack; before nodes in the wire form");
  add("document", "nodes", "array of nodes", true, "", "Graph::nodes", "topological order (section node)");
  for (const auto& spec : field_table::kFields) {
    GraphField field;
    field.section = "node";
    field.name = spec.name;
    field.kind = kind_words(spec.kind);
    field.required = spec.required;
    field.default_json = spec.default_json;
    field.member = std::string("Node::") + spec.member;
    field.always = spec.always;
    field.flag = spec.flag;
    field.check = spec.check;
    fields.push_back(std::move(field));
  }
  add("output", "bytes", "integer", true, "", "TensorFact::bytes", ">= 0");
  add("output", "dtype", "string", false, "\"\"", "TensorFact::dtype", "");
  add("output", "shape", "array of integers", false, "[]", "TensorFact::shape", "each >= 0");
  add("frame", "fqn", "string", true, "", "ModuleFrame::fqn", "");
  add("frame", "type", "string", true, "", "ModuleFrame::type", "");
  add("model", "type", "string", false, "\"\"", "ModelFacts::type", "");
  add("model", "marked", "boolean", false, "false", "ModelFacts::marked", "");
  add("model", "modules", "array of modules", false, "[]", "ModelFacts::modules", "each fqn once (section module)");
  add("module", "fqn", "string", true, "", "ModuleFact::fqn", "non-empty, listed once");
  add("module", "type", "string", true, "", "ModuleFact::type", "");
  add("module", "container", "boolean", false, "false", "ModuleFact::container", "");
  add("module", "marked", "boolean", false, "false", "ModuleFact::marked", "");
  add("module", "same_as", "string", false, "\"\"", "ModuleFact::same_as", "a module listed before, itself no repeat");
  for (auto& field : fields)  // graph_to_json writes these only when set
    if ((field.section == "model" || field.section == "module") && field.name != "type" && field.name != "fqn")
      field.always = field.name == "modules";
  return fields;
}

std::string cell(const std::string& text) { return text.empty() ? "" : "`" + text + "`"; }

}  // namespace

const std::vector<GraphField>& graph_fields() {
  static const std::vector<GraphField> fields = build_fields();
  return fields;
}

std::string graph_fields_markdown() {
  std::ostringstream out;
  out << "| section | field | JSON kind | required / default | member | check | printed as |\n"
      << "|---|---|---|---|---|---|---|\n";
  for (const auto& field : graph_fields()) {
    std::string presence = field.required ? "required" : "default " + cell(field.default_json);
    if (!field.required && !field.always) presence += ", written only when set";
    out << "| " << field.section << " | `" << field.name << "` | " << field.kind << " | " << presence << " | "
        << cell(field.member) << " | " << field.check << " | " << cell(field.flag) << " |\n";
  }
  return out.str();
}

}  // namespace hyper_ac
