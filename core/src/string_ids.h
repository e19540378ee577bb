// Internal to the core: dense ids for distinct strings (open addressing,
// linear probing, one flat slot array): one probe sequence per lookup, no node
// allocation per key. The keys are views; the caller keeps the strings alive.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace hyper_ac {
namespace detail {

class StringIds {
 public:
  explicit StringIds(std::size_t expected = 16) { rehash(capacity_for(expected)); }

  std::size_t size() const { return keys_.size(); }
  std::string_view key(std::int32_t id) const { return keys_[static_cast<std::size_t>(id)]; }

  // The id of `key`, -1 when absent.
  std::int32_t find(std::string_view key) const {
    const std::size_t h = hash(key);
    for (std::size_t slot = h & mask_;; slot = (slot + 1) & mask_) {
      const std::int32_t id = slots_[slot];
      if (id < 0) return -1;
      if (hashes_[static_cast<std::size_t>(id)] == h && keys_[static_cast<std::size_t>(id)] == key) return id;
    }
  }

  // The id of `key` (the next free id when it is new) and whether it is new.
  std::pair<std::int32_t, bool> insert(std::string_view key) {
    if (2 * (keys_.size() + 1) > slots_.size()) rehash(2 * slots_.size());
    const std::size_t h = hash(key);
    std::size_t slot = h & mask_;
    for (;; slot = (slot + 1) & mask_) {
      const std::int32_t id = slots_[slot];
      if (id < 0) break;
      if (hashes_[static_cast<std::size_t>(id)] == h && keys_[static_cast<std::size_t>(id)] == key) return {id, false};
    }
    const auto id = static_cast<std::int32_t>(keys_.size());
    slots_[slot] = id;
    keys_.push_back(key);
    hashes_.push_back(h);
    return {id, true};
  }

 private:
  // Eight bytes at a time, multiply-xorshift mixed: the keys are short
  // (targets, FQNs), and ids follow insertion order, never the hash.
  static std::size_t hash(std::string_view key) {
    std::uint64_t h = 0x9e3779b97f4a7c15ULL ^ key.size();
    const char* p = key.data();
    std::size_t left = key.size();
    auto mix = [&h](std::uint64_t word) {
      h = (h ^ word) * 0xbf58476d1ce4e5b9ULL;
      h ^= h >> 31;
    };
    for (; left >= 8; left -= 8, p += 8) {
      std::uint64_t word;
      std::memcpy(&word, p, 8);
      mix(word);
    }
    if (left > 0) {
      std::uint64_t word = 0;
      std::memcpy(&word, p, left);
      mix(word);
    }
    h ^= h >> 29;
    h *= 0x94d049bb133111ebULL;
    return static_cast<std::size_t>(h ^ (h >> 32));
  }
  static std::size_t capacity_for(std::size_t expected) {
    std::size_t capacity = 16;
    while (capacity < 2 * expected) capacity *= 2;
    return capacity;
  }
  void rehash(std::size_t capacity) {
    slots_.assign(capacity, -1);
    mask_ = capacity - 1;
    for (std::size_t id = 0; id < keys_.size(); ++id) {
      std::size_t slot = hashes_[id] & mask_;
      while (slots_[slot] >= 0) slot = (slot + 1) & mask_;
      slots_[slot] = static_cast<std::int32_t>(id);
    }
  }

  std::vector<std::int32_t> slots_;  // id per slot, -1 = empty
  std::size_t mask_ = 0;
  std::vector<std::string_view> keys_;
  std::vector<std::size_t> hashes_;
};

}  // namespace detail
}  // namespace hyper_ac
