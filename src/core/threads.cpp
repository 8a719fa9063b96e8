#include "core/threads.h"

#include "mantis_config.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif

namespace mantis {

void set_num_threads(int n) {
#if MANTIS_HAVE_OPENMP
  if (n > 0) omp_set_num_threads(n);
#else
  (void)n;
#endif
}

int num_threads() {
#if MANTIS_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace mantis
