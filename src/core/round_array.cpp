#include "core/round_array.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mantis_config.h"
#include "core/round.h"
#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif

namespace mantis {

namespace {

constexpr size_t kChunk = 1024;  // elements per inner pass (random words stay in L1)

// Random words for global indices g0 .. g0+len−1 (len ≤ kChunk), one Philox call per aligned block
// of four. Indices are taken mod 2^64 (round_array.h): a range that passes 2^64 − 1 goes on at 0, as
// random_word(seed, stream, g0 + i) does, so blocks run mod 2^62. Every count here is formed from
// g0 mod 4 and len, never from g0 + len, which would wrap. Blocks are computed lane-parallel
// (structure of arrays), then interleaved.
void fill_random(uint32_t* buf, uint64_t seed, uint64_t stream, uint64_t g0, size_t len) {
  constexpr uint64_t kBlockMask = (uint64_t(1) << 62) - 1;
  const uint64_t b0 = g0 >> 2;
  const size_t nb = size_t(((g0 & 3) + len + 3) >> 2);
  alignas(64) uint32_t w[4][kChunk / 4 + 2];
  for (size_t j = 0; j < nb; ++j) {
    const Philox4 r = random_block(seed, stream, (b0 + j) & kBlockMask);
    w[0][j] = r.v[0];
    w[1][j] = r.v[1];
    w[2][j] = r.v[2];
    w[3][j] = r.v[3];
  }
  for (size_t j = 0; j < nb; ++j)
    for (int k = 0; k < 4; ++k) buf[j * 4 + k] = w[k][j];
}

// The words of rounding indices g0 .. g0+len−1 packed 2^pack per random word (philox.h sr_word):
// the chunk's random words drawn as fill_random does, each expanded into its 2^pack slots (slot s
// shifted left by s·32/2^pack) from an aligned start; returns where index g0's word lies in buf
// (buf holds kChunk + 8). A chunk whose indices pass 2^64 − 1 (word indices then wrap mod
// 2^(64 − pack)) takes sr_word per element.
const uint32_t* fill_packed(uint32_t* buf, uint32_t* words, uint64_t seed, uint64_t stream, uint64_t g0, size_t len,
                            int pack) {
  if (g0 + len < g0) {
    for (size_t i = 0; i < len; ++i) buf[i] = sr_word(seed, stream, g0 + i, pack);
    return buf;
  }
  const uint64_t w0 = g0 >> pack;
  const size_t nw = size_t((g0 + len - 1) >> pack) - size_t(w0) + 1;  // nw·2^pack ≤ len + 2·4 − 1
  fill_random(words, seed, stream, w0, nw);
  const uint32_t* w = words + (w0 & 3);
  if (pack == 1)
    for (size_t j = 0; j < nw; ++j) buf[2 * j] = w[j], buf[2 * j + 1] = w[j] << 16;
  else
    for (size_t j = 0; j < nw; ++j)
      buf[4 * j] = w[j], buf[4 * j + 1] = w[j] << 8, buf[4 * j + 2] = w[j] << 16, buf[4 * j + 3] = w[j] << 24;
  return buf + (g0 & ((uint64_t(1) << pack) - 1));
}

// Integer grids under rne (RoundPlan::int_grid): a chunk whose values all lie in [lo, hi], the
// grid's ends, rounds each by (x + 1.5·2^P) − 1.5·2^P, P the container's mantissa width: for
// |x| ≤ 2^(P−1) the sum lies in [2^P, 2^(P+1)), where the spacing is 1, so it is x rounded to an
// integer, ties to even, and the difference is exact (+0 for a zero result: the grids have no −0).
// That is round_value's result there (the value is in range, so nothing saturates); any other
// chunk (NaN, ±inf, beyond an end) takes round_value. Tested against MPFR with every format.
template <class T>
bool int_chunk(const T* x, T* y, size_t len, T lo, T hi) {
  using U = typename Target<T>::U;
  U outside = 0;
  for (size_t i = 0; i < len; ++i) outside |= (x[i] >= lo) & (x[i] <= hi) ? U(0) : U(1);  // NaN: outside
  if (outside) return false;
  constexpr T kMagic = sizeof(T) == 4 ? T(0x1.8p23) : T(0x1.8p52);
  for (size_t i = 0; i < len; ++i) y[i] = (x[i] + kMagic) - kMagic;
  return true;
}

template <Rounding M, bool Int, class T, class Tout>
void kernel(const T* in, Tout* out, size_t begin, size_t end, const Target<T>& target, uint64_t seed,
            uint64_t stream, uint64_t index0, int pack) {
  const Target<T> t = target;  // a local copy: its fields stay in registers across stores to out
  constexpr bool kRandom = is_stochastic(M);
  alignas(64) uint32_t rnd[kChunk + 8];
  [[maybe_unused]] alignas(64) uint32_t words[kRandom ? kChunk + 8 : 1];
  [[maybe_unused]] alignas(64) T ibuf[Int ? kChunk : 1];
  [[maybe_unused]] const T lo = t.unsigned_fmt ? T(0) : -from_bits<T>(t.neg_max_bits), hi = from_bits<T>(t.max_bits);
  for (size_t c = begin; c < end; c += kChunk) {
    const size_t len = std::min(kChunk, end - c);
    const T* x = in + c;
    Tout* y = out + c;
    if constexpr (Int) {
      if (int_chunk(x, ibuf, len, lo, hi)) {
        for (size_t i = 0; i < len; ++i) y[i] = Tout(ibuf[i]);
        continue;
      }
    }
    // Chunks made only of zeros and normal-range values take the shortcut (round.h); so do chunks
    // with a few values outside that range (at most kChunk / 8: e4m3's subnormals in normal data),
    // which are then rounded again, from copies (in == out is allowed), by the general rounding.
    typename Target<T>::U outside = 0;
    for (size_t i = 0; i < len; ++i) outside |= outside_normal_range(x[i], t);
    constexpr size_t kFew = kChunk / 8;
    uint16_t pos[kFew];
    T val[kFew];
    size_t nout = 0;
    bool shortcut = outside == 0;
    if (!shortcut) {
      shortcut = true;
      for (size_t i = 0; i < len && shortcut; ++i)
        if (outside_normal_range(x[i], t)) {
          if (nout == kFew) shortcut = false;
          else pos[nout] = uint16_t(i), val[nout++] = x[i];
        }
    }
    const uint32_t* r = nullptr;
    if constexpr (kRandom) {
      const uint64_t g0 = index0 + c;
      if (pack == 0) {
        fill_random(rnd, seed, stream, g0, len);
        r = rnd + (g0 & 3);
      } else {
        r = fill_packed(rnd, words, seed, stream, g0, len, pack);
      }
    }
    auto word = [&](size_t i) { if constexpr (kRandom) return r[i]; else return 0u; };
    if (shortcut) {
      for (size_t i = 0; i < len; ++i) y[i] = Tout(round_normal<M>(x[i], t, word(i)));
      for (size_t k = 0; k < nout; ++k) y[pos[k]] = Tout(round_value<M>(val[k], t, word(pos[k])));
    } else {
      for (size_t i = 0; i < len; ++i) y[i] = Tout(round_value<M>(x[i], t, word(i)));
    }
  }
}

template <Rounding M, bool Int, class T, class Tout>
void run(const T* in, Tout* out, size_t n, const Target<T>& t, uint64_t seed, uint64_t stream, uint64_t index0,
         int pack) {
#if MANTIS_HAVE_OPENMP
  if (n >= kParallelThreshold && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      // Static split in multiples of four elements; results do not depend on it.
      const size_t nt = size_t(omp_get_num_threads()), id = size_t(omp_get_thread_num());
      const size_t per = ((n + nt - 1) / nt + 3) & ~size_t(3);
      const size_t b = std::min(n, id * per), e = std::min(n, b + per);
      kernel<M, Int>(in, out, b, e, t, seed, stream, index0, pack);
    }
    return;
  }
#endif
  kernel<M, Int>(in, out, 0, n, t, seed, stream, index0, pack);
}

template <class T, class Tout>
void dispatch(const T* in, Tout* out, size_t n, const Target<T>& t, const RoundPlan& p, uint64_t stream,
              uint64_t index0) {
  constexpr int kP = sizeof(T) == 4 ? 23 : 52;  // int_chunk's magic sum needs |x| ≤ 2^(P−1)
  if (p.int_grid && p.mode == Rounding::rne && p.int_max <= std::ldexp(1.0, kP - 1))
    return run<Rounding::rne, true>(in, out, n, t, p.seed, stream, index0, 0);
  with_rounding(p.mode,
                [&](auto mode) { run<decltype(mode)::value, false>(in, out, n, t, p.seed, stream, index0, p.sr_pack); });
}

}  // namespace

