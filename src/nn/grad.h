// grad — gradient buffers: one per parameter, by name, in the parameter's layout (model.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn/model.h"

namespace mantis {

template <class T>
using GradMap = std::map<std::string, std::vector<T>>;

// Zero gradients for every parameter of m (the parameters' shapes), its LoRA adapters included.
template <class T>
GradMap<T> zero_grads(const Model& m);

extern template GradMap<float> zero_grads<float>(const Model&);
extern template GradMap<double> zero_grads<double>(const Model&);

}  // namespace mantis
