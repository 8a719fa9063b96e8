// _mantis — the native part of the `mantis` Python module: the library's own calls on numpy
// arrays, read and written in place (no copies). Nothing here computes: every number comes from the
// same function the CLI calls (tests/test_python.py compares both bit for bit). Rules:
//   * every argument of every call goes through one conversion layer (Call, below): bound as
//     Python binds arguments, converted by kind — integers in a declared range compared without
//     overflow, bools, strings, paths, formats, arrays — before the GIL is released and before
//     any thread starts; a bad call is never a pybind11 TypeError, a silent cast or a wrap;
//   * every error is mantis.Error (a ValueError) of one line that starts with the call's name:
//     the conversion layer's own, or the library's InputError (the CLI's message) after it;
//   * arrays must already have the dtype the call needs (float32 / float64; integers for tokens):
//     a wrong dtype is an error, never a silent cast; a non-contiguous or misaligned input is
//     copied, and every result has the input's shape (0-d included).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
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
  std::string path;  // the file system's bytes
};

// --- messages ------------------------------------------------------------------------------------

// A value the caller gave, for a message: its type and a short repr.
std::string shown(py::handle v) {
  std::string type = Py_TYPE(v.ptr())->tp_name, r;
  try {
    r = py::repr(v).cast<std::string>();
  } catch (const py::error_already_set&) {  // a failing __repr__, a huge int
    return type;
  } catch (const py::cast_error&) {  // a lone surrogate
    return type;
  }
  if (r.size() > 60) r = r.substr(0, 57) + "...";
  return type + " " + r;
}

std::string clip(std::string s) { return s.size() > 60 ? s.substr(0, 57) + "..." : s; }

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }
bool is_f32(const py::array& a) { return a.dtype().equal(py::dtype::of<float>()); }
bool is_f64(const py::array& a) { return a.dtype().equal(py::dtype::of<double>()); }

// --- arguments: the one conversion layer ---------------------------------------------------------

// A parameter of a call: its name, its default (none: required), keyword-only or not.
struct Param {
  const char* name;
  py::object dflt = {};
  bool keyword_only = false;
};
using Params = std::vector<Param>;


// One call's arguments, bound by position and name as Python binds them (unknown keywords,
// missing, repeated or surplus arguments are errors) and read through typed converters. A
// converter's error names the argument and what it accepts; run() puts the call's name first.
class Call {
 public:
  Call(const char* name, const Params& params, const py::args& args, const py::kwargs& kwargs,
       bool more_keywords = false)
      : name_(name), params_(params), values_(params.size()) {
    size_t positional = 0;
    for (const Param& p : params) positional += !p.keyword_only;
    if (args.size() > positional)
      throw InputError(fmt::format("takes at most {} positional argument{}, got {}", positional,
                                   positional == 1 ? "" : "s", args.size()));
    for (size_t i = 0; i < args.size(); ++i) values_[i] = py::reinterpret_borrow<py::object>(args[i]);
    for (const auto& [key, value] : kwargs) {
      std::string k;
      try {
        k = py::str(key).cast<std::string>();
      } catch (const py::cast_error&) {  // a lone surrogate: no parameter's name
        k = py::module_::import("builtins").attr("ascii")(key).cast<std::string>();
      }
      const size_t i = index(k);
      if (i == params.size()) {
        if (!more_keywords)
          throw InputError(fmt::format("unknown keyword argument '{}' (parameters: {})", clip(k), names()));
        more_[key] = value;
      } else if (values_[i]) {
        throw InputError(fmt::format("argument '{}' given twice (by position and by name)", k));
      } else {
        values_[i] = py::reinterpret_borrow<py::object>(value);
      }
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (!values_[i]) {
        if (!params[i].dflt) throw InputError(fmt::format("missing argument '{}'", params[i].name));
        values_[i] = params[i].dflt;
      }
  }

  py::handle operator[](const char* p) const { return values_[checked_index(p)]; }
  bool none(const char* p) const { return (*this)[p].is_none(); }
  const py::dict& more() const { return more_; }  // the keywords no parameter took (more_keywords)

  [[noreturn]] void fail(const char* p, const std::string& what) const {
    throw InputError(fmt::format("{} {}", p, what));
  }
  [[noreturn]] void wrong_type(const char* p, const std::string& expected) const {
    fail(p, fmt::format("must be {}, got {}", expected, shown((*this)[p])));
  }

  // An integer in lo..hi: a Python int or numpy integer (not a bool, not a float), compared as
  // Python's unbounded int, so that no value wraps or truncates on its way in.
  template <class T>
  T integer(const char* p, T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) const {
    const py::handle v = (*this)[p];
    const std::string range = fmt::format("{}..{}", lo, hi);
    if (PyBool_Check(v.ptr()) || (!PyLong_Check(v.ptr()) && !py::isinstance(v, numpy("integer"))))
      wrong_type(p, "an integer in " + range);
    const auto i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    bool fits = overflow == 0;  // in int64, or (below) in uint64
    __int128 value = s;
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
      fits = !PyErr_Occurred();
      PyErr_Clear();
      value = u;
    }
    if (fits && value >= __int128(lo) && value <= __int128(hi)) return T(value);
    const auto bits = i.attr("bit_length")().cast<size_t>();
    fail(p, fmt::format(
                "= {} is outside {}",
                bits <= 128 ? py::str(py::handle(i)).cast<std::string>() : fmt::format("<an integer of {} bits>", bits),
                range));
  }
  uint64_t u64(const char* p) const { return integer<uint64_t>(p); }
  int int32(const char* p) const { return integer<int>(p); }

  bool boolean(const char* p) const {
    const py::handle v = (*this)[p];
    if (!PyBool_Check(v.ptr()) && !py::isinstance(v, numpy("bool_"))) wrong_type(p, "True or False");
    return PyObject_IsTrue(v.ptr()) == 1;
  }

