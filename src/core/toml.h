// toml — reading configuration files: the parse with a "FILE:LINE: malformed TOML" error, the
// "FILE:LINE" of a node, and the unknown-key check every configuration reader makes.
#pragma once

#include <toml++/toml.h>

#include <initializer_list>
#include <cstdint>
#include <string>
#include <vector>

namespace mantis {

// The table of `text` (read from `path`); InputError "PATH:LINE: malformed TOML: …" otherwise.
toml::table parse_toml(const std::string& text, const std::string& path);

// "PATH:LINE" of a node, for messages.
std::string toml_where(const std::string& path, const toml::node& n);

// InputError "PATH:LINE: unknown key 'K' (known: a, b, …)" for the first key of `t` not in `known`
// (`context`, when given, follows the key: " in [train]").
void check_known_keys(const toml::table& t, const std::string& path, std::initializer_list<const char*> known,
                      const std::string& context = "");

// A non-empty array of distinct non-negative integers (seeds); InputError "PATH:LINE: 'WHAT' …".
std::vector<uint64_t> toml_seeds(const toml::node& n, const std::string& path, const std::string& what);

}  // namespace mantis
