"""mantis — exact emulation of custom floating-point formats, from Python.

The same library the `mantis` command line runs, called in process on numpy arrays (no copies:
results are written into a new array or into ``out=``, which may be x itself — the same bytes with
the same dtype and shape — or memory x does not share; any other overlap is refused). Every result is
bit-identical to the CLI's (tests/test_python.py checks it). Bad input raises ``mantis.Error``
(a ValueError) with the CLI's one-line message. Long calls release the GIL.

    import numpy as np, mantis
    x = np.random.default_rng(0).standard_normal(10**6).astype(np.float32)
    y = mantis.round(x, "bf16")                       # a new float32 array
    mantis.round(x, "ps4", mode="sr", seed=1, out=x)  # in place; element i uses word (1, 0, i)

Random words: element i of the flattened (C-order) array uses Philox (seed, stream, index0 + i),
so a tensor rounded in slices gives the same bits as rounded whole.
"""
import json as _json
import os as _os
import tempfile as _tempfile

import numpy as _np

from . import _mantis
from ._mantis import Error, GemmSpec, Model, Scheme, SitePolicy

__all__ = ["Error", "Format", "Scheme", "GemmSpec", "Policy", "Model", "SitePolicy", "formats", "schemes",
           "roundings", "sites", "round", "round_reference", "quantize", "gemm", "dot", "load_model", "logits",
           "site_gemm", "eval", "set_threads", "threads", "version"]

Error.__module__ = __name__
version = _mantis.version
set_threads = _mantis.set_threads
threads = _mantis.threads


def formats():
    """The named formats (formats/*.toml and their aliases); the families ps<μ>, e<E>m<M>, … are
    described by ``mantis.Format.__doc__`` and `mantis formats`."""
    return list(_mantis.named_formats()) + [a for a, _ in _mantis.format_aliases()]


def schemes():
    """The scaled-format presets (OCP MX, NVFP4, DeepSeek tiles, INT8)."""
    return list(_mantis.scheme_presets())


def roundings():
    return list(_mantis.rounding_names())


def sites():
    return [s.strip() for s in _mantis.site_names().split(",")]


class Format(_mantis.Format):
    """A format: by name, family or .toml path (``Format("bf16")``, ``Format("ps7")``,
    ``Format("e4m3")``), from TOML text (``Format(toml=...)``), or from the keys of formats/*.toml
    as keyword arguments (``Format(name="my8", mantissa_bits=3, exponent_bits=4, specials="fn",
    overflow="nan")``), validated exactly as a .toml file is. `mantis formats` lists the families."""

    def __init__(self, name=None, *, toml=None, source="<string>", **fields):
        if fields:
            if toml is not None:
                raise Error("format: give TOML text or keyword fields, not both")
            toml, source = _toml({"name": name, **fields} if name is not None else fields), "<keyword arguments>"
        if toml is not None:
            super().__init__(toml=toml, source=source)
        elif isinstance(name, str):
            super().__init__(name)
        else:
            raise Error(f"format: expected a name, a .toml path, toml= or keyword fields, got {type(name).__name__}")


def _format(f):
    if isinstance(f, _mantis.Format):
        return f
    if isinstance(f, str):
        return Format(f)
    raise Error(f"format: expected a name, a .toml path or a mantis.Format, got {type(f).__name__}")


def _scheme(s):
    if isinstance(s, Scheme):
        return s
    if isinstance(s, str):
        return Scheme(s)
    raise Error(f"scheme: expected a preset name, a .toml path or a mantis.Scheme, got {type(s).__name__}")


def _contiguous(x):
    """x as a C-contiguous array of its own shape (np.ascontiguousarray makes a 0-d array 1-d)."""
    a = _np.asarray(x)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _float_array(x, what="x"):
    a = _np.asarray(x)
    if a.dtype not in (_np.float32, _np.float64):
        raise Error(f"{what} has dtype {a.dtype}; expected float32 or float64 (convert explicitly)")
    return _contiguous(a)


def _check_out(out, call):
    """out= is a numpy array (native.cpp's require_out decides everything else, overlap included)."""
    if out is not None and not isinstance(out, _np.ndarray):
        raise Error(f"{call}: out must be a numpy array, got {type(out).__name__}")


def round(x, fmt, mode="rne", seed=0, stream=0, index0=0, out=None, sr_bits=32):
    """x rounded to ``fmt`` (float32 / float64 array; the result has x's dtype, float64 where the
    format does not fit binary32, or is written into ``out``: x itself, or memory x does not share)."""
    a = _float_array(x)
    _check_out(out, "round")
    return _mantis.round(a, _format(fmt), mode, seed, stream, index0, sr_bits, out)


def round_reference(x, fmt, mode="rne", seed=0, stream=0, index0=0, sr_bits=32):
    """The MPFR oracle's rounding (float64 result): what ``round`` is tested against."""
    return _mantis.round_reference(_float_array(x), _format(fmt), mode, seed, stream, index0, sr_bits)


def quantize(x, scheme, mode="rne", seed=0, stream=0, out=None, sr_bits=32, stats=False):
    """The dequantised values of x under a scaled format (a matrix whose columns are its last axis,
    as `mantis quantize`); element (i, j) rounds with word (seed, stream, i·cols + j).
    stats=True also returns the scales and block counts (what `mantis quantize --json` prints)."""
    a = _float_array(x)
    _check_out(out, "quantize")
    y, st = _mantis.quantize(a, _scheme(scheme), mode, seed, stream, sr_bits, out)
    return (y, st) if stats else y


