// _mantis — the native part of the `mantis` Python module: the library's own calls on numpy
// arrays, read and written in place (no copies). Nothing here computes: every number comes from the
// same function the CLI calls (tests/test_python.py compares both bit for bit). Rules:
//   * arguments are validated here, before the GIL is released and before any thread starts;
//   * InputError becomes mantis.Error (a ValueError) with the CLI's one-line message;
//   * arrays must already have the dtype the call needs (float32 / float64; int for tokens): a
//     wrong dtype is an error, never a silent cast; the Python layer (__init__.py) makes
//     non-contiguous inputs contiguous before they get here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "core/gemm.h"
#include "core/oracle.h"
#include "core/philox.h"
#include "core/progress.h"
#include "core/round_array.h"
#include "core/scheme.h"
#include "core/threads.h"
#include "exp/eval.h"
#include "io/checkpoint.h"
#include "mantis_config.h"
#include "nn/forward.h"
#include "nn/linear.h"
#include "nn/policy.h"
#include "nn/streams.h"

namespace py = pybind11;
using namespace mantis;

namespace {

// A loaded checkpoint and where it came from (eval() reads the model by path, as the CLI does).
struct PyModel {
  std::shared_ptr<const Model> model;
  std::string path;
};

bool is_f32(const py::array& a) { return a.dtype().is(py::dtype::of<float>()); }
bool is_f64(const py::array& a) { return a.dtype().is(py::dtype::of<double>()); }
bool c_contiguous(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// x: a C-contiguous float32 / float64 array (what the Python layer passes on).
void require_float_array(const py::array& x, const char* what, const char* call) {
  if (!is_f32(x) && !is_f64(x))
    throw InputError(fmt::format("{}: {} has dtype {}; expected float32 or float64", call, what, dtype_str(x)));
  if (!c_contiguous(x)) throw InputError(fmt::format("{}: {} is not C-contiguous", call, what));
}

// out: the caller's result array, written in place: C-contiguous, writeable, x's shape. It may
// be x itself — the same bytes with the same dtype and shape — or memory x does not touch; any
// other overlap (a shifted view, another dtype's view of x's bytes) is refused: the kernels would
// read elements they had already overwritten. Both arrays are C-contiguous here, so each one's
// bytes are [data, data + nbytes). Every call with out= goes through this.
void require_out(const py::array& x, const py::array& out, const char* call) {
  require_float_array(out, "out", call);
  if (!out.writeable()) throw InputError(fmt::format("{}: out is read-only", call));
  bool same = out.ndim() == x.ndim();
  for (py::ssize_t i = 0; same && i < x.ndim(); ++i) same = out.shape(i) == x.shape(i);
  if (!same)
    throw InputError(fmt::format("{}: out has shape {}, x has shape {}", call, shape_str(out), shape_str(x)));
  const auto* xb = static_cast<const char*>(x.data());
  const auto* ob = static_cast<const char*>(out.data());
  const auto xn = size_t(x.nbytes()), on = size_t(out.nbytes());
  const bool overlap = xn > 0 && on > 0 && xb < ob + on && ob < xb + xn;
  const bool in_place = xb == ob && xn == on && is_f64(x) == is_f64(out);
  if (overlap && !in_place)
    throw InputError(fmt::format("{}: out overlaps x without being x (in place needs the same bytes, dtype and "
                                 "shape: give x itself, or separate memory)", call));
}

// The new result array of a call without out=: x's shape, the given dtype.
py::array like(const py::array& x, bool f64) {
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  return f64 ? py::array(py::dtype::of<double>(), shape) : py::array(py::dtype::of<float>(), shape);
}

// Rows × columns of an array whose last axis is the columns (a 0-D or 1-D array is one row), as
// `mantis quantize` reads a .npy.
std::pair<int64_t, int64_t> matrix_shape(const py::array& x) {
  int64_t rows = 1, cols = x.ndim() == 0 ? 1 : x.shape(x.ndim() - 1);
  for (py::ssize_t i = 0; i + 1 < x.ndim(); ++i) rows *= x.shape(i);
  return {rows, cols};
}

// --- rounding ------------------------------------------------------------------------------------

// round(x, fmt, …) into out (which may be x itself). Element i of the flattened array uses the
// random word (seed, stream, index0 + i), as `mantis round --in` does with index0 = 0.
py::array py_round(const py::array& x, const Format& f, const std::string& mode, uint64_t seed, uint64_t stream,
                   uint64_t index0, int sr_bits, std::optional<py::array> out) {
  require_float_array(x, "x", "round");
  RoundOptions o;
  o.mode = rounding_from_string(mode);
  validate_sr_bits(sr_bits);
  o.sr_bits = sr_bits;
  o.seed = seed;
  o.stream = stream;
  o.index0 = index0;
  py::array y = out ? *out : like(x, is_f64(x) || !fits_float(f));
  if (out) require_out(x, y, "round");
  if (is_f32(y) && !fits_float(f))
    throw InputError(fmt::format("round: format {} does not fit binary32: a float32 array cannot hold its values "
                                 "(give a float64 out=)", f.name));
  const size_t n = size_t(x.size());
  const void* in = x.data();
  void* dst = y.mutable_data();
  const bool in64 = is_f64(x), out64 = is_f64(y);
  {
    py::gil_scoped_release nogil;
    if (in64 && out64) round_array(static_cast<const double*>(in), static_cast<double*>(dst), n, f, o);
    else if (in64) round_array(static_cast<const double*>(in), static_cast<float*>(dst), n, f, o);
    else if (out64) round_array(static_cast<const float*>(in), static_cast<double*>(dst), n, f, o);
    else round_array(static_cast<const float*>(in), static_cast<float*>(dst), n, f, o);
  }
  return y;
}

// The MPFR oracle, element by element (core/oracle.h): the reference round() is tested against.
py::array py_round_reference(const py::array& x, const Format& f, const std::string& mode, uint64_t seed,
                             uint64_t stream, uint64_t index0, int sr_bits) {
  require_float_array(x, "x", "round_reference");
  const Rounding m = rounding_from_string(mode);
  validate_sr_bits(sr_bits);
  py::array y = like(x, true);
  const size_t n = size_t(x.size());
  const bool in64 = is_f64(x);
  const void* in = x.data();
  double* dst = static_cast<double*>(y.mutable_data());
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < n; ++i) {
      const double v = in64 ? static_cast<const double*>(in)[i] : double(static_cast<const float*>(in)[i]);
      dst[i] = oracle_round(v, f, m, random_word(seed, stream, index0 + i), sr_bits);
    }
  }
  return y;
}

