// hyper_ac._memory: exact CPU tensor-memory accounting through c10's allocator.
//
// A CountingAllocator is installed as c10's CPU allocator (c10::SetCPUAllocator)
// and delegates every request to the allocator that was there before.  While at
// least one tracking scope is open it counts the bytes each allocate(n) call
// received, and it counts the matching free through its own deleter, so the
// bytes given back are exactly the bytes that were counted.  Memory allocated
// while nobody tracks is passed through untouched and never counted, neither
// when it is allocated nor when it is freed.
//
// Only c10 is used: this translation unit includes c10 headers and links
// libc10.so, nothing from libtorch_cpu or libtorch_python.
//
// Bookkeeping.  A tracked allocation keeps the data pointer as its DataPtr
// context (context == data, so torch's "simple data pointer" paths -- copy on
// write, raw_allocate -- keep working) and is recorded in a side table: size,
// the scope stamp at allocation time and the delegate's deleter.  Scopes are
// numbered in the order they open; an allocation is charged to every scope
// open at the time, and its free is credited to every scope that is still
// open and was opened before the allocation.  Scopes are process-wide: all
// threads' allocations count, nesting works and scopes may close out of order.

#include <c10/core/CPUAllocator.h>

#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

struct Record {
  std::int64_t bytes;
  std::uint64_t stamp;           // id of the last scope opened before it
  c10::DeleterFnPtr inner_deleter;
};

struct Scope {
  std::uint64_t id;
  std::int64_t current;  // bytes allocated inside the scope and still live
  std::int64_t peak;     // max of `current` since the scope opened / reset
};

// Leaked on purpose: tensors may be freed during interpreter shutdown, after
// static destructors would have run.
struct State {
  std::mutex mu;
  std::unordered_map<void*, Record> live;  // tracked, not yet freed
  std::vector<Scope> scopes;               // open scopes, ascending id
  std::uint64_t last_id = 0;
  std::atomic<int> open{0};                // scopes.size(), read lock-free
  // Allocations whose delegate returned context != data (not the case for
  // torch's default CPU allocator): counted through a heap context instead.
  std::uint64_t wrapped_allocations = 0;
};

State& state() {
  static State* s = new State();
  return *s;
}

// The delegate and its raw deleter.  Atomic because other threads may be
// allocating while install() runs.
std::atomic<c10::Allocator*> g_prev{nullptr};
std::atomic<c10::DeleterFnPtr> g_prev_raw{nullptr};
std::uint8_t g_priority = 0;  // priority our SetCPUAllocator call won at

// Set by reaches_wrapper() on its own thread to see whether a request to
// GetCPUAllocator() ends up in the wrapper.
thread_local bool t_probing = false;
thread_local bool t_probe_hit = false;

// Charge `bytes` to every open scope (caller holds the lock).
void charge(State& s, std::int64_t bytes) {
  for (auto& sc : s.scopes) {
    sc.current += bytes;
    sc.peak = std::max(sc.peak, sc.current);
  }
}

// Credit `bytes` to open scopes that were open when the allocation was made.
void credit(State& s, std::int64_t bytes, std::uint64_t stamp) {
  for (auto& sc : s.scopes) {
    if (sc.id > stamp) break;  // opened after the allocation
    sc.current -= bytes;
  }
}

// Deleter of tracked allocations whose context is the data pointer.
void tracked_delete(void* ptr) noexcept {
  if (ptr == nullptr) return;
  auto& s = state();
  c10::DeleterFnPtr inner = g_prev_raw.load();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.live.find(ptr);
    if (it != s.live.end()) {
      credit(s, it->second.bytes, it->second.stamp);
      inner = it->second.inner_deleter;
      s.live.erase(it);
    }
  }
  // Not in the table: an untracked pointer handed to raw_deallocate(), which
  // is only possible when the delegate has a raw deleter (see raw_deleter()).
  if (inner != nullptr) inner(ptr);
}

// Fallback context for delegates whose DataPtr context differs from the data.
struct WrappedCtx {
  c10::DataPtr inner;
  std::int64_t bytes;
  std::uint64_t stamp;
};

void wrapped_delete(void* ctx) noexcept {
  auto* w = static_cast<WrappedCtx*>(ctx);
  auto& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    credit(s, w->bytes, w->stamp);
  }
  delete w;  // frees the delegate's DataPtr
}

struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = g_prev.load()->allocate(n);
    if (C10_UNLIKELY(t_probing)) {
      t_probe_hit = true;
      return inner;
    }
    auto& s = state();
    if (s.open.load(std::memory_order_acquire) == 0 || n == 0 || !inner) {
      return inner;
    }
    void* data = inner.get();
    const auto device = inner.device();
    const auto bytes = static_cast<std::int64_t>(n);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.scopes.empty()) return inner;  // last scope closed meanwhile
    if (inner.get_context() == data) {
      // May throw (bad_alloc); `inner` still owns the memory then.
      s.live.insert_or_assign(data, Record{bytes, s.last_id, inner.get_deleter()});
      inner.release_context();
      charge(s, bytes);
      return c10::DataPtr(data, data, &tracked_delete, device);
    }
    auto* w = new WrappedCtx{std::move(inner), bytes, s.last_id};
    ++s.wrapped_allocations;
    charge(s, bytes);
    return c10::DataPtr(data, w, &wrapped_delete, device);
  }

  bool is_simple_data_ptr(const c10::DataPtr& p) const override {
    if (p.get_deleter() == &tracked_delete) return true;  // context == data
    if (p.get_deleter() == &wrapped_delete) return false;
    return g_prev.load()->is_simple_data_ptr(p);
  }

  // Constant, as c10 requires.  Only offered when the delegate offers one:
  // tracked_delete then frees untracked pointers with the delegate's deleter.
  c10::DeleterFnPtr raw_deleter() const override {
    return g_prev_raw.load() != nullptr ? &tracked_delete : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_prev.load()->copy_data(dest, src, count);
  }
};

