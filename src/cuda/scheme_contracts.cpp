// scheme_contracts — the contracts (contracts.h) of the scaled formats (cuda_quantize_scheme
// against quantize_scheme) and of the block-absmax quantiser (cuda_quantize_absmax against
// quantize_absmax): outputs, scales, zero points and statistics, bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/quant.h"
#include "core/scheme.h"
#include "cuda/contracts.h"
#include "cuda/cuda.h"

namespace mantis {

namespace {

const Rounding kModes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                           Rounding::rd,  Rounding::ro,  Rounding::sr, Rounding::sre};

struct Shape {
  int64_t rows, cols;
};

// Partial blocks of every preset (1×33: a ragged 32-block; 7×100; 130×260: ragged 128×128 tiles),
// and one large matrix whose rows shrink with scale.
std::vector<Shape> scheme_shapes(double scale) {
  return {{1, 33}, {7, 100}, {64, 256}, {130, 260}, {std::max<int64_t>(2, int64_t(128 * scale)), 4096}};
}

// rows × cols values over ±spread binades, reproducible; then the special values: an outlier, a
// run of 64 zeros (whole zero blocks of 16 and 32) with a −0, subnormals of T, and (specials) a NaN
// and a −inf in their own blocks.
template <class T>
std::vector<T> scheme_inputs(int64_t rows, int64_t cols, uint64_t seed, bool specials) {
  const size_t n = size_t(rows * cols);
  const int spread = sizeof(T) == 4 ? 30 : 200;
  std::vector<T> x(n);
  for (size_t i = 0; i < n; ++i) {
    const double u = double(random_word(seed, 1, i)) / 4294967296.0 * 2 - 1;
    x[i] = T(std::ldexp(u, int(random_word(seed, 2, i) % uint32_t(2 * spread + 1)) - spread));
  }
  auto put = [&](size_t at, T v) {
    if (at < n) x[at] = v;
  };
  put(n / 3, sizeof(T) == 4 ? T(3.0e37) : T(1e300));
  for (size_t j = 0; j < 64; ++j) put(n / 2 + j, T(0));
  put(n / 2 + 1, T(-0.0));
  put(n - 1, std::numeric_limits<T>::denorm_min());
  put(n - 2, -std::numeric_limits<T>::min() / 4);
  if (specials) {
    put(5, std::numeric_limits<T>::quiet_NaN());
    put(n - 40, -std::numeric_limits<T>::infinity());
  }
  return x;
}

// One case: the CPU and the GPU on the same inputs; outputs, scales, zero points, statistics.
template <class T>
void scheme_case(ContractTally& tl, const Scheme& s, const std::vector<T>& x, int64_t rows, int64_t cols, Rounding m,
                 int sr_bits, uint64_t seed, uint64_t index0, const std::string& label) {
  if (!tl.take()) return;
  std::vector<T> cpu(x.size()), gpu(x.size());
  std::vector<double> cs, gs, cz, gz;
  const SchemeStats a = quantize_scheme<T>(s, x.data(), cpu.data(), rows, cols, m, sr_bits, seed, 7, index0, &cs, &cz);
  const SchemeStats b =
      cuda_quantize_scheme(s, x.data(), gpu.data(), rows, cols, m, sr_bits, seed, 7, index0, &gs, &gz);
  const std::string what = fmt::format("{} {}x{} {} {} sr_bits={} seed={} index0={}", s.name, rows, cols,
                                       sizeof(T) == 4 ? "float" : "double", to_string(m), sr_bits, seed, index0) +
                           label;
  tl.compare(what, cpu.data(), gpu.data(), cpu.size(), Agreement::bit_exact, 0);
  tl.compare_count(what + " scales", cs.size(), gs.size());
  if (cs.size() == gs.size()) tl.compare(what + " scales", cs.data(), gs.data(), cs.size(), Agreement::bit_exact, 0);
  if (s.rule == ScaleRule::minmax && cz.size() == gz.size())
    tl.compare(what + " zero points", cz.data(), gz.data(), cz.size(), Agreement::bit_exact, 0);
  tl.compare_count(what + " blocks", a.blocks, b.blocks);
  tl.compare_count(what + " nan_blocks", a.nan_blocks, b.nan_blocks);
  tl.compare_count(what + " zero_blocks", a.zero_blocks, b.zero_blocks);
  tl.compare_count(what + " clipped", a.clipped, b.clipped);
  tl.compare(what + " G", &a.global_scale, &b.global_scale, 1, Agreement::bit_exact, 0);
}

// Every preset × every mode × the shapes × 2 seeds (sr with 32 and 13 random bits, index0 0 and an
// unaligned one); inputs with and without NaN / inf blocks (the large matrix: without).
template <class T>
void scheme_contract(ContractTally& tl, double scale) {
  for (const Shape& sh : scheme_shapes(scale))
    for (uint64_t seed : {1, 2}) {
      const bool large = sh.rows * sh.cols > 100'000;
      for (const bool specials : {false, true}) {
        if (specials && large) continue;
        const std::vector<T> x = scheme_inputs<T>(sh.rows, sh.cols, seed, specials);
        for (const std::string& name : scheme_presets()) {
          const Scheme s = scheme_lookup(name);
          for (Rounding m : kModes)
            scheme_case(tl, s, x, sh.rows, sh.cols, m, seed == 1 ? 32 : 13, seed, seed == 1 ? 0 : 3,
                        specials ? " nan/inf" : "");
        }
      }
    }
}

// The rules no preset uses (ceil, nearest, a bf16 or e4m3 absmax scale, row and column blocks) and
// NVFP4's reciprocal order, from TOML as a user writes them.
void scheme_variants_contract(ContractTally& tl, double scale) {
  const char* tomls[] = {"element='fp4_e2m1'\nrule='ceil'", "element='fp6_e3m2'\nrule='nearest'\nblock=[2,8]",
                         "element='int8'\nrule='absmax'\nscale='bf16'\nblock='column'",
                         "element='int4tc'\nrule='absmax'\nscale='e4m3'\nblock='row'",
                         "element='fp4_e2m1'\nrule='absmax'\nscale='e4m3'\nblock=[1,16]\ntwo_level=true\n"
                         "division='reciprocal'",
                         "element='uint4'\nrule='minmax'\nblock=[4,4]"};
  for (const char* toml : tomls) {
    const Scheme s = scheme_from_toml(toml, "variant.toml");
    for (const Shape& sh : scheme_shapes(std::min(scale, 0.25)))
      for (const bool specials : {false, true})
        for (Rounding m : kModes) {
          const auto xf = scheme_inputs<float>(sh.rows, sh.cols, 3, specials);
          const auto xd = scheme_inputs<double>(sh.rows, sh.cols, 3, specials);
          const std::string label = std::string(" [") + toml + "]" + (specials ? " nan/inf" : "");
          scheme_case(tl, s, xf, sh.rows, sh.cols, m, 20, 3, 1, label);
          scheme_case(tl, s, xd, sh.rows, sh.cols, m, 20, 3, 1, label);
        }
  }
}

// quantize_absmax: bits × groups (whole row, 32, a ragged 100, 2048: a group wider than a warp's
// share) × rne / sr × shapes × 2 seeds; rows with a NaN, an inf and all zeros.
template <class T>
void absmax_contract(ContractTally& tl, double scale) {
  const std::vector<Shape> shapes = {{1, 33}, {7, 100}, {64, 256}, {std::max<int64_t>(2, int64_t(16 * scale)), 5000}};
  for (const Shape& sh : shapes)
    for (uint64_t seed : {1, 2}) {
      std::vector<T> x = scheme_inputs<T>(sh.rows, sh.cols, seed + 10, false);
      if (sh.rows >= 4) {
        const size_t c = size_t(sh.cols);
        x[c + 3] = std::numeric_limits<T>::quiet_NaN();
        x[2 * c + 1] = std::numeric_limits<T>::infinity();
        std::fill(x.begin() + std::ptrdiff_t(3 * c), x.begin() + std::ptrdiff_t(4 * c), T(0));
        x[3 * c + 2] = T(-0.0);
      }
      for (int bits : {2, 4, 8, 16})
        for (size_t block : {size_t(0), size_t(32), size_t(100), size_t(2048)})
          for (Rounding m : {Rounding::rne, Rounding::sr}) {
            if (!tl.take()) continue;
            const AbsmaxQuant q{bits, block, m, seed};
            std::vector<T> cpu(x.size()), gpu(x.size());
            quantize_absmax<T>(x.data(), cpu.data(), size_t(sh.rows), size_t(sh.cols), q, 9);
            cuda_quantize_absmax(x.data(), gpu.data(), size_t(sh.rows), size_t(sh.cols), q, 9);
            tl.compare(fmt::format("{}x{} {} bits={} block={} {} seed={}", sh.rows, sh.cols,
                                   sizeof(T) == 4 ? "float" : "double", bits, block, to_string(m), seed),
                       cpu.data(), gpu.data(), cpu.size(), Agreement::bit_exact, 0);
          }
    }
}

}  // namespace