// --- scaled formats ------------------------------------------------------------------------------

py::tuple py_quantize(const py::array& x, const Scheme& s, const std::string& mode, uint64_t seed, uint64_t stream,
                      int sr_bits, std::optional<py::array> out) {
  require_float_array(x, "x", "quantize");
  const Rounding m = rounding_from_string(mode);
  validate_quantize(s, m, sr_bits);
  py::array y = out ? *out : like(x, is_f64(x));
  if (out) {
    require_out(x, y, "quantize");
    if (!y.dtype().is(x.dtype()))
      throw InputError(fmt::format("quantize: out has dtype {}, x has {}", dtype_str(y), dtype_str(x)));
  }
  const auto [rows, cols] = matrix_shape(x);
  std::vector<double> scales, zero_points;
  SchemeStats st;
  {
    py::gil_scoped_release nogil;
    if (is_f64(x))
      st = quantize_scheme<double>(s, static_cast<const double*>(x.data()), static_cast<double*>(y.mutable_data()),
                                   rows, cols, m, sr_bits, seed, stream, 0, &scales, &zero_points);
    else
      st = quantize_scheme<float>(s, static_cast<const float*>(x.data()), static_cast<float*>(y.mutable_data()),
                                  rows, cols, m, sr_bits, seed, stream, 0, &scales, &zero_points);
  }
  py::dict stats;
  stats["scheme"] = s.name;
  stats["rows"] = rows;
  stats["cols"] = cols;
  stats["elements"] = st.elements;
  stats["blocks"] = st.blocks;
  stats["nan_blocks"] = st.nan_blocks;
  stats["zero_blocks"] = st.zero_blocks;
  stats["clipped"] = st.clipped;
  if (s.two_level) stats["global_scale"] = st.global_scale;
  stats["scales"] = py::array_t<double>(py::ssize_t(scales.size()), scales.data());
  if (s.rule == ScaleRule::minmax) stats["zero_points"] = py::array_t<double>(py::ssize_t(zero_points.size()), zero_points.data());
  return py::make_tuple(y, stats);
}

