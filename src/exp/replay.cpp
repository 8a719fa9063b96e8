#include "exp/replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/philox.h"
#include "io/checkpoint.h"
#include "nn/model.h"

namespace mantis {

namespace {

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

void check_finite(const NamedTensor& t, const std::string& file) {
  for (size_t i = 0; i < t.data.size(); ++i)
    if (!std::isfinite(t.data[i]))
      throw InputError(fmt::format("{}: tensor {}: value {} at index {} is not finite", file, t.name, t.data[i], i));
}

// Element i of a state tensor as a double; nothing for the 16-bit float patterns.
std::optional<double> element(const StateTensor& t, size_t i) {
  auto get = [&]<class T>(T) {
    T v;
    std::memcpy(&v, t.bytes.data() + i * sizeof(T), sizeof(T));
    return double(v);
  };
  switch (t.dtype) {
    case DType::f64: return get(double{});
    case DType::f32: return get(float{});
    case DType::i64: return get(int64_t{});
    case DType::i32: return get(int32_t{});
    case DType::i16: return get(int16_t{});
    case DType::i8: return get(int8_t{});
    case DType::u64: return get(uint64_t{});
    case DType::u32: return get(uint32_t{});
    case DType::u16: return get(uint16_t{});
    case DType::u8: return get(uint8_t{});
    default: return std::nullopt;
  }
}

// "t.<t>.<n>" → (t, n); t decimal without leading zeros.
std::optional<std::pair<uint64_t, std::string>> step_name(const std::string& s) {
  if (!s.starts_with("t.")) return std::nullopt;
  size_t i = 2;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 2 || i - 2 > 18 || i >= s.size() || s[i] != '.' || (s[2] == '0' && i > 3)) return std::nullopt;
  return std::pair{std::stoull(s.substr(2, i - 2)), s.substr(i + 1)};
}

}  // namespace

