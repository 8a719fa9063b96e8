#!/usr/bin/python3
"""Property-based tests of the Python module (Hypothesis; issue 32).

Arrays of every dtype (float16/32/64, big-endian, long double, ints, bool, complex, object, str),
every shape (0-d, empty, up to 3-d; a few of 2^16+ elements, where the kernels split over threads),
every layout (reversed, strided, transposed, broadcast, misaligned, read-only, Fortran order, numpy
scalars, lists), out= of every kind (fresh, x itself, a view of x, another dtype's view of x's
bytes at any offset, read-only, non-contiguous, wrong shape or dtype, not an array), and integer
arguments at and past every limit (-1, 0, 2^31-1, 2^31, 2^32, 2^63, 2^64-1, 2^64, bools, floats,
None, strings, numpy integers). The property of each call: it returns exactly the bits the CLI
gives for the same input (the MPFR reference path where the CLI cannot take it: index0 > 0, GEMM
options `mantis dot` lacks), or it raises one line of mantis.Error starting with the call's name
and writes nothing — never a crash, another exception, a multi-line message, a result the CLI
refuses, or a refusal of what the CLI and the module's documented rules accept.

Deterministic: derandomize=True, no example database, a fixed number of examples per property.
The properties run in a child process (this file with --child): a crash there is reported here as
a failure that names the example being run (the child writes each one to a log before running it).

Run by Meson with PYTHONPATH=<build>/python and MANTIS_BIN; exit 77 (SKIP) without numpy or
hypothesis. At the end it prints how each call's examples ended (equal to the CLI, refused, ...);
MANTIS_PROPS_WHY=1 also counts the refusals by the argument named first."""
import collections
import json
import os
import subprocess
import sys
import tempfile

if "--child" not in sys.argv:  # the parent: runs the child, reports a crash with its example
    with tempfile.TemporaryDirectory(prefix="mantis-props-") as tmp:
        log = os.path.join(tmp, "example.txt")
        # HYPOTHESIS_STORAGE_DIRECTORY: Hypothesis keeps nothing (no database), but would create
        # .hypothesis/ in the working directory
        env = dict(os.environ, MANTIS_PROPS_LOG=log, MANTIS_PROPS_TMP=tmp,
                   HYPOTHESIS_STORAGE_DIRECTORY=os.path.join(tmp, "hypothesis"))
        r = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--child", *sys.argv[1:]], env=env)
        if r.returncode < 0:
            example = open(log).read() if os.path.exists(log) else "(none recorded)"
            print(f"FAIL: the properties' process died by signal {-r.returncode} while running:\n{example}")
            sys.exit(1)
        sys.exit(r.returncode)

import unittest  # noqa: E402 (the child from here on)

try:
    import numpy as np
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st
    import hypothesis.extra.numpy as hnp
except ImportError as e:
    print(f"{e.name} missing: SKIP")
    sys.exit(77)

import mantis  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_python_args import BAD, surface  # noqa: E402  (the public callables with valid arguments)

ROOT = os.path.abspath(os.environ.get("MANTIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..")))
BIN = os.environ["MANTIS_BIN"]
TMP = os.environ["MANTIS_PROPS_TMP"]
LOG = os.environ["MANTIS_PROPS_LOG"]


def fixed(n):
    """Hypothesis settings: deterministic, no database, n examples, no time limits."""
    return settings(derandomize=True, database=None, max_examples=n, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


def record(call, /, **args):
    """The example about to run, for the parent to report should this process die."""
    with open(LOG, "w") as fh:
        fh.write(f"{call}({', '.join(f'{k}={v!r:.300}' for k, v in args.items())})\n")


# How each property's examples ended (printed at the end: a property whose examples were all
# refused would test little).
OUTCOMES = collections.defaultdict(collections.Counter)


def cli(*args, stdin=None):
    return subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True, cwd=ROOT)


# --- values ---------------------------------------------------------------------------------------

