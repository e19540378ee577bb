#include "hyper_ac/graph.h"
#include "hyper_ac/saturate.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hyper_ac/alias.h"
#include "graph_fields.h"
#include "graph_load.h"

namespace hyper_ac {

using json = nlohmann::json;

const char* to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::Placeholder: return "placeholder";
    case NodeKind::CallFunction: return "call_function";
    case NodeKind::GetAttr: return "get_attr";
    case NodeKind::Output: return "output";
  }
  return "?";
}

const char* to_string(Phase phase) { return phase == Phase::Forward ? "forward" : "backward"; }

const char* to_string(Role role) {
  switch (role) {
    case Role::Activation: return "activation";
    case Role::Parameter: return "parameter";
    case Role::Buffer: return "buffer";
    case Role::Input: return "input";
    case Role::Tangent: return "tangent";
  }
  return "?";
}

const char* to_string(Policy policy) {
  switch (policy) {
    case Policy::None: return "";
    case Policy::MustSave: return "MUST_SAVE";
    case Policy::PreferSave: return "PREFER_SAVE";
    case Policy::MustRecompute: return "MUST_RECOMPUTE";
    case Policy::PreferRecompute: return "PREFER_RECOMPUTE";
  }
  return "?";
}

bool is_recompute(Policy policy) {
  return policy == Policy::MustRecompute || policy == Policy::PreferRecompute;
}

std::int64_t Node::output_bytes() const {
  std::int64_t total = 0;  // saturates at kMaxBytes (saturate.h)
  for (const auto& fact : outputs) total = add_bytes(total, fact.bytes);
  return total;
}

const std::vector<ModuleFrame>& Graph::stack_of(const Node& node) const {
  static const std::vector<ModuleFrame> kEmpty;
  return node.stack < 0 ? kEmpty : stacks[static_cast<std::size_t>(node.stack)];
}

void Graph::finalize() {
  // Counted first, so each list is allocated once at its size.
  std::vector<std::int32_t> count(nodes.size(), 0);
  for (const auto& node : nodes)
    for (std::int32_t input : node.inputs) ++count[static_cast<std::size_t>(input)];
  users.assign(nodes.size(), {});
  for (std::size_t i = 0; i < nodes.size(); ++i) users[i].reserve(static_cast<std::size_t>(count[i]));
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::int32_t input : nodes[i].inputs) users[static_cast<std::size_t>(input)].push_back(static_cast<std::int32_t>(i));
}

namespace {

bool same_frames(const std::vector<ModuleFrame>& a, const std::vector<ModuleFrame>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].fqn != b[i].fqn || a[i].type != b[i].type) return false;
  return true;
}

}  // namespace

bool identical(const Graph& a, const Graph& b) {
  if (a.nodes.size() != b.nodes.size() || a.stacks.size() != b.stacks.size() || a.users != b.users) return false;
  if (a.elided_copies.size() != b.elided_copies.size()) return false;
  for (std::size_t i = 0; i < a.elided_copies.size(); ++i)
    if (a.elided_copies[i].node != b.elided_copies[i].node || a.elided_copies[i].source != b.elided_copies[i].source)
      return false;
  for (std::size_t i = 0; i < a.nodes.size(); ++i)
    if (!field_table::same_node(a.nodes[i], b.nodes[i])) return false;
  for (std::size_t i = 0; i < a.stacks.size(); ++i)
    if (!same_frames(a.stacks[i], b.stacks[i])) return false;
  const ModelFacts& m = a.model;
  const ModelFacts& n = b.model;
  if (m.present != n.present || m.type != n.type || m.marked != n.marked || m.modules.size() != n.modules.size())
    return false;
  for (std::size_t i = 0; i < m.modules.size(); ++i) {
    const ModuleFact& x = m.modules[i];
    const ModuleFact& y = n.modules[i];
    if (x.fqn != y.fqn || x.type != y.type || x.container != y.container || x.marked != y.marked ||
        x.same_as != y.same_as)
      return false;
  }
  return true;
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0)
    std::snprintf(buffer, sizeof buffer, "%" PRId64 " B", bytes);
  else
    std::snprintf(buffer, sizeof buffer, "%.2f %s", value, units[unit]);
  return buffer;
}

namespace {

// Exact copies are elided after either loader (both read the graph as
// written); the stats count the graph the core plans.
void finish_load(LoadResult& result, const LoadOptions& options) {
  Graph& graph = result.graph;
  // elide_copies builds the users once, after it removed the copies.
  if (options.elide_copies)
    graph.elided_copies = elide_copies(graph);
  else
    graph.finalize();
  result.stats.elided_copies = graph.elided_copies.size();
  result.stats.nodes = graph.nodes.size();
  result.stats.forward_nodes = result.stats.backward_nodes = 0;
  for (const auto& node : graph.nodes) (node.is_forward() ? result.stats.forward_nodes : result.stats.backward_nodes)++;
  result.stats.unique_stacks = graph.stacks.size();
}

}  // namespace

