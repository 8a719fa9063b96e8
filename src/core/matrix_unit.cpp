#include "core/matrix_unit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/round.h"

namespace mantis {

namespace {

constexpr const char* kSource =
    "F. A. Khattak and M. Mikaitis, Accurate Models of NVIDIA Tensor Cores, ACM TACO (doi 10.1145/3830409); "
    "parameters fitted here to their measured outputs (github north-numerical-computing/MATLAB-tensor-core, "
    "model_validation/)";

struct In {
  const char* name;
  int prec, emin;
};
constexpr In kInputs[] = {{"fp16", 11, -14}, {"bf16", 8, -126}, {"tf32", 11, -126}, {"e4m3", 4, -6}, {"e5m2", 3, -14}};

bool is_fp8(const std::string& in) { return in == "e4m3" || in == "e5m2"; }

// The generation's fp16/bf16/tf32 datapath: block, extra alignment bits, α (min_align for an
// fp32 and an fp16 output: the authors' values; no measured case depends on them).
struct Gen {
  const char* gpus[3];
  int block16, block_tf32, extra, min_align32, min_align16;
  int fp8;  // 0: none, 1: Ada (16-product blocks, 13 bits), 2: Hopper (wgmma and mma), 3: Blackwell (mma)
};
constexpr Gen kGens[] = {
    {{"v100"}, 4, 0, 0, -1024, -19, 0},
    {{"a100", "a2"}, 8, 4, 1, -132, -20, 0},
    {{"ada", "l40s"}, 8, 4, 1, -132, -20, 1},
    {{"h100", "h200"}, 16, 8, 2, -133, -21, 2},
    {{"b200"}, 16, 8, 2, -133, -21, 3},
};

MatrixUnit base_unit(const In& in, bool out16) {
  MatrixUnit u;
  u.in_prec = in.prec, u.in_emin = in.emin;
  u.out_prec = out16 ? 11 : 24, u.out_emin = out16 ? -14 : -126, u.out_emax = out16 ? 15 : 127;
  u.dp.out_prec = u.out_prec, u.dp.out_emin = u.out_emin, u.dp.out_emax = u.out_emax;
  u.dp.out_rne = out16;  // toward zero into binary32, to nearest into binary16
  return u;
}

// Which (gpu, input, output) pairs the measured data cover (model_validation/<GPU>/<format>/).
bool measured(const std::string& gpu, const std::string& in, bool out16) {
  if (gpu == "v100") return in == "fp16";
  if (in == "tf32" || in == "bf16") return !out16;
  if (in == "fp16") return true;
  if (gpu == "a100" || gpu == "a2") return false;
  if (gpu == "l40s") return !out16;  // no FP8 → fp16 files for the L40S
  return true;
}

std::vector<MatrixUnitPreset> build() {
  std::vector<MatrixUnitPreset> v;
  for (const Gen& g : kGens)
    for (const char* gpu : g.gpus) {
      if (!gpu) continue;
      const std::string G = gpu;
      for (const In& in : kInputs) {
        const std::string I = in.name;
        if (G == "v100" && I != "fp16") continue;
        if (is_fp8(I) && g.fp8 == 0) continue;
        for (bool out16 : {false, true}) {
          if (out16 && (I == "bf16" || I == "tf32")) continue;  // fp32 accumulators only
          MatrixUnitPreset p{G, "mma", I, out16 ? "fp16" : "fp32", base_unit(in, out16), false, ""};
          MuDatapath& d = p.unit.dp;
          d.block = I == "tf32" ? g.block_tf32 : g.block16;
          d.frac_bits = 23 + g.extra;
          d.min_align = out16 ? g.min_align16 : g.min_align32;
          std::vector<MatrixUnitPreset> extra;
          if (is_fp8(I)) {
            if (g.fp8 == 1) {  // Ada: 16-product blocks, 13 fraction bits, a 14-bit binary32 result
              d.block = 16, d.frac_bits = 13;
              if (!out16) d.out_prec = 14;
            } else {  // Hopper and Blackwell mma.sync: the fp16 datapath, two interleaved halves
              p.unit.interleaved = 1;
              if (g.fp8 == 2) {  // Hopper wgmma: one 32-product block, 13 fraction bits
                MatrixUnitPreset w = p;
                w.path = "wgmma";
                w.unit.interleaved = 0;
                w.unit.dp.block = 32, w.unit.dp.frac_bits = 13;
                if (!out16) w.unit.dp.out_prec = 14;
                extra.push_back(w);
              }
            }
          }
          extra.insert(extra.begin(), p);
          for (MatrixUnitPreset& q : extra) {
            // Hopper FP8 data: wgmma for fp32 (C = 0 in the measurement), mma.sync for fp16.
            const bool data_path = !(is_fp8(I) && g.fp8 == 2) || (q.path == "wgmma") == !out16;
            q.validated = measured(G, I, out16) && data_path;
            if (q.validated)
              q.evidence = fmt::format("5,000 measured {} {} → {} inner products (K = {}{}), all reproduced; {}", G, I,
                                       q.output, is_fp8(I) ? 32 : G == "v100" ? 4 : I == "tf32" ? 4 : d.block,
                                       q.path == "wgmma" ? ", wgmma with C = 0" : "", kSource);
            else if (G == "l40s" && is_fp8(I))
              q.evidence = fmt::format("model only: no L40S {} → fp16 data; the Ada parameters (the L40S is an Ada GPU "
                                       "and its other files are byte-identical copies of Ada's)", I);
            else if (is_fp8(I) && g.fp8 == 2)
              q.evidence = fmt::format("model only: the measured {} {} → {} data use {}; this datapath with this "
                                       "output is the same unit's assumed behaviour", G, I, q.output,
                                       q.path == "wgmma" ? "mma.sync" : "wgmma");
            else
              q.evidence = "model only: no measured data for this pair";
            v.push_back(q);
          }
        }
      }
    }
  return v;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The matrix-unit name of a format, by its parameters (any alias of it qualifies), or "".
std::string unit_format_name(const Format& f, bool input) {
  if (!f.subnormals || !f.is_signed || !f.has_zero) return "";
  struct K { const char* name; int mu, emin, emax; bool in, out; };
  static const K k[] = {{"fp16", 10, -14, 15, true, true},   {"bf16", 7, -126, 127, true, false},
                        {"tf32", 10, -126, 127, true, false}, {"e4m3", 3, -6, 8, true, false},
                        {"e5m2", 2, -14, 15, true, false},    {"fp32", 23, -126, 127, false, true}};
  for (const K& x : k)
    if (f.mu == x.mu && f.emin == x.emin && f.emax == x.emax && (input ? x.in : x.out)) return x.name;
  return "";
}

}  // namespace

const std::vector<MatrixUnitPreset>& matrix_unit_presets() {
  static const std::vector<MatrixUnitPreset> v = build();
  return v;
}

const std::vector<std::string>& matrix_unit_gpus() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> g;
    for (const Gen& x : kGens)
      for (const char* n : x.gpus)
        if (n) g.emplace_back(n);
    return g;
  }();
  return v;
}