OMIT = object()  # the argument is not passed (its default applies)
U64_MAX = 2 ** 64 - 1
LIMITS = [-1, 0, 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 63, U64_MAX, 2 ** 64, -2 ** 63 - 1, True, False, 1.0, 1.5,
          float("nan"), None, "1", np.int64(-1), np.uint64(U64_MAX), np.int32(7), np.float64(2.0)]


def mostly(usual, other, tenths=8):
    """usual in `tenths` of the examples, other in the rest: most examples should get past the
    argument checks to the bits, and some should not."""
    return st.integers(0, 9).flatmap(lambda i: usual if i < tenths else other)


def integers(valid):
    """An integer argument: mostly omitted or in the valid range (its ends included), else a limit,
    a value of another type or any integer."""
    lo, hi = valid
    usual = st.one_of(st.just(OMIT), st.integers(lo, hi), st.sampled_from([lo, hi]))
    return mostly(usual, st.one_of(st.sampled_from(LIMITS), st.integers(-2 ** 70, 2 ** 70)), 9)


def names(valid, invalid):
    """A name argument: mostly one of valid, else an unknown one or a value of another type."""
    return mostly(st.sampled_from(valid), st.sampled_from(invalid), 9)


def is_int(v, lo, hi):
    """What the module accepts for an integer argument: an int or numpy integer (not a bool) in lo..hi."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and lo <= int(v) <= hi


def is_text(v):
    """What the module accepts for a name: a str without NUL that is valid Unicode."""
    try:
        return isinstance(v, str) and "\0" not in v and bool(v.encode("utf-8") or True)
    except UnicodeEncodeError:  # a lone surrogate
        return False


FORMATS = ["bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2", "e4m3fnuz", "ps3", "ps10", "ps23", "fp64", "e2m5", "e11m52",
           "int8", "uint4", "int4tc", "p3109_p3", "fp4_e2m1", "fp6_e3m2", "e8m0", "bfloat16", "BF16"]
NOT_FORMATS = ["nope", "", "ps0", "ps24", "e1m1", "bf16\n", None, 3, b"bf16"]
MODES = ["rne", "rna", "rz", "ru", "rd", "ro", "sr", "sre", "SR", OMIT]
NOT_MODES = ["nearest", "", None, 1]
SCHEMES = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp4", "mxint8", "nvfp4", "deepseek_act", "deepseek_weight",
           "int8_channel", "int8_tensor", "uint8_channel_zp", "uint8_tensor_zp"]
NOT_SCHEMES = ["nope", "", None, 3]
FLOATS = [np.dtype(np.float32), np.dtype(np.float64)]
OTHER_DTYPES = [np.dtype(t) for t in (np.float16, ">f4", ">f8", np.longdouble, np.int8, np.int64, np.uint64, np.bool_,
                                      np.complex64, np.complex128, object, "<U3")]
TIES = [1 + 2 ** -8, 1 + 2 ** -4, 1.5, -2.5, 2 ** -149, 2 ** -126, 3 * 2 ** -150, 65504.0, 448.0, 57344.0, 2.0 ** 128,
        -0.0, float("inf"), float("nan")]


def cast(dtype, v):
    """v in dtype (inf past its range, without numpy's overflow warning)."""
    with np.errstate(over="ignore"):
        return dtype.type(v)


@st.composite
def values(draw):
    """A C-ordered numpy array: any dtype (mostly float32 / float64), any small shape, values of
    every kind (specials, subnormals, ties); now and then 2^16+ elements from a seeded generator."""
    dtype = draw(mostly(st.sampled_from(FLOATS), st.sampled_from(OTHER_DTYPES), 9))
    if dtype in FLOATS and draw(st.integers(0, 19)) == 0:
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32)))
        n = draw(st.integers(1 << 16, (1 << 16) + 300))
        with np.errstate(over="ignore"):
            return (rng.standard_normal(n) * np.exp2(rng.integers(-150, 130, n))).astype(dtype)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    if dtype.kind == "f":
        width = 64 if dtype.itemsize >= 8 else dtype.itemsize * 8
        elements = st.one_of(st.floats(width=width), st.sampled_from(TIES).map(lambda v: cast(dtype, v)))
        return draw(hnp.arrays(dtype, shape, elements=elements))
    if dtype == np.dtype(object):
        return draw(hnp.arrays(dtype, shape, elements=st.sampled_from([1.0, None, "a", 2])))
    return draw(hnp.arrays(dtype, shape))