LoadResult load_graph(const std::string& json_text, const LoadOptions& options) {
  if (!options.reference_loader) {
    LoadResult result;
    if (graph_load::load_fast(json_text, options, result)) {
      finish_load(result, options);
      result.stats.fast_path = true;
      return result;
    }
  }  // a partial graph is freed before the reference loader starts
  LoadResult result = graph_load::load_reference(json_text, options);
  finish_load(result, options);
  return result;
}

namespace {

// The whole of an open file descriptor, read with read(2) (a pipe, a FIFO).
std::string read_all(int fd, const std::string& path, std::size_t expected) {
  std::string text;
  text.reserve(expected + 64);  // the fast path's padding: no copy in load_graph
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got == 0) return text;
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read '" + path + "'");
    }
    text.append(buffer, static_cast<std::size_t>(got));
  }
}

// A read-only private mapping of a whole file followed by at least `padding`
// readable zero bytes: an anonymous zero mapping is laid down first and the
// file mapped over its start (the rest of the file's last page reads as zeros,
// the pages after it are the anonymous mapping's).
class MappedFile {
 public:
  MappedFile(int fd, std::size_t size, std::size_t padding) : size_(size) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    length_ = (size + padding + page - 1) / page * page;
    void* area = ::mmap(nullptr, length_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) return;
    void* file = ::mmap(area, size, PROT_READ, MAP_PRIVATE | MAP_FIXED | MAP_POPULATE, fd, 0);
    if (file == MAP_FAILED) {
      ::munmap(area, length_);
      return;
    }
    data_ = static_cast<const char*>(area);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), length_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  bool ok() const { return data_ != nullptr; }
  std::string_view text() const { return {data_, size_}; }
  std::size_t readable() const { return length_; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0, length_ = 0;
};

struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

LoadResult load_graph_file(const std::string& path, const LoadOptions& options) {
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw std::runtime_error("cannot open '" + path + "'");
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) throw std::runtime_error("cannot read '" + path + "'");
  if (S_ISREG(info.st_mode) && info.st_size > 0 && !options.reference_loader) {
    const auto size = static_cast<std::size_t>(info.st_size);
    std::optional<MappedFile> mapped;
    mapped.emplace(file.fd, size, std::size_t{64});
    if (mapped->ok()) {
      {
        LoadResult result;
        if (graph_load::load_fast(mapped->text(), mapped->readable(), options, result)) {
          mapped.reset();  // the document is no longer needed: unmapped before the finishing passes
          finish_load(result, options);
          result.stats.fast_path = true;
          return result;
        }
      }  // a partial graph is freed before the reference loader starts
      std::string text(mapped->text());
      mapped.reset();
      return load_graph(text, options);
    }
  }
  const std::size_t expected = S_ISREG(info.st_mode) && info.st_size > 0 ? static_cast<std::size_t>(info.st_size) : 0;
  return load_graph(read_all(file.fd, path, expected), options);
}

namespace {

// One node field's canonical JSON value (graph_fields.h); null stands for a
// default spelt null.
json field_json(const Graph& graph, const Node& node, int f) {
  namespace gf = field_table;
  const gf::FieldSpec& spec = gf::kFields[f];
  if (std::strcmp(spec.default_json, "null") == 0 && gf::at_default(f, node)) return nullptr;
  switch (spec.kind) {
    case gf::Kind::Int: return *gf::slot<std::int64_t>(f, node);
    case gf::Kind::Number: return *gf::slot<double>(f, node);
    case gf::Kind::Bool: return *gf::slot<bool>(f, node);
    case gf::Kind::String: return *gf::slot<std::string>(f, node);
    case gf::Kind::Enum: return gf::value_text(f, node);
    case gf::Kind::Ids: {
      json ids = json::array();
      for (auto input : node.inputs) ids.push_back(graph.nodes[static_cast<std::size_t>(input)].id);
      return ids;
    }
    case gf::Kind::Positions: return *gf::slot<std::vector<std::int32_t>>(f, node);
    case gf::Kind::Outputs: {
      json outputs = json::array();
      for (const auto& fact : node.outputs)
        outputs.push_back({{"bytes", fact.bytes}, {"dtype", fact.dtype}, {"shape", fact.shape}});
      return outputs;
    }
    case gf::Kind::Frames: {
      json stack = json::array();
      for (const auto& frame : graph.stack_of(node)) stack.push_back({{"fqn", frame.fqn}, {"type", frame.type}});
      return stack;
    }
    case gf::Kind::StackRef: break;  // the canonical form inlines the stack (module_stack)
  }
  return nullptr;
}

json model_json(const ModelFacts& facts) {
  json model;
  model["type"] = facts.type;
  if (facts.marked) model["marked"] = true;
  json modules = json::array();
  for (const auto& m : facts.modules) {
    json entry = {{"fqn", m.fqn}, {"type", m.type}};
    if (m.container) entry["container"] = true;
    if (m.marked) entry["marked"] = true;
    if (!m.same_as.empty()) entry["same_as"] = m.same_as;
    modules.push_back(std::move(entry));
  }
  model["modules"] = modules;
  return model;
}

}  // namespace

