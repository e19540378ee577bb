// The fast path of load_graph: simdjson On-Demand straight into the IR.
//
// It accepts exactly the well-formed documents the reference loader accepts
// and builds the same Graph; it never names an error. Anything it does not
// accept (malformed JSON, a repeated key, a number out of range, any failed
// check) or does not read (an escaped string, a key spelt with escapes, an
// unknown field of a tensor fact or module frame, `module_stacks` after
// `nodes`, ...) makes it return false, and load_graph hands the same bytes to
// the reference loader, which builds the graph or names the problem.
//
// Strings are read raw, as views into the document: stage 1 has validated
// UTF-8 and refused unescaped control characters, and a string holding a
// backslash is not read here, so a raw view is the string's value.
#include "graph_fields.h"
#include "graph_load.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <simdjson.h>

namespace hyper_ac {
namespace graph_load {
namespace {

namespace od = simdjson::ondemand;
namespace gf = field_table;

enum TopField : int { tFormat, tVersion, tModel, tModuleStacks, tNodes };

// `raw` points just past a key's opening quote. The document is padded and a
// key is followed by its closing quote and a colon, so comparing n + 1 bytes
// stays inside the buffer; a key spelt with escapes matches nothing.
template <std::size_t N>
inline bool is(const char* raw, const char (&literal)[N]) {
  return std::memcmp(raw, literal, N - 1) == 0 && raw[N - 1] == '"';
}

int top_field(const char* k) {
  switch (k[0]) {
    case 'f': return is(k, "format") ? tFormat : -1;
    case 'v': return is(k, "version") ? tVersion : -1;
    case 'm': return is(k, "model") ? tModel : is(k, "module_stacks") ? tModuleStacks : -1;
    case 'n': return is(k, "nodes") ? tNodes : -1;
    default: return -1;
  }
}

// A string without escapes, as a view into the document.
inline bool read_string(od::value& value, std::string_view& out) {
  od::raw_json_string raw;
  if (value.get_raw_json_string().get(raw)) return false;
  const char* begin = raw.raw();
  const char* p = begin;
  while (*p != '"') {
    if (*p == '\\') return false;  // escapes: the reference loader reads these
    ++p;
  }
  out = std::string_view(begin, static_cast<std::size_t>(p - begin));
  return true;
}

inline bool read_int(od::value& value, std::int64_t& out) { return !value.get_int64().get(out); }

// 1: null (consumed), 0: something else, -1: error.
inline int null_state(od::value& value) {
  bool null = false;
  if (value.is_null().get(null)) return -1;
  return null ? 1 : 0;
}

bool read_ints(od::value& value, std::vector<std::int64_t>& out) {
  out.clear();
  od::array array;
  if (value.get_array().get(array)) return false;
  for (auto entry : array) {
    std::int64_t v;
    if (entry.get_int64().get(v)) return false;
    out.push_back(v);
  }
  return true;
}

class FastLoader {
 public:
  FastLoader(Graph& graph, std::size_t text_size) : graph_(graph), text_size_(text_size) {}

  bool load(od::document& doc, const LoadOptions& options) {
    od::object top;
    if (doc.get_object().get(top)) return false;
    unsigned have = 0;
    for (auto entry : top) {
      od::field field;
      if (std::move(entry).get(field)) return false;
      const int key = top_field(field.key().raw());
      if (key < 0 || (have & (1u << key))) return false;
      have |= 1u << key;
      od::value& value = field.value();
      switch (key) {
        case tFormat: {
          std::string_view format;
          if (!read_string(value, format) || format != "hyper_ac.graph") return false;
          break;
        }
        case tVersion:
          if (!read_int(value, version_)) return false;
          break;
        case tModel: {
          const int null = null_state(value);
          if (null < 0) return false;
          if (null) break;
          od::object model;
          std::string_view text;
          if (value.get_object().get(model) || model.raw_json().get(text)) return false;
          try {
            graph_.model = parse_model_text(text);
          } catch (...) {
            return false;  // the reference loader names it
          }
          break;
        }
        case tModuleStacks:
          // The wire form puts the table first; after the nodes, the
          // reference loader reads it (stack numbering depends on it).
          if (have & (1u << tNodes)) return false;
          if (!read_table(value)) return false;
          break;
        case tNodes:
          if (!read_nodes(value)) return false;
          break;
      }
    }
    // Nothing may follow the document.
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) return false;
    if (!(have & (1u << tVersion)) || !(have & (1u << tNodes))) return false;
    return !options.strict_version || version_ == kGraphFormatVersion;
  }