// --- GEMM ----------------------------------------------------------------------------------------

void require_f32_matrix(const py::array& a, const char* what, const char* call) {
  if (!is_f32(a))
    throw InputError(fmt::format("{}: {} has dtype {}; the operands are binary32 (float32)", call, what, dtype_str(a)));
  if (a.ndim() != 2) throw InputError(fmt::format("{}: {} has shape {}; expected a matrix", call, what, shape_str(a)));
  if (!c_contiguous(a)) throw InputError(fmt::format("{}: {} is not C-contiguous", call, what));
}

// C[M×N] = A[M×K]·B[K×N] under spec (core/gemm.h); float64 out holds the accumulator's exact
// values; float32 needs an accumulator that fits binary32; reference: the MPFR oracle.
py::array py_gemm(const py::array& a, const py::array& b, const GemmSpec& s, const std::string& out_dtype,
                  bool reference) {
  require_f32_matrix(a, "a", "gemm");
  require_f32_matrix(b, "b", "gemm");
  if (a.shape(1) != b.shape(0))
    throw InputError(fmt::format("gemm: a is {} and b is {}: inner dimensions differ", shape_str(a), shape_str(b)));
  if (out_dtype != "float64" && out_dtype != "float32")
    throw InputError(fmt::format("gemm: out_dtype '{}'; expected float64 or float32", out_dtype));
  const bool f32 = out_dtype == "float32";
  const GemmPlan p = plan_gemm(s);
  if (f32 && !p.acc_fits_float)
    throw InputError(fmt::format("gemm: accumulator {} does not fit binary32 (use out_dtype='float64')", s.acc.name));
  if (f32 && reference) throw InputError("gemm: reference=True gives float64 results");
  const size_t M = a.shape(0), K = a.shape(1), N = b.shape(1);
  py::array c = f32 ? py::array(py::dtype::of<float>(), std::vector<py::ssize_t>{py::ssize_t(M), py::ssize_t(N)})
                    : py::array(py::dtype::of<double>(), std::vector<py::ssize_t>{py::ssize_t(M), py::ssize_t(N)});
  const float* A = static_cast<const float*>(a.data());
  const float* B = static_cast<const float*>(b.data());
  {
    py::gil_scoped_release nogil;
    if (reference) oracle_gemm(A, B, static_cast<double*>(c.mutable_data()), M, N, K, s);
    else if (f32) gemm(p, A, B, static_cast<float*>(c.mutable_data()), M, N, K, s.stream);
    else gemm(p, A, B, static_cast<double*>(c.mutable_data()), M, N, K, s.stream);
  }
  return c;
}