bool is_matrix_unit_name(const std::string& name) {
  const std::string n = lower(name.substr(0, name.find(':')));
  for (const std::string& g : matrix_unit_gpus())
    if (g == n) return true;
  return false;
}

const MatrixUnitPreset& matrix_unit(const std::string& name, const Format& input, const Format& output) {
  const std::string n = lower(name);
  const size_t colon = n.find(':');
  const std::string gpu = n.substr(0, colon), path = colon == std::string::npos ? "" : n.substr(colon + 1);
  std::string gpus;
  for (const std::string& g : matrix_unit_gpus()) gpus += (gpus.empty() ? "" : ", ") + g;
  if (!is_matrix_unit_name(gpu))
    throw InputError(fmt::format("unknown tensor-core GPU '{}' (known: {}; optionally :mma or :wgmma)", name, gpus));
  if (!path.empty() && path != "mma" && path != "wgmma")
    throw InputError(fmt::format("tensor core '{}': unknown datapath '{}' (known: mma, wgmma)", name, path));
  const std::string in = unit_format_name(input, true), out = unit_format_name(output, false);
  if (in.empty())
    throw InputError(fmt::format("tensor core {}: input format {} is not a matrix-unit input (fp16, bf16, tf32, e4m3, "
                                 "e5m2)", name, input.name));
  if (out.empty())
    throw InputError(fmt::format("tensor core {}: output (accumulator) format {} is not a matrix-unit output (fp32, "
                                 "fp16)", name, output.name));
  const MatrixUnitPreset* first = nullptr;
  for (const MatrixUnitPreset& p : matrix_unit_presets()) {
    if (p.gpu != gpu || p.input != in || p.output != out) continue;
    if (!path.empty() ? p.path == path : p.validated) return p;
    if (!first) first = &p;
  }
  if (path.empty() && first) return *first;
  std::string have;
  for (const MatrixUnitPreset& p : matrix_unit_presets())
    if (p.gpu == gpu) {
      const std::string c = fmt::format("{}→{}{}", p.input, p.output, p.path == "wgmma" ? " (wgmma)" : "");
      if (have.find(c) == std::string::npos) have += (have.empty() ? "" : ", ") + c;
    }
  throw InputError(fmt::format("tensor core {}: the {} has no {}{} → {} unit (it has: {})", name, gpu,
                               path.empty() ? "" : path + " ", in, out, have));
}