@st.composite
def vector_pair(draw):
    """Two float32 vectors of one length (now and then two arrays of any kind)."""
    if draw(st.integers(0, 3)) == 0:
        return draw(values()), draw(values())
    n = draw(st.integers(0, 80))
    el = st.one_of(st.floats(width=32), st.sampled_from(TIES).map(lambda v: cast(np.dtype(np.float32), v)))
    return draw(hnp.arrays(np.float32, n, elements=el)), draw(hnp.arrays(np.float32, n, elements=el))


LAYOUTS = ["contiguous", "reversed", "strided", "transposed", "broadcast", "misaligned", "readonly", "fortran",
           "scalar", "list"]


def laid_out(a, layout):
    """a's values in another memory layout (or as a numpy scalar / a list)."""
    if layout == "reversed" and a.ndim:
        return a[::-1]
    if layout == "strided" and a.ndim:
        b = np.empty((2 * a.shape[0],) + a.shape[1:], a.dtype)
        b[::2] = a
        return b[::2]
    if layout == "transposed":
        return a.T
    if layout == "broadcast" and a.ndim and a.shape[-1]:
        return np.broadcast_to(a[..., :1], a.shape)
    if layout == "misaligned" and a.dtype.itemsize > 1 and a.dtype != np.dtype(object):
        buf = np.zeros(a.nbytes + 1, np.uint8)
        m = np.ndarray(a.shape, a.dtype, buffer=buf, offset=1)
        m[...] = a
        return m
    if layout == "readonly":
        b = a.copy()
        b.setflags(write=False)
        return b
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "scalar" and a.ndim == 0:
        return a[()]
    if layout == "list" and a.size < 1000:
        return a.tolist()
    return a


OUTS = ["none", "fresh", "x", "view of x", "shared buffer", "readonly", "strided", "wrong shape", "int32", "list"]


@st.composite
def x_and_out(draw):
    """x (any array-like) and out= (or OMIT): out of every kind, including another dtype's view of
    x's bytes at any 4-byte offset of one buffer (partial overlap, same start, disjoint)."""
    kind = draw(mostly(st.sampled_from(OUTS[:5]), st.sampled_from(OUTS[5:]), 9))
    if kind == "shared buffer":
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=8))
        dx, do = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
        n = int(np.prod(shape))
        ox, oo = 4 * draw(st.integers(0, 2 * n + 2)), 4 * draw(st.integers(0, 2 * n + 2))
        buf = np.zeros(max(ox + n * dx.itemsize, oo + n * do.itemsize) + 8, np.uint8)
        x = np.ndarray(shape, dx, buffer=buf, offset=ox)
        x[...] = draw(hnp.arrays(dx, shape, elements=st.floats(width=dx.itemsize * 8)))
        return x, np.ndarray(shape, do, buffer=buf, offset=oo)
    x = laid_out(draw(values()), draw(st.sampled_from(LAYOUTS)))
    xa = as_array(x)
    shape = xa.shape if xa is not None else ()
    dtype = draw(st.sampled_from(FLOATS))
    if kind == "none":
        return x, draw(st.sampled_from([OMIT, None]))
    if kind == "fresh":
        return x, np.full(shape, 7, dtype)
    if kind == "x":
        return x, x
    if kind == "view of x":
        return x, xa[...] if isinstance(x, np.ndarray) else x
    if kind == "readonly":
        o = np.full(shape, 7, dtype)
        o.setflags(write=False)
        return x, o
    if kind == "strided":
        return x, np.full((2 * shape[0],) + shape[1:], 7, dtype)[::2] if shape else np.full(shape, 7, dtype)
    if kind == "wrong shape":
        return x, np.full(shape + (1,), 7, dtype)
    if kind == "int32":
        return x, np.full(shape, 7, np.int32)
    return x, np.full(shape, 7, dtype).tolist()


