// testutil — the helpers every test shares: error messages, scratch directories, files,
// bit-exact comparison, stratified inputs and boundaries of a format. The inline part needs only
// the headers (tests that run the binary, cliutil.h, use it without linking the library); the rest
// is in testutil.cpp.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "core/sample.h"

namespace mantis::test {

// LAMP's uniform setup (nn/policy.h's example) as a policy file.
inline constexpr const char* kLampToml = R"(# LAMP's setup: only the score GEMM in PS(4), strictly accumulated
[site."attn.qk"]
accumulation = "strict"
accumulator = "ps4"
output = "ps4"
)";

// The message of the InputError that f() throws; "(no error)" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// This test process's own directory under the system temp dir (made once).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mantis-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    return std::filesystem::path(tmpl);
  }();
  return dir;
}
// scratch_dir()/name, emptied and created.
inline std::filesystem::path scratch(const std::string& name) {
  const std::filesystem::path d = scratch_dir() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
inline void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The same bytes (sizes included).
template <class T>
bool same_bits(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return same_bits(std::span<const T>(a), std::span<const T>(b));
}

// A raw little-endian array file (tests/reference/*.py writes them) as T values.
template <class T>
std::vector<T> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + " (run tests/reference/torch_reference.py)");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// Scale factor for sample counts (MANTIS_TEST_SCALE, default 1; the sanitizer job uses less).
double scale();
size_t scaled(size_t n);

// Bit-identical, treating every NaN as equal to every NaN (NaN results are canonical anyway).
bool same(double a, double b);
std::string hex(double x);

// The test-value generators live in core/sample.h (the GPU contracts use them too).
using mantis::boundary_doubles;
using mantis::boundary_floats;
using mantis::stratified_doubles;
using mantis::stratified_floats;
using mantis::test_formats;

}  // namespace mantis::test
