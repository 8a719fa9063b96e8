#include "core/error.h"

#include <fmt/format.h>

namespace mantis {

InputError::InputError(std::string_view message) : std::runtime_error(escape_control(message)) {}

std::string escape_control(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

}  // namespace mantis
