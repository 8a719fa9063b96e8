#include "optim/clip.h"

#include <cmath>

#include "core/reduce.h"

namespace mantis {

double grad_norm(const Model& m, const GradMap<float>& g) {
  double ss = 0;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) {
    const std::vector<float>& v = g.at(name);
    ss += sum_squares(v.data(), v.size());
  }
  return std::sqrt(ss);
}

double clip_grads(const Model& m, GradMap<float>& g, double clip) {
  const double norm = grad_norm(m, g);
  if (clip > 0 && norm > clip) {
    const float k = float(clip / norm);
    for (auto& [name, v] : g)
      for (float& x : v) x *= k;
  }
  return norm;
}

}  // namespace mantis