  // A finite real number (int, float, or a numpy one; not a bool).
  double real(const char* p) const {
    const py::handle v = (*this)[p];
    if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()) ||
                                   py::isinstance(v, numpy("floating")) || py::isinstance(v, numpy("integer"))))
      wrong_type(p, "a finite number");
    const double d = PyFloat_AsDouble(v.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      fail(p, "is out of binary64's range");
    }
    if (!std::isfinite(d)) fail(p, fmt::format("= {} is not finite", d));
    return d;
  }

  // A str, as UTF-8 without NUL (a NUL would end a name or path early in the library).
  std::string text(const char* p) const {
    const py::handle v = (*this)[p];
    if (!PyUnicode_Check(v.ptr())) wrong_type(p, "a string");
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
    if (!s) {
      PyErr_Clear();
      fail(p, "is not valid Unicode text (a lone surrogate)");
    }
    return no_nul(p, std::string(s, size_t(n)));
  }

  // A file system path: str, bytes or os.PathLike, as the file system's bytes (os.fsencode).
  std::string path(const char* p) const {
    const py::handle v = (*this)[p];
    py::object b;
    try {
      b = py::module_::import("os").attr("fsencode")(v);
    } catch (const py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_UnicodeError)) throw;
      wrong_type(p, "a path (str, bytes or os.PathLike)");
    }
    return no_nul(p, b.cast<std::string>());
  }

  // Text the library parses (a rounding mode, a format, a scheme, ...): its InputError names the
  // argument too.
  template <class F>
  auto parsed(const char* p, F parse) const {
    try {
      return parse();
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", p, e.what()));
    }
  }
  Rounding rounding(const char* p) const {
    const std::string s = text(p);
    return parsed(p, [&] { return rounding_from_string(s); });
  }
  // An object of one of the module's classes, or the name (or .toml path) the library looks up.
  template <class T, class Lookup>
  T named(const char* p, const char* what, Lookup lookup) const {
    const py::handle v = (*this)[p];
    if (py::isinstance<T>(v)) return v.cast<T>();
    if (!PyUnicode_Check(v.ptr())) wrong_type(p, what);
    const std::string s = text(p);
    return parsed(p, [&] { return lookup(s); });
  }
  Format format(const char* p) const {
    return named<Format>(p, "a format name, a .toml path or a mantis.Format", format_lookup);
  }
  Scheme scheme(const char* p) const {
    return named<Scheme>(p, "a scheme name, a .toml path or a mantis.Scheme", scheme_lookup);
  }
  Site site(const char* p) const {
    const std::string s = text(p);
    const auto site = site_from_string(s);
    if (!site) fail(p, fmt::format("'{}' is not a site (sites: {})", clip(s), site_names()));
    return *site;
  }
  // An object of one of the module's classes.
  template <class T>
  const T& object(const char* p, const char* what) const {
    const py::handle v = (*this)[p];
    if (!py::isinstance<T>(v)) wrong_type(p, what);
    return v.cast<const T&>();
  }

  // Any array-like, as numpy reads it (np.asarray; its refusal becomes this call's error).
  py::array array(const char* p) const {
    try {
      return numpy("asarray")((*this)[p]);
    } catch (const py::error_already_set& e) {
      if (e.matches(PyExc_MemoryError) || !e.matches(PyExc_Exception)) throw;
      fail(p, fmt::format("cannot be read as an array ({})", e.what()));
    }
  }
  // A float32 / float64 array (no cast from any other dtype), C-contiguous and aligned: a copy
  // where it is not, of the same shape (np.ascontiguousarray would make a 0-d array 1-d).
  py::array float_array(const char* p) const {
    const py::array a = array(p);
    if (!is_f32(a) && !is_f64(a))
      fail(p, fmt::format("has dtype {}; expected float32 or float64 (convert explicitly)", dtype_str(a)));
    return contiguous(a);
  }
  // A float32 array of ndim dimensions: GEMM and dot operands are binary32.
  py::array f32_array(const char* p, int ndim) const {
    const py::array a = array(p);
    if (!is_f32(a)) fail(p, fmt::format("has dtype {}; the operands are binary32 (float32)", dtype_str(a)));
    if (a.ndim() != ndim)
      fail(p, fmt::format("has shape {}; expected {}", shape_str(a), ndim == 1 ? "a vector" : "a matrix"));
    return contiguous(a);
  }
  // out=: the caller's array, written in place — a float32 / float64 numpy array, C-contiguous,
  // aligned, writeable, of x's shape. It may be x itself (the same bytes with the same dtype and
  // shape) or memory x does not touch; any other overlap (a shifted view, another dtype's view of
  // x's bytes) is refused: the kernels would read elements they had already overwritten. x is
  // C-contiguous (float_array), so both arrays' bytes are [data, data + nbytes). Every call with
  // out= reads it here.
  std::optional<py::array> out(const char* p, const py::array& x) const {
    const py::handle v = (*this)[p];
    if (v.is_none()) return std::nullopt;
    if (!py::isinstance<py::array>(v)) wrong_type(p, "a numpy array");
    const auto o = py::reinterpret_borrow<py::array>(v);
    if (!is_f32(o) && !is_f64(o)) fail(p, fmt::format("has dtype {}; expected float32 or float64", dtype_str(o)));
    if (!(o.flags() & py::array::c_style)) fail(p, "is not C-contiguous");
    if (!(o.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) fail(p, "is not aligned");
    if (!o.writeable()) fail(p, "is read-only");
    bool same = o.ndim() == x.ndim();
    for (py::ssize_t i = 0; same && i < x.ndim(); ++i) same = o.shape(i) == x.shape(i);
    if (!same) fail(p, fmt::format("has shape {}, x has shape {}", shape_str(o), shape_str(x)));
    const auto* xb = static_cast<const char*>(x.data());
    const auto* ob = static_cast<const char*>(o.data());
    const auto xn = size_t(x.nbytes()), on = size_t(o.nbytes());
    const bool overlap = xn > 0 && on > 0 && xb < ob + on && ob < xb + xn;
    const bool in_place = xb == ob && xn == on && is_f64(x) == is_f64(o);
    if (overlap && !in_place)
      fail(p, "overlaps x without being x (in place needs the same bytes, dtype and shape: give x itself, or "
              "separate memory)");
    return o;
  }
  // Token ids: a 1-D integer array (bools are not ids) of values in 0..2^31-1.
  std::vector<int32_t> tokens(const char* p) const {
    const py::array a = array(p);
    if (a.ndim() != 1) fail(p, fmt::format("has shape {}; expected one sequence", shape_str(a)));
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u') fail(p, fmt::format("has dtype {}; expected integers", dtype_str(a)));
    std::vector<int32_t> out(size_t(a.size()));
    auto check = [&](auto values) {
      for (size_t i = 0; i < out.size(); ++i) {
        const auto id = values.data()[i];
        if (id < 0 || uint64_t(id) > uint64_t(std::numeric_limits<int32_t>::max()))
          fail(p, fmt::format("[{}] = {} is not a token id (0..2147483647)", i, id));
        out[i] = int32_t(id);
      }
    };
    if (kind == 'u') check(py::array_t<uint64_t, py::array::c_style | py::array::forcecast>(a));
    else check(py::array_t<int64_t, py::array::c_style | py::array::forcecast>(a));
    return out;
  }

 private:
  static py::object numpy(const char* attr) { return py::module_::import("numpy").attr(attr); }
  static py::array contiguous(const py::array& a) {
    return py::array::ensure(a, int(py::array::c_style) | int(py::detail::npy_api::NPY_ARRAY_ALIGNED_));
  }
  std::string no_nul(const char* p, std::string s) const {
    if (s.find('\0') != std::string::npos) fail(p, "contains a NUL character");
    return s;
  }
  size_t index(const std::string& k) const {
    size_t i = 0;
    while (i < params_.size() && k != params_[i].name) ++i;
    return i;
  }
  size_t checked_index(const char* p) const {
    const size_t i = index(p);
    if (i == params_.size()) throw std::logic_error(fmt::format("{}: no parameter {}", name_, p));
    return i;
  }
  std::string names() const {
    std::string s;
    for (const Param& p : params_) s += (s.empty() ? "" : ", ") + std::string(p.name);
    return s;
  }

  const char* name_;
  const Params& params_;
  std::vector<py::object> values_;
  py::dict more_;
};

