#include "optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "optim/adafactor.h"
#include "optim/adam4bit.h"
#include "optim/adam8bit.h"
#include "optim/adam_mini.h"
#include "optim/adamw.h"
#include "optim/gefen.h"
#include "optim/gefen_muon.h"
#include "optim/sm3.h"

namespace mantis {

namespace {

std::vector<OptimizerEntry>& registry() {
  static std::vector<OptimizerEntry> r = {adamw_entry(),     gefen_entry(),     gefen_muon_entry(),
                                          adam8bit_entry(),  adam4bit_entry(),  adam_mini_entry(),
                                          adafactor_entry(), sm3_entry()};
  return r;
}

std::string known_names() {
  std::string s;
  for (auto& e : registry()) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

}  // namespace

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {{DType::f64, "f64", 8}, {DType::f32, "f32", 4}, {DType::f16, "f16", 2},
                                 {DType::bf16, "bf16", 2}, {DType::i64, "i64", 8}, {DType::i32, "i32", 4},
                                 {DType::i16, "i16", 2},   {DType::i8, "i8", 1},   {DType::u64, "u64", 8},
                                 {DType::u32, "u32", 4},   {DType::u16, "u16", 2}, {DType::u8, "u8", 1}};

const DTypeInfo& info(DType d) {
  for (auto& i : kDTypes)
    if (i.dtype == d) return i;
  throw std::logic_error("DType out of range");
}

}  // namespace

const char* to_string(DType d) { return info(d).name; }
size_t dtype_size(DType d) { return info(d).size; }

std::optional<DType> dtype_from_string(std::string_view s) {
  for (auto& i : kDTypes)
    if (s == i.name) return i.dtype;
  return std::nullopt;
}

std::string dtype_names() {
  std::string s;
  for (auto& i : kDTypes) s += (s.empty() ? "" : ", ") + std::string(i.name);
  return s;
}

uint64_t StateTensor::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

std::string StateTensor::describe() const { return fmt::format("{} [{}]", to_string(dtype), fmt::join(shape, ", ")); }

const StateTensor& expect_state(const std::vector<StateTensor>& s, const std::string& name, DType dtype,
                                const std::vector<uint64_t>& shape) {
  for (auto& t : s)
    if (t.name == name) {
      if (t.dtype != dtype || t.shape != shape)
        throw InputError(fmt::format("optimizer state: tensor '{}' is {}, expected {}", name, t.describe(),
                                     StateTensor{name, dtype, shape, {}}.describe()));
      if (t.bytes.size() != t.numel() * dtype_size(dtype))  // a tensor built in code, not read from a file
        throw InputError(fmt::format("optimizer state: tensor '{}' holds {} bytes, expected {}", name, t.bytes.size(),
                                     t.numel() * dtype_size(dtype)));
      return t;
    }
  throw InputError(fmt::format("optimizer state: missing tensor '{}'", name));
}

void check_adam_settings(const char* who, double beta1, double beta2, double eps, double weight_decay) {
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    throw InputError(fmt::format("{}: betas ({}, {}) must lie in [0, 1)", who, beta1, beta2));
  if (!(eps > 0)) throw InputError(fmt::format("{}: eps = {} must be positive", who, eps));
  if (!(weight_decay >= 0)) throw InputError(fmt::format("{}: weight_decay = {} must be ≥ 0", who, weight_decay));
}

void expect_state_count(const std::vector<StateTensor>& s, size_t count) {
  if (s.size() != count) throw InputError(fmt::format("optimizer state: {} tensors, expected {}", s.size(), count));
}

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

std::unique_ptr<Optimizer> make_optimizer(const ParamSet& p, const OptimizerOptions& o) { return find_optimizer(o).make(p, o); }

ParamSet param_set(const ModelConfig& c) { return {parameter_infos(c), true}; }

ParamSet param_set(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  ParamSet s{{}, false};
  for (auto& [name, shape] : shapes) {
    ParamInfo p;
    p.name = name, p.shape = shape;
    s.params.push_back(std::move(p));
  }
  return s;
}

}  // namespace mantis
