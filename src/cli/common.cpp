#include "common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <climits>
#include <numbers>

#include "core/philox.h"
#include "core/round_array.h"

namespace mantis::cli {

std::string read_all_stdin() {
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const size_t k = std::fread(buf, 1, sizeof buf, stdin);
    s.append(buf, k);
    if (k < sizeof buf) {
      if (std::ferror(stdin)) throw InputError("cannot read standard input");
      break;
    }
  }
  return s;
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) {
      lines.push_back(text.substr(pos));
      break;
    }
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  const std::string z(s);
  char* end = nullptr;
  errno = 0;
  out = std::strtod(z.c_str(), &end);  // overflow gives ±inf, underflow ±0/subnormal: IEEE conversion
  return end == z.c_str() + z.size();
}

bool parse_float(std::string_view s, float& out) {
  if (s.empty()) return false;
  const std::string z(s);
  char* end = nullptr;
  errno = 0;
  out = std::strtof(z.c_str(), &end);
  return end == z.c_str() + z.size();
}

std::vector<int64_t> parse_token_ids(std::string_view text, const std::string& what) {
  constexpr std::string_view ws = " \t\r\n\f\v";
  std::vector<int64_t> ids;
  size_t pos = text.find_first_not_of(ws);
  while (pos != std::string_view::npos) {
    const size_t end = std::min(text.find_first_of(ws, pos), text.size());
    const std::string_view w = text.substr(pos, end - pos);
    int64_t v = 0;
    const bool digits = w.size() <= 10 && std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits)
      for (char c : w) v = v * 10 + (c - '0');
    if (!digits || v > INT32_MAX)
      throw InputError(fmt::format("{}: token {} ('{}') is not a token id (a non-negative integer)", what, ids.size(),
                                   escape_control(w.substr(0, 40))));
    ids.push_back(v);
    pos = text.find_first_not_of(ws, end);
  }
  return ids;
}

std::string hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

bool stderr_is_tty() { return ::isatty(2) == 1; }

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + m, v.end());
  if (v.size() % 2) return v[m];
  const double hi = v[m];
  const double lo = *std::max_element(v.begin(), v.begin() + m);
  return lo + (hi - lo) / 2;
}

void apply_threads(int threads) {
  if (threads > 0) set_num_threads(threads);
}

namespace {
// u in [0,1): top 24 bits of the word, an exact binary32 value.
inline double unit(uint32_t w) { return double(w >> 8) * 0x1p-24; }

template <class T>
void fill_impl(T* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  if (d == Distribution::uniform01) {
    for (size_t i = 0; i < n; ++i) x[i] = T(float(unit(random_word(seed, stream, i))));
    return;
  }
  // Box–Muller on words 2i, 2i+1: u1 in (0,1], u2 in [0,1).
  for (size_t i = 0; i < n; ++i) {
    const double u1 = double((random_word(seed, stream, 2 * i) >> 8) + 1) * 0x1p-24;
    const double u2 = unit(random_word(seed, stream, 2 * i + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    x[i] = T(float(z));
  }
}
}  // namespace

void fill_random(float* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}
void fill_random(double* x, size_t n, Distribution d, uint64_t seed, uint64_t stream) {
  fill_impl(x, n, d, seed, stream);
}

}  // namespace mantis::cli
