#include "train/controller.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mantis {

void check_paths(const std::vector<UnitPath>& paths, const ModelConfig& m, uint64_t step) {
  if (paths.size() != size_t(m.layers) * kUnitCount)
    throw InputError(fmt::format("step {}: the controller left {} unit paths, expected {} ({} layers × {} units)", step,
                                 paths.size(), size_t(m.layers) * kUnitCount, m.layers, kUnitCount));
  for (size_t i = 0; i < paths.size(); ++i) {
    const Unit u = Unit(i % kUnitCount);
    try {
      validate(paths[i].saved);
      if (const SavedBlocks& b = paths[i].blocks; b.block != 0) {
        const size_t nb = b.count(size_t(saved_cols(m, u)));
        if (b.block < 0) throw InputError(fmt::format("column blocks of {} < 0", b.block));
        if (b.recovered.size() != nb)
          throw InputError(fmt::format("column blocks of {}: {} flags, expected {}", b.block, b.recovered.size(), nb));
        validate(b.recover);
      }
      for (auto [o, pass] : {std::pair{&paths[i].forward, "forward"}, {&paths[i].dx, "dx"}, {&paths[i].dw, "dw"}})
        try {
          if (*o) validate(**o, site_of(u));
        } catch (const InputError& e) {
          throw InputError(fmt::format("{} override: {}", pass, e.what()));
        }
    } catch (const InputError& e) {
      throw InputError(fmt::format("step {}: unit layer.{}.{}: {}", step, i / kUnitCount, to_string(u), e.what()));
    }
  }
}

bool has_overrides(const std::vector<UnitPath>& paths) {
  for (auto& p : paths)
    if (p.forward || p.dx || p.dw) return true;
  return false;
}

Policy with_overrides(const Policy& run, const std::vector<UnitPath>& paths) {
  Policy p = run;
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::pair<int, Site> at{int(i / kUnitCount), site_of(Unit(i % kUnitCount))};
    if (paths[i].forward) p.layer[at] = *paths[i].forward;
    if (paths[i].dx) p.grad_layer[0][at] = *paths[i].dx;
    if (paths[i].dw) p.grad_layer[1][at] = *paths[i].dw;
  }
  return p;
}

}  // namespace mantis
