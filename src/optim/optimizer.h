// optimizer — the Optimizer interface and the registry of optimizers by name.
//
// Optimizer: one update of every parameter from its gradient at a given learning rate; reports
// its exact state size in bytes; saves and restores its state as named typed tensors (dtype,
// shape, bytes: binary32 moments, 8-bit codes, block scales, codebooks) plus a step count
// (checkpoints, train/state.h). Parameters are visited in parameter_shapes order.
//
// Registry: each optimizer is an entry {name, description, its keys, a parser / validator of
// its settings, a factory}. A training configuration's [optimizer] table gives `name` and that
// optimizer's keys (OptimizerOptions); the entry reads them (unknown keys, wrong types and
// out-of-range values are InputErrors naming the key and where it was given). The optimizers
// themselves live in files of their own (adamw.h); optimizer.cpp lists them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "nn/grad.h"
#include "nn/model.h"

namespace mantis {

// The element type of a state tensor; names as in optimizer.bin's index ("f32", "u8", …).
// f16 and bf16 are stored as their 16-bit patterns (no C++ arithmetic type here).
enum class DType : uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8 };
const char* to_string(DType d);
size_t dtype_size(DType d);  // bytes per element
std::optional<DType> dtype_from_string(std::string_view s);
std::string dtype_names();  // "f64, f32, …, u8"

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::i64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::i32;
  else if constexpr (std::is_same_v<T, int16_t>) return DType::i16;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::i8;
  else if constexpr (std::is_same_v<T, uint64_t>) return DType::u64;
  else if constexpr (std::is_same_v<T, uint32_t>) return DType::u32;
  else if constexpr (std::is_same_v<T, uint16_t>) return DType::u16;
  else {
    static_assert(std::is_same_v<T, uint8_t>, "no DType for this type");
    return DType::u8;
  }
}

// One tensor of an optimizer's state, at the dtype it is stored in: 8-bit codes, per-block
// scales, codebooks and full-precision moments alike. bytes holds numel() elements row-major,
// little-endian (the byte order mantis builds for).
struct StateTensor {
  std::string name;  // "<param>.<slot>" for per-parameter state
  DType dtype = DType::f32;
  std::vector<uint64_t> shape;  // {} = a scalar
  std::vector<std::byte> bytes;

  uint64_t numel() const;  // the product of shape (1 for a scalar)
  std::string describe() const;  // "f32 [4, 32]"
  template <class T>
  static StateTensor of(std::string name, std::vector<uint64_t> shape, std::span<const T> values) {
    StateTensor t{std::move(name), dtype_of<T>(), std::move(shape), std::vector<std::byte>(values.size_bytes())};
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size_bytes());  // (empty: data() may be null)
    return t;
  }
  // Copies the elements into `out` (out.size() must equal numel(); the dtype must be T's).
  template <class T>
  void copy_to(std::span<T> out) const {
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size_bytes());
  }
};

// The parameters an optimizer updates, in the order it visits them (its state follows this
// order): a model's parameter_infos, roles known; or a replay file's tensors by name, where only
// name and shape mean anything unless a model configuration supplied the roles (Adam-mini,
// which partitions by role and head, refuses a set without roles).
struct ParamSet {
  std::vector<ParamInfo> params;
  bool roles = true;
};
ParamSet param_set(const ModelConfig& c);  // parameter_infos(c)
// A set from names and shapes alone (roles unknown).
ParamSet param_set(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes);
// Decoupled weight decay applies to tensors with ≥ 2 dimensions (matrices and embeddings; not
// biases or norm gains), in every optimizer.
inline bool decays(const ParamInfo& p) { return p.shape.size() >= 2; }

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // m.params and g hold every parameter of the set by name (m.cfg is not read).
  virtual void step(Model& m, const GradMap<float>& g, double lr) = 0;
  // Exactly what the state holds: Σ bytes of state() + 8 for the step count.
  virtual uint64_t state_bytes() const = 0;
  virtual uint64_t steps() const = 0;
  // The state as typed tensors in a fixed order, and its step count; load_state checks that
  // every tensor is present with the right dtype and shape (InputError naming the offender).
  virtual std::vector<StateTensor> state() const = 0;
  virtual void load_state(const std::vector<StateTensor>& s, uint64_t steps) = 0;
};

// The Adam family's shared settings (AdamW, Gefen, the 8- and 4-bit Adams, Adam-mini): InputError
// "WHO: betas (b1, b2) must lie in [0, 1)", "WHO: eps = … must be positive" or
// "WHO: weight_decay = … must be ≥ 0".
void check_adam_settings(const char* who, double beta1, double beta2, double eps, double weight_decay);

// For load_state: the tensor of `s` named `name`, which must have this dtype and shape;
// InputError "optimizer state: …" naming it otherwise.
const StateTensor& expect_state(const std::vector<StateTensor>& s, const std::string& name, DType dtype,
                                const std::vector<uint64_t>& shape);
// InputError unless `s` holds exactly `count` tensors (after each expected one was found).
void expect_state_count(const std::vector<StateTensor>& s, size_t count);

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
  // The same, then the optimizer for these parameters (InputError if it cannot serve them).
  std::function<std::unique_ptr<Optimizer>(const ParamSet&, const OptimizerOptions&)> make;
};

// Every registered optimizer in registration order (the built-in ones first).
const std::vector<OptimizerEntry>& optimizers();
// Adds one (say a test's); InputError if the name is taken. Not thread-safe: register before use.
void register_optimizer(OptimizerEntry e);
// The entry for o.name; InputError "SOURCE: [optimizer] name = 'X' (known: adamw, …)".
const OptimizerEntry& find_optimizer(const OptimizerOptions& o);
void check_optimizer(const OptimizerOptions& o);
std::unique_ptr<Optimizer> make_optimizer(const ParamSet& p, const OptimizerOptions& o);
inline std::unique_ptr<Optimizer> make_optimizer(const Model& m, const OptimizerOptions& o) {
  return make_optimizer(param_set(m.cfg), o);
}

}  // namespace mantis