ReplayResult replay(const ReplayOptions& o) {
  // the optimizer and its settings
  const OptimizerEntry* entry = nullptr;
  std::string known;
  for (auto& e : optimizers()) {
    if (e.name == o.optimizer) entry = &e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  if (!entry) throw InputError(fmt::format("optim replay: unknown optimizer '{}' (known: {})", o.optimizer, known));
  if (o.steps <= 0) throw InputError(fmt::format("optim replay: --steps {} must be ≥ 1", o.steps));
  OptimizerOptions opts;
  opts.name = o.optimizer;
  opts.source = "optim replay";
  for (auto& [k, v] : o.values) {
    bool has = false;
    for (auto& key : entry->keys) has |= key == k;
    if (!has)
      throw InputError(fmt::format("optim replay: optimizer '{}' has no setting '{}' (its keys: {})", o.optimizer, k,
                                   entry->keys.empty() ? std::string("none") : fmt::format("{}", fmt::join(entry->keys, ", "))));
    opts.values[k] = OptionValue{v, fmt::format("optim replay: --{}", k)};
  }
  entry->check(opts);
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) throw InputError(fmt::format("optim replay: --lr {} must be finite and ≥ 0", o.lr));
  if (!o.out.empty()) check_output_path(o.out, "optim replay: --out");

  // P, and the parameter set
  std::vector<NamedTensor> p = read_f32_tensors(o.params);
  if (p.empty()) throw InputError(fmt::format("{}: no tensors", o.params));
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < p.size(); ++i) index[p[i].name] = i;
  for (auto& t : p) check_finite(t, o.params);
  ParamSet set;
  if (o.config.empty()) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (auto& t : p) shapes.push_back({t.name, t.shape});
    set = param_set(shapes);
  } else {
    const ModelConfig c = load_model_config(o.config);
    set = param_set(c);
    for (auto& info : set.params) {
      auto it = index.find(info.name);
      if (it == index.end())
        throw InputError(fmt::format("{}: tensor {} missing (the model {} has it, shape {})", o.params, info.name,
                                     o.config, shape_str(info.shape)));
      if (p[it->second].shape != info.shape)
        throw InputError(fmt::format("{}: tensor {}: shape {}, but the model {} has {}", o.params, info.name,
                                     shape_str(p[it->second].shape), o.config, shape_str(info.shape)));
    }
    if (set.params.size() != p.size()) {
      std::set<std::string> want;
      for (auto& info : set.params) want.insert(info.name);
      for (auto& t : p)
        if (!want.count(t.name))
          throw InputError(fmt::format("{}: tensor {} is not a parameter of the model {}", o.params, t.name, o.config));
    }
  }

  // G: exactly t.<t>.<n> for t < steps and every n, each of n's shape
  std::vector<NamedTensor> g = read_f32_tensors(o.grads);
  const uint64_t N = uint64_t(o.steps);
  if (N > g.size() / p.size()) {  // fewer tensors than N steps need: name the first one missing
    std::map<uint64_t, std::set<std::string>> seen;
    for (auto& t : g)
      if (const auto sn = step_name(t.name)) seen[sn->first].insert(sn->second);
    for (uint64_t s = 0;; ++s)
      for (auto& t : p)
        if (!seen[s].count(t.name))
          throw InputError(fmt::format("{}: missing step tensor t.{}.{}", o.grads, s, t.name));
  }
  std::vector<std::vector<NamedTensor*>> at(N, std::vector<NamedTensor*>(p.size(), nullptr));
  for (auto& t : g) {
    const auto sn = step_name(t.name);
    if (!sn) throw InputError(fmt::format("{}: tensor {}: not a step tensor t.<step>.<param>", o.grads, t.name));
    const auto it = index.find(sn->second);
    if (it == index.end())
      throw InputError(fmt::format("{}: tensor {}: no parameter {} in {}", o.grads, t.name, sn->second, o.params));
    if (sn->first >= N)
      throw InputError(fmt::format("{}: tensor {}: step {} is beyond --steps {} (steps 0..{})", o.grads, t.name,
                                   sn->first, N, N - 1));
    const NamedTensor& param = p[it->second];
    if (t.shape != param.shape)
      throw InputError(fmt::format("{}: tensor {}: shape {}, but parameter {} has shape {}", o.grads, t.name,
                                   shape_str(t.shape), param.name, shape_str(param.shape)));
    at[sn->first][it->second] = &t;
  }
  for (uint64_t s = 0; s < N; ++s)
    for (size_t i = 0; i < p.size(); ++i)
      if (!at[s][i]) throw InputError(fmt::format("{}: missing step tensor t.{}.{}", o.grads, s, p[i].name));
  for (auto& t : g) check_finite(t, o.grads);

  // the run
  std::unique_ptr<Optimizer> opt = entry->make(set, opts);
  if (!opt) throw InputError(fmt::format("optim replay: optimizer '{}' made nothing", o.optimizer));
  Model m;
  for (auto& t : p) m.params[t.name] = Tensor{t.shape, std::move(t.data)};
  for (uint64_t s = 0; s < N; ++s) {
    GradMap<float> grads;
    for (size_t i = 0; i < p.size(); ++i) grads[p[i].name] = std::move(at[s][i]->data);  // each step's used once
    opt->step(m, grads, o.lr);
    // A diverged update is an error naming the step and tensor: non-finite weights are never written.
    for (auto& t : p) {
      const std::vector<float>& v = m.params.at(t.name).data;
      for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
          throw InputError(fmt::format("optim replay: step {}: the update (lr {}) made tensor {} non-finite (value {} at "
                                       "index {}); nothing was written", s, o.lr, t.name, v[i], i));
    }
  }

  ReplayResult r;
  r.optimizer = opt->name();
  r.steps = o.steps;
  r.state_bytes = opt->state_bytes();
  for (auto& t : p) {
    Tensor& v = m.params.at(t.name);
    r.params += uint64_t(v.data.size());
    r.final_params.push_back({t.name, t.shape, std::move(v.data)});
  }
  r.bytes_per_param = double(r.state_bytes) / double(r.params);
  r.state = opt->state();
  for (auto& t : r.state) {
    if (t.name == "codebook") {
      r.codebook.clear();
      for (size_t i = 0; i < t.numel(); ++i)
        if (auto v = element(t, i)) r.codebook.push_back(*v);
    } else if (t.name.ends_with(".period") && t.numel() == 1) {
      // "<p>.period", or GefenMuon's rest group "rest.<p>.period" (each parameter in one group)
      std::string p = t.name.substr(0, t.name.size() - 7);
      if (!index.count(p) && p.starts_with("rest.") && index.count(p.substr(5))) p = p.substr(5);
      if (index.count(p))
        if (auto v = element(t, 0)) r.periods[p] = uint64_t(*v);
    }
  }
  if (r.codebook.empty() || r.periods.empty()) r.codebook.clear(), r.periods.clear();  // not Gefen's naming
  if (!o.out.empty()) {
    std::vector<TensorView> views;
    for (auto& t : r.final_params) views.push_back({t.name, t.shape, t.data});
    write_f32_tensors(o.out, views);
  }
  return r;
}