// Runs a call's body: every InputError it raises — a converter's, the library's — leaves with the
// call's name in front.
template <class F>
py::object run(const std::string& name, F body) {
  try {
    return body();
  } catch (const InputError& e) {
    throw InputError(name + ": " + e.what());
  }
}

// The signature line of a call ("round(x, fmt, mode='rne', …)", with "--" after it, so that
// inspect.signature reads it) and its text: the docstring of every function registered below.
std::string signature_doc(const std::string& name, const Params& params, const char* doc, bool method = false,
                          bool more = false) {
  std::string s = name.substr(name.rfind('.') + 1) + "(" + (method ? "self" : "");
  bool star = false;
  for (const Param& p : params) {
    if (s.back() != '(') s += ", ";
    if (p.keyword_only && !star) s += "*, ", star = true;
    s += p.name;
    if (p.dflt) s += fmt::format("={}", py::repr(p.dflt).cast<std::string>());
  }
  if (more) s += std::string(s.back() != '(' ? ", " : "") + "**kwargs";
  return s + ")\n--\n\n" + doc;
}

// A call's Python callable: its arguments bound and converted by Call, its body run by run().
template <class F>
auto bound(const char* name, Params params, F body, bool more = false) {
  return [name, params = std::move(params), body, more](const py::args& a, const py::kwargs& k) {
    return run(name, [&] { return py::object(body(Call(name, params, a, k, more))); });
  };
}

// A function of the module.
template <class F>
void def(py::module_& m, const char* name, Params params, const char* doc, F body, bool more = false) {
  const std::string d = signature_doc(name, params, doc, false, more);
  m.def(name, bound(name, std::move(params), body, more), d.c_str());
}

// A static method of a class.
template <class Cls, class F>
void static_method(Cls& cls, const char* pyname, const char* name, Params params, const char* doc, F body) {
  const std::string d = signature_doc(name, params, doc);
  cls.def_static(pyname, bound(name, std::move(params), body), d.c_str());
}

// A method of a class (self first, then the bound arguments).
template <class T, class Cls, class F>
void method(Cls& cls, const char* pyname, const char* name, Params params, const char* doc, F body) {
  const std::string d = signature_doc(name, params, doc, true);
  cls.def(
      pyname,
      [name, params = std::move(params), body](const T& self, const py::args& a, const py::kwargs& k) {
        return run(name, [&] { return py::object(body(self, Call(name, params, a, k))); });
      },
      d.c_str());
}

// A class's constructor through the same layer.
template <class T, class Cls, class F>
void constructor(Cls& cls, const char* name, Params params, const char* doc, F make) {
  const std::string d = signature_doc("__init__", params, doc, true);
  cls.def(py::init([name, params = std::move(params), make](const py::args& a, const py::kwargs& k) {
            T* t = nullptr;
            run(name, [&] {
              t = new T(make(Call(name, params, a, k)));
              return py::object();
            });
            return t;
          }),
          d.c_str());
}

// A class Python code does not construct (load_model makes Models, Policy.site SitePolicies).
template <class T>
auto no_init(const char* name, const char* how) {
  return py::init([name, how](const py::args&, const py::kwargs&) -> T* {
    throw InputError(fmt::format("{}: not constructed directly ({})", name, how));
  });
}

// --- the calls -----------------------------------------------------------------------------------

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

// The random-word arguments of the rounding calls; elementwise (round, round_reference) also
// index0 and sr_packed (quantize has neither).
RoundOptions round_options(const Call& c, bool elementwise = true) {
  RoundOptions o;
  o.mode = c.rounding("mode");
  o.seed = c.u64("seed");
  o.stream = c.u64("stream");
  o.index0 = elementwise ? c.u64("index0") : 0;
  o.sr_bits = c.integer<int>("sr_bits", kSrBitsMin, kSrBitsMax);
  validate_sr_bits(o.sr_bits);
  if (elementwise) {
    o.sr_packed = c.boolean("sr_packed");
    validate_sr_packed(o.sr_packed, o.sr_bits, is_stochastic(o.mode));
  }
  return o;
}

