#include "optim/clip.h"

#include <cmath>

#include "core/reduce.h"

namespace mantis {

namespace {

// The global L2 norm of the gradients `names` (binary64 squares, per tensor in reduce.h's order).
double norm_of(const std::vector<std::string>& names, const GradMap<float>& g) {
  double ss = 0;
  for (const std::string& n : names) {
    const std::vector<float>& v = g.at(n);
    ss += sum_squares(v.data(), v.size());
  }
  return std::sqrt(ss);
}

std::vector<std::string> parameter_names(const Model& m) {
  std::vector<std::string> names;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) names.push_back(name);
  return names;
}

}  // namespace

double grad_norm(const Model& m, const GradMap<float>& g) { return norm_of(parameter_names(m), g); }

double clip_grads(const Model& m, GradMap<float>& g, double clip) { return clip_grads(parameter_names(m), g, clip); }

double clip_grads(const std::vector<std::string>& names, GradMap<float>& g, double clip) {
  const double norm = norm_of(names, g);
  if (clip > 0 && norm > clip) {
    const float k = float(clip / norm);
    for (const std::string& n : names)
      for (float& x : g.at(n)) x *= k;
  }
  return norm;
}

}  // namespace mantis
