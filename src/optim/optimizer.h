// optimizer — the Optimizer interface and the registry of optimizers by name.
//
// Optimizer: one update of every parameter from its gradient at a given learning rate; reports
// its exact state size in bytes; saves and restores its state as named binary32 tensors plus a
// step count (checkpoints). Parameters are visited in parameter_shapes order.
//
// Registry: each optimizer is an entry {name, description, its keys, a parser / validator of
// its settings, a factory}. A training configuration's [optimizer] table gives `name` and that
// optimizer's keys (OptimizerOptions); the entry reads them (unknown keys, wrong types and
// out-of-range values are InputErrors naming the key and where it was given). The optimizers
// themselves live in files of their own (adamw.h); optimizer.cpp lists them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "nn/backward.h"  // GradMap
#include "nn/model.h"

namespace mantis {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  virtual void step(Model& m, const GradMap<float>& g, double lr) = 0;
  virtual uint64_t state_bytes() const = 0;
  virtual uint64_t steps() const = 0;
  // State as named tensors (names "<param>.<slot>") and its step count; load_state checks that
  // every tensor is present with the right size (InputError naming the offender).
  virtual std::map<std::string, std::vector<float>> state() const = 0;
  virtual void load_state(const std::map<std::string, std::vector<float>>& s, uint64_t steps) = 0;
};

// One setting as the configuration gave it. monostate: a value of another kind (an array, a
// table, a date), which no optimizer key accepts. `where` locates it in messages ("FILE:LINE").
struct OptionValue {
  std::variant<std::monostate, bool, int64_t, double, std::string> value;
  std::string where;
};

// The [optimizer] table of a training configuration: the optimizer's name and its other keys.
struct OptimizerOptions {
  std::string name = "adamw";
  std::map<std::string, OptionValue> values;  // every key but `name`
  std::string source;                         // the configuration's path, for messages
};

// Reads an optimizer's keys: the constructor refuses a key not in `known`; each get leaves `out`
// unchanged when the key is absent and otherwise requires its type (InputError
// "WHERE: 'KEY' in [optimizer] must be …").
class OptionReader {
 public:
  OptionReader(const OptimizerOptions& o, std::vector<std::string> known);
  void get(const std::string& key, double& out) const;  // a finite number (an integer is taken as one)
  void get(const std::string& key, uint64_t& out) const;
  void get(const std::string& key, bool& out) const;
  void get(const std::string& key, std::string& out) const;

 private:
  const OptionValue* find(const std::string& key) const;
  const OptimizerOptions& o_;
};

struct OptimizerEntry {
  std::string name, description;
  std::vector<std::string> keys;  // the [optimizer] keys it reads, besides `name`
  // Parses and validates the settings (InputError naming the key or the value).
  std::function<void(const OptimizerOptions&)> check;
  // The same, then the optimizer for m's parameters.
  std::function<std::unique_ptr<Optimizer>(const Model&, const OptimizerOptions&)> make;
};

// Every registered optimizer in registration order (the built-in ones first).
const std::vector<OptimizerEntry>& optimizers();
// Adds one (say a test's); InputError if the name is taken. Not thread-safe: register before use.
void register_optimizer(OptimizerEntry e);
// The entry for o.name; InputError "SOURCE: [optimizer] name = 'X' (known: adamw, …)".
const OptimizerEntry& find_optimizer(const OptimizerOptions& o);
void check_optimizer(const OptimizerOptions& o);
std::unique_ptr<Optimizer> make_optimizer(const Model& m, const OptimizerOptions& o);

}  // namespace mantis