std::string graph_to_json(const Graph& graph) {
  namespace gf = field_table;
  json document;
  document["format"] = "hyper_ac.graph";
  document["version"] = kGraphFormatVersion;
  json nodes = json::array();
  for (const auto& node : graph.nodes) {
    json raw = json::object();
    for (int f = 0; f < gf::kFieldCount; ++f) {
      // Every field but the stack reference; the fields added after the first
      // release of version 1 only when set (the documents of that time stay identical).
      if (gf::kFields[f].kind == gf::Kind::StackRef || (!gf::kFields[f].always && gf::at_default(f, node))) continue;
      raw[gf::kFields[f].name] = field_json(graph, node, f);
    }
    nodes.push_back(std::move(raw));
  }
  document["nodes"] = std::move(nodes);
  if (graph.model.present) document["model"] = model_json(graph.model);
  return document.dump();
}

std::string print_graph(const Graph& graph, const PrintOptions& options) {
  namespace gf = field_table;
  std::ostringstream out;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    out << (node.is_forward() ? "F " : "B ") << node.name << " = " << to_string(node.kind);
    if (!node.target.empty()) out << ' ' << node.target;
    out << '(';
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (k) out << ", ";
      out << graph.nodes[static_cast<std::size_t>(node.inputs[k])].name;
    }
    out << ')';
    if (options.show_sizes && !node.outputs.empty()) {
      out << " :";
      for (const auto& fact : node.outputs) {
        out << ' ' << (fact.dtype.empty() ? "?" : fact.dtype) << '[';
        for (std::size_t d = 0; d < fact.shape.size(); ++d) out << (d ? "," : "") << fact.shape[d];
        out << "] " << fact.bytes << 'B';
      }
    }
    // The table's flags, in its order, for every field off its default.
    std::string flags;
    for (int f = 0; f < gf::kFieldCount; ++f) {
      const char* flag = gf::kFields[f].flag;
      if (*flag == '\0' || gf::at_default(f, node)) continue;
      std::string text = flag;
      const auto at = text.find('%');
      if (at != std::string::npos) text.replace(at, 1, gf::value_text(f, node));
      flags += (flags.empty() ? "" : ",") + text;
    }
    if (!flags.empty()) out << " {" << flags << '}';
    if (options.show_module_stack && node.stack >= 0) out << " @" << graph.stack_of(node).front().fqn;
    if (i < options.annotations.size() && !options.annotations[i].empty()) out << "  # " << options.annotations[i];
    out << '\n';
  }
  return out.str();
}

GraphSummary summarize(const Graph& graph) {
  GraphSummary summary;
  const auto roots = storage_roots(graph);
  std::vector<char> counted(graph.nodes.size(), 0);
  summary.nodes = graph.nodes.size();
  summary.elided_copies = graph.elided_copies.size();
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.is_forward()) {
      ++summary.forward_nodes;
      summary.forward_flops = add_finite(summary.forward_flops, node.flops);
    } else {
      ++summary.backward_nodes;
      summary.backward_flops = add_finite(summary.backward_flops, node.flops);
    }
    if (node.kind == NodeKind::Placeholder) {
      ++summary.placeholders;
      if (node.role == Role::Parameter) ++summary.parameters;
    }
    if (!node.is_forward() || node.kind == NodeKind::Placeholder || node.kind == NodeKind::GetAttr) continue;
    bool read_by_backward = false;
    for (auto user : graph.users[i]) {
      const Node& reader = graph.nodes[static_cast<std::size_t>(user)];
      if (reader.is_backward() && reader.kind != NodeKind::Output) read_by_backward = true;
    }
    if (read_by_backward) {
      ++summary.activations_read_by_backward;
      // Storage counts once however many views of it the backward reads.
      auto root = static_cast<std::size_t>(roots[i]);
      const Node& base = graph.nodes[root];
      bool activation = base.is_forward() && base.kind == NodeKind::CallFunction;
      if (activation && !counted[root]) {
        counted[root] = 1;
        summary.activation_bytes_read_by_backward = add_bytes(summary.activation_bytes_read_by_backward, base.output_bytes());
      }
    }
  }
  return summary;
}

std::string format_summary(const GraphSummary& summary) {
  std::ostringstream out;
  out << "nodes: " << summary.nodes << " (forward " << summary.forward_nodes << ", backward "
      << summary.backward_nodes << ")\n";
  if (summary.elided_copies)
    out << "elided copies: " << summary.elided_copies << " (exact clones; readers read the source)\n";
  out << "placeholders: " << summary.placeholders << " (parameters " << summary.parameters << ")\n";
  out << "activations read by backward: " << summary.activations_read_by_backward << " ("
      << format_bytes(summary.activation_bytes_read_by_backward) << ")\n";
  char flops[128];
  std::snprintf(flops, sizeof flops, "flops: forward %.3g, backward %.3g\n", summary.forward_flops, summary.backward_flops);
  out << flops;
  return out.str();
}

}  // namespace hyper_ac