std::vector<MeasuredSet> read_measured_sets(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  if (ec) throw InputError(fmt::format("{}: cannot list the measured sets ({})", dir, ec.message()));
  std::sort(files.begin(), files.end());
  std::vector<MeasuredSet> v;
  for (const std::string& f : files) {
    MeasuredSet s;
    std::istringstream name(std::filesystem::path(f).stem().string());
    std::getline(name, s.gpu, '_'), std::getline(name, s.input, '_'), std::getline(name, s.output, '_');
    std::istringstream in(read_text_file(f, "measured tensor-core set"));
    std::string line;
    for (int ln = 1; std::getline(in, line); ++ln) {
      if (line.empty() || line[0] == '#') continue;
      auto bad = [&](const std::string& why) { return InputError(fmt::format("{}:{}: {}", f, ln, why)); };
      std::vector<std::string> parts;
      std::istringstream ls(line);
      for (std::string p; std::getline(ls, p, '|');) parts.push_back(p);
      if (parts.size() != 5) throw bad("expected 'number | A | B | C | D'");
      auto words = [&](const std::string& t) {
        std::vector<float> w;
        std::istringstream ss(t);
        for (std::string h; ss >> h;) {
          char* end = nullptr;
          const unsigned long u = std::strtoul(h.c_str(), &end, 16);
          if (h.size() != 8 || *end != '\0') throw bad("'" + h + "' is not an 8-digit hex word");
          const uint32_t b = uint32_t(u);
          float x;
          std::memcpy(&x, &b, 4);
          w.push_back(x);
        }
        return w;
      };
      MeasuredTest t;
      t.a = words(parts[1]), t.b = words(parts[2]);
      const std::vector<float> c = words(parts[3]), d = words(parts[4]);
      if (t.a.empty() || t.a.size() != t.b.size() || c.size() != 1 || d.size() != 1)
        throw bad("A and B need the same number of words (at least one), C and D one each");
      t.c = c[0], t.d = d[0];
      s.tests.push_back(std::move(t));
    }
    v.push_back(std::move(s));
  }
  return v;
}

std::vector<ProbeGroup> probe_groups(const std::vector<MeasuredSet>& sets) {
  std::vector<ProbeGroup> g;
  for (const MeasuredSet& s : sets)
    for (const MeasuredTest& t : s.tests) {
      const int K = int(t.a.size());
      auto it = std::find_if(g.begin(), g.end(), [&](const ProbeGroup& x) {
        return x.input == s.input && x.output == s.output && x.K == K;
      });
      if (it == g.end()) it = g.insert(g.end(), ProbeGroup{s.input, s.output, K, {}, {}, {}});
      it->a.insert(it->a.end(), t.a.begin(), t.a.end());
      it->b.insert(it->b.end(), t.b.begin(), t.b.end());
      it->c.push_back(t.c);
    }
  return g;
}

size_t probe_matches(const MatrixUnitPreset& p, const ProbeGroup& g, const std::vector<float>& d) {
  size_t ok = 0;
  const Target<double> out = make_target<double>(format_lookup(p.output));
  for (size_t t = 0; t < d.size() && t < g.c.size(); ++t) {
    const double c = round_value<Rounding::rne>(double(g.c[t]), out);  // the harness's __float2half
    const double want = mu_dot(p.unit, &g.a[t * size_t(g.K)], &g.b[t * size_t(g.K)], 1, size_t(g.K), c);
    const double got = d[t];
    ok += (want == got && std::signbit(want) == std::signbit(got)) || (want != want && got != got);
  }
  return ok;
}

}  // namespace mantis