CountingAllocator& counting_allocator() {
  static CountingAllocator* a = new CountingAllocator();
  return *a;
}

bool is_installed() { return c10::GetCPUAllocator() == &counting_allocator(); }

// True when CPU allocations reach the wrapper: it is registered, or whatever
// replaced it delegates to it.  Probes with a 1-byte allocation.
bool reaches_wrapper() {
  if (is_installed()) return true;
  if (g_prev.load() == nullptr) return false;  // never installed
  t_probing = true;
  t_probe_hit = false;
  try {
    c10::GetCPUAllocator()->allocate(1);  // freed at once
  } catch (...) {
    t_probing = false;
    throw;
  }
  t_probing = false;
  return t_probe_hit;
}

// Install the wrapper.  c10::SetAllocator only replaces the registered
// allocator when the new priority is >= the registered one, and the
// registered priority is not readable.  Trying 0, 1, 2, ... and stopping at
// the first success therefore installs at exactly the current priority: the
// priority level is left as it was, anyone who could override torch's
// allocator can still override ours, and uninstall() can restore the
// delegate at that same priority.
//
// If something replaced the wrapper but still delegates to it, requests reach
// it already; installing again would make the two delegate to each other, so
// install() leaves things as they are then.
bool install() {
  if (reaches_wrapper()) return true;
  auto& wrapper = counting_allocator();
  c10::Allocator* prev = c10::GetCPUAllocator();
  if (prev == nullptr) throw std::runtime_error("c10 has no CPU allocator registered");
  // Set the delegate before the wrapper can receive a request.  Re-installing
  // over a different allocator is safe: tracked pointers keep their own
  // inner deleters.
  g_prev.store(prev);
  g_prev_raw.store(prev->raw_deleter());
  for (int p = 0; p <= 255; ++p) {
    c10::SetCPUAllocator(&wrapper, static_cast<std::uint8_t>(p));
    if (is_installed()) {
      g_priority = static_cast<std::uint8_t>(p);
      return true;
    }
  }
  return false;
}

// Put the delegate back if we are still the registered allocator.  Memory
// tracked so far keeps working: its deleter lives in this (never unloaded)
// module and frees through the delegate's own deleter.
bool uninstall() {
  if (!is_installed()) return false;
  c10::Allocator* prev = g_prev.load();
  c10::SetCPUAllocator(prev, g_priority);
  return c10::GetCPUAllocator() == prev;
}

std::uint64_t push_scope() {
  if (!install()) {
    throw std::runtime_error(
        "hyper_ac._memory: could not install the counting CPU allocator "
        "(another allocator holds priority 255)");
  }
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::uint64_t id = ++s.last_id;
  s.scopes.push_back(Scope{id, 0, 0});
  s.open.store(static_cast<int>(s.scopes.size()), std::memory_order_release);
  return id;
}

std::vector<Scope>::iterator find_scope(State& s, std::uint64_t id) {
  auto it = std::find_if(s.scopes.begin(), s.scopes.end(),
                         [id](const Scope& sc) { return sc.id == id; });
  if (it == s.scopes.end()) throw py::key_error("no open memory scope " + std::to_string(id));
  return it;
}

std::tuple<std::int64_t, std::int64_t> pop_scope(std::uint64_t id) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = find_scope(s, id);
  auto result = std::make_tuple(it->current, it->peak);
  s.scopes.erase(it);
  s.open.store(static_cast<int>(s.scopes.size()), std::memory_order_release);
  return result;
}

std::tuple<std::int64_t, std::int64_t> scope_stats(std::uint64_t id) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = find_scope(s, id);
  return std::make_tuple(it->current, it->peak);
}

void reset_peak(std::uint64_t id) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = find_scope(s, id);
  it->peak = it->current;
}

py::dict debug_info() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  py::dict d;
  d["installed"] = is_installed();
  d["priority"] = static_cast<int>(g_priority);
  d["open_scopes"] = s.scopes.size();
  d["live_tracked_allocations"] = s.live.size();
  d["wrapped_allocations"] = s.wrapped_allocations;
  return d;
}

}  // namespace

PYBIND11_MODULE(_memory, m) {
  m.doc() =
      "Counting wrapper around c10's CPU allocator: exact current/peak bytes of "
      "tensor memory per scope. Import torch before this module.";
  m.def("install", &install,
        "Install the counting allocator as c10's CPU allocator (idempotent). "
        "Returns True when CPU allocations now reach it.");
  m.def("uninstall", &uninstall,
        "Restore the previous CPU allocator if the counting one is still "
        "registered. Returns True if restored.");
  m.def("is_installed", &is_installed,
        "True when c10::GetCPUAllocator() returns the counting allocator.");
  m.def("reaches_wrapper", &reaches_wrapper,
        "True when CPU allocations reach the counting allocator (registered, or "
        "wrapped by a later allocator that delegates to it).");
  m.def("push_scope", &push_scope,
        "Open a tracking scope (installs the allocator if needed); returns its id.");
  m.def("pop_scope", &pop_scope, py::arg("scope"),
        "Close a scope; returns (current_bytes, peak_bytes) relative to its start.");
  m.def("scope_stats", &scope_stats, py::arg("scope"),
        "(current_bytes, peak_bytes) of an open scope.");
  m.def("reset_peak", &reset_peak, py::arg("scope"),
        "Set an open scope's peak to its current bytes.");
  m.def("debug_info", &debug_info);
}
