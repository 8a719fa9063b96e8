// fuzz_npy — NumPy .npy files (core/file.h): the header (magic, version, dict, dtype, order,
// shape) and the data, through every reader: read_npy (float32), read_npy_floats (float32 /
// float64) and read_npy_ints (the token-array dtypes).
#include "core/file.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(npy) {
  const std::string path = fuzz::put("array.npy", data, size);
  fuzz::refused([&] { (void)read_npy(path); });
  fuzz::refused([&] { (void)read_npy_floats(path); });
  fuzz::refused([&] { (void)read_npy_ints(path); });
  return 0;
}
