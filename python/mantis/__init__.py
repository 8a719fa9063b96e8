"""mantis — exact emulation of custom floating-point formats, from Python.

The same library the `mantis` command line runs, called in process on numpy arrays (no copies:
results are written into a new array or into ``out=``, which may be x itself — the same bytes with
the same dtype and shape — or memory x does not share; any other overlap is refused). Every result is
bit-identical to the CLI's (tests/test_python.py checks it). Long calls release the GIL.

Bad input raises ``mantis.Error`` (a ValueError): one line that starts with the call's name —
and, where the library refused a value, the CLI's message after it. Every argument of every call
goes through one conversion layer (native.cpp): an unknown keyword or a missing argument is an
error; integers are ints or numpy integers (not bools or floats) in a stated range, never wrapped
or truncated (seed, stream, index0: 0..2^64-1; sr_bits: 1..32); flags are True or False; names are
strings; arrays keep their shape (0-d included) and must already have the dtype the call needs.

    import numpy as np, mantis
    x = np.random.default_rng(0).standard_normal(10**6).astype(np.float32)
    y = mantis.round(x, "bf16")                       # a new float32 array
    mantis.round(x, "ps4", mode="sr", seed=1, out=x)  # in place; element i uses word (1, 0, i)

Random words: element i of the flattened (C-order) array uses Philox (seed, stream, index0 + i),
so a tensor rounded in slices gives the same bits as rounded whole.
"""
import functools as _functools
import inspect as _inspect
import json as _json
import os as _os
import tempfile as _tempfile

from . import _mantis
from ._mantis import Error, GemmSpec, Model, Scheme, SitePolicy, dot, gemm, load_model, quantize, round, \
    round_reference, set_threads, site_gemm, threads

__all__ = ["Error", "Format", "Scheme", "GemmSpec", "Policy", "Model", "SitePolicy", "formats", "schemes",
           "roundings", "sites", "round", "round_reference", "quantize", "gemm", "dot", "load_model", "logits",
           "site_gemm", "eval", "set_threads", "threads", "version"]

Error.__module__ = __name__
version = _mantis.version


