#include "optim/optimizer.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "optim/adamw.h"

namespace mantis {

namespace {

std::vector<OptimizerEntry>& registry() {
  static std::vector<OptimizerEntry> r = {adamw_entry()};
  return r;
}

std::string known_names() {
  std::string s;
  for (auto& e : registry()) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

}  // namespace

OptionReader::OptionReader(const OptimizerOptions& o, std::vector<std::string> known) : o_(o) {
  for (auto& [k, v] : o.values) {
    bool ok = false;
    std::string list = "name";
    for (auto& key : known) ok |= k == key, list += ", " + key;
    if (!ok) throw InputError(fmt::format("{}: unknown key '{}' in [optimizer] (known: {})", v.where, k, list));
  }
}

const OptionValue* OptionReader::find(const std::string& key) const {
  const auto it = o_.values.find(key);
  return it == o_.values.end() ? nullptr : &it->second;
}

namespace {

InputError must_be(const OptionValue& v, const std::string& key, const char* what) {
  return InputError(fmt::format("{}: '{}' in [optimizer] must be {}", v.where, key, what));
}

}  // namespace

void OptionReader::get(const std::string& key, double& out) const {
  const OptionValue* v = find(key);
  if (!v) return;
  if (auto* i = std::get_if<int64_t>(&v->value)) out = double(*i);
  else if (auto* d = std::get_if<double>(&v->value)) out = *d;
  else throw must_be(*v, key, "a number");
  if (!std::isfinite(out)) throw must_be(*v, key, "finite");
}

void OptionReader::get(const std::string& key, uint64_t& out) const {
  const OptionValue* v = find(key);
  if (!v) return;
  const auto* i = std::get_if<int64_t>(&v->value);
  if (!i) throw must_be(*v, key, "an integer");
  if (*i < 0) throw must_be(*v, key, "a non-negative integer in range");
  out = uint64_t(*i);
}

void OptionReader::get(const std::string& key, bool& out) const {
  const OptionValue* v = find(key);
  if (!v) return;
  const auto* b = std::get_if<bool>(&v->value);
  if (!b) throw must_be(*v, key, "true or false");
  out = *b;
}

void OptionReader::get(const std::string& key, std::string& out) const {
  const OptionValue* v = find(key);
  if (!v) return;
  const auto* s = std::get_if<std::string>(&v->value);
  if (!s) throw must_be(*v, key, "a string");
  out = *s;
}

const std::vector<OptimizerEntry>& optimizers() { return registry(); }

void register_optimizer(OptimizerEntry e) {
  for (auto& r : registry())
    if (r.name == e.name) throw InputError(fmt::format("optimizer '{}' is already registered", e.name));
  registry().push_back(std::move(e));
}

const OptimizerEntry& find_optimizer(const OptimizerOptions& o) {
  for (auto& e : registry())
    if (e.name == o.name) return e;
  throw InputError(fmt::format("{}: [optimizer] name = '{}' (known: {})", o.source, o.name, known_names()));
}

void check_optimizer(const OptimizerOptions& o) { find_optimizer(o).check(o); }

std::unique_ptr<Optimizer> make_optimizer(const Model& m, const OptimizerOptions& o) { return find_optimizer(o).make(m, o); }

}  // namespace mantis