def _spec(spec, kw):
    if spec is None:
        return GemmSpec(**{k: (_format(v) if k in ("acc", "input") and v is not None else v) for k, v in kw.items()})
    if kw:
        raise Error("give either a GemmSpec or keyword arguments, not both")
    if isinstance(spec, (str, _mantis.Format)):
        return GemmSpec(_format(spec))
    return spec


def gemm(a, b, spec=None, out_dtype="float64", reference=False, **kw):
    """C = A·B with a rounded accumulator (core/gemm.h): A [M, K], B [K, N] float32. ``spec`` is a
    GemmSpec, an accumulator format, or keyword arguments of GemmSpec (acc=, mode=, accumulation=,
    block=, align_bits=, input=, input_mode=, sr_bits=, seed=, stream=). float64 results hold the
    accumulator's values exactly; reference=True computes them with the MPFR oracle."""
    return _mantis.gemm(_contiguous(a), _contiguous(b), _spec(spec, kw), out_dtype, reference)


def dot(x, y, spec=None, reference=False, **kw):
    """x·y (float32 vectors) with a rounded accumulator; as `mantis dot`."""
    return _mantis.dot(_contiguous(x), _contiguous(y), _spec(spec, kw), reference)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _json.dumps(v)  # a TOML basic string is a JSON string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(e) for e in v) + "]"
    raise Error(f"policy: cannot write {type(v).__name__} {v!r} as a TOML value")


def _toml(d, prefix=""):
    """A dict as TOML text: scalars and arrays first, then one [table] per nested dict."""
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{_json.dumps(str(k))} = {_toml_value(v)}")
    for k, v in tables:
        name = f"{prefix}.{_json.dumps(str(k))}" if prefix else _json.dumps(str(k))
        lines.append(f"\n[{name}]")
        lines.append(_toml(v, name))
    return "\n".join(lines)


class Policy:
    """A precision policy (the TOML of `mantis eval --policy`): from a spec ("native", "lamp:<μ>",
    a .toml path), TOML text, or a dict in the TOML's own shape
    (``{"site": {"attn.qk": {"accumulation": "strict", "accumulator": "ps4", "output": "ps4"}}}``)."""

    def __init__(self, spec="native"):
        if isinstance(spec, Policy):
            self._p, self.toml, self.spec = spec._p, spec.toml, spec.spec
        elif isinstance(spec, dict):
            self.toml, self.spec = _toml(spec), None
            self._p = _mantis.Policy.from_toml(self.toml, "<dict>")
        elif isinstance(spec, str) and ("\n" in spec or "=" in spec):
            self.toml, self.spec = spec, None
            self._p = _mantis.Policy.from_toml(spec, "<string>")
        elif isinstance(spec, str):
            self.toml, self.spec = None, spec
            self._p = _mantis.Policy.from_spec(spec)
        else:
            raise Error(f"policy: expected a spec, TOML text or a dict, got {type(spec).__name__}")

    def site(self, name, layer=-1):
        """The entry a site uses at a layer (-1: the every-layer entry), for site_gemm."""
        return self._p.site(name, layer)

    def __str__(self):
        return self._p.describe()

    def __repr__(self):
        return f"mantis.Policy({self._p.describe()!r})"


def load_model(path):
    """A checkpoint (a mantis or Hugging Face directory, llm.c or llama2.c file)."""
    return _mantis.load_model(_os.fspath(path))


def logits(model, tokens, policy="native"):
    """The float32 logits [T, vocab] of one token sequence under a policy (`mantis logits`)."""
    if not isinstance(model, Model):
        model = load_model(model)
    t = _np.asarray(tokens)
    if t.dtype.kind not in "iu":
        raise Error(f"tokens has dtype {t.dtype}; expected integers")
    return _mantis.logits(model, t, Policy(policy)._p)


def site_gemm(x, w, entry, w_transposed=True, bias=None, divisor=1.0, stream=0):
    """One site GEMM of a policy entry (nn/linear.h): round_output((x·wᵀ)/divisor + bias) with the
    entry's accumulation and operand rounding; w [out, in] (w_transposed=False: [in, out])."""
    c = _contiguous
    return _mantis.site_gemm(c(x), c(w), entry, w_transposed, None if bias is None else c(bias), divisor, stream)


def eval(model, policy="native", data="validation", seqs=16, ctx=0, tokenizer="", out=None, progress=False):
    """`mantis eval`: FP32 and the policy on the same windows of real text. Returns a dict with
    "results" (results.json), "manifest" and "report" (the table the CLI prints); out= also writes
    the result set there, as the CLI does."""
    model = model.path if isinstance(model, Model) else _os.fspath(model)
    p = policy if isinstance(policy, Policy) else Policy(policy)
    tmp = None
    try:
        if p.spec is not None:
            spec = p.spec
        else:  # TOML text or a dict: eval reads a policy file, as the CLI does
            tmp = _tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
            tmp.write(p.toml)
            tmp.close()
            spec = tmp.name
        report, results, manifest = _mantis.eval(model, spec, data, seqs, ctx, tokenizer,
                                                 "" if out is None else _os.fspath(out), progress)
    finally:
        if tmp is not None:
            _os.unlink(tmp.name)
    return {"results": _json.loads(results), "manifest": _json.loads(manifest), "report": report}