void validate_sr_bits(int sr_bits) {
  if (sr_bits < kSrBitsMin || sr_bits > kSrBitsMax)
    throw InputError(fmt::format("sr_bits = {} out of range {}..{}", sr_bits, kSrBitsMin, kSrBitsMax));
}

void validate_sr_packed(bool sr_packed, int sr_bits, bool stochastic) {
  if (!sr_packed) return;
  if (sr_bits > 16)
    throw InputError(fmt::format("sr_packed shares a random word among 2 (sr_bits ≤ 16) or 4 (≤ 8) roundings; "
                                 "sr_bits = {} does not fit", sr_bits));
  if (!stochastic) throw InputError("sr_packed is for stochastic rounding (sr, sre); no rounding here is");
}

void require_fits_float(const Format& f) {
  if (!fits_float(f))
    throw InputError(fmt::format("format {} does not fit a binary32 container (μ ≤ 23, exponents within "
                                 "[-126, 127], nothing below 2^-149); use double arrays",
                                 f.name));
}

RoundPlan plan_round(const Format& f, Rounding mode, int sr_bits, uint64_t seed, bool sr_packed) {
  validate(f);
  validate_sr_bits(sr_bits);
  validate_sr_packed(sr_packed, sr_bits, is_stochastic(mode));
  RoundPlan p;
  p.mode = mode;
  p.sr_bits = sr_bits;
  p.seed = seed;
  p.sr_pack = sr_pack(sr_bits, sr_packed);
  p.fits_float = fits_float(f);
  if (p.fits_float) p.tf = make_target<float>(f, sr_bits);
  p.td = make_target<double>(f, sr_bits);  // every validated format fits binary64
  p.int_grid = f.mu == f.emin && f.emin == f.emax && f.subnormals && f.specials == Specials::none &&
               f.overflow == Overflow::saturate && !f.negative_zero && f.has_zero;
  p.int_max = p.int_grid ? std::max(from_bits<double>(p.td.max_bits), from_bits<double>(p.td.neg_max_bits)) : 0;
  return p;
}

