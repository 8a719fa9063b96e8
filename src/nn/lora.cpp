// lora — see lora.h.
#include "nn/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <algorithm>

#include "core/error.h"
#include "core/philox.h"
#include "nn/backward.h"

namespace mantis {

namespace {

constexpr const char* kA = ".lora_A";
constexpr const char* kB = ".lora_B";

// The projection weights that may carry adapters: (info, its index in parameter_infos order).
std::vector<ParamInfo> adaptable(const ModelConfig& c) {
  std::vector<ParamInfo> v;
  for (const ParamInfo& p : parameter_infos(c))
    if (!p.bias && p.layer >= 0 && unit_of(p.role)) v.push_back(p);
  return v;
}

}  // namespace

Unit unit_from_name(const std::string& name) {
  for (int u = 0; u < kUnitCount; ++u)
    if (name == to_string(Unit(u))) return Unit(u);
  throw InputError(fmt::format("unit '{}' (known: attn.qkv, attn.proj, mlp.fc, mlp.proj)", name));
}

std::vector<std::string> lora_targets(const ModelConfig& c, const std::vector<Unit>& units) {
  std::vector<std::string> names;
  for (const ParamInfo& p : adaptable(c))
    for (Unit u : units)
      if (*unit_of(p.role) == u) {
        names.push_back(p.name);
        break;
      }
  return names;
}

Adapters init_lora(const ModelConfig& c, const LoraSpec& spec, uint64_t seed) {
  if (spec.units.empty()) throw InputError("LoRA: no units to adapt (give attn.qkv, attn.proj, mlp.fc or mlp.proj)");
  if (spec.rank < 1) throw InputError(fmt::format("LoRA: rank = {} must be at least 1", spec.rank));
  if (!(spec.alpha >= 0) || !std::isfinite(spec.alpha))
    throw InputError(fmt::format("LoRA: alpha = {} must be finite and ≥ 0 (0: alpha = rank)", spec.alpha));
  Adapters a;
  a.rank = spec.rank;
  a.alpha = spec.alpha > 0 ? spec.alpha : double(spec.rank);
  const auto targets = lora_targets(c, spec.units);
  const auto infos = parameter_infos(c);
  for (size_t k = 0; k < targets.size(); ++k) {
    const ParamInfo& w = *std::find_if(infos.begin(), infos.end(), [&](const ParamInfo& p) { return p.name == targets[k]; });
    const int64_t out = w.shape[0], in = w.shape[1];
    if (spec.rank > std::min(out, in))
      throw InputError(fmt::format("LoRA: rank {} exceeds {} [{},{}]", spec.rank, w.name, out, in));
    Tensor A{{spec.rank, in}, std::vector<float>(size_t(spec.rank * in))};
    const double bound = 1.0 / std::sqrt(double(in));
    for (size_t i = 0; i < A.data.size(); ++i)
      A.data[i] = float(bound * (2.0 * (double(random_word(seed, k, i) >> 8) * 0x1p-24) - 1.0));  // [−b, b)
    a.params.emplace(w.name + kA, std::move(A));
    a.params.emplace(w.name + kB, Tensor{{out, spec.rank}, std::vector<float>(size_t(out * spec.rank), 0.0f)});
  }
  return a;
}

void validate(const Adapters& a, const ModelConfig& c) {
  if (a.params.empty()) return;
  if (a.rank < 1) throw InputError(fmt::format("LoRA adapters: rank = {} must be at least 1", a.rank));
  if (!(a.alpha > 0) || !std::isfinite(a.alpha))
    throw InputError(fmt::format("LoRA adapters: alpha = {} must be finite and > 0", a.alpha));
  std::map<std::string, ParamInfo> weights;
  for (const ParamInfo& p : adaptable(c)) weights.emplace(p.name, p);
  for (const auto& [name, t] : a.params) {
    const bool is_a = name.ends_with(kA), is_b = name.ends_with(kB);
    const std::string base = (is_a || is_b) ? name.substr(0, name.size() - 7) : "";
    const auto w = weights.find(base);
    if (w == weights.end())
      throw InputError(fmt::format("LoRA tensor {}: not <projection weight>.lora_A or .lora_B of this model", name));
    if (!a.params.count(base + (is_a ? kB : kA)))
      throw InputError(fmt::format("LoRA tensor {}: its partner {} is missing", name, base + (is_a ? kB : kA)));
    const std::vector<int64_t> want = is_a ? std::vector<int64_t>{a.rank, w->second.shape[1]}
                                           : std::vector<int64_t>{w->second.shape[0], a.rank};
    if (t.shape != want || int64_t(t.data.size()) != t.numel())
      throw InputError(fmt::format("LoRA tensor {}: shape [{}] ({} values), expected [{}] for rank {}", name,
                                   fmt::join(t.shape, ","), t.data.size(), fmt::join(want, ","), a.rank));
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw InputError(fmt::format("LoRA tensor {}: non-finite value {} at flat index {}", name, t.data[i], i));
  }
}

Model merge_lora(const Model& m) {
  validate(m.lora, m.cfg);
  Model out{m.cfg, m.params, {}};
  const double s = lora_scale(m.lora);
  const int64_t r = m.lora.rank;
  for (const auto& [name, A] : m.lora.params) {
    if (!name.ends_with(kA)) continue;
    const std::string base = name.substr(0, name.size() - 7);
    const Tensor& B = m.lora.params.at(base + kB);
    Tensor& W = out.params.at(base);
    const int64_t rows = W.shape[0], cols = W.shape[1];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double d = 0;  // Σ_k B[i,k]·A[k,j], k in order, binary64
        for (int64_t k = 0; k < r; ++k) d += double(B.data[size_t(i * r + k)]) * double(A.data[size_t(k * cols + j)]);
        float& w = W.data[size_t(i * cols + j)];
        w = float(double(w) + s * d);
      }
  }
  return out;
}

