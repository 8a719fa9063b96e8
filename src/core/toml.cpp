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
    // (an init-capture: clang before 16 cannot capture a structured binding; the fuzz build uses clang 14)
    if (std::any_of(known.begin(), known.end(), [&k = k](const char* x) { return k.str() == x; })) continue;
    std::string list;
    for (const char* x : known) list += (list.empty() ? "" : ", ") + std::string(x);
    throw InputError(fmt::format("{}: unknown key '{}'{} (known: {})", toml_where(path, v), k.str(), context, list));
  }
}

std::vector<uint64_t> toml_seeds(const toml::node& n, const std::string& path, const std::string& what) {
  if (!n.is_array() || n.as_array()->empty())
    throw InputError(fmt::format("{}: '{}' must be a non-empty array of seeds", toml_where(path, n), what));
  std::vector<uint64_t> v;
  for (auto& e : *n.as_array()) {
    if (!e.is_integer() || e.as_integer()->get() < 0)
      throw InputError(fmt::format("{}: '{}' must hold non-negative integers", toml_where(path, e), what));
    const uint64_t s = uint64_t(e.as_integer()->get());
    if (std::find(v.begin(), v.end(), s) != v.end())
      throw InputError(fmt::format("{}: '{}' lists seed {} twice", toml_where(path, e), what, s));
    v.push_back(s);
  }
  return v;
}

}  // namespace mantis