void add_scheme_contracts(std::vector<Contract>& t) {
  const std::string shapes = "{1×33, 7×100, 64×256, 130×260, 128×4096} × 2 seeds (sr_bits 32 / 13, index0 0 / 3)";
  t.push_back({"scheme/float", Agreement::bit_exact, 0, "",
               "every preset × 8 modes × " + shapes +
                   ", with and without NaN / inf blocks; zero blocks, −0, subnormals, an outlier; outputs, scales, "
                   "zero points, statistics",
               scheme_contract<float>});
  t.push_back({"scheme/double", Agreement::bit_exact, 0, "", "as scheme/float, binary64 arrays",
               scheme_contract<double>});
  t.push_back({"scheme/variants", Agreement::bit_exact, 0, "",
               "ceil, nearest, bf16 / e4m3 absmax scales, row and column blocks, NVFP4's reciprocal order, uint4 "
               "minmax 4×4 × 8 modes × the shapes (large one at 1/4) × float, double, with and without NaN / inf",
               scheme_variants_contract});
}

void add_quant_contracts(std::vector<Contract>& t) {
  t.push_back({"quant/float", Agreement::bit_exact, 0, "",
               "bits {2, 4, 8, 16} × groups {row, 32, 100, 2048} × {rne, sr} × {1×33, 7×100, 64×256, 16×5000} × 2 "
               "seeds; NaN, inf and all-zero rows",
               absmax_contract<float>});
  t.push_back({"quant/double", Agreement::bit_exact, 0, "", "as quant/float, binary64 arrays",
               absmax_contract<double>});
}

}  // namespace mantis