def as_array(x):
    """np.asarray(x), or None where numpy cannot read it."""
    try:
        return np.asarray(x)
    except Exception:  # noqa: BLE001 — numpy's refusal: the module must refuse too
        return None


def kernel_bytes(xa):
    """The bytes the call reads x from: x's own where it is a C-contiguous aligned float array,
    else a copy's (None: nothing out= could overlap)."""
    if xa.dtype in FLOATS and xa.flags.c_contiguous and xa.flags.aligned and xa.size:
        start = xa.__array_interface__["data"][0]
        return start, start + xa.nbytes
    return None


def out_is_valid(out, xa, same_dtype=False):
    """The module's documented rule for out=: a writeable, aligned, C-contiguous float32 / float64
    ndarray of x's shape (x's dtype for quantize) that is x itself — the same bytes, dtype and
    shape — or shares no byte with the x the call reads."""
    if out is OMIT or out is None:
        return True
    if not isinstance(out, np.ndarray) or out.dtype not in FLOATS or out.shape != xa.shape:
        return False
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
        return False
    if same_dtype and out.dtype != xa.dtype:
        return False
    xb = kernel_bytes(xa)
    if xb is None or out.size == 0:
        return True
    ob = out.__array_interface__["data"][0]
    overlap = xb[0] < ob + out.nbytes and ob < xb[1]
    return not overlap or (ob == xb[0] and out.nbytes == xb[1] - xb[0] and out.dtype == xa.dtype)


