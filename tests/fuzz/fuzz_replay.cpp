// fuzz_replay — the optimizer replay's inputs (exp/replay.h replay): the parameters P and the
// gradient stream G, two safetensors files, replayed for two steps by one registered optimizer.
// The input packs the three choices: byte 0 picks the optimizer (its index in optimizers(), mod
// their count), bytes 1..4 are P's length n (little-endian), then P's n bytes, then G (the rest).
#include "exp/replay.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(replay) {
  if (size < 5) return 0;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t(data[1 + i]) << (8 * i);
  if (n > size - 5) return 0;
  ReplayOptions o;
  o.optimizer = optimizers()[data[0] % optimizers().size()].name;
  o.params = fuzz::put("params.safetensors", data + 5, n);
  o.grads = fuzz::put("grads.safetensors", data + 5 + n, size - 5 - n);
  o.steps = 2;
  fuzz::refused([&] { (void)replay(o); });
  return 0;
}