namespace detail {

template <class T>
LoraViews<T>::LoraViews(const Model& m, GradMap<T>* grads) {
  if (m.lora.params.empty()) return;
  validate(m.lora, m.cfg);
  scale_ = T(lora_scale(m.lora));
  auto as_matrix = [](const Tensor& t) {
    return Eigen::Map<const Matrix<float>>(t.data.data(), t.shape[0], t.shape[1]).template cast<T>().eval();
  };
  auto grad = [&](const std::string& name, size_t n) -> T* {
    if (!grads) return nullptr;
    auto it = grads->find(name);
    if (it == grads->end() || it->second.size() != n)
      throw std::logic_error(fmt::format("backward: gradient buffer '{}' missing or mis-sized", name));
    return it->second.data();
  };
  for (const ParamInfo& p : adaptable(m.cfg)) {
    const auto a = m.lora.params.find(p.name + kA);
    if (a == m.lora.params.end()) continue;
    const Tensor& b = m.lora.params.at(p.name + kB);
    Slot s{as_matrix(a->second), as_matrix(b), grad(a->first, a->second.data.size()),
           grad(p.name + kB, b.data.size())};
    slots_.emplace(std::pair{int(p.role), p.layer}, std::move(s));
  }
}

template <class T>
const typename LoraViews<T>::Slot* LoraViews<T>::find(Role role, int l) const {
  if (slots_.empty()) return nullptr;
  const auto it = slots_.find({int(role), l});
  return it == slots_.end() ? nullptr : &it->second;
}

template <class T>
void LoraViews<T>::forward(Role role, int l, const Matrix<T>& x, Eigen::Ref<Matrix<T>> y) const {
  const Slot* s = find(role, l);
  if (!s) return;
  Matrix<T> u = x * s->a.transpose();  // [N,r]
  u *= scale_;
  y.noalias() += u * s->b.transpose();
}

template <class T>
void LoraViews<T>::backward(Role role, int l, const Matrix<T>& dy, const Matrix<T>& x, Matrix<T>& dx) const {
  const Slot* s = find(role, l);
  if (!s) return;
  const Eigen::Index r = s->a.rows(), in = s->a.cols(), out = s->b.rows();
  Matrix<T> us = x * s->a.transpose();  // [N,r]
  us *= scale_;
  Eigen::Map<Matrix<T>>(s->db, out, r).noalias() += dy.transpose() * us;
  Matrix<T> gs = dy * s->b;  // [N,r]
  gs *= scale_;
  Eigen::Map<Matrix<T>>(s->da, r, in).noalias() += gs.transpose() * x;
  dx.noalias() += gs * s->a;
}

template class LoraViews<float>;
template class LoraViews<double>;

}  // namespace detail
}  // namespace mantis