double py_dot(const py::array& x, const py::array& y, const GemmSpec& s, bool reference) {
  for (const auto& [v, name] : {std::pair{&x, "x"}, std::pair{&y, "y"}}) {
    if (!is_f32(*v))
      throw InputError(fmt::format("dot: {} has dtype {}; the operands are binary32 (float32)", name, dtype_str(*v)));
    if (v->ndim() != 1) throw InputError(fmt::format("dot: {} has shape {}; expected a vector", name, shape_str(*v)));
    if (!c_contiguous(*v)) throw InputError(fmt::format("dot: {} is not contiguous", name));
  }
  if (x.shape(0) != y.shape(0))
    throw InputError(fmt::format("dot: vectors of different lengths: {} and {}", x.shape(0), y.shape(0)));
  const float* px = static_cast<const float*>(x.data());
  const float* py_ = static_cast<const float*>(y.data());
  const size_t K = size_t(x.shape(0));
  validate(s);
  double r;
  {
    py::gil_scoped_release nogil;
    if (reference) oracle_gemm(px, py_, &r, 1, 1, K, s);
    else r = dot(px, py_, K, s);
  }
  return r;
}

GemmSpec make_gemm_spec(const Format& acc, const std::string& mode, const std::string& accumulation, int block,
                        int align_bits, std::optional<Format> input, const std::string& input_mode, int sr_bits,
                        uint64_t seed, uint64_t stream) {
  GemmSpec s;
  s.acc = acc;
  s.acc_mode = rounding_from_string(mode);
  s.accumulation = accumulation_from_string(accumulation);
  s.block = block;
  s.align_bits = align_bits;
  s.input = input;
  s.input_mode = rounding_from_string(input_mode);
  s.sr_bits = sr_bits;
  s.seed = seed;
  s.stream = stream;
  validate(s);
  return s;
}

// --- models --------------------------------------------------------------------------------------

std::vector<int32_t> token_vector(const py::array& t) {
  if (t.ndim() != 1) throw InputError(fmt::format("tokens has shape {}; expected one sequence", shape_str(t)));
  if (t.dtype().kind() != 'i' && t.dtype().kind() != 'u')
    throw InputError(fmt::format("tokens has dtype {}; expected integers", dtype_str(t)));
  const py::array_t<int64_t, py::array::c_style | py::array::forcecast> v(t);  // integer widening only
  std::vector<int32_t> out(size_t(v.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t id = v.data()[i];
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw InputError(fmt::format("tokens[{}] = {} is not a token id", i, id));
    out[i] = int32_t(id);
  }
  return out;
}

// The logits [T, vocab] of one sequence under a policy (float32), as `mantis logits` writes them.
py::array py_logits(const PyModel& m, const py::array& tokens, const Policy& policy) {
  const std::vector<int32_t> t = token_vector(tokens);
  const PolicyPlan plan(policy, m.model->cfg);  // validated here, before the GIL goes
  Matrix<float> out;
  {
    py::gil_scoped_release nogil;
    out = forward<float>(*m.model, t, plan);
  }
  py::array_t<float> r({py::ssize_t(out.rows()), py::ssize_t(out.cols())});
  std::copy(out.data(), out.data() + out.size(), r.mutable_data());
  return r;
}

// One site GEMM (nn/linear.h): out = round_output((x · wᵀ) / divisor + bias) with the site entry's
// accumulation and operand rounding; w is [out, in] (a Linear's weight) or, transposed=False,
// [in, out] (GPT-2's Conv1D). The stream is the mantis forward's (streams.h) unless given.
py::array py_site_gemm(const py::array& x, const py::array& w, const SitePolicy& entry, bool w_transposed,
                       std::optional<py::array> bias, double divisor, uint64_t stream) {
  require_f32_matrix(x, "x", "site_gemm");
  require_f32_matrix(w, "w", "site_gemm");
  const int64_t M = x.shape(0), K = x.shape(1);
  const int64_t N = w_transposed ? w.shape(0) : w.shape(1);
  if ((w_transposed ? w.shape(1) : w.shape(0)) != K)
    throw InputError(fmt::format("site_gemm: x is {} and w is {} ({}): inner dimensions differ", shape_str(x),
                                 shape_str(w), w_transposed ? "[out, in]" : "[in, out]"));
  const float* b = nullptr;
  if (bias) {
    if (!is_f32(*bias) || bias->ndim() != 1 || bias->shape(0) != N || !c_contiguous(*bias))
      throw InputError(fmt::format("site_gemm: bias must be a contiguous float32 vector of {} values, got {} {}", N,
                                   dtype_str(*bias), shape_str(*bias)));
    b = static_cast<const float*>(bias->data());
  }
  if (!(divisor > 0) || !std::isfinite(divisor)) throw InputError(fmt::format("site_gemm: divisor {} must be positive", divisor));
  const SitePlan plan = plan_site(entry);
  py::array_t<float> out({py::ssize_t(M), py::ssize_t(N)});
  {
    py::gil_scoped_release nogil;
    const Eigen::Map<const Matrix<float>> A(static_cast<const float*>(x.data()), M, K);
    const Eigen::Map<const Matrix<float>> B(static_cast<const float*>(w.data()), w.shape(0), w.shape(1));
    Eigen::Map<Matrix<float>> C(out.mutable_data(), M, N);
    site_gemm<float>(plan, A, B, w_transposed, C, stream, float(divisor), b);
  }
  return out;
}

Site site_named(const std::string& name) {
  const auto s = site_from_string(name);
  if (!s) throw InputError(fmt::format("unknown site '{}' (sites: {})", name, site_names()));
  return *s;
}

std::string format_repr(const Format& f) {
  return fmt::format("mantis.Format('{}': μ={}, emin={}, emax={}, subnormals={}, specials={}, overflow={})", f.name,
                     f.mu, f.emin, f.emax, f.subnormals ? "on" : "off", to_string(f.specials), to_string(f.overflow));
}

}  // namespace