namespace {

float unit(uint64_t seed, uint64_t stream, uint64_t counter) {
  return float(double(random_word64(seed, stream, counter) >> 40) * 0x1p-23 - 1);
}

}  // namespace

void synth_replay_inputs(const SynthOptions& o) {
  if (o.steps <= 0) throw InputError(fmt::format("optim synth: --steps {} must be ≥ 1", o.steps));
  validate(o.model);
  check_output_path(o.params, "optim synth: --params");
  check_output_path(o.grads, "optim synth: --grads");
  if (!o.config_out.empty()) check_output_path(o.config_out, "optim synth: --write-config");
  const auto infos = parameter_infos(o.model);
  std::vector<NamedTensor> p, g;
  for (size_t k = 0; k < infos.size(); ++k) {
    const ParamInfo& info = infos[k];
    NamedTensor t{info.name, info.shape, {}};
    size_t n = 1;
    for (int64_t d : info.shape) n *= size_t(d);
    t.data.resize(n);
    const int64_t len = int64_t(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < len; ++i) t.data[size_t(i)] = float(0.02 * double(unit(o.seed, k, uint64_t(i))));
    p.push_back(std::move(t));
  }
  for (int64_t s = 0; s < o.steps; ++s)
    for (size_t k = 0; k < infos.size(); ++k) {
      const ParamInfo& info = infos[k];
      const size_t n = p[k].data.size();
      const size_t cols = info.shape.size() >= 2 ? size_t(info.shape.back()) : n;
      NamedTensor t{fmt::format("t.{}.{}", s, info.name), info.shape, std::vector<float>(n)};
      const uint64_t stream = (uint64_t(s + 1) << 32) | k;
      const int64_t len = int64_t(n);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < len; ++i) {
        const uint64_t row = cols ? uint64_t(i) / cols : 0;
        const double scale = std::ldexp(1.0, int(random_word64(o.seed, (uint64_t(1) << 62) | k, row) % 9) - 4);
        t.data[size_t(i)] = float(scale * 1e-3 * double(unit(o.seed, stream, uint64_t(i))));
      }
      g.push_back(std::move(t));
    }
  auto write = [](const std::string& path, const std::vector<NamedTensor>& ts) {
    std::vector<TensorView> v;
    for (auto& t : ts) v.push_back({t.name, t.shape, t.data});
    write_f32_tensors(path, v);
  };
  write(o.params, p);
  write(o.grads, g);
  if (!o.config_out.empty()) write_file_atomic(o.config_out, model_config_json(o.model));
}

}  // namespace mantis
