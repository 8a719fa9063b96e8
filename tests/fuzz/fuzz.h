// fuzz — what every fuzz target (tests/fuzz/fuzz_<name>.cpp) shares.
//
// A target gives one input to the library's public readers, as a file where the reader takes a
// path, and lets only mantis::InputError (the expected one-line refusal) pass: any other
// exception, crash, sanitizer report, hang or runaway allocation is a finding.
//
// MANTIS_FUZZ_TARGET(name) { … } is the target's body, (data, size) its input. Every target is
// compiled into one binary, mantis_fuzz, that runs the one --target=NAME names: in the fuzz build
// (-Dfuzz=enabled, clang) under libFuzzer (fuzz.cpp's LLVMFuzzerTestOneInput; libFuzzer ignores
// flags that start with "--" and passes them on to the processes it starts), in every other build
// as a replay of given inputs (replay_main.cpp): the seed corpus and tests/fuzz/regress/<name>/, as
// a Meson test. One binary, not one per target: each link takes the whole library (seconds apiece).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "nn/model.h"

namespace mantis::fuzz {

using Target = int (*)(const uint8_t* data, size_t size);
struct Registration {
  Registration(const char* name, Target target);
};
// The target NAME; prints the known ones and exits 2 when there is none of that name.
Target target(const std::string& name);

// This process's scratch directory, made on first use in $MANTIS_FUZZ_SCRATCH, else /dev/shm when
// there is one, else $TMPDIR or /tmp; removed at a normal exit (scripts/fuzz.sh removes what a crash
// leaves).
const std::string& scratch();
// Writes BYTES to scratch()/NAME, or to NAME when it is an absolute path (the directories are made),
// and returns the path.
std::string put(const std::string& name, std::string_view bytes);
inline std::string put(const std::string& name, const uint8_t* data, size_t size) {
  return put(name, std::string_view(reinterpret_cast<const char*>(data), size));
}

// A finding that is not a crash (a documented property that does not hold): says what, and aborts.
void check(bool ok, const char* what);

// The targets' small models (two layers, dimension 8, vocabulary 16, context 8): GPT-2, and LLaMA
// with grouped-query attention (two heads, one key/value head), untied.
ModelConfig tiny_config(Arch arch);
// scratch()/NAME holding init_model(tiny_config(arch), 1) as save_model (hf false) or save_model_hf
// writes it: config.json + model.safetensors.
std::string tiny_checkpoint(const std::string& name, Arch arch, bool hf);

// Runs f; an InputError is the reader refusing the input, which is what bad input must get.
template <class F>
void refused(F&& f) {
  try {
    f();
  } catch (const InputError&) {}
}

}  // namespace mantis::fuzz

#define MANTIS_FUZZ_TARGET(name)                                                               \
  static int fuzz_target_body(const uint8_t* data, size_t size);                               \
  static const ::mantis::fuzz::Registration fuzz_target_registration(#name, fuzz_target_body); \
  static int fuzz_target_body(const uint8_t* data, size_t size)
