// contracts — the table (contracts.h) and the contracts of rounding, the emulated GEMMs and the
// optimizer updates.
#include "cuda/contracts.h"

#include <algorithm>
#include <cmath>

#include "core/gemm.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "core/sample.h"
#include "cuda/cuda.h"
#include "cuda/device.h"
#include "optim/adamw_step.h"
#include "optim/gefen.h"

namespace mantis {

namespace {

const Rounding kAllModes[] = {Rounding::rne, Rounding::rna, Rounding::rz, Rounding::ru,
                              Rounding::rd,  Rounding::ro,  Rounding::sr, Rounding::sre};

size_t scaled(size_t n, double scale) { return std::max<size_t>(1000, size_t(double(n) * scale)); }

template <class T>
std::vector<T> round_inputs(const Format& f, size_t n, uint64_t seed) {
  std::vector<T> xs;
  if constexpr (sizeof(T) == 4) {
    xs = stratified_floats(f, n, seed);
    const auto b = boundary_floats(f);
    xs.insert(xs.end(), b.begin(), b.end());
  } else {
    xs = stratified_doubles(f, n, seed);
    const auto b = boundary_doubles(f);
    xs.insert(xs.end(), b.begin(), b.end());
  }
  return xs;
}

template <class T>
void round_case(ContractTally& tl, const Format& f, const std::vector<T>& xs, Rounding m, int sr_bits, uint64_t index0,
                uint64_t seed, bool packed = false) {
  const RoundOptions o{.mode = m, .sr_bits = sr_bits, .seed = seed, .stream = 5, .index0 = index0, .sr_packed = packed};
  std::vector<T> cpu(xs.size()), gpu(xs.size());
  round_array(xs.data(), cpu.data(), xs.size(), f, o);
  cuda_round_array(xs.data(), gpu.data(), xs.size(), f, o);
  tl.compare(fmt::format("{} {} sr_bits={}{} index0={} seed={}", f.name, to_string(m), sr_bits, packed ? " packed" : "",
                         index0, seed),
             cpu.data(), gpu.data(), xs.size(), Agreement::bit_exact, 0);
}

// Every mode on stratified values and every boundary of each format; the stochastic modes also
// with few random bits, an unaligned and a large index0 (the Philox block split), another seed.
template <class T>
void round_contract(ContractTally& tl, double scale) {
  std::vector<Format> formats;
  const std::vector<const char*> named =
      sizeof(T) == 4 ? std::vector<const char*>{"bf16", "fp16", "e4m3", "e5m2", "ps4", "ps13", "fp32"}
                     : std::vector<const char*>{"bf16", "fp16", "e4m3", "e5m2", "ps4", "ps13", "fp32", "tf32", "fp64"};
  for (const char* n : named) formats.push_back(format_lookup(n));
  for (const Format& f : test_formats())
    if (sizeof(T) == 8 || fits_float(f)) formats.push_back(f);
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const Format& f = formats[fi];
    const auto xs = round_inputs<T>(f, scaled(fi < named.size() ? 1'000'000 : 100'000, scale), 1000 + fi);
    for (Rounding m : kAllModes) round_case(tl, f, xs, m, 32, 3, 11);
    round_case(tl, f, xs, Rounding::sr, 5, 0, 12);
    round_case(tl, f, xs, Rounding::sr, 13, (uint64_t(1) << 40) + 1, 13);
    round_case(tl, f, xs, Rounding::sre, 32, 2, 14);
    round_case(tl, f, xs, Rounding::sr, 8, 5, 15, true);  // packed: 4 roundings per word, 2
    round_case(tl, f, xs, Rounding::sr, 16, ~uint64_t(0) - 9, 16, true);
  }
}

// Sizes 0..5, 17 and 1027, each index0 mod 16: the partial Philox blocks at both ends, unpacked
// and packed (4·2^pack elements per block).
void round_edges_contract(ContractTally& tl, double) {
  const Format f = format_lookup("bf16");
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(5), size_t(17), size_t(1027)})
    for (uint64_t index0 = 0; index0 < 16; ++index0) {
      auto xs = stratified_floats(f, std::max<size_t>(n, 1), 77 + n);
      xs.resize(n);
      if (index0 < 4)
        for (Rounding m : {Rounding::rne, Rounding::sr}) round_case(tl, f, xs, m, 32, index0, 9);
      for (int bits : {8, 16}) round_case(tl, f, xs, Rounding::sr, bits, index0, 9, true);
    }
}

struct GemmShape {
  size_t M, N, K;
};

// Every accumulation × accumulator formats × modes × shapes (tile edges: 1, 15–17, 33, 64, 100 …,
// K past several k slices and chunks) × input rounding × seeds.
void gemm_contract(ContractTally& tl, double scale, Accumulation acc) {
  std::vector<GemmShape> shapes = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 64, 64}, {31, 100, 300}};
  if (scale >= 0.5) shapes.push_back({130, 70, 1000});
  if (scale >= 1) shapes.push_back({256, 256, 4096});
  const std::vector<const char*> formats = {"ps4", "ps7", "bf16", "ps10", "fp16", "ps23"};
  const Rounding modes[] = {Rounding::rne, Rounding::rz, Rounding::ru, Rounding::sr};
  for (const GemmShape& sh : shapes)
    for (uint64_t seed : {1, 2}) {
      std::vector<float> A(sh.M * sh.K), B(sh.K * sh.N);
      fill_random(A.data(), A.size(), Distribution::normal, seed, 100);
      fill_random(B.data(), B.size(), Distribution::normal, seed, 101);
      std::vector<double> C0(sh.M * sh.N);
      fill_random(C0.data(), C0.size(), Distribution::normal, seed, 102);
      for (const char* fn : formats)
        for (Rounding m : modes)
          for (bool input : {false, true}) {
            if (!tl.take()) continue;
            GemmSpec s{.acc = format_lookup(fn), .acc_mode = m, .accumulation = acc, .block = 32,
                       .align_bits = 24, .sr_bits = 16, .seed = seed, .stream = 3};
            if (acc == Accumulation::blocked || acc == Accumulation::promoted) s.block = 8 + int(seed) * 11;  // not a tile multiple
            if (input) s.input = format_lookup("e4m3"), s.input_mode = m;
            if (m == Rounding::sr && seed == 2) s.sr_packed = true, s.sr_bits = input ? 8 : 16;  // philox.h sr_word
            const bool with_c = seed == 2 && !input;  // the addend C (gemm.h)
            std::vector<double> cpu(sh.M * sh.N), gpu(sh.M * sh.N);
            const GemmPlan p = plan_gemm(s);
            gemm(p, A.data(), B.data(), cpu.data(), sh.M, sh.N, sh.K, s.stream, with_c ? C0.data() : nullptr);
            cuda_gemm(A.data(), B.data(), gpu.data(), sh.M, sh.N, sh.K, s, with_c ? C0.data() : nullptr);
            tl.compare(fmt::format("{}x{}x{} {} {}{}{}{} seed={}", sh.M, sh.N, sh.K, fn, to_string(m),
                                   s.sr_packed ? " packed" : "", input ? " input=e4m3" : "", with_c ? " C" : "", seed),
                       cpu.data(), gpu.data(), cpu.size(), Agreement::bit_exact, 0);
          }
    }
}

