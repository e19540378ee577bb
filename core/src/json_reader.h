// Private to the core: strict JSON reading shared by the graph loader and the
// config parser. On top of nlohmann's grammar it rejects a key repeated in one
// object (nlohmann keeps the last) and a number past double range (nlohmann's
// out_of_range.406), naming the place in the document.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyper_ac {
namespace json_reader {

// Where the reader is in the document, for messages: `nodes[3].flops`.
class Path {
 public:
  void enter_object() { levels_.push_back({false, 0, {}}); }
  void enter_array() { levels_.push_back({true, 0, {}}); }
  void leave() {
    levels_.pop_back();
    value_done();
  }
  void set_key(const std::string& key) { levels_.back().key = key; }
  // After a scalar value or a closed container: the enclosing array moves on.
  void value_done() {
    if (!levels_.empty() && levels_.back().array) ++levels_.back().index;
  }
  std::size_t depth() const { return levels_.size(); }
  std::string str() const;
  // The innermost key (the field a value belongs to, even inside arrays); "" at top level.
  std::string last_key() const;

 private:
  struct Level {
    bool array;
    std::size_t index;
    std::string key;
  };
  std::vector<Level> levels_;
};

// Why a document was refused before any validation of its content.
class ReadError : public std::runtime_error {
 public:
  enum class Kind { Malformed, DuplicateKey, NumberRange };
  ReadError(Kind kind, std::string message, std::string path, std::string key, std::string detail)
      : std::runtime_error(std::move(message)), kind(kind), path(std::move(path)), key(std::move(key)),
        detail(std::move(detail)) {}
  Kind kind;
  // what(): the problem with its place; detail: the same without the place.
  std::string path;  // `nodes[2].flops`; "" = the document itself
  std::string key;   // innermost key of the place ("" at top level)
  std::string detail;
};

// Converts a sax parse_error callback into a ReadError (406 = number past double range).
[[noreturn]] void raise_parse_error(const nlohmann::json::exception& error, const std::string& token,
                                    const Path& path);
// A key met twice in the object now open (`seen` holds the keys so far).
[[noreturn]] void raise_duplicate_key(const std::string& key, const Path& path);

// Parses `text` into a DOM with the checks above. Throws ReadError.
nlohmann::json parse_strict(const std::string& text);

}  // namespace json_reader
}  // namespace hyper_ac