// round(x, fmt, …) into out (which may be x itself). Element i of the flattened array uses the
// random word (seed, stream, (index0 + i) mod 2^64), as `mantis round --in` does with index0 = 0.
py::object py_round(const Call& c) {
  const py::array x = c.float_array("x");
  const Format f = c.format("fmt");
  const RoundOptions o = round_options(c);
  const auto out = c.out("out", x);
  py::array y = out ? *out : like(x, is_f64(x) || !fits_float(f));
  if (is_f32(y) && !fits_float(f))
    throw InputError(fmt::format("format {} does not fit binary32: a float32 array cannot hold its values "
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
py::object py_round_reference(const Call& c) {
  const py::array x = c.float_array("x");
  const Format f = c.format("fmt");
  const RoundOptions o = round_options(c);
  py::array y = like(x, true);
  const size_t n = size_t(x.size());
  const bool in64 = is_f64(x);
  const void* in = x.data();
  double* dst = static_cast<double*>(y.mutable_data());
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < n; ++i) {
      const double v = in64 ? static_cast<const double*>(in)[i] : double(static_cast<const float*>(in)[i]);
      dst[i] = oracle_round(v, f, o.mode, oracle_sr_word(o.seed, o.stream, o.index0 + i, 1 << sr_pack(o.sr_bits, o.sr_packed)),
                            o.sr_bits);
    }
  }
  return y;
}

py::object py_quantize(const Call& c) {
  const py::array x = c.float_array("x");
  const Scheme s = c.scheme("scheme");
  const RoundOptions o = round_options(c, false);
  const bool want_stats = c.boolean("stats");
  validate_quantize(s, o.mode, o.sr_bits);
  const auto out = c.out("out", x);
  if (out && !out->dtype().equal(x.dtype()))
    throw InputError(fmt::format("out has dtype {}, x has {}", dtype_str(*out), dtype_str(x)));
  py::array y = out ? *out : like(x, is_f64(x));
  const auto [rows, cols] = matrix_shape(x);
  std::vector<double> scales, zero_points;
  SchemeStats st;
  const void* in = x.data();
  void* dst = y.mutable_data();
  const bool f64 = is_f64(x);  // a Python call: not under nogil
  {
    py::gil_scoped_release nogil;
    if (f64)
      st = quantize_scheme<double>(s, static_cast<const double*>(in), static_cast<double*>(dst), rows, cols, o.mode,
                                   o.sr_bits, o.seed, o.stream, 0, &scales, &zero_points);
    else
      st = quantize_scheme<float>(s, static_cast<const float*>(in), static_cast<float*>(dst), rows, cols, o.mode,
                                  o.sr_bits, o.seed, o.stream, 0, &scales, &zero_points);
  }
  if (!want_stats) return y;
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

// GemmSpec's parameters, read from a Call (the constructor's, or gemm's / dot's keywords).
Params gemm_spec_params() {
  return {{"acc"},
          {"mode", py::str("rne")},
          {"accumulation", py::str("strict")},
          {"block", py::int_(32)},
          {"align_bits", py::int_(24)},
          {"tensor_core", py::none()},
          {"promote_every", py::int_(0)},
          {"split_k", py::int_(1)},
          {"input", py::none()},
          {"input_mode", py::str("rne")},
          {"sr_bits", py::int_(32)},
          {"sr_packed", py::bool_(false)},
          {"seed", py::int_(0)},
          {"stream", py::int_(0)}};
}

GemmSpec gemm_spec(const Call& c) {
  GemmSpec s;
  s.acc = c.format("acc");
  s.acc_mode = c.rounding("mode");
  const std::string acc = c.text("accumulation");
  s.accumulation = c.parsed("accumulation", [&] { return accumulation_from_string(acc); });
  s.block = c.integer<int>("block", 1, kGemmMaxBlock);
  s.align_bits = c.int32("align_bits");
  if (!c.none("tensor_core")) s.tensor_core = c.text("tensor_core");
  s.promote_every = c.integer<int>("promote_every", 0, kGemmMaxBlock);
  s.split_k = c.integer<int>("split_k", 1, kGemmMaxSplitK);
  if (!c.none("input")) s.input = c.format("input");
  s.input_mode = c.rounding("input_mode");
  s.sr_bits = c.integer<int>("sr_bits", kSrBitsMin, kSrBitsMax);
  s.sr_packed = c.boolean("sr_packed");
  s.seed = c.u64("seed");
  s.stream = c.u64("stream");
  validate(s);
  return s;
}

// gemm's / dot's spec: a GemmSpec, an accumulator format (str or Format), or GemmSpec's keywords.
GemmSpec spec_of(const Call& c, const char* call) {
  if (c.none("spec")) {
    const Params params = gemm_spec_params();
    return gemm_spec(Call(call, params, py::args(), py::reinterpret_borrow<py::kwargs>(c.more())));
  }
  if (c.more().size() > 0) throw InputError("give either spec or GemmSpec's keyword arguments, not both");
  if (py::isinstance<GemmSpec>(c["spec"])) return c["spec"].cast<GemmSpec>();
  if (!py::isinstance<Format>(c["spec"]) && !PyUnicode_Check(c["spec"].ptr()))
    c.wrong_type("spec", "a mantis.GemmSpec, an accumulator format or None");
  GemmSpec s;
  s.acc = c.format("spec");
  validate(s);
  return s;
}

// out_dtype: float64 or float32, by name or numpy dtype (np.float32, np.dtype('float32'), 'f4').
bool out_f32(const Call& c) {
  const py::handle v = c["out_dtype"];
  if (!v.is_none()) {
    try {
      const auto d = py::dtype::from_args(py::reinterpret_borrow<py::object>(v));
      if (d.equal(py::dtype::of<float>())) return true;
      if (d.equal(py::dtype::of<double>())) return false;
    } catch (const py::error_already_set& e) {
      if (!e.matches(PyExc_Exception) || e.matches(PyExc_MemoryError)) throw;
    }
  }
  c.wrong_type("out_dtype", "float64 or float32 (a name or a numpy dtype)");
}

// C[M×N] = A[M×K]·B[K×N] under spec (core/gemm.h); float64 out holds the accumulator's exact
// values; float32 needs an accumulator that fits binary32; reference: the MPFR oracle.
py::object py_gemm(const Call& c) {
  const py::array a = c.f32_array("a", 2), b = c.f32_array("b", 2);
  const GemmSpec s = spec_of(c, "gemm");
  const bool f32 = out_f32(c), reference = c.boolean("reference");
  if (a.shape(1) != b.shape(0))
    throw InputError(fmt::format("a is {} and b is {}: inner dimensions differ", shape_str(a), shape_str(b)));
  const GemmPlan p = plan_gemm(s);
  if (f32 && !p.acc_fits_float)
    throw InputError(fmt::format("accumulator {} does not fit binary32 (use out_dtype='float64')", s.acc.name));
  if (f32 && reference) throw InputError("reference=True gives float64 results");
  const size_t M = a.shape(0), K = a.shape(1), N = b.shape(1);
  std::vector<double> c0;  // the addend, float32 [M, N]
  if (!c.none("c")) {
    const py::array ca = c.f32_array("c", 2);
    if (size_t(ca.shape(0)) != M || size_t(ca.shape(1)) != N)
      throw InputError(fmt::format("c is {}; the product is ({}, {})", shape_str(ca), M, N));
    const float* cp = static_cast<const float*>(ca.data());
    c0.assign(cp, cp + M * N);
  }
  const double* C0 = c0.empty() ? nullptr : c0.data();
  py::array out = f32 ? py::array(py::dtype::of<float>(), std::vector<py::ssize_t>{py::ssize_t(M), py::ssize_t(N)})
                      : py::array(py::dtype::of<double>(), std::vector<py::ssize_t>{py::ssize_t(M), py::ssize_t(N)});
  const float* A = static_cast<const float*>(a.data());
  const float* B = static_cast<const float*>(b.data());
  {
    py::gil_scoped_release nogil;
    if (reference) oracle_gemm(A, B, static_cast<double*>(out.mutable_data()), M, N, K, s, C0);
    else if (f32) gemm(p, A, B, static_cast<float*>(out.mutable_data()), M, N, K, s.stream, C0);
    else gemm(p, A, B, static_cast<double*>(out.mutable_data()), M, N, K, s.stream, C0);
  }
  return out;
}

py::object py_dot(const Call& c) {
  const py::array x = c.f32_array("x", 1), y = c.f32_array("y", 1);
  const GemmSpec s = spec_of(c, "dot");
  const bool reference = c.boolean("reference");
  if (x.shape(0) != y.shape(0))
    throw InputError(fmt::format("vectors of different lengths: {} and {}", x.shape(0), y.shape(0)));
  const float* px = static_cast<const float*>(x.data());
  const float* py_ = static_cast<const float*>(y.data());
  const size_t K = size_t(x.shape(0));
  double r;
  {
    py::gil_scoped_release nogil;
    if (reference) oracle_gemm(px, py_, &r, 1, 1, K, s);
    else r = dot(px, py_, K, s);
  }
  return py::float_(r);
}

// --- models --------------------------------------------------------------------------------------

// A model argument: a loaded Model, or a checkpoint path.
std::string model_path(const Call& c, const char* p) {
  if (py::isinstance<PyModel>(c[p])) return c[p].cast<const PyModel&>().path;
  return c.path(p);
}

PyModel load(const std::string& path) {
  PyModel pm;
  {
    py::gil_scoped_release nogil;
    pm.model = std::make_shared<const Model>(load_model(path));
  }
  pm.path = path;
  return pm;
}

// The logits [T, vocab] of one sequence under a policy (float32), as `mantis logits` writes them.
py::object py_logits(const Call& c) {
  const PyModel m = py::isinstance<PyModel>(c["model"]) ? c["model"].cast<PyModel>() : load(c.path("model"));
  const std::vector<int32_t> t = c.tokens("tokens");
  const PolicyPlan plan(c.object<Policy>("policy", "a policy"), m.model->cfg);  // validated before the GIL goes
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
py::object py_site_gemm(const Call& c) {
  const py::array x = c.f32_array("x", 2), w = c.f32_array("w", 2);
  const SitePolicy& entry = c.object<SitePolicy>("entry", "a mantis.SitePolicy (Policy.site)");
  const bool w_transposed = c.boolean("w_transposed");
  const double divisor = c.real("divisor");
  const uint64_t stream = c.u64("stream");
  const int64_t M = x.shape(0), K = x.shape(1);
  const int64_t N = w_transposed ? w.shape(0) : w.shape(1);
  if ((w_transposed ? w.shape(1) : w.shape(0)) != K)
    throw InputError(fmt::format("x is {} and w is {} ({}): inner dimensions differ", shape_str(x), shape_str(w),
                                 w_transposed ? "[out, in]" : "[in, out]"));
  std::optional<py::array> bias;
  if (!c.none("bias")) {
    bias = c.f32_array("bias", 1);
    if (bias->shape(0) != N) c.fail("bias", fmt::format("has shape {}; expected ({},)", shape_str(*bias), N));
  }
  if (!(divisor > 0)) c.fail("divisor", fmt::format("= {} must be positive", divisor));
  const SitePlan plan = plan_site(entry);
  py::array_t<float> out({py::ssize_t(M), py::ssize_t(N)});
  const float* b = bias ? static_cast<const float*>(bias->data()) : nullptr;
  {
    py::gil_scoped_release nogil;
    const Eigen::Map<const Matrix<float>> A(static_cast<const float*>(x.data()), M, K);
    const Eigen::Map<const Matrix<float>> B(static_cast<const float*>(w.data()), w.shape(0), w.shape(1));
    Eigen::Map<Matrix<float>> C(out.mutable_data(), M, N);
    site_gemm<float>(plan, A, B, w_transposed, C, stream, float(divisor), b);
  }
  return out;
}

// eval: the same study as `mantis eval` (exp/eval.h); results and manifest as JSON text.
py::object py_eval(const Call& c) {
  EvalOptions o;
  o.model = model_path(c, "model");
  o.policy = c.text("policy");
  o.data = c.text("data");
  o.seqs = c.integer<int>("seqs", 1, kEvalMaxSeqs);
  o.ctx = c.integer<int>("ctx", 0, kEvalMaxCtx);
  o.tokenizer = c.text("tokenizer");
  o.out = c.none("out") ? "" : c.path("out");
  o.progress = c.boolean("progress") ? ProgressMode::automatic : ProgressMode::quiet;
  EvalResult r;
  {
    py::gil_scoped_release nogil;
    r = run_eval(o);
  }
  return py::make_tuple(r.report, r.results.dump(), r.manifest.dump());
}

std::string format_repr(const Format& f) {
  return fmt::format("mantis.Format('{}': μ={}, emin={}, emax={}, subnormals={}, specials={}, overflow={})", f.name,
                     f.mu, f.emin, f.emax, f.subnormals ? "on" : "off", to_string(f.specials), to_string(f.overflow));
}

// The converters by name, for the Python-level functions of __init__.py and torch.py (their own
// arguments go through this layer too): _mantis.convert(call, parameter, kind, value).
const std::map<std::string, std::function<py::object(const Call&, const char*)>>& kinds() {
  static const std::map<std::string, std::function<py::object(const Call&, const char*)>> k = {
      {"bool", [](const Call& c, const char* p) { return py::object(py::bool_(c.boolean(p))); }},
      {"u64", [](const Call& c, const char* p) { return py::object(py::int_(c.u64(p))); }},
      {"layer", [](const Call& c, const char* p) { return py::object(py::int_(c.integer<int>(p, -1, kStreamMaxLayer))); }},
      {"slot", [](const Call& c, const char* p) { return py::object(py::int_(c.integer<int64_t>(p, 0, kStreamMaxSlot))); }},
      {"real", [](const Call& c, const char* p) { return py::object(py::float_(c.real(p))); }},
      {"site", [](const Call& c, const char* p) {
         c.site(p);
         return py::object(py::str(c.text(p)));
       }},
  };
  return k;
}

}  // namespace

PYBIND11_MODULE(_mantis, m) {
  m.doc() = "mantis native calls (use the `mantis` package, which wraps these)";
  py::options options;
  options.disable_function_signatures();  // signature_doc writes them
  static py::exception<InputError> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(error.ptr(), e.what());  // one line of valid UTF-8 (InputError escapes it)
    }
  });
  m.attr("version") = MANTIS_VERSION;
  m.attr("have_openmp") = bool(MANTIS_HAVE_OPENMP);

  def(m, "set_threads", {{"n"}}, "The number of threads the calls use (1..4096).", [](const Call& c) {
    set_num_threads(c.integer<int>("n", 1, kMaxThreads));
    return py::none();
  });
  def(m, "threads", {}, "The number of threads the calls use.", [](const Call&) { return py::int_(num_threads()); });
  def(m, "named_formats", {}, "", [](const Call&) { return py::cast(named_formats()); });
  def(m, "format_aliases", {}, "", [](const Call&) { return py::cast(format_aliases()); });
  def(m, "family_help", {}, "", [](const Call&) { return py::str(family_help()); });
  def(m, "rounding_names", {}, "", [](const Call&) { return py::cast(rounding_names()); });
  def(m, "scheme_presets", {}, "", [](const Call&) { return py::cast(scheme_presets()); });
  def(m, "site_names", {}, "", [](const Call&) { return py::str(site_names()); });
  def(m, "one_line", {{"text"}}, "text as one line of valid UTF-8 (control characters escaped)",
      [](const Call& c) { return py::str(escape_control(c.text("text"))); });
  def(m, "shown", {{"value"}}, "a value's type and short repr, one line, for a message",
      [](const Call& c) { return py::str(escape_control(shown(c["value"]))); });
  // Not through def(): the error is the named call's, not convert's.
  m.def(
      "convert",
      [](const std::string& call, const std::string& param, const std::string& kind, py::handle value) {
        const auto it = kinds().find(kind);
        if (it == kinds().end()) throw std::logic_error("convert: unknown kind " + kind);
        const Params one{{param.c_str()}};
        const auto args = py::reinterpret_steal<py::args>(py::make_tuple(value).release());
        return run(call, [&] { return it->second(Call(call.c_str(), one, args, py::kwargs()), param.c_str()); });
      },
      "convert(call, parameter, kind, value): value converted as the native calls convert an argument of that kind "
      "(bool, u64, layer, slot, real, text, site), or mantis.Error naming call and parameter");

  py::class_<Format> format(m, "Format");
  constructor<Format>(format, "Format",
                      {{"name", py::none()}, {"toml", py::none(), true}, {"source", py::str("<string>"), true}},
                      "A format by name, family or .toml path, or from TOML text (toml=).", [](const Call& c) {
                        if (!c.none("toml")) {
                          if (!c.none("name")) throw InputError("give a name or toml=, not both");
                          const std::string t = c.text("toml"), s = c.text("source");
                          return format_from_toml(t, s);
                        }
                        return c.format("name");
                      });
  format.def_readonly("name", &Format::name)
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

  py::class_<Scheme> scheme(m, "Scheme",
                            "A scaled format: a preset name or a .toml path (Scheme.from_toml: TOML text).");
  constructor<Scheme>(scheme, "Scheme", {{"name"}}, "A preset by name, or a .toml path.",
                      [](const Call& c) { return c.scheme("name"); });
  scheme.def_readonly("name", &Scheme::name)
      .def_readonly("element", &Scheme::element)
      .def_readonly("scale", &Scheme::scale)
      .def_property_readonly("block", [](const Scheme& s) { return py::make_tuple(s.block_rows, s.block_cols); })
      .def_property_readonly("rule", [](const Scheme& s) { return std::string(to_string(s.rule)); })
      .def_readonly("two_level", &Scheme::two_level)
      .def("__repr__", [](const Scheme& s) { return fmt::format("mantis.Scheme('{}')", s.name); });
  static_method(scheme, "from_toml", "Scheme.from_toml", {{"text"}, {"source", py::str("<string>")}},
                "A scheme from TOML text (the keys of a scheme .toml).", [](const Call& c) {
                  const std::string t = c.text("text"), s = c.text("source");
                  return py::cast(scheme_from_toml(t, s));
                });

  py::class_<GemmSpec> spec(m, "GemmSpec");
  constructor<GemmSpec>(
      spec, "GemmSpec", gemm_spec_params(),
      "A GEMM's accumulation: accumulator format and rounding, accumulation order (strict, unfused, "
      "blocked, promoted, tensor_core) and its block / alignment, the operands' input format, and the "
      "random words (sr_bits 1..32, seed and stream 0..2^64-1); validated when made.",
      gemm_spec);
  spec.def_readonly("acc", &GemmSpec::acc)
      .def_property_readonly("mode", [](const GemmSpec& s) { return std::string(to_string(s.acc_mode)); })
      .def_property_readonly("accumulation", [](const GemmSpec& s) { return std::string(to_string(s.accumulation)); })
      .def_readonly("block", &GemmSpec::block)
      .def_readonly("align_bits", &GemmSpec::align_bits)
      .def_property_readonly("tensor_core", [](const GemmSpec& s) -> py::object {
        return s.tensor_core.empty() ? py::none() : py::object(py::str(s.tensor_core));
      })
      .def_readonly("promote_every", &GemmSpec::promote_every)
      .def_readonly("split_k", &GemmSpec::split_k)
      .def_readonly("input", &GemmSpec::input)
      .def_readonly("sr_bits", &GemmSpec::sr_bits)
      .def_readonly("sr_packed", &GemmSpec::sr_packed)
      .def_readonly("seed", &GemmSpec::seed)
      .def_readonly("stream", &GemmSpec::stream)
      .def("__repr__", [](const GemmSpec& s) {
        return fmt::format("mantis.GemmSpec(acc='{}', mode='{}', accumulation='{}', block={}{})", s.acc.name,
                           to_string(s.acc_mode), to_string(s.accumulation), s.block,
                           s.input ? ", input='" + s.input->name + "'" : "");
      });

  const auto zero = py::int_(0);
  def(m, "round",
      {{"x"}, {"fmt"}, {"mode", py::str("rne")}, {"seed", zero}, {"stream", zero}, {"index0", zero},
       {"out", py::none()}, {"sr_bits", py::int_(32)}, {"sr_packed", py::bool_(false)}},
      "x rounded to fmt (a float32 / float64 array of any shape). The result has x's shape and dtype, float64 "
      "where the format does not fit binary32, or is written into out: x itself (the same bytes, dtype and "
      "shape) or memory x does not share — any other overlap is refused. Element i of the flattened (C-order) "
      "array uses the Philox word (seed, stream, (index0 + i) mod 2^64); sr_packed=True: 2 (sr_bits <= 16) or "
      "4 (<= 8) elements share one word, element i taking slot i mod P of word i / P from the top (Blackwell's "
      "cvt.rs).",
      py_round);
  def(m, "round_reference",
      {{"x"}, {"fmt"}, {"mode", py::str("rne")}, {"seed", zero}, {"stream", zero}, {"index0", zero},
       {"sr_bits", py::int_(32)}, {"sr_packed", py::bool_(false)}},
      "The MPFR oracle's rounding (a float64 array of x's shape): what round is tested against.", py_round_reference);
  def(m, "quantize",
      {{"x"}, {"scheme"}, {"mode", py::str("rne")}, {"seed", zero}, {"stream", zero}, {"out", py::none()},
       {"sr_bits", py::int_(32)}, {"stats", py::bool_(false)}},
      "The dequantised values of x under a scaled format (a matrix whose columns are its last axis, as `mantis "
      "quantize`; the result has x's shape and dtype, or goes into out, as round's); element (i, j) rounds with "
      "word (seed, stream, i·cols + j). stats=True also returns the scales and block counts (what `mantis "
      "quantize --json` prints).",
      py_quantize);
  def(m, "gemm",
      {{"a"}, {"b"}, {"spec", py::none()}, {"c", py::none()}, {"out_dtype", py::str("float64")},
       {"reference", py::bool_(false)}},
      "D = C + A·B with a rounded accumulator (core/gemm.h): A [M, K], B [K, N] float32, C [M, N] float32 the "
      "addend (rounded to nearest-even into the accumulator format; default zeros). spec is a GemmSpec, an "
      "accumulator format, or keyword arguments of GemmSpec (acc=, mode=, accumulation=, block=, align_bits=, "
      "tensor_core=, promote_every=, split_k=, input=, input_mode=, sr_bits=, sr_packed=, seed=, stream=). "
      "accumulation='tensor_core' with tensor_core='h100' (v100, a100, a2, ada, l40s, h100, h200, b200; ':mma' / "
      "':wgmma' to choose a datapath) is that GPU's matrix unit bit for bit (acc 'fp32' or 'fp16', input fp16, "
      "bf16, tf32, e4m3 or e5m2); promote_every=128 adds each run of 128 products into a binary32 register "
      "(DeepGEMM), split_k=S sums S parts of K in binary32 (core/matrix_unit.h MuKernel). "
      "float64 results hold the accumulator's values exactly; reference=True computes them with the MPFR oracle.",
      py_gemm, true);
  def(m, "dot", {{"x"}, {"y"}, {"spec", py::none()}, {"reference", py::bool_(false)}},
      "x·y (float32 vectors) with a rounded accumulator, as `mantis dot`; spec as gemm's.", py_dot, true);

  py::class_<SitePolicy>(m, "SitePolicy", "A policy's entry for one site (Policy.site): what site_gemm runs.")
      .def(no_init<SitePolicy>("SitePolicy", "Policy.site gives one"))
      .def_property_readonly("native", &SitePolicy::is_native)
      .def("__repr__", [](const SitePolicy& p) {
        Policy one;
        one.all[0] = p;  // describe() names a site; this is only a readable summary of the entry
        std::string d = describe(one);
        while (!d.empty() && d.back() == '\n') d.pop_back();
        const auto colon = d.find(": ");
        return "mantis.SitePolicy(" + (p.is_native() ? std::string("native") : d.substr(colon + 2)) + ")";
      });

  py::class_<Policy> policy(m, "Policy");
  policy.def(no_init<Policy>("_mantis.Policy", "mantis.Policy makes one"))
      .def_property_readonly("lamp", [](const Policy& p) { return p.lamp.has_value(); });
  static_method(policy, "from_spec", "Policy", {{"spec"}}, "", [](const Call& c) {
    return py::cast(policy_from_spec(c.text("spec")));
  });
  static_method(policy, "from_toml", "Policy", {{"text"}, {"source", py::str("<string>")}}, "", [](const Call& c) {
    const std::string t = c.text("text"), s = c.text("source");
    return py::cast(policy_from_toml(t, s));
  });
  method<Policy>(policy, "site", "Policy.site", {{"name"}, {"layer", py::int_(-1)}},
                 "The entry a site uses at a layer (-1: the every-layer entry), for site_gemm.",
                 [](const Policy& p, const Call& c) {
                   const Site s = c.site("name");
                   return py::cast(p.at(s, c.integer<int>("layer", -1, kStreamMaxLayer)));
                 });
  method<Policy>(policy, "describe", "Policy.describe", {}, "", [](const Policy& p, const Call&) {
    std::string d = describe(p);
    while (!d.empty() && d.back() == '\n') d.pop_back();
    return py::str(d);
  });
  def(m, "site_stream", {{"site"}, {"layer"}, {"slot", zero}},
      "The random stream of a site call in mantis's forward (nn/streams.h).", [](const Call& c) {
        const Site s = c.site("site");
        return py::int_(stream_of(s, c.integer<int>("layer", -1, kStreamMaxLayer), c.integer<int64_t>("slot", 0, kStreamMaxSlot)));
      });

  py::class_<PyModel> model(m, "Model", "A loaded checkpoint (load_model).");
  model.def(no_init<PyModel>("Model", "mantis.load_model(path) loads one"))
      .def_property_readonly(
          "path", [](const PyModel& m) { return py::module_::import("os").attr("fsdecode")(py::bytes(m.path)); })
      .def_property_readonly("arch",
                             [](const PyModel& m) { return m.model->cfg.arch == Arch::gpt2 ? "gpt2" : "llama"; })
      .def_property_readonly("vocab", [](const PyModel& m) { return m.model->cfg.vocab; })
      .def_property_readonly("ctx", [](const PyModel& m) { return m.model->cfg.ctx; })
      .def_property_readonly("layers", [](const PyModel& m) { return m.model->cfg.layers; })
      .def_property_readonly("heads", [](const PyModel& m) { return m.model->cfg.heads; })
      .def_property_readonly("kv_heads", [](const PyModel& m) { return m.model->cfg.kv_heads; })
      .def_property_readonly("dim", [](const PyModel& m) { return m.model->cfg.dim; })
      .def_property_readonly("hidden", [](const PyModel& m) { return m.model->cfg.hidden; })
      .def_property_readonly("config_json", [](const PyModel& m) { return model_config_json(m.model->cfg); });
  method<PyModel>(model, "sha256", "Model.sha256", {}, "The model's SHA-256 (as its manifest records it).",
                  [](const PyModel& m, const Call&) { return py::str(model_sha256(*m.model)); });
  method<PyModel>(model, "parameter_names", "Model.parameter_names", {}, "The parameters' names.",
                  [](const PyModel& m, const Call&) {
                    std::vector<std::string> v;
                    for (const auto& [k, _] : m.model->params) v.push_back(k);
                    return py::cast(v);
                  });
  method<PyModel>(model, "parameter", "Model.parameter", {{"name"}}, "A parameter's values (a float32 copy).",
                  [](const PyModel& m, const Call& c) {
                    const std::string name = c.text("name");
                    const auto it = m.model->params.find(name);
                    if (it == m.model->params.end())
                      c.fail("name", fmt::format("'{}': the model has no such parameter", clip(name)));
                    std::vector<py::ssize_t> shape(it->second.shape.begin(), it->second.shape.end());
                    py::array_t<float> a(shape);
                    std::copy(it->second.data.begin(), it->second.data.end(), a.mutable_data());
                    return py::object(std::move(a));
                  });
  def(m, "load_model", {{"path"}}, "A checkpoint (a mantis or Hugging Face directory, llm.c or llama2.c file).",
      [](const Call& c) { return py::cast(load(c.path("path"))); });
  def(m, "logits", {{"model"}, {"tokens"}, {"policy"}}, "", py_logits);
  def(m, "site_gemm",
      {{"x"}, {"w"}, {"entry"}, {"w_transposed", py::bool_(true)}, {"bias", py::none()}, {"divisor", py::float_(1.0)},
       {"stream", zero}},
      "One site GEMM of a policy entry (nn/linear.h): round_output((x·wᵀ)/divisor + bias) with the entry's "
      "accumulation and operand rounding; x [M, K] and w [out, in] float32 (w_transposed=False: [in, out]).",
      py_site_gemm);
  def(m, "eval",
      {{"model"}, {"policy"}, {"data"}, {"seqs"}, {"ctx"}, {"tokenizer"}, {"out"}, {"progress"}}, "", py_eval);
}
