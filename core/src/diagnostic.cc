#include "hyper_ac/diagnostic.h"

namespace hyper_ac {

const char* to_string(Severity severity) {
  switch (severity) {
    case Severity::Info: return "info";
    case Severity::Warning: return "warning";
  }
  return "?";
}

}  // namespace hyper_ac
