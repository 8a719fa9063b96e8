#include "core/cpu.h"

namespace mantis {

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

}  // namespace mantis