 private:
  bool read_frames(od::value& value, std::vector<ModuleFrame>& frames) {
    frames.clear();
    od::array array;
    if (value.get_array().get(array)) return false;
    for (auto entry : array) {
      od::object object;
      if (entry.get_object().get(object)) return false;
      ModuleFrame frame;
      unsigned have = 0;
      for (auto item : object) {
        od::field field;
        if (std::move(item).get(field)) return false;
        const char* k = field.key().raw();
        const unsigned bit = is(k, "fqn") ? 1u : is(k, "type") ? 2u : 0u;
        if (bit == 0 || (have & bit)) return false;  // other fields: the reference loader ignores them
        have |= bit;
        std::string_view text;
        if (!read_string(field.value(), text)) return false;
        (bit == 1u ? frame.fqn : frame.type).assign(text);
      }
      if (have != 3u) return false;
      frames.push_back(std::move(frame));
    }
    return true;
  }

  bool read_table(od::value& value) {
    const int null = null_state(value);
    if (null < 0) return false;
    if (null) return true;
    od::array array;
    if (value.get_array().get(array)) return false;
    for (auto entry : array) {
      od::value item;
      if (std::move(entry).get(item)) return false;
      std::vector<ModuleFrame> frames;
      if (!read_frames(item, frames)) return false;
      if (frames.empty()) {
        table_index_.push_back(-1);
        continue;
      }
      table_index_.push_back(static_cast<std::int32_t>(graph_.stacks.size()));
      graph_.stacks.push_back(std::move(frames));
    }
    return true;
  }

  bool read_nodes(od::value& value) {
    od::array array;
    if (value.get_array().get(array)) return false;
    // A guess from the size (a compact node takes ~250 bytes): counting the
    // elements first would walk the whole array once more.
    graph_.nodes.reserve(text_size_ / 128 + 16);
    for (auto entry : array) {
      od::object object;
      if (entry.get_object().get(object)) return false;
      if (!read_node(object)) return false;
    }
    return true;
  }

  bool read_outputs(od::value& value, std::vector<TensorFact>& outputs) {
    od::array array;
    if (value.get_array().get(array)) return false;
    for (auto entry : array) {
      od::object object;
      if (entry.get_object().get(object)) return false;
      TensorFact fact;
      unsigned have = 0;
      for (auto item : object) {
        od::field field;
        if (std::move(item).get(field)) return false;
        const char* k = field.key().raw();
        const unsigned bit = is(k, "bytes") ? 1u : is(k, "dtype") ? 2u : is(k, "shape") ? 4u : 0u;
        if (bit == 0 || (have & bit)) return false;  // other fields: the reference loader ignores them
        have |= bit;
        od::value& v = field.value();
        if (bit == 1u) {
          if (!read_int(v, fact.bytes) || fact.bytes < 0) return false;
          continue;
        }
        const int null = null_state(v);
        if (null < 0) return false;
        if (null) continue;
        if (bit == 2u) {
          std::string_view dtype;
          if (!read_string(v, dtype)) return false;
          fact.dtype.assign(dtype);
        } else {
          if (!read_ints(v, ints_)) return false;
          for (auto dim : ints_)
            if (dim < 0) return false;
          fact.shape.assign(ints_.begin(), ints_.end());
        }
      }
      if (!(have & 1u)) return false;
      outputs.push_back(std::move(fact));
    }
    return true;
  }