def _api(**kinds):
    """The functions written in Python (here and in mantis.torch) take their arguments as the
    native calls do: a wrong call (an unknown keyword, a missing or surplus argument) is one line of
    mantis.Error naming the call, and each parameter named in ``kinds`` is converted by native.cpp's
    conversion layer (``_mantis.convert``: the kinds bool, u64, layer, slot, real, site). An
    error of a call made inside gets this call's name in front ("logits: Policy: ...")."""

    def wrap(f):
        sig = _inspect.signature(f)
        name = f.__qualname__.split(".<locals>.")[-1].removesuffix(".__init__")

        @_functools.wraps(f)
        def call(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise Error(f"{name}: {_mantis.one_line(str(e))}") from None
            for p, kind in kinds.items():
                if p in bound.arguments:  # defaults are valid
                    bound.arguments[p] = _mantis.convert(name, p, kind, bound.arguments[p])
            try:
                return f(*bound.args, **bound.kwargs)
            except Error as e:
                if str(e).startswith(name + ": "):
                    raise
                raise Error(f"{name}: {e}") from None

        return call

    return wrap


def _shown(v):
    """A value the caller gave, in a message: its type and a short repr, one line."""
    return _mantis.shown(v)


@_api()
def formats():
    """The named formats (formats/*.toml and their aliases); the families ps<μ>, e<E>m<M>, … are
    described by ``mantis.Format.__doc__`` and `mantis formats`."""
    return list(_mantis.named_formats()) + [a for a, _ in _mantis.format_aliases()]


@_api()
def schemes():
    """The scaled-format presets (OCP MX, NVFP4, DeepSeek tiles, INT8)."""
    return list(_mantis.scheme_presets())


@_api()
def roundings():
    """The rounding modes (rne, rna, rz, ru, rd, ro, sr, sre)."""
    return list(_mantis.rounding_names())


@_api()
def sites():
    """The sites a policy names (attn.qkv, attn.qk, …)."""
    return [s.strip() for s in _mantis.site_names().split(",")]


class Format(_mantis.Format):
    """A format: by name, family or .toml path (``Format("bf16")``, ``Format("ps7")``,
    ``Format("e4m3")``), from TOML text (``Format(toml=...)``), or from the keys of formats/*.toml
    as keyword arguments (``Format(name="my8", mantissa_bits=3, exponent_bits=4, specials="fn",
    overflow="nan")``), validated exactly as a .toml file is. `mantis formats` lists the families."""

    @_api()
    def __init__(self, name=None, *, toml=None, source="<string>", **fields):
        if fields:
            if toml is not None:
                raise Error("Format: give TOML text or keyword fields, not both")
            toml, source = _toml({"name": name, **fields} if name is not None else fields, "Format"), "<keyword arguments>"
            name = None
        super().__init__(name, toml=toml, source=source)


def _toml_value(v, call):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _json.dumps(v)  # a TOML basic string is a JSON string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(e, call) for e in v) + "]"
    raise Error(f"{call}: cannot write {_shown(v)} as a TOML value")


def _toml(d, call, prefix=""):
    """A dict as TOML text: scalars and arrays first, then one [table] per nested dict."""
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{_json.dumps(str(k))} = {_toml_value(v, call)}")
    for k, v in tables:
        name = f"{prefix}.{_json.dumps(str(k))}" if prefix else _json.dumps(str(k))
        lines.append(f"\n[{name}]")
        lines.append(_toml(v, call, name))
    return "\n".join(lines)


class Policy:
    """A precision policy (the TOML of `mantis eval --policy`): from a spec ("native", "lamp:<μ>",
    a .toml path), TOML text, or a dict in the TOML's own shape
    (``{"site": {"attn.qk": {"accumulation": "strict", "accumulator": "ps4", "output": "ps4"}}}``)."""

    @_api()
    def __init__(self, spec="native"):
        if isinstance(spec, _os.PathLike):
            spec = _os.fspath(spec)
        if isinstance(spec, Policy):
            self._p, self.toml, self.spec = spec._p, spec.toml, spec.spec
        elif isinstance(spec, dict):
            self.toml, self.spec = _toml(spec, "Policy"), None
            self._p = _mantis.Policy.from_toml(self.toml, "<dict>")
        elif isinstance(spec, str) and ("\n" in spec or "=" in spec):
            self.toml, self.spec = spec, None
            self._p = _mantis.Policy.from_toml(spec, "<string>")
        elif isinstance(spec, str):
            self.toml, self.spec = None, spec
            self._p = _mantis.Policy.from_spec(spec)
        else:
            raise Error(f"Policy: spec must be a spec or path, TOML text, a dict or a Policy, got {_shown(spec)}")

    @_api()
    def site(self, name, layer=-1):
        """The entry a site uses at a layer (-1: the every-layer entry), for site_gemm."""
        return self._p.site(name, layer)

    def __str__(self):
        return self._p.describe()

    def __repr__(self):
        return f"mantis.Policy({self._p.describe()!r})"


@_api()
def logits(model, tokens, policy="native"):
    """The float32 logits [T, vocab] of one token sequence (1-D integers) under a policy (`mantis
    logits`); model: a Model or a checkpoint path."""
    return _mantis.logits(model, tokens, Policy(policy)._p)


@_api()
def eval(model, policy="native", data="validation", seqs=16, ctx=0, tokenizer="", out=None, progress=False):
    """`mantis eval`: FP32 and the policy on the same windows of real text. Returns a dict with
    "results" (results.json), "manifest" and "report" (the table the CLI prints); out= also writes
    the result set there, as the CLI does. seqs: 1..1000000 windows; ctx: 1..2^24 tokens per
    window (0: the model's context)."""
    p = Policy(policy)
    tmp = None
    try:
        if p.spec is not None:
            spec = p.spec
        else:  # TOML text or a dict: eval reads a policy file, as the CLI does
            tmp = _tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
            tmp.write(p.toml)
            tmp.close()
            spec = tmp.name
        report, results, manifest = _mantis.eval(model, spec, data, seqs, ctx, tokenizer, out, progress)
    finally:
        if tmp is not None:
            _os.unlink(tmp.name)
    return {"results": _json.loads(results), "manifest": _json.loads(manifest), "report": report}
