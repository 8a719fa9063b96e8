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
  std::vector<std::string> names;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) names.push_back(name);
  return clip_grads(names, g, clip);
}

double clip_grads(const std::vector<std::string>& names, GradMap<float>& g, double clip) {
  double ss = 0;
  for (const std::string& n : names) {
    const std::vector<float>& v = g.at(n);
    ss += sum_squares(v.data(), v.size());
  }
  const double norm = std::sqrt(ss);
  if (clip > 0 && norm > clip) {
    const float k = float(clip / norm);
    for (const std::string& n : names)
      for (float& x : g.at(n)) x *= k;
  }
  return norm;
}

}  // namespace mantis