// Operands with random significands, exponents in [lo, hi], random signs and a few exact zeros.
std::vector<float> ranged_operands(size_t n, int lo, int hi, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r0 = random_word(seed, 99, 2 * i), r1 = random_word(seed, 99, 2 * i + 1);
    if (r1 % 53 == 0) continue;
    const int e = lo + int(r1 % uint32_t(hi - lo + 1));
    const float m = 1.0f + std::ldexp(float(r0 >> 9), -23);
    v[i] = ((r1 >> 16) & 1 ? -1.0f : 1.0f) * std::ldexp(m, e);
  }
  return v;
}

// The accumulator's range: products that overflow narrow accumulators, subnormal and underflowing
// ones, K = 0; every mode, strict / unfused / blocked (block 1, 8, 32), narrow formats.
void gemm_extremes_contract(ContractTally& tl, double) {
  struct Range { GemmShape sh; int lo, hi; };
  const Range ranges[] = {{{7, 9, 64}, 10, 14}, {{7, 9, 64}, -75, -60}, {{2, 3, 0}, -6, 6}, {{1, 40, 1000}, -6, 6}};
  uint64_t seed = 500;
  for (const char* fn : {"bf16", "fp16", "e5m2", "fp32"})
    for (Rounding m : kAllModes)
      for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked})
        for (int block : a == Accumulation::blocked ? std::vector<int>{1, 8, 32} : std::vector<int>{32}) {
          GemmSpec s{.acc = format_lookup(fn), .acc_mode = m, .accumulation = a, .block = block, .sr_bits = 16,
                     .seed = ++seed, .stream = 4};
          for (const Range& r : ranges) {
            if (!tl.take()) continue;
            const auto A = ranged_operands(r.sh.M * r.sh.K, r.lo, r.hi, seed);
            const auto B = ranged_operands(r.sh.K * r.sh.N, r.lo, r.hi, seed + 1);
            std::vector<double> cpu(r.sh.M * r.sh.N, -1.0), gpu(r.sh.M * r.sh.N, -2.0);
            gemm(A.data(), B.data(), cpu.data(), r.sh.M, r.sh.N, r.sh.K, s);
            cuda_gemm(A.data(), B.data(), gpu.data(), r.sh.M, r.sh.N, r.sh.K, s);
            tl.compare(fmt::format("{}x{}x{} 2^[{},{}] {} {} {} block {}", r.sh.M, r.sh.N, r.sh.K, r.lo, r.hi, fn,
                                   to_string(m), to_string(a), block),
                       cpu.data(), gpu.data(), cpu.size(), Agreement::bit_exact, 0);
          }
        }
}

