#include "json_reader.h"

#include <algorithm>

namespace hyper_ac {
namespace json_reader {

using json = nlohmann::json;

std::string Path::str() const {
  std::string out;
  for (std::size_t i = 0; i < levels_.size(); ++i) {
    const Level& level = levels_[i];
    if (level.array) {
      out += '[' + std::to_string(level.index) + ']';
    } else if (!level.key.empty()) {
      if (!out.empty()) out += '.';
      out += level.key;
    }
  }
  return out;
}

std::string Path::last_key() const {
  for (auto it = levels_.rbegin(); it != levels_.rend(); ++it)
    if (!it->array && !it->key.empty()) return it->key;
  return "";
}

void raise_parse_error(const json::exception& error, const std::string& token, const Path& path) {
  if (error.id == 406) {
    const std::string where = path.str();
    const std::string range = " is out of range (beyond a double; give a finite number)";
    throw ReadError(ReadError::Kind::NumberRange,
                    "number " + token + (where.empty() ? std::string() : " at '" + where + "'") + range, where,
                    path.last_key(), "number " + token + range);
  }
  throw ReadError(ReadError::Kind::Malformed, error.what(), path.str(), path.last_key(), error.what());
}

void raise_duplicate_key(const std::string& key, const Path& path) {
  std::string where = path.str();
  // The path already ends in the repeated key; name the object holding it.
  const std::size_t cut = where.rfind('.');
  std::string object = where.size() == key.size() ? std::string() : where.substr(0, cut == std::string::npos ? 0 : cut);
  throw ReadError(ReadError::Kind::DuplicateKey,
                  "key '" + key + "' appears twice in " + (object.empty() ? std::string("the document") : "'" + object + "'") +
                      " (JSON objects must not repeat a key; the last would silently win)",
                  where, key, "given twice in one object (JSON keys must be unique; the last would silently win)");
}

namespace {

// Builds a DOM like nlohmann's own, plus the two checks.
class StrictDomBuilder {
 public:
  explicit StrictDomBuilder(json& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    json* value = place(json::object());
    stack_.push_back(value);
    keys_.emplace_back();
    path_.enter_object();
    return true;
  }
  bool key(json::string_t& k) {
    path_.set_key(k);
    auto& seen = keys_.back();
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) raise_duplicate_key(k, path_);
    seen.push_back(k);
    key_ = k;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    keys_.pop_back();
    path_.leave();
    return true;
  }
  bool start_array(std::size_t) {
    json* value = place(json::array());
    stack_.push_back(value);
    path_.enter_array();
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    path_.leave();
    return true;
  }
  bool parse_error(std::size_t, const std::string& token, const json::exception& error) {
    raise_parse_error(error, token, path_);
  }

 private:
  json* place(json&& value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    return &(parent[key_] = std::move(value));
  }
  template <class T>
  bool put(T&& value) {
    place(json(std::forward<T>(value)));
    path_.value_done();
    return true;
  }

  json& root_;
  std::vector<json*> stack_;
  std::vector<std::vector<std::string>> keys_;
  std::string key_;
  Path path_;
};

}  // namespace

json parse_strict(const std::string& text) {
  json root;
  StrictDomBuilder builder(root);
  json::sax_parse(text, &builder);
  return root;
}

}  // namespace json_reader
}  // namespace hyper_ac