void round_array(const RoundPlan& p, const float* in, float* out, size_t n, uint64_t stream,
                 uint64_t index0) noexcept {
  dispatch(in, out, n, p.tf, p, stream, index0);
}
void round_array(const RoundPlan& p, const double* in, double* out, size_t n, uint64_t stream,
                 uint64_t index0) noexcept {
  dispatch(in, out, n, p.td, p, stream, index0);
}
void round_array(const RoundPlan& p, const double* in, float* out, size_t n, uint64_t stream,
                 uint64_t index0) noexcept {
  dispatch(in, out, n, p.td, p, stream, index0);
}
void round_array(const RoundPlan& p, const float* in, double* out, size_t n, uint64_t stream,
                 uint64_t index0) noexcept {
  // Widen exactly in chunks, then round in the double container (one rounding).
  double buf[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t len = std::min(kChunk, n - c);
    for (size_t i = 0; i < len; ++i) buf[i] = in[c + i];
    dispatch(buf, out + c, len, p.td, p, stream, index0 + c);
  }
}

void round_array(const float* in, float* out, size_t n, const Format& f, const RoundOptions& o) {
  require_fits_float(f);
  round_array(plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed), in, out, n, o.stream, o.index0);
}
void round_array(const double* in, double* out, size_t n, const Format& f, const RoundOptions& o) {
  round_array(plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed), in, out, n, o.stream, o.index0);
}
void round_array(const double* in, float* out, size_t n, const Format& f, const RoundOptions& o) {
  require_fits_float(f);
  round_array(plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed), in, out, n, o.stream, o.index0);
}
void round_array(const float* in, double* out, size_t n, const Format& f, const RoundOptions& o) {
  round_array(plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed), in, out, n, o.stream, o.index0);
}

double round_scalar(double x, const Format& f, const RoundOptions& o, uint64_t index) {
  const RoundPlan p = plan_round(f, o.mode, o.sr_bits, o.seed, o.sr_packed);
  return round_value(x, p.td, p.mode, sr_word(p.seed, o.stream, o.index0 + index, p.sr_pack));
}

}  // namespace mantis
