// The one diagnostic every stage reports: a severity, the node it concerns
// (if any) and a human-readable message. Deterministic: no timings, no pointers.
#pragma once

#include <cstdint>
#include <string>

namespace hyper_ac {

enum class Severity { Info, Warning };
const char* to_string(Severity severity);  // "info", "warning"

struct Diagnostic {
  Severity severity = Severity::Info;
  std::int32_t node = -1;  // index into Graph::nodes; -1 = about the graph as a whole
  std::string message;
};

inline bool operator==(const Diagnostic& a, const Diagnostic& b) {
  return a.severity == b.severity && a.node == b.node && a.message == b.message;
}
inline bool operator!=(const Diagnostic& a, const Diagnostic& b) { return !(a == b); }

}  // namespace hyper_ac