  // Positions into a node's inputs: each in range; sorted, each once.
  static bool positions(const std::vector<std::int64_t>& raw, std::size_t input_count, std::vector<std::int32_t>& out) {
    out.clear();
    for (auto p : raw) {
      if (p < 0 || static_cast<std::uint64_t>(p) >= input_count) return false;
      out.push_back(static_cast<std::int32_t>(p));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return true;
  }

  // One field's non-null value, by its kind (graph_fields.h); false = not accepted.
  bool read_field(int key, od::value& value, Node& node) {
    std::string_view text;
    switch (gf::kFields[key].kind) {
      case gf::Kind::Int:
        if (!read_int(value, *gf::slot<std::int64_t>(key, node))) return false;
        break;
      case gf::Kind::Number: {
        double& number = *gf::slot<double>(key, node);
        if (value.get_double().get(number)) return false;
        // -0 is left to the reference (it reads an integer -0 as +0).
        if (number == 0.0 && std::signbit(number)) return false;
        break;
      }
      case gf::Kind::Bool:
        if (value.get_bool().get(*gf::slot<bool>(key, node))) return false;
        break;
      case gf::Kind::String:
        if (!read_string(value, text)) return false;
        gf::slot<std::string>(key, node)->assign(text);
        break;
      case gf::Kind::Enum:
        if (!read_string(value, text) || !gf::set_enum(key, text, node)) return false;
        break;
      case gf::Kind::Ids: return read_ints(value, input_ids_);
      case gf::Kind::Positions: return read_ints(value, positions_[key]);
      case gf::Kind::Outputs: return read_outputs(value, node.outputs);
      case gf::Kind::Frames: return read_frames(value, frames_);
      case gf::Kind::StackRef: return read_int(value, stack_ref_);
    }
    return gf::value_ok(key, node);
  }

  // Ids to indices (earlier nodes, each once), the stack, positions.
  bool resolve(Node& node, std::int32_t index, std::uint32_t given) {
    if (!ids_.add(node.id, index)) return false;
    node.inputs.reserve(input_ids_.size());
    for (auto input_id : input_ids_) {
      if (input_id == node.id) return false;
      const std::int32_t found = ids_.find(input_id);
      if (found < 0) return false;
      node.inputs.push_back(found);
    }
    if (!distinct(node.inputs)) return false;
    if (given & gf::bit(gf::fStack)) {
      if (stack_ref_ < 0 || static_cast<std::uint64_t>(stack_ref_) >= table_index_.size()) return false;
      node.stack = table_index_[static_cast<std::size_t>(stack_ref_)];
    }
    if ((given & gf::bit(gf::fModuleStack)) && !frames_.empty()) node.stack = intern(frames_);
    for (int f : {gf::fMutatedInputs, gf::fAliasedInputs})
      if ((given & gf::bit(f)) && !positions(positions_[f], node.inputs.size(), *gf::slot<std::vector<std::int32_t>>(f, node)))
        return false;
    return true;
  }

  std::int32_t intern(std::vector<ModuleFrame>& frames) {
    stack_key_.clear();
    for (const auto& frame : frames) {
      stack_key_ += frame.fqn;
      stack_key_ += '\x1f';
      stack_key_ += frame.type;
      stack_key_ += '\x1e';
    }
    auto found = stack_index_.find(stack_key_);
    if (found == stack_index_.end()) {
      found = stack_index_.emplace(stack_key_, static_cast<std::int32_t>(graph_.stacks.size())).first;
      graph_.stacks.push_back(frames);
    }
    frames.clear();
    return found->second;
  }

  bool read_node(od::object& object) {
    const auto index = static_cast<std::int32_t>(graph_.nodes.size());
    Node& node = graph_.nodes.emplace_back();
    std::uint32_t keys = 0, given = 0;
    for (auto item : object) {
      od::field field;
      if (std::move(item).get(field)) return false;
      const int key = gf::field_of_raw(field.key().raw());
      if (key < 0) return false;  // unknown (or escaped) field
      const std::uint32_t bit = gf::bit(key);
      if (keys & bit) return false;
      keys |= bit;
      od::value& value = field.value();
      const int null = null_state(value);
      if (null < 0) return false;
      if (null) {
        if (gf::kFields[key].required) return false;  // the reference names it
        continue;  // null = the default
      }
      given |= bit;
      if (!read_field(key, value, node)) return false;
    }
    if ((given & gf::kRequired) != gf::kRequired) return false;
    if (!resolve(node, index, given)) return false;
    return gf::check_node(node, given, keys).empty();
  }

  static bool distinct(const std::vector<std::int32_t>& inputs) {
    if (inputs.size() <= 16) {
      for (std::size_t a = 1; a < inputs.size(); ++a)
        for (std::size_t b = 0; b < a; ++b)
          if (inputs[a] == inputs[b]) return false;
      return true;
    }
    std::vector<std::int32_t> sorted = inputs;
    std::sort(sorted.begin(), sorted.end());
    return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  }


  // Every name once: an open-addressing set of (hash, node index) pairs; a
  // node's name is read only when the hashes agree. Run after the parser is
  // gone (its structural index is the largest buffer of the load).
 public:
  bool names_unique() const {
    const auto& nodes = graph_.nodes;
    std::size_t capacity = 16;
    while (capacity < nodes.size() * 2) capacity <<= 1;
    std::vector<std::uint64_t> slots(capacity, 0);  // (hash high bits << 32) | (index + 1)
    const std::hash<std::string_view> hash;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const std::string_view name = nodes[i].name;
      const std::uint64_t h = hash(name);
      const std::uint64_t tag = h & 0xffffffff00000000ull;
      std::size_t at = static_cast<std::size_t>(h) & (capacity - 1);
      while (slots[at] != 0) {
        if ((slots[at] & 0xffffffff00000000ull) == tag && nodes[(slots[at] & 0xffffffffull) - 1].name == name)
          return false;
        at = (at + 1) & (capacity - 1);
      }
      slots[at] = tag | static_cast<std::uint64_t>(i + 1);
    }
    return true;
  }

