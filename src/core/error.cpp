#include "core/error.h"

#include <fmt/format.h>

#include <cstdint>

namespace mantis {

InputError::InputError(std::string_view message) : std::runtime_error(escape_control(message)) {}

std::string escape_control(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
    uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      ok = (c >> 6) == 0x2;
      cp = cp << 6 | (c & 0x3f);
    }
    // overlong forms, surrogates and values past U+10FFFF are not UTF-8 either
    ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
         !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
      continue;
    }
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0)) out += fmt::format("\\x{:02x}", cp);
    else if (cp == 0x2028 || cp == 0x2029) out += fmt::format("\\u{:04x}", cp);
    else out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace mantis
