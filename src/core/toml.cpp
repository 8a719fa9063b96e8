#include "core/toml.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace mantis {

toml::table parse_toml(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}: malformed TOML: {}", path, e.source().begin.line, e.description()));
  }
}

std::string toml_where(const std::string& path, const toml::node& n) {
  return fmt::format("{}:{}", path, n.source().begin.line);
}

void check_known_keys(const toml::table& t, const std::string& path, std::initializer_list<const char*> known,
                      const std::string& context) {
  for (auto&& [k, v] : t) {
    if (std::any_of(known.begin(), known.end(), [&](const char* x) { return k.str() == x; })) continue;
    std::string list;
    for (const char* x : known) list += (list.empty() ? "" : ", ") + std::string(x);
    throw InputError(fmt::format("{}: unknown key '{}'{} (known: {})", toml_where(path, v), k.str(), context, list));
  }
}

}  // namespace mantis