 private:

  Graph& graph_;
  std::size_t text_size_;
  std::int64_t version_ = 0;
  std::vector<std::int32_t> table_index_;
  graph_load::IdTable ids_;
  std::unordered_map<std::string, std::int32_t> stack_index_;
  std::string stack_key_;
  // scratch, reused node to node
  std::vector<std::int64_t> input_ids_, ints_;
  std::vector<std::int64_t> positions_[gf::kFieldCount];  // raw entries of the Positions fields
  std::int64_t stack_ref_ = -1;
  std::vector<ModuleFrame> frames_;
};

}  // namespace

bool load_fast(const std::string& json_text, const LoadOptions& options, LoadResult& result) {
  // The string's spare capacity is readable padding.
  return load_fast(std::string_view(json_text), json_text.capacity(), options, result);
}

bool load_fast(std::string_view json_text, std::size_t readable, const LoadOptions& options, LoadResult& result) {
  // simdjson reads up to SIMDJSON_PADDING bytes past the end: use the bytes
  // in place when enough past the end are readable (a string with spare
  // capacity, a file mapped with a padding tail: load_graph_file), else a
  // padded copy.
  simdjson::padded_string copy;
  simdjson::padded_string_view view(json_text.data(), json_text.size(), std::max(readable, json_text.size()));
  if (view.padding() < simdjson::SIMDJSON_PADDING) {
    copy = simdjson::padded_string(json_text);
    view = simdjson::padded_string_view(copy);
  }
  FastLoader loader(result.graph, json_text.size());
  {
    od::parser parser;
    od::document doc;
    if (parser.iterate(view).get(doc) || !loader.load(doc, options)) return false;
  }  // the structural index and any padded copy are freed here
  copy = simdjson::padded_string();
  return loader.names_unique();
}

}  // namespace graph_load
}  // namespace hyper_ac