// AdamW: three steps on gradients of several magnitudes (zeros, tiny, huge included), with and
// without weight decay; p, m and v compared after every step.
void adamw_contract(ContractTally& tl, double scale) {
  for (size_t n : {size_t(1), size_t(1000), scaled(300'003, scale)})
    for (bool decay : {false, true}) {
      std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
      fill_random(p.data(), n, Distribution::normal, 5, 1);
      gpu::Array<float> dp(p), dm(m), dv(v), dg(n);
      for (uint64_t t = 1; t <= 3; ++t) {
        fill_random(g.data(), n, Distribution::normal, 5, 10 + t);
        for (size_t i = 0; i < n; i += 7) g[i] = std::ldexp(g[i], int(i % 61) - 30);
        if (n > 3) g[1] = 0.0f, g[2] = 1e-30f, g[3] = -1e30f;
        const AdamWScalars c = adamw_scalars(0.9, 0.95, 1e-8, 0.1, 3e-4 * double(t), t);
        for (size_t i = 0; i < n; ++i) adamw_element(p[i], m[i], v[i], g[i], c, decay);
        dg.upload(g.data(), n);
        gpu::adamw_step(dp.get(), dm.get(), dv.get(), dg.get(), n, c, decay, gpu::Stream());
        const std::string what = fmt::format("n={} decay={} step {}", n, decay, t);
        tl.compare(what + " p", p.data(), dp.to_vector().data(), n, Agreement::bit_exact, 0);
        tl.compare(what + " m", m.data(), dm.to_vector().data(), n, Agreement::bit_exact, 0);
        tl.compare(what + " v", v.data(), dv.to_vector().data(), n, Agreement::bit_exact, 0);
      }
    }
}

// Gefen: tensors of every period shape (P = 1 with Q a divisor ≤ 256, P = Q over rows, a prime
// length, a single element), the codebook learned from the first gradients (as the optimizer does),
// three steps with and without weight decay; p, idx, mag and v compared after every step. The CPU
// side is the optimizer's own per-block code (gefen_block.h) with its reference nearest-code rule.
void gefen_contract(ContractTally& tl, double scale) {
  struct Shape {
    size_t n, P;
  };
  const std::vector<Shape> shapes = {{1, 1}, {1000, 1}, {6 * 768, 768}, {scaled(300'007, scale), 1}, {64 * 96, 96}};
  std::vector<std::vector<float>> g0;
  std::vector<size_t> periods;
  for (size_t s = 0; s < shapes.size(); ++s) {
    g0.emplace_back(shapes[s].n);
    fill_random(g0.back().data(), shapes[s].n, Distribution::normal, 11, 100 + s);
    periods.push_back(shapes[s].P);
  }
  std::vector<std::span<const float>> spans(g0.begin(), g0.end());
  const std::vector<float> C = gefen_learn_codebook(spans, periods);
  gpu::Array<float> dC(C);
  for (size_t s = 0; s < shapes.size(); ++s)
    for (bool wd : {false, true}) {
      const size_t n = shapes[s].n, P = shapes[s].P, Q = gefen_magnitude_block(n, P);
      std::vector<float> p(n), mag(n / Q, 0.0f), v(n / P, 0.0f), g = g0[s], m(Q), st(Q / P);
      std::vector<uint8_t> idx(n, 0);
      std::vector<uint32_t> c(Q);
      fill_random(p.data(), n, Distribution::normal, 11, 200 + s);
      gpu::Array<float> dp(p), dmag(mag), dv(v), dg(n), dm(n), dst(n / P);
      gpu::Array<uint8_t> didx(idx);
      gpu::Array<uint32_t> dc(n);
      auto codes = [&C](const float* x, size_t k, uint32_t* out) {
        for (size_t e = 0; e < k; ++e) out[e] = gefen_nearest(C.data(), uint32_t(C.size()), x[e]);
      };
      for (uint64_t t = 1; t <= 3; ++t) {
        if (t > 1) fill_random(g.data(), n, Distribution::normal, 11, 300 + 10 * s + t);
        if (n > 3) g[1] = 0.0f, g[2] = 1e-30f, g[3] = -1e20f;
        const double lr = 1e-3, bc1 = 1 - std::pow(0.9, double(t)), bc2 = 1 - std::pow(0.999, double(t));
        GefenScalars k{};
        k.b2 = 0.999f, k.a2 = float(1 - 0.999), k.w = float(1 - 0.9), k.inv_bc1 = float(1 / bc1);
        k.bc2_sqrt = float(std::sqrt(bc2)), k.eps = 1e-8f, k.lr = float(lr), k.decay = float(1 - lr * 0.1), k.wd = wd;
        for (size_t q = 0; q < n / Q; ++q)
          gefen_update_block(q, P, Q, p.data(), g.data(), idx.data(), mag.data(), v.data(), C.data(), k, m.data(),
                             c.data(), st.data(), codes);
        dg.upload(g.data(), n);
        gpu::gefen_step(dp.get(), dg.get(), didx.get(), dmag.get(), dv.get(), n, P, Q, dC.get(), k, dm.get(), dc.get(),
                        dst.get(), gpu::Stream());
        const std::string what = fmt::format("n={} P={} Q={} wd={} step {}", n, P, Q, wd, t);
        tl.compare(what + " p", p.data(), dp.to_vector().data(), n, Agreement::bit_exact, 0);
        tl.compare(what + " idx", idx.data(), didx.to_vector().data(), n, Agreement::bit_exact, 0);
        tl.compare(what + " mag", mag.data(), dmag.to_vector().data(), mag.size(), Agreement::bit_exact, 0);
        tl.compare(what + " v", v.data(), dv.to_vector().data(), v.size(), Agreement::bit_exact, 0);
      }
    }
}

}  // namespace

void add_round_contracts(std::vector<Contract>& t) {
  t.push_back({"round/float", Agreement::bit_exact, 0, "",
               "binary32 container: 7 named + every test format fitting binary32 × 8 modes (+ sr with 5 and 13 "
               "random bits, large index0) on 1e6 (named) / 1e5 stratified values + every boundary",
               round_contract<float>});
  t.push_back({"round/double", Agreement::bit_exact, 0, "",
               "binary64 container: 9 named + every test format × 8 modes (+ sr variants) on 1e6 / 1e5 stratified "
               "values + every boundary",
               round_contract<double>});
  t.push_back({"round/edges", Agreement::bit_exact, 0, "",
               "bf16 rne and sr, n ∈ {0,1,2,3,5,17,1027} × index0 mod 16 (partial Philox blocks), unpacked and "
               "packed (8, 16 bits)", round_edges_contract});
}

// tensor_core with a GPU: every matrix-unit preset, CPU (gemm.cpp) against the GPU kernel.
void gemm_unit_contract(ContractTally& tl, double scale) {
  const size_t K = std::max<size_t>(64, size_t(300 * scale));
  for (const MatrixUnitPreset& pr : matrix_unit_presets())
    for (size_t k : {size_t(1), size_t(31), K}) {
      const size_t M = 9, N = 13;
      std::vector<float> A(M * k), B(k * N);
      fill_random(A.data(), A.size(), Distribution::normal, 5, 100);
      fill_random(B.data(), B.size(), Distribution::normal, 5, 101);
      GemmSpec s;
      s.acc = format_lookup(pr.output);
      s.accumulation = Accumulation::tensor_core;
      s.tensor_core = pr.gpu + ":" + pr.path;
      s.input = format_lookup(pr.input);
      if (k == K) s.promote_every = pr.unit.interleaved ? 64 : 2 * pr.unit.dp.block, s.split_k = 2;  // a composition
      std::vector<double> C0(M * N);  // the addend: every K with and without it
      fill_random(C0.data(), C0.size(), Distribution::normal, 5, 102);
      for (bool with_c : {false, true}) {
        std::vector<double> cpu(M * N), gpu(M * N);
        gemm(plan_gemm(s), A.data(), B.data(), cpu.data(), M, N, k, 0, with_c ? C0.data() : nullptr);
        cuda_gemm(A.data(), B.data(), gpu.data(), M, N, k, s, with_c ? C0.data() : nullptr);
        tl.compare(fmt::format("{} {} -> {} K={}{}", s.tensor_core, pr.input, pr.output, k, with_c ? " C" : ""),
                   cpu.data(), gpu.data(), cpu.size(), Agreement::bit_exact, 0);
      }
    }
}

void add_gemm_contracts(std::vector<Contract>& t) {
  for (Accumulation a : {Accumulation::strict, Accumulation::unfused, Accumulation::blocked, Accumulation::promoted,
                         Accumulation::tensor_core})
    t.push_back({std::string("gemm/") + to_string(a), Agreement::bit_exact, 0, "",
                 "M×N×K from 1×1×1 to 256×256×4096 (tile edges, partial chunks) × {ps4, ps7, bf16, ps10, fp16, ps23} × "
                 "{rne, rz, ru, sr (seed 2: packed random bits)} × {no input rounding, e4m3 inputs} × 2 seeds (seed 2 "
                 "without input rounding: with the addend C)",
                 [a](ContractTally& tl, double scale) { gemm_contract(tl, scale, a); }});
  t.push_back({"gemm/matrix_unit", Agreement::bit_exact, 0, "",
               "every GPU matrix-unit preset (core/matrix_unit.h) × K ∈ {1, 31, 300 (promotion every two blocks, split-K "
               "2)} on 9×13 outputs, with and without the addend C, e4m3 / fp16 / bf16 / tf32 / e5m2 inputs rounded "
               "from normal values",
               gemm_unit_contract});
  t.push_back({"gemm/extremes", Agreement::bit_exact, 0, "",
               "accumulator overflow (products 2^10..2^14), subnormal and underflowing products (2^-75..2^-60), K = 0, "
               "K = 1000 × {bf16, fp16, e5m2, fp32} × 8 modes × strict / unfused / blocked (block 1, 8, 32)",
               gemm_extremes_contract});
}

void add_optimizer_contracts(std::vector<Contract>& t) {
  t.push_back({"optim/adamw", Agreement::bit_exact, 0, "",
               "n ∈ {1, 1000, 300003} × weight decay on/off × 3 steps; p, m, v after each step", adamw_contract});
  t.push_back({"optim/gefen", Agreement::bit_exact, 0, "",
               "P = 1 (Q = 1, 250, 1 of a prime n), P = Q = 768 and 96, n = 1 × weight decay on/off × 3 steps, the "
               "codebook learned from the first gradients; p, idx, mag, v after each step",
               gefen_contract});
}

const std::vector<Contract>& gpu_contracts() {
  static const std::vector<Contract> table = [] {
    std::vector<Contract> t;
    add_round_contracts(t);
    add_gemm_contracts(t);
    add_scheme_contracts(t);
    add_quant_contracts(t);
    add_attention_contracts(t);
    add_forward_contracts(t);
    add_optimizer_contracts(t);
    return t;
  }();
  return table;
}

}  // namespace mantis
