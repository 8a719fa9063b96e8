// params — a model's parameters and their gradient buffers as T matrices by (role, layer, bias)
// (model.h: ParamInfo), resolved from their names once per forward or backward call, so the
// graphs never build a name.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <type_traits>
#include <vector>

#include "nn/grad.h"
#include "nn/ops.h"

namespace mantis::detail {

// (role, layer, bias) → position in parameter_infos order; −1 where the architecture has none.
class ParamSlots {
 public:
  explicit ParamSlots(const std::vector<ParamInfo>& infos, int layers)
      : slot_(size_t(layers + 1) * kRoleCount * 2, -1) {
    for (size_t i = 0; i < infos.size(); ++i) slot_[key(infos[i].role, infos[i].layer, infos[i].bias)] = int(i);
  }
  int operator()(Role r, int layer, bool bias) const { return slot_[key(r, layer, bias)]; }

 private:
  static size_t key(Role r, int layer, bool bias) { return (size_t(layer + 1) * kRoleCount + size_t(r)) * 2 + bias; }
  std::vector<int> slot_;
};

// Every parameter as a row-major T matrix [shape[0], rest] (1-D: [1, n]): a view of the binary32
// values for float, a converted copy for double.
template <class T>
class Weights {
 public:
  using View = Eigen::Map<const Matrix<T>>;
  // InputError naming the parameter if one is missing or has another shape.
  explicit Weights(const Model& m) : infos_(parameter_infos(m.cfg)), slots_(infos_, m.cfg.layers) {
    if constexpr (!std::is_same_v<T, float>) copies_.reserve(infos_.size());
    for (const ParamInfo& info : infos_) {
      const auto it = m.params.find(info.name);
      if (it == m.params.end())
        throw InputError(fmt::format("model: missing parameter '{}' [{}]", info.name, fmt::join(info.shape, ",")));
      const Tensor& t = it->second;
      if (t.shape != info.shape || int64_t(t.data.size()) != t.numel())
        throw InputError(fmt::format("model: parameter '{}' has shape [{}] ({} values), expected [{}]", info.name,
                                     fmt::join(t.shape, ","), t.data.size(), fmt::join(info.shape, ",")));
      const Eigen::Index rows = info.shape.size() == 1 ? 1 : info.shape[0], cols = Eigen::Index(t.numel()) / rows;
      if constexpr (std::is_same_v<T, float>) {
        views_.emplace_back(t.data.data(), rows, cols);
      } else {
        copies_.push_back(Eigen::Map<const Matrix<float>>(t.data.data(), rows, cols).template cast<T>());
        views_.emplace_back(copies_.back().data(), rows, cols);
      }
    }
  }
  // The weight (or bias) of `role` at `layer` (−1: outside the layers).
  const View& operator()(Role r, int layer = -1) const { return at(r, layer, false); }
  const View& bias(Role r, int layer = -1) const { return at(r, layer, true); }

 private:
  const View& at(Role r, int layer, bool bias) const {
    const int i = slots_(r, layer, bias);
    if (i < 0) throw std::logic_error(fmt::format("params: no parameter of role {} at layer {}", int(r), layer));
    return views_[size_t(i)];
  }
  std::vector<ParamInfo> infos_;
  ParamSlots slots_;
  std::vector<Matrix<T>> copies_;  // T = double: the converted values (reserved: never reallocated)
  std::vector<View> views_;        // parameter_infos order
};

// The gradient buffers of GradMap g, shaped as Weights' views.
template <class T>
class Grads {
 public:
  using View = Eigen::Map<Matrix<T>>;
  // logic_error if a buffer is missing or mis-sized (zero_grads makes them).
  Grads(const ModelConfig& c, GradMap<T>& g) : Grads(parameter_infos(c), c.layers, g) {}

 private:
  Grads(const std::vector<ParamInfo>& infos, int layers, GradMap<T>& g) : slots_(infos, layers) {
    for (const ParamInfo& info : infos) {
      const Eigen::Index rows = info.shape.size() == 1 ? 1 : info.shape[0];
      Eigen::Index n = 1;
      for (int64_t d : info.shape) n *= Eigen::Index(d);
      auto it = g.find(info.name);
      if (it == g.end() || Eigen::Index(it->second.size()) != n)
        throw std::logic_error(fmt::format("backward: gradient buffer '{}' missing or mis-sized", info.name));
      views_.emplace_back(it->second.data(), rows, n / rows);
    }
  }

 public:
  View& operator()(Role r, int layer = -1) { return at(r, layer, false); }
  T* bias(Role r, int layer = -1) { return at(r, layer, true).data(); }

 private:
  View& at(Role r, int layer, bool bias) {
    const int i = slots_(r, layer, bias);
    if (i < 0) throw std::logic_error(fmt::format("params: no gradient of role {} at layer {}", int(r), layer));
    return views_[size_t(i)];
  }
  ParamSlots slots_;
  std::vector<View> views_;
};

}  // namespace mantis::detail