def same_values(test, got, want, what):
    """got has want's values: the same bits where the dtypes agree, else equal values (NaN with
    NaN, zeros of the same sign)."""
    test.assertEqual(got.shape, want.shape, what)
    if got.dtype == want.dtype:
        test.assertEqual(got.tobytes(), want.tobytes(), what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    test.assertTrue(np.array_equal(g, w, equal_nan=True) and np.array_equal(np.signbit(g), np.signbit(w)), what)


def snapshot(v):
    return v.copy() if isinstance(v, np.ndarray) else None


def refused(test, call, e, out, before):
    """A refusal: one line of mantis.Error that starts with the call's name; out= untouched."""
    msg = str(e)
    test.assertIsInstance(e, mantis.Error, msg)
    test.assertEqual(len(msg.splitlines()), 1, repr(msg))
    test.assertTrue(msg.startswith(call + ": "), msg)
    if before is not None:
        test.assertEqual(before.tobytes(), out.tobytes(), f"{call} wrote out= and refused: {msg}")
    OUTCOMES[call]["refused"] += 1
    if os.environ.get("MANTIS_PROPS_WHY"):
        OUTCOMES[call + " why"][msg.split(" ")[1][:20]] += 1


def attempt(fn):
    """(fn()'s result, None), or (None, the exception it raised)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 — settle() lets only mantis.Error through
        return None, e


def settle(test, call, err, valid, out=None, before=None, detail=""):
    """A call refused exactly when it is not valid (the CLI and the documented rules say): a refusal
    is one line of mantis.Error that wrote nothing. True where the call returned."""
    if err is not None:
        refused(test, call, err, out, before)
        test.assertFalse(valid, f"{call} refused what the CLI and the rules accept: {err}")
        return False
    test.assertTrue(valid, f"{call} accepted what the CLI or the rules refuse {detail}")
    return True


def inputs(x, out):
    """x as the call reads it (x itself where x is an array: out= may overlap it; None where numpy
    cannot read it), a copy of its values (an in-place call overwrites them), a copy of out."""
    xa = as_array(x)
    return xa, None if xa is None else xa.copy(), snapshot(out)


def words_valid(seed, stream, sr_bits, *more):
    """The random-word arguments are valid types and ranges (sr_bits: an int; the library checks its range)."""
    return (all(v is OMIT or is_int(v, 0, U64_MAX) for v in (seed, stream, *more))
            and (sr_bits is OMIT or is_int(sr_bits, -2 ** 31, 2 ** 31 - 1)))


def kwargs_of(**given):
    return {k: v for k, v in given.items() if v is not OMIT}


def cli_args(names):
    """The CLI options for the arguments a call was given (OMIT: the CLI's default, the same)."""
    out = []
    for option, v in names:
        if v is not OMIT:
            out += [option, str(int(v)) if isinstance(v, (int, np.integer)) else v]
    return out


# --- the properties -------------------------------------------------------------------------------

class Properties(unittest.TestCase):
    @classmethod
    def tearDownClass(cls):
        for call, n in sorted(OUTCOMES.items()):
            print(f"{call}: " + ", ".join(f"{k} {v}" for k, v in sorted(n.items())))

    @fixed(220)
    @given(xo=x_and_out(), fmt=names(FORMATS, NOT_FORMATS), mode=names(MODES, NOT_MODES),
           seed=integers((0, U64_MAX)), stream=integers((0, U64_MAX)), index0=integers((0, U64_MAX)),
           sr_bits=integers((1, 32)))
    def test_round(self, xo, fmt, mode, seed, stream, index0, sr_bits):
        x, out = xo
        kw = kwargs_of(mode=mode, seed=seed, stream=stream, index0=index0, sr_bits=sr_bits, out=out)
        record("round", x=x, fmt=fmt, **kw)
        xa, x0, before = inputs(x, out)
        y, err = attempt(lambda: mantis.round(x, fmt, **kw))
        valid = (xa is not None and xa.dtype in FLOATS and is_text(fmt) and (mode is OMIT or is_text(mode))
                 and words_valid(seed, stream, sr_bits, index0) and out_is_valid(out, xa))
        r = None
        if valid:
            fits = as_fits(fmt)
            src = x0 if fits is not False or x0.dtype == np.float64 else x0.astype(np.float64)
            np.save(os.path.join(TMP, "x.npy"), src)
            r = cli("round", "--format", fmt, *cli_args([("--rounding", mode), ("--seed", seed), ("--stream", stream),
                                                         ("--sr-bits", sr_bits)]),
                    "--in", os.path.join(TMP, "x.npy"), "--out", os.path.join(TMP, "y.npy"))
            out_f32 = isinstance(out, np.ndarray) and out.dtype == np.float32
            valid = r.returncode == 0 and not (out_f32 and fits is False)
        if not settle(self, "round", err, valid, out, before, f"(CLI: {r.stderr if r else '-'})"):
            return
        if isinstance(out, np.ndarray):
            self.assertIs(y, out)
        self.assertEqual(y.shape, xa.shape)
        if index0 is OMIT or int(index0) == 0:
            want = np.load(os.path.join(TMP, "y.npy"))
        else:  # the CLI starts at word 0: the MPFR reference with this index0
            want = mantis.round_reference(src, fmt, **kwargs_of(mode=mode, seed=seed, stream=stream, index0=index0,
                                                                sr_bits=sr_bits))
        if out is OMIT or out is None:
            self.assertEqual(y.dtype, np.float64 if xa.dtype == np.float64 or fits is False else np.float32)
        same_values(self, y, want, "round")
        OUTCOMES["round"]["equal to the CLI" if index0 is OMIT or int(index0) == 0 else "equal to the reference"] += 1

    @fixed(160)
    @given(xo=x_and_out(), scheme=names(SCHEMES, NOT_SCHEMES), mode=names(MODES, NOT_MODES),
           seed=integers((0, U64_MAX)), stream=integers((0, U64_MAX)), sr_bits=integers((1, 32)),
           stats=names([OMIT, True, False, np.bool_(True)], [1, None, "yes"]))
    def test_quantize(self, xo, scheme, mode, seed, stream, sr_bits, stats):
        x, out = xo
        kw = kwargs_of(mode=mode, seed=seed, stream=stream, sr_bits=sr_bits, out=out, stats=stats)
        record("quantize", x=x, scheme=scheme, **kw)
        xa, x0, before = inputs(x, out)
        res, err = attempt(lambda: mantis.quantize(x, scheme, **kw))
        valid = (xa is not None and xa.dtype in FLOATS and is_text(scheme) and (mode is OMIT or is_text(mode))
                 and words_valid(seed, stream, sr_bits) and (stats is OMIT or isinstance(stats, (bool, np.bool_)))
                 and out_is_valid(out, xa, same_dtype=True))
        if valid:
            np.save(os.path.join(TMP, "q.npy"), x0)
            r = cli("quantize", "--scheme", scheme, *cli_args([("--rounding", mode), ("--seed", seed), ("--stream", stream),
                                                               ("--sr-bits", sr_bits)]),
                    "--in", os.path.join(TMP, "q.npy"), "--out", os.path.join(TMP, "qy.npy"), "--json")
            valid = r.returncode == 0
        if not settle(self, "quantize", err, valid, out, before):
            return
        y, st_ = res if stats is not OMIT and stats else (res, None)
        if isinstance(out, np.ndarray):
            self.assertIs(y, out)
        self.assertEqual(y.dtype, xa.dtype)
        same_values(self, y, np.load(os.path.join(TMP, "qy.npy")), "quantize")
        OUTCOMES["quantize"]["equal to the CLI"] += 1
        if st_ is not None:
            want = json.loads(r.stdout)
            for k in ("rows", "cols", "blocks", "nan_blocks", "zero_blocks", "clipped"):
                self.assertEqual(st_[k], want[k], k)
            self.assertTrue(np.array_equal(st_["scales"], np.array([float(v) for v in want["scales"]]), equal_nan=True))

    @fixed(160)
    @given(v=vector_pair(), acc=names(FORMATS, NOT_FORMATS), mode=names(MODES, NOT_MODES),
           accumulation=names([OMIT, "strict", "unfused", "blocked"], ["promoted", "tensor_core", "nope", None]),
           block=integers((-2, 70)), sr_bits=integers((1, 32)), seed=integers((0, U64_MAX)),
           stream=integers((0, U64_MAX)), reference=names([OMIT, False, True], [0, None]), as_spec=st.booleans())
    def test_dot(self, v, acc, mode, accumulation, block, sr_bits, seed, stream, reference, as_spec):
        x, y = v
        spec = kwargs_of(mode=mode, accumulation=accumulation, block=block, sr_bits=sr_bits, seed=seed, stream=stream)
        kw = kwargs_of(reference=reference)
        record("dot", x=x, y=y, acc=acc, **spec, **kw, as_spec=as_spec)
        got, err = attempt(lambda: mantis.dot(x, y, mantis.GemmSpec(acc, **spec), **kw) if as_spec
                           else mantis.dot(x, y, acc=acc, **spec, **kw))
        valid = (x.dtype == y.dtype == np.float32 and x.ndim == y.ndim == 1 and x.shape == y.shape and is_text(acc)
                 and (mode is OMIT or is_text(mode)) and (accumulation is OMIT or is_text(accumulation))
                 and words_valid(seed, stream, sr_bits) and (block is OMIT or is_int(block, -2 ** 31, 2 ** 31 - 1))
                 and (reference is OMIT or isinstance(reference, bool)))
        if valid:
            stdin = "".join(",".join(float(e).hex() for e in vec) + "\n" for vec in (x, y))
            r = cli("dot", "--format", acc, *cli_args([("--rounding", mode), ("--accumulation", accumulation),
                                                       ("--block", block), ("--sr-bits", sr_bits), ("--seed", seed),
                                                       ("--stream", stream)]),
                    *(["--reference"] if reference is True else []), stdin=stdin)
            valid = r.returncode == 0
        call = "GemmSpec" if as_spec and isinstance(err, mantis.Error) and str(err).startswith("GemmSpec: ") else "dot"
        if not settle(self, call, err, valid):
            return
        want = float.fromhex(r.stdout.strip())
        self.assertTrue(got.hex() == want.hex() or (got != got and want != want), f"{got!r} != {want!r}")
        OUTCOMES["dot"]["equal to the CLI"] += 1

    @fixed(80)
    @given(m=st.integers(0, 4), k=st.integers(0, 40), n=st.integers(0, 4), seed_data=st.integers(0, 2 ** 32),
           acc=st.sampled_from(["ps4", "ps10", "bf16", "fp32", "e4m3", "fp64", "e11m52"]),
           mode=st.sampled_from(["rne", "rz", "sr", "ro"]),
           accumulation=st.sampled_from(["strict", "unfused", "blocked", "promoted", "tensor_core"]),
           block=integers((-1, 70)), align_bits=integers((-1, 60)),
           input_=st.sampled_from([OMIT, None, "e4m3", "bf16", "ps2"]),
           input_mode=st.sampled_from([OMIT, "rne", "sr", "bogus"]), sr_bits=integers((1, 32)), seed=integers((0, 9)),
           out_dtype=st.sampled_from([OMIT, "float64", "float32", np.float32, np.float64, "f4", None, int]))
    def test_gemm_against_reference(self, m, k, n, seed_data, acc, mode, accumulation, block, align_bits, input_,
                                    input_mode, sr_bits, seed, out_dtype):
        rng = np.random.default_rng(seed_data)
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        spec = kwargs_of(acc=acc, mode=mode, accumulation=accumulation, block=block, align_bits=align_bits,
                         input=input_, input_mode=input_mode, sr_bits=sr_bits, seed=seed)
        record("gemm", a=a, b=b, **spec, out_dtype=out_dtype)
        got, err = attempt(lambda: mantis.gemm(a, b, **spec, **kwargs_of(out_dtype=out_dtype)))
        if err is not None:
            refused(self, "gemm", err, None, None)
            return
        self.assertEqual(got.shape, (m, n))
        want = mantis.gemm(a, b, **spec, reference=True)  # the MPFR oracle, float64
        same_values(self, got.astype(np.float64) if got.dtype == np.float32 else got, want, "gemm")
        OUTCOMES["gemm"]["equal to the reference"] += 1

    def test_block_zero_is_refused(self):
        # block = 0 under strict / unfused (which do not use it) once divided by zero in the GEMM
        # kernel: SIGFPE, in `mantis dot --block 0` too (issue 32). Both refuse it now, in one line.
        for accumulation in ("strict", "unfused", "blocked"):
            with self.assertRaisesRegex(mantis.Error, "block = 0 is outside 1..1073741824"):
                mantis.dot(np.ones(2, np.float32), np.ones(2, np.float32), acc="bf16", block=0,
                           accumulation=accumulation)
            r = cli("dot", "--format", "bf16", "--block", "0", "--accumulation", accumulation, stdin="1,2\n3,4\n")
            self.assertEqual(r.returncode, 2)
            self.assertIn("block = 0 is outside 1..1073741824", r.stderr)
            self.assertEqual(r.stderr.count("\n"), 1)

    @fixed(300)
    @given(row=st.integers(0, 10 ** 6),
           changes=mostly(st.lists(st.tuples(st.integers(0, 20), st.integers(0, len(BAD) + 30)), min_size=1, max_size=4),
                          st.just([]), 7),
           extra=mostly(st.just(None), st.sampled_from(["bogus", "x\ny"])), drop=mostly(st.just(-1), st.integers(0, 9)))
    def test_public_surface(self, row, changes, extra, drop):
        """Any callable of the API with any mix of bad values, unknown keywords and missing
        arguments: a result or one line of mantis.Error."""
        rows = [r for r in SURFACE if r[0] not in ("eval", "set_threads")]  # eval runs a model; threads: global
        call, fn, args, kwargs = rows[row % len(rows)]
        kwargs = dict(kwargs)
        pool = BAD + [v for r in SURFACE for v in r[3].values()][:30]
        for p, i in changes:
            if kwargs:
                kwargs[list(kwargs)[p % len(kwargs)]] = pool[i % len(pool)]
        if extra:
            kwargs[extra] = 1
        if 0 <= drop < len(kwargs):
            del kwargs[list(kwargs)[drop]]
        record(call, positional=args, **kwargs)
        _, err = attempt(lambda: fn(*args, **kwargs))
        if err is not None:
            refused(self, call, err, None, None)
        else:
            OUTCOMES["(surface)"]["returned"] += 1

    @fixed(120)
    @given(a=values(), layout=st.sampled_from(["contiguous", "transposed", "reversed"]), grad=st.booleans(),
           fmt=st.sampled_from(["bf16", "ps3", "fp64", "nope"]), which=st.sampled_from(["round", "quantize"]),
           seed=integers((0, U64_MAX)))
    def test_torch_round_quantize(self, a, layout, grad, fmt, which, seed):
        try:
            import torch
            import mantis.torch as mt
        except ImportError:
            self.skipTest("python3-torch missing")
        try:
            t = torch.from_numpy(a.copy())
        except (TypeError, ValueError):
            return  # a dtype torch has no tensor for (object, str, uint64, big-endian): not an input
        if layout == "transposed":
            t = t.permute(tuple(reversed(range(t.dim()))))
        elif layout == "reversed" and t.dim():
            t = t.flip(0)
        if grad and t.is_floating_point():
            t = t.detach().requires_grad_(True)
        kw = kwargs_of(seed=seed)
        record(f"torch.{which}", t=t, fmt=fmt, **kw)
        got, err = attempt(lambda: mt.round(t, fmt, mode="sr", **kw) if which == "round"
                           else mt.quantize(t, "mxfp4" if fmt != "nope" else fmt, mode="sr", **kw))
        if err is not None:
            refused(self, which, err, None, None)
            return
        self.assertEqual(got.shape, t.shape)
        self.assertEqual(got.dtype, t.dtype)
        xa = t.detach().contiguous().numpy()
        want = (mantis.round(xa, fmt, mode="sr", **kw) if which == "round"
                else mantis.quantize(xa, "mxfp4", mode="sr", **kw))
        same_values(self, got.detach().numpy(), want.astype(xa.dtype) if which == "round" else want, which)
        OUTCOMES[which]["torch equal to numpy"] += 1

    @fixed(80)
    @given(group=st.integers(0, 3), hkv=st.integers(0, 3), h=mostly(st.just(None), st.integers(0, 5)),
           t=st.integers(0, 5), d=st.integers(0, 4), tk=mostly(st.just(None), st.integers(0, 5)),
           layer=integers((-1, 40)), causal=names([True, False, OMIT], [1, None]),
           policy=names(["native", "lamp:3"], [3, "nope"]))
    def test_torch_attention(self, group, hkv, h, t, d, tk, layer, causal, policy):
        """q [H, T, D], k = v [Hkv, T', D]: mostly H a multiple of Hkv and T' = T, else any."""
        try:
            import torch
            import mantis.torch as mt
        except ImportError:
            self.skipTest("python3-torch missing")
        q = torch.ones(group * hkv if h is None else h, t, d)
        k = torch.ones(hkv, t if tk is None else tk, d)
        kw = kwargs_of(layer=layer, causal=causal)
        record("torch.attention", q=q.shape, k=k.shape, policy=policy, **kw)
        out, err = attempt(lambda: mt.attention(q, k, k, policy, **kw))
        if err is not None:
            refused(self, "attention", err, None, None)
            return
        self.assertEqual(out.shape, q.shape)
        OUTCOMES["attention"]["returned"] += 1


def as_fits(fmt):
    """Whether fmt fits binary32 (None where it is no format: the CLI will say)."""
    try:
        return mantis.Format(fmt).fits_float
    except mantis.Error:
        return None


SURFACE = surface()

if __name__ == "__main__":
    sys.argv.remove("--child")
    unittest.main(verbosity=2)