PYBIND11_MODULE(_mantis, m) {
  m.doc() = "mantis native calls (use the `mantis` package, which wraps these)";
  static py::exception<InputError> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  m.attr("version") = MANTIS_VERSION;
  m.attr("have_openmp") = bool(MANTIS_HAVE_OPENMP);

  m.def("set_threads", [](int n) {
    if (n < 1 || n > 4096) throw InputError(fmt::format("threads {}: expected 1..4096", n));
    set_num_threads(n);
  });
  m.def("threads", &num_threads);

  py::class_<Format>(m, "Format")
      .def(py::init(&format_lookup), py::arg("name"))
      .def(py::init(&format_from_toml), py::kw_only(), py::arg("toml"), py::arg("source") = "<string>")
      .def_readonly("name", &Format::name)
      .def_readonly("mu", &Format::mu)
      .def_readonly("emin", &Format::emin)
      .def_readonly("emax", &Format::emax)
      .def_readonly("subnormals", &Format::subnormals)
      .def_property_readonly("precision", &Format::precision)
      .def_property_readonly("overflow", [](const Format& f) { return std::string(to_string(f.overflow)); })
      .def_property_readonly("specials", [](const Format& f) { return std::string(to_string(f.specials)); })
      .def_property_readonly("max_finite", [](const Format& f) { return max_finite(f); })
      .def_property_readonly("min_normal", [](const Format& f) { return min_normal(f); })
      .def_property_readonly("min_subnormal", [](const Format& f) { return min_subnormal(f); })
      .def_property_readonly("unit_roundoff", [](const Format& f) { return unit_roundoff(f); })
      .def_property_readonly("fits_float", [](const Format& f) { return fits_float(f); })
      .def("__repr__", &format_repr);
  m.def("named_formats", &named_formats);
  m.def("format_aliases", &format_aliases);
  m.def("family_help", &family_help);
  m.def("rounding_names", &rounding_names);

  py::class_<Scheme>(m, "Scheme")
      .def(py::init(&scheme_lookup), py::arg("name"))
      .def_static("from_toml", &scheme_from_toml, py::arg("text"), py::arg("source") = "<string>")
      .def_readonly("name", &Scheme::name)
      .def_readonly("element", &Scheme::element)
      .def_readonly("scale", &Scheme::scale)
      .def_property_readonly("block", [](const Scheme& s) { return py::make_tuple(s.block_rows, s.block_cols); })
      .def_property_readonly("rule", [](const Scheme& s) { return std::string(to_string(s.rule)); })
      .def_readonly("two_level", &Scheme::two_level)
      .def("__repr__", [](const Scheme& s) { return fmt::format("mantis.Scheme('{}')", s.name); });
  m.def("scheme_presets", &scheme_presets);

  py::class_<GemmSpec>(m, "GemmSpec")
      .def(py::init(&make_gemm_spec), py::arg("acc"), py::arg("mode") = "rne", py::arg("accumulation") = "strict",
           py::arg("block") = 32, py::arg("align_bits") = 24, py::arg("input") = std::nullopt,
           py::arg("input_mode") = "rne", py::arg("sr_bits") = 32, py::arg("seed") = 0, py::arg("stream") = 0)
      .def_readonly("acc", &GemmSpec::acc)
      .def_property_readonly("mode", [](const GemmSpec& s) { return std::string(to_string(s.acc_mode)); })
      .def_property_readonly("accumulation", [](const GemmSpec& s) { return std::string(to_string(s.accumulation)); })
      .def_readonly("block", &GemmSpec::block)
      .def_readonly("align_bits", &GemmSpec::align_bits)
      .def_readonly("input", &GemmSpec::input)
      .def_readonly("sr_bits", &GemmSpec::sr_bits)
      .def_readonly("seed", &GemmSpec::seed)
      .def_readonly("stream", &GemmSpec::stream)
      .def("__repr__", [](const GemmSpec& s) {
        return fmt::format("mantis.GemmSpec(acc='{}', mode='{}', accumulation='{}', block={}{})", s.acc.name,
                           to_string(s.acc_mode), to_string(s.accumulation), s.block,
                           s.input ? ", input='" + s.input->name + "'" : "");
      });

  m.def("round", &py_round, py::arg("x"), py::arg("fmt"), py::arg("mode"), py::arg("seed"), py::arg("stream"),
        py::arg("index0"), py::arg("sr_bits"), py::arg("out"));
  m.def("round_reference", &py_round_reference, py::arg("x"), py::arg("fmt"), py::arg("mode"), py::arg("seed"),
        py::arg("stream"), py::arg("index0"), py::arg("sr_bits"));
  m.def("quantize", &py_quantize, py::arg("x"), py::arg("scheme"), py::arg("mode"), py::arg("seed"),
        py::arg("stream"), py::arg("sr_bits"), py::arg("out"));
  m.def("gemm", &py_gemm, py::arg("a"), py::arg("b"), py::arg("spec"), py::arg("out_dtype"), py::arg("reference"));
  m.def("dot", &py_dot, py::arg("x"), py::arg("y"), py::arg("spec"), py::arg("reference"));

  py::class_<SitePolicy>(m, "SitePolicy")
      .def_property_readonly("native", &SitePolicy::is_native)
      .def("__repr__", [](const SitePolicy& p) {
        Policy one;
        one.all[0] = p;  // describe() names a site; this is only a readable summary of the entry
        std::string d = describe(one);
        while (!d.empty() && d.back() == '\n') d.pop_back();
        const auto colon = d.find(": ");
        return "mantis.SitePolicy(" + (p.is_native() ? std::string("native") : d.substr(colon + 2)) + ")";
      });

  py::class_<Policy>(m, "Policy")
      .def_static("from_spec", &policy_from_spec, py::arg("spec"))
      .def_static("from_toml", &policy_from_toml, py::arg("text"), py::arg("source") = "<string>")
      .def("site", [](const Policy& p, const std::string& site, int layer) { return p.at(site_named(site), layer); },
           py::arg("site"), py::arg("layer") = -1)
      .def("describe", [](const Policy& p) {
        std::string d = describe(p);
        while (!d.empty() && d.back() == '\n') d.pop_back();
        return d;
      })
      .def_property_readonly("lamp", [](const Policy& p) { return p.lamp.has_value(); });
  m.def("site_names", &site_names);
  m.def("site_stream", [](const std::string& site, int layer, int64_t slot) { return stream_of(site_named(site), layer, slot); },
        py::arg("site"), py::arg("layer"), py::arg("slot") = 0);

  py::class_<PyModel>(m, "Model")
      .def_readonly("path", &PyModel::path)
      .def_property_readonly("arch", [](const PyModel& m) { return m.model->cfg.arch == Arch::gpt2 ? "gpt2" : "llama"; })
      .def_property_readonly("vocab", [](const PyModel& m) { return m.model->cfg.vocab; })
      .def_property_readonly("ctx", [](const PyModel& m) { return m.model->cfg.ctx; })
      .def_property_readonly("layers", [](const PyModel& m) { return m.model->cfg.layers; })
      .def_property_readonly("heads", [](const PyModel& m) { return m.model->cfg.heads; })
      .def_property_readonly("kv_heads", [](const PyModel& m) { return m.model->cfg.kv_heads; })
      .def_property_readonly("dim", [](const PyModel& m) { return m.model->cfg.dim; })
      .def_property_readonly("hidden", [](const PyModel& m) { return m.model->cfg.hidden; })
      .def_property_readonly("config_json", [](const PyModel& m) { return model_config_json(m.model->cfg); })
      .def("sha256", [](const PyModel& m) { return model_sha256(*m.model); })
      .def("parameter_names", [](const PyModel& m) {
        std::vector<std::string> v;
        for (const auto& [k, _] : m.model->params) v.push_back(k);
        return v;
      })
      .def("parameter", [](const PyModel& m, const std::string& name) {
        const auto it = m.model->params.find(name);
        if (it == m.model->params.end()) throw InputError(fmt::format("the model has no parameter '{}'", name));
        std::vector<py::ssize_t> shape(it->second.shape.begin(), it->second.shape.end());
        py::array_t<float> a(shape);
        std::copy(it->second.data.begin(), it->second.data.end(), a.mutable_data());
        return a;
      }, py::arg("name"));
  m.def("load_model", [](const std::string& path) {
    PyModel pm;
    {
      py::gil_scoped_release nogil;
      pm.model = std::make_shared<const Model>(load_model(path));
    }
    pm.path = path;
    return pm;
  }, py::arg("path"));
  m.def("logits", &py_logits, py::arg("model"), py::arg("tokens"), py::arg("policy"));
  m.def("site_gemm", &py_site_gemm, py::arg("x"), py::arg("w"), py::arg("entry"), py::arg("w_transposed"),
        py::arg("bias"), py::arg("divisor"), py::arg("stream"));

  // eval: the same study as `mantis eval` (exp/eval.h); results and manifest as JSON text.
  m.def("eval", [](const std::string& model, const std::string& policy, const std::string& data, int seqs, int ctx,
                   const std::string& tokenizer, const std::string& out, bool progress) {
    EvalOptions o;
    o.model = model;
    o.policy = policy;
    o.data = data;
    o.seqs = seqs;
    o.ctx = ctx;
    o.tokenizer = tokenizer;
    o.out = out;
    o.progress = progress ? ProgressMode::automatic : ProgressMode::quiet;
    EvalResult r;
    {
      py::gil_scoped_release nogil;
      r = run_eval(o);
    }
    return py::make_tuple(r.report, r.results.dump(), r.manifest.dump());
  }, py::arg("model"), py::arg("policy"), py::arg("data"), py::arg("seqs"), py::arg("ctx"), py::arg("tokenizer"),
     py::arg("out"), py::arg("progress"));
}
