#!/usr/bin/python3
"""The `mantis` Python module against the CLI, bit for bit: rounding, quantisation, dot / GEMM,
logits and eval give the same bits in process as through `mantis` (MANTIS_BIN); errors are
mantis.Error with the CLI's message; mantis.torch's autograd functions and policy hooks.

Run by Meson with PYTHONPATH=<build>/python; exit 77 (SKIP) where numpy is missing."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    print("numpy missing: SKIP")
    sys.exit(77)

import mantis

ROOT = os.environ.get("MANTIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ["MANTIS_BIN"]
TMP = tempfile.mkdtemp(prefix="mantis-py-")


def cli(*args, stdin=None, ok=True):
    r = subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True, cwd=ROOT)
    if ok and r.returncode != 0:
        raise AssertionError(f"mantis {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r


def bits(a):
    """The bit patterns of a float array (so that NaN, -0 and +0 compare exactly)."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def sample(n, dtype, seed=0):
    """Values across the binary32 range and the specials: normals of every scale, subnormals,
    zeros, infinities, NaN, and exact ties of low-precision formats."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp2(rng.integers(-140, 130, n).astype(np.float64))
    x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.5, 1 + 2.0 ** -8]
    with np.errstate(over="ignore"):
        return x.astype(dtype)


class Rounding(unittest.TestCase):
    def test_round_matches_cli(self):
        for dtype in (np.float32, np.float64):
            x = sample(5000, dtype, 1)
            src = os.path.join(TMP, f"x-{np.dtype(dtype).name}.npy")
            np.save(src, x)
            for fmt in ("bf16", "ps4", "e4m3", "e5m2", "fp6_e2m3", "int8"):
                for mode, seed, stream in (("rne", 0, 0), ("rz", 0, 0), ("sr", 7, 3), ("sre", 1, 2), ("ro", 0, 0)):
                    with self.subTest(dtype=np.dtype(dtype).name, fmt=fmt, mode=mode):
                        dst = os.path.join(TMP, "y.npy")
                        cli("round", "--format", fmt, "--rounding", mode, "--seed", str(seed), "--stream", str(stream),
                            "--in", src, "--out", dst)
                        want = np.load(dst)
                        got = mantis.round(x, fmt, mode=mode, seed=seed, stream=stream)
                        self.assertEqual(got.dtype, want.dtype)
                        self.assertTrue(np.array_equal(bits(got), bits(want)))

    def test_in_place_and_slices(self):
        x = sample(4096, np.float32, 2)
        whole = mantis.round(x, "ps5", mode="sr", seed=3, stream=1)
        # index0: rounding a tensor in slices gives the bits of rounding it whole
        parts = np.concatenate([mantis.round(x[i:i + 1000], "ps5", mode="sr", seed=3, stream=1, index0=i)
                                for i in range(0, x.size, 1000)])
        self.assertTrue(np.array_equal(bits(parts), bits(whole)))
        y = x.copy()
        r = mantis.round(y, "ps5", mode="sr", seed=3, stream=1, out=y)
        self.assertIs(r, y)
        self.assertTrue(np.array_equal(bits(y), bits(whole)))
        # a non-contiguous view is read in C order (as its contiguous copy)
        m = x.reshape(64, 64)
        self.assertTrue(np.array_equal(bits(mantis.round(m.T, "bf16")), bits(mantis.round(np.ascontiguousarray(m.T), "bf16"))))
        # multi-dimensional shapes are kept
        self.assertEqual(mantis.round(m, "bf16").shape, (64, 64))

    def test_out_overlap_is_decided_by_bytes(self):
        # In place means the same bytes with the same dtype and shape; any other overlap of out= with
        # x is refused before anything is written. The float64 / float32 views of one buffer below
        # start at the same address: once taken for "x itself", they gave ~50,000 and ~199,000
        # wrong elements with no error.
        n = 200000
        b = sample(n, np.float64, 5)
        for call in (lambda x, out: mantis.round(x, "bf16", out=out),
                     lambda x, out: mantis.quantize(x, "mxfp8_e4m3", out=out)):
            cases = (("f64 x, f32 view out", b, b.view(np.float32)[:n]),
                     ("f32 view x, f64 out", b.view(np.float32)[:n], b),
                     ("shifted by one element", b[1:], b[:-1]),
                     ("same start, half the bytes", b[:n // 2], b.view(np.float32)[:n // 2]))
            for what, x, out in cases:
                with self.subTest(what=what):
                    before = b.copy()
                    with self.assertRaisesRegex(mantis.Error, "overlaps x"):
                        call(x, out)
                    self.assertTrue(np.array_equal(bits(b), bits(before)))
        # the same bytes, dtype and shape through another array object: in place
        y = b.copy()
        mantis.round(y, "bf16", out=y[:])
        self.assertTrue(np.array_equal(bits(y), bits(mantis.round(b, "bf16"))))
        # the two halves of one buffer do not overlap: allowed, and correct
        z = b.copy()
        want = mantis.round(z[:n // 2], "bf16")
        mantis.round(z[:n // 2], "bf16", out=z[n // 2:])
        self.assertTrue(np.array_equal(bits(z[n // 2:]), bits(want)))

    def test_results_keep_the_input_shape(self):
        # 0-d, empty and multi-dimensional inputs, contiguous or not: every result has x's shape
        # (np.ascontiguousarray once turned a 0-d input into shape (1,), and out=x then failed) and
        # the CLI's bits for the same .npy (which keeps a 0-d shape too).
        base = sample(64, np.float64, 6)
        arrays = [base[5].reshape(()), np.float64(base[6]), base[:0], base[:0].reshape(4, 0), base[:24].reshape(2, 3, 4),
                  base[:24].reshape(4, 6)[::-1, ::2], base[:1]]
        for x in arrays:
            for dtype in (np.float32, np.float64):
                xs = np.asarray(x).astype(dtype)
                shape = xs.shape
                with self.subTest(shape=shape, dtype=np.dtype(dtype).name):
                    src, dst = os.path.join(TMP, "s.npy"), os.path.join(TMP, "s-out.npy")
                    np.save(src, xs)
                    cli("round", "--format", "bf16", "--rounding", "sr", "--seed", "3", "--in", src, "--out", dst)
                    want = np.load(dst)
                    self.assertEqual(want.shape, shape)
                    got = mantis.round(xs, "bf16", mode="sr", seed=3)
                    self.assertEqual(got.shape, shape)
                    self.assertTrue(np.array_equal(bits(got), bits(want)))
                    self.assertEqual(mantis.round_reference(xs, "bf16", mode="sr", seed=3).shape, shape)
                    cli("quantize", "--scheme", "mxfp4", "--in", src, "--out", dst)
                    q = mantis.quantize(xs, "mxfp4")
                    self.assertEqual(q.shape, shape)
                    self.assertTrue(np.array_equal(bits(q), bits(np.load(dst))))
                    y = np.ascontiguousarray(xs) if xs.ndim else xs.copy()
                    self.assertIs(mantis.round(y, "bf16", mode="sr", seed=3, out=y), y)
                    self.assertEqual(y.shape, shape)
                    self.assertTrue(np.array_equal(bits(y), bits(want)))
                    self.assertIs(mantis.quantize(y, "mxfp4", out=y), y)
        # a 0-d operand is not a vector of one element (it was, through np.ascontiguousarray)
        with self.assertRaisesRegex(mantis.Error, r"x has shape \(\); expected a vector"):
            mantis.dot(np.float32(2), np.float32(3), acc="ps4")
        with self.assertRaisesRegex(mantis.Error, r"a has shape \(\); expected a matrix"):
            mantis.gemm(np.float32(2), np.ones((1, 1), np.float32), acc="ps4")

    def test_index_range_past_2_64_wraps(self):
        # element i uses word (index0 + i) mod 2^64 (round_array.h); index0 = 2^64 - 1 once segfaulted
        x = sample(3001, np.float32, 4)
        for back in (0, 1, 2, 3, 1000):
            with self.subTest(back=back):
                i0 = 2 ** 64 - 1 - back
                got = mantis.round(x, "bf16", mode="sr", seed=9, index0=i0)
                want = mantis.round_reference(x, "bf16", mode="sr", seed=9, index0=i0)
                self.assertTrue(np.array_equal(bits(got.astype(np.float64)), bits(want)))
                # the part after the wrap is the part of a call that starts at index 0
                k = back + 1
                self.assertTrue(np.array_equal(bits(got[k:]), bits(mantis.round(x[k:], "bf16", mode="sr", seed=9))))

    def test_reference_equals_fast_path(self):
        x = sample(3000, np.float64, 3)
        for fmt in ("bf16", "ps3", "e4m3", "e2m5"):
            for mode in ("rne", "rna", "ru", "rd", "sr"):
                with self.subTest(fmt=fmt, mode=mode):
                    self.assertTrue(np.array_equal(bits(mantis.round(x, fmt, mode=mode, seed=5)),
                                                   bits(mantis.round_reference(x, fmt, mode=mode, seed=5))))

    def test_packed_random_bits(self):
        # sr_packed: 4 (sr_bits <= 8) or 2 (<= 16) elements share a Philox word (philox.h sr_word)
        x = sample(3001, np.float32, 6)
        for bits_, i0 in ((8, 0), (16, 5), (8, 2 ** 64 - 7)):
            with self.subTest(sr_bits=bits_, index0=i0):
                got = mantis.round(x, "bf16", mode="sr", seed=9, index0=i0, sr_bits=bits_, sr_packed=True)
                want = mantis.round_reference(x, "bf16", mode="sr", seed=9, index0=i0, sr_bits=bits_, sr_packed=True)
                self.assertTrue(np.array_equal(bits(got.astype(np.float64)), bits(want)))
                plain = mantis.round(x, "bf16", mode="sr", seed=9, index0=i0, sr_bits=bits_)
                self.assertFalse(np.array_equal(bits(got), bits(plain)))
        a, b = sample(6 * 40, np.float32, 7).reshape(6, 40), sample(40 * 9, np.float32, 8).reshape(40, 9)
        spec = dict(acc="bf16", mode="sr", sr_bits=8, sr_packed=True, seed=3)
        self.assertTrue(mantis.GemmSpec(**spec).sr_packed)
        self.assertTrue(np.array_equal(bits(mantis.gemm(a, b, **spec)), bits(mantis.gemm(a, b, reference=True, **spec))))
        with self.assertRaisesRegex(mantis.Error, "sr_bits = 20 does not fit"):
            mantis.round(x, "bf16", mode="sr", sr_bits=20, sr_packed=True)
        with self.assertRaisesRegex(mantis.Error, "sr_packed is for stochastic rounding"):
            mantis.gemm(a, b, acc="bf16", sr_bits=8, sr_packed=True)

    def test_wide_format_needs_float64(self):
        x = sample(10, np.float32)
        self.assertEqual(mantis.round(x, "fp64").dtype, np.float64)
        with self.assertRaisesRegex(mantis.Error, "does not fit binary32"):
            mantis.round(x, "fp64", out=np.empty_like(x))

    def test_errors_are_the_cli_messages(self):
        r = cli("round", "--format", "nope", stdin="1\n", ok=False)
        self.assertEqual(r.returncode, 2)
        with self.assertRaises(mantis.Error) as e:
            mantis.round(np.ones(3, np.float32), "nope")
        # the call and the argument, then the CLI's message
        self.assertEqual(str(e.exception), "round: fmt: " + r.stderr.strip().removeprefix("mantis: error: "))
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaisesRegex(mantis.Error, "dtype int64"):
            mantis.round(np.arange(3), "bf16")
        with self.assertRaisesRegex(mantis.Error, "out has shape"):
            mantis.round(np.ones(3, np.float32), "bf16", out=np.ones(4, np.float32))
        z = np.ones(8, np.float32)
        with self.assertRaisesRegex(mantis.Error, "overlaps"):
            mantis.round(z[1:], "bf16", out=z[:-1])
        with self.assertRaisesRegex(mantis.Error, "rounding"):
            mantis.round(np.ones(3, np.float32), "bf16", mode="nearest-ish")


class Formats(unittest.TestCase):
    def test_formats(self):
        names = mantis.formats()
        for n in ("bf16", "e4m3", "fp16"):
            self.assertIn(n, names)
        f = mantis.Format("e4m3")
        self.assertEqual((f.mu, f.emin, f.emax, f.max_finite), (3, -6, 8, 448.0))
        g = mantis.Format(name="e4m3", mantissa_bits=3, exponent_bits=4, specials="fn", overflow="nan")
        self.assertEqual((g.mu, g.emin, g.emax, g.specials, g.overflow), (f.mu, f.emin, f.emax, f.specials, f.overflow))
        x = sample(2000, np.float32, 4)
        self.assertTrue(np.array_equal(bits(mantis.round(x, g)), bits(mantis.round(x, f))))
        with open(os.path.join(ROOT, "formats", "e4m3.toml")) as fh:
            self.assertEqual(mantis.Format(toml=fh.read()).max_finite, 448.0)
        with self.assertRaisesRegex(mantis.Error, "mantissa_bits|unknown key"):
            mantis.Format(name="bad", mantisa_bits=3, exponent_bits=4)


class Quantize(unittest.TestCase):
    def test_quantize_matches_cli(self):
        rng = np.random.default_rng(5)
        for dtype in (np.float32, np.float64):
            x = (rng.standard_normal((8, 96)) * np.exp2(rng.integers(-20, 20, (8, 1)))).astype(dtype)
            src = os.path.join(TMP, "q.npy")
            np.save(src, x)
            for scheme in ("mxfp4", "mxfp8_e4m3", "nvfp4", "int8_channel", "uint8_tensor_zp"):
                for mode in ("rne", "sr"):
                    with self.subTest(dtype=np.dtype(dtype).name, scheme=scheme, mode=mode):
                        dst = os.path.join(TMP, "qy.npy")
                        r = cli("quantize", "--scheme", scheme, "--rounding", mode, "--seed", "9", "--in", src,
                                "--out", dst, "--json")
                        want = json.loads(r.stdout)
                        y, st = mantis.quantize(x, scheme, mode=mode, seed=9, stats=True)
                        self.assertTrue(np.array_equal(bits(y), bits(np.load(dst))))
                        self.assertEqual(st["blocks"], want["blocks"])
                        self.assertEqual(st["clipped"], want["clipped"])
                        self.assertEqual(list(st["scales"]), want["scales"])


class Gemm(unittest.TestCase):
    def test_dot_matches_cli(self):
        rng = np.random.default_rng(6)
        x, y = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
        stdin = ",".join(float(v).hex() for v in x) + "\n" + ",".join(float(v).hex() for v in y) + "\n"
        for acc, mode, accumulation in (("ps4", "rne", "strict"), ("ps7", "sr", "strict"), ("bf16", "rz", "blocked")):
            with self.subTest(acc=acc, mode=mode, accumulation=accumulation):
                r = cli("dot", "--format", acc, "--rounding", mode, "--accumulation", accumulation, "--seed", "4",
                        stdin=stdin)
                want = float.fromhex(r.stdout.strip())
                got = mantis.dot(x, y, acc=acc, mode=mode, accumulation=accumulation, seed=4)
                self.assertEqual(got.hex(), want.hex())

    def test_gemm_rows_are_dots_and_reference(self):
        rng = np.random.default_rng(7)
        a, b = rng.standard_normal((5, 40)).astype(np.float32), rng.standard_normal((40, 3)).astype(np.float32)
        for spec in (mantis.GemmSpec(mantis.Format("ps6")),
                     mantis.GemmSpec(mantis.Format("ps6"), accumulation="blocked", block=8),
                     mantis.GemmSpec(mantis.Format("ps10"), input=mantis.Format("e4m3"))):
            with self.subTest(spec=repr(spec)):
                c = mantis.gemm(a, b, spec)
                self.assertTrue(np.array_equal(c, mantis.gemm(a, b, spec, reference=True)))
                if spec.input is None:
                    for i in range(5):
                        for j in range(3):
                            self.assertEqual(c[i, j], mantis.dot(a[i], np.ascontiguousarray(b[:, j]), spec))
        with self.assertRaisesRegex(mantis.Error, "inner dimensions"):
            mantis.gemm(a, a, acc="ps6")
        with self.assertRaisesRegex(mantis.Error, "binary32"):
            mantis.gemm(a.astype(np.float64), b, acc="ps6")


class TensorCore(unittest.TestCase):
    """GPU matrix units (core/matrix_unit.h): the committed measured outputs through mantis.gemm
    with the bare GPU name, the CLI's `mantis gemm` on .npy files, and the refusals."""

    @staticmethod
    def data_sets():
        d = os.path.join(ROOT, "tests", "data", "tensor_core")
        for name in sorted(os.listdir(d)):
            if not name.endswith(".txt"):
                continue
            gpu, inp, out = name[:-4].split("_")
            rows = [l.split("|") for l in open(os.path.join(d, name)) if l.strip() and not l.startswith("#")]
            w = lambda s: np.array([int(h, 16) for h in s.split()], dtype=np.uint32).view(np.float32)
            yield gpu, inp, out, [(w(a), w(b), w(c)[0], w(dd)[0]) for _, a, b, c, dd in rows]

    def test_measured_outputs(self):
        sets = total = 0
        for gpu, inp, out, tests in self.data_sets():
            sets += 1
            with self.subTest(gpu=gpu, input=inp, output=out):
                # One GEMM per set: the tests' rows of A against every test's column of B; the
                # diagonal holds the measured products (the addend per row: C[i, i]).
                A = np.stack([t[0] for t in tests])
                B = np.stack([t[1] for t in tests]).T.copy()
                C = np.zeros((len(tests), len(tests)), dtype=np.float32)
                np.fill_diagonal(C, [t[2] for t in tests])
                D = mantis.gemm(A, B, c=C, acc=out, input=inp, accumulation="tensor_core", tensor_core=gpu)
                want = np.array([t[3] for t in tests], dtype=np.float32).astype(np.float64)
                self.assertTrue(np.array_equal(bits(np.diagonal(D).copy()), bits(want)))
                total += len(tests)
        self.assertEqual(sets, 48)
        self.assertGreaterEqual(total, 4800)

    def test_cli_gemm_matches_module(self):
        rng = np.random.default_rng(8)
        a, b = rng.standard_normal((6, 70)).astype(np.float32), rng.standard_normal((70, 5)).astype(np.float32)
        c = rng.standard_normal((6, 5)).astype(np.float32)
        paths = {n: os.path.join(TMP, f"tc-{n}.npy") for n in "abcd"}
        for n, v in zip("abc", (a, b, c)):
            np.save(paths[n], v)
        for gpu, inp, out in (("h100", "e4m3", "fp32"), ("h100", "e4m3", "fp16"), ("b200:mma", "e5m2", "fp32"),
                              ("v100", "fp16", "fp16"), ("a100", "bf16", "fp32")):
            with self.subTest(gpu=gpu, input=inp, output=out):
                cli("gemm", "--a", paths["a"], "--b", paths["b"], "--c", paths["c"], "--out", paths["d"], "--format",
                    out, "--accumulation", "tensor_core", "--tensor-core", gpu, "--input", inp)
                want = mantis.gemm(a, b, c=c, acc=out, input=inp, accumulation="tensor_core", tensor_core=gpu)
                self.assertTrue(np.array_equal(bits(np.load(paths["d"])), bits(want)))
                ref = mantis.gemm(a, b, c=c, acc=out, input=inp, accumulation="tensor_core", tensor_core=gpu,
                                  reference=True)
                self.assertTrue(np.array_equal(bits(ref), bits(want)))
        # the addend for another accumulation, through both
        cli("gemm", "--a", paths["a"], "--b", paths["b"], "--c", paths["c"], "--out", paths["d"], "--format", "ps6")
        self.assertTrue(np.array_equal(bits(np.load(paths["d"])), bits(mantis.gemm(a, b, c=c, acc="ps6"))))

    def test_refusals(self):
        a = np.ones((2, 4), dtype=np.float32)
        with self.assertRaisesRegex(mantis.Error, "unknown tensor-core GPU 'h900'"):
            mantis.gemm(a, a.T.copy(), acc="fp32", input="fp16", accumulation="tensor_core", tensor_core="h900")
        with self.assertRaisesRegex(mantis.Error, "the v100 has no bf16"):
            mantis.gemm(a, a.T.copy(), acc="fp32", input="bf16", accumulation="tensor_core", tensor_core="v100")
        with self.assertRaisesRegex(mantis.Error, r"c is \(3, 3\); the product is \(2, 2\)"):
            mantis.gemm(a, a.T.copy(), c=np.zeros((3, 3), np.float32), acc="ps6")
        r = cli("gemm", "--a", "/nonexistent.npy", "--b", "/nonexistent.npy", "--out", os.path.join(TMP, "x.npy"),
                "--format", "fp32", "--accumulation", "tensor_core", "--tensor-core", "v100", "--input", "bf16",
                ok=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("the v100 has no bf16", r.stderr)


MODELS = [os.path.join(ROOT, "models", m) for m in ("gpt2-bytes", "llama-bytes")]
TOKENS = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 84, 104, 101]


class Models(unittest.TestCase):
    def test_logits_match_cli(self):
        ptoml = os.path.join(TMP, "p.toml")
        text = '[site."mlp.fc"]\naccumulation = "strict"\naccumulator = "ps5"\noutput = "bf16"\n'
        with open(ptoml, "w") as fh:
            fh.write(text)
        as_dict = {"site": {"mlp.fc": {"accumulation": "strict", "accumulator": "ps5", "output": "bf16"}}}
        for path in MODELS:
            m = mantis.load_model(path)
            for spec, py_policy in (("native", "native"), ("lamp:4", "lamp:4"), (ptoml, text), (ptoml, as_dict)):
                with self.subTest(model=os.path.basename(path), policy=spec, form=type(py_policy).__name__):
                    out = os.path.join(TMP, "logits.npy")
                    cli("logits", "--model", path, "--policy", spec, "--tokens", " ".join(map(str, TOKENS)), "--out", out)
                    got = mantis.logits(m, TOKENS, py_policy)
                    self.assertEqual(got.shape, (len(TOKENS), m.vocab))
                    self.assertTrue(np.array_equal(bits(got), bits(np.load(out))))
        with self.assertRaisesRegex(mantis.Error, "token"):
            mantis.logits(mantis.load_model(MODELS[0]), [1, 2, 100000])

    def test_eval_matches_cli(self):
        def strip(j):
            if isinstance(j, dict):
                return {k: strip(v) for k, v in j.items() if k not in ("seconds", "elapsed_s")}
            if isinstance(j, list):
                return [strip(v) for v in j]
            return j
        out = os.path.join(TMP, "eval-cli")
        cli("eval", "--model", MODELS[1], "--policy", "lamp:5", "--data", "kjv/test", "--seqs", "2", "--ctx", "32",
            "--out", out, "--quiet")
        with open(os.path.join(out, "results.json")) as fh:
            want = json.load(fh)
        got = mantis.eval(MODELS[1], policy="lamp:5", data="kjv/test", seqs=2, ctx=32)
        self.assertEqual(strip(got["results"]), strip(want))
        self.assertIn("lamp", got["report"].lower())


class Torch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import torch  # noqa: F401
        except ImportError:
            raise unittest.SkipTest("python3-torch missing")

    def test_round_straight_through(self):
        import torch
        import mantis.torch as mt
        x = torch.randn(100, dtype=torch.float32, generator=torch.Generator().manual_seed(0), requires_grad=True)
        y = mt.round(x, "ps3", mode="sr", seed=2)
        self.assertTrue(np.array_equal(bits(y.detach().numpy()),
                                       bits(mantis.round(x.detach().numpy(), "ps3", mode="sr", seed=2))))
        (y * torch.arange(100.0)).sum().backward()
        self.assertTrue(torch.equal(x.grad, torch.arange(100.0)))
        q = mt.quantize(x.detach().reshape(2, 50), "mxfp4")
        self.assertTrue(np.array_equal(q.numpy(), mantis.quantize(x.detach().numpy().reshape(2, 50), "mxfp4")))
        with self.assertRaisesRegex(mantis.Error, "dtype"):
            mt.round(torch.ones(3, dtype=torch.float16), "bf16")
        # 0-d and empty tensors keep their shape (a 0-d tensor once failed: out had shape (), x (1,))
        for t in (torch.tensor(1.3), torch.tensor(1.3, dtype=torch.float64), torch.ones(0, 3)):
            with self.subTest(shape=tuple(t.shape), dtype=t.dtype):
                r = mt.round(t, "bf16")
                self.assertEqual(r.shape, t.shape)
                self.assertTrue(np.array_equal(bits(r.numpy()), bits(mantis.round(t.numpy(), "bf16"))))
                self.assertEqual(mt.quantize(t, "mxfp4").shape, t.shape)

    def test_linear_and_hooks(self):
        import torch
        import mantis.torch as mt
        g = torch.Generator().manual_seed(1)
        policy = mantis.Policy({"site": {"mlp.fc": {"accumulation": "strict", "accumulator": "ps6", "output": "ps6"}}})
        entry = policy.site("mlp.fc", 0)
        x = torch.randn(2, 5, 16, generator=g, requires_grad=True)
        lin = torch.nn.Linear(16, 8)
        y = mt.linear(x, lin.weight, lin.bias, entry)
        want = mantis.site_gemm(x.detach().reshape(10, 16).numpy(), lin.weight.detach().numpy(), entry,
                                bias=lin.bias.detach().numpy())
        self.assertTrue(np.array_equal(y.detach().reshape(10, 8).numpy(), want))
        # gradients: those of the binary32 Linear
        y.sum().backward()
        x2 = x.detach().clone().requires_grad_(True)
        lin2 = torch.nn.Linear(16, 8)
        lin2.load_state_dict(lin.state_dict())
        torch.nn.functional.linear(x2, lin2.weight, lin2.bias).sum().backward()
        self.assertTrue(torch.allclose(x.grad, x2.grad, rtol=1e-6, atol=1e-6))
        self.assertTrue(torch.allclose(lin.weight.grad, lin2.weight.grad, rtol=1e-6, atol=1e-6))

        # an HF-style LLaMA tree: the hooked projections give the site GEMMs' bits
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gate_proj, self.up_proj = torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(16, 32, bias=False)
                self.down_proj = torch.nn.Linear(32, 16, bias=False)

            def forward(self, h):
                return self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))

        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = MLP()

        class Tree(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = torch.nn.Module()
                self.model.layers = torch.nn.ModuleList([Layer(), Layer()])

        tree = Tree()
        handles, routed = mt.apply_policy(tree, policy)
        self.assertEqual(sorted(n for n, _, _ in routed),
                         [f"model.layers.{i}.mlp.{p}_proj" for i in (0, 1) for p in ("gate", "up")])
        mlp = tree.model.layers[1].mlp
        h = torch.randn(7, 16, generator=g)
        got = mlp.gate_proj(h).detach().numpy()
        want = mantis.site_gemm(h.numpy(), mlp.gate_proj.weight.detach().numpy(), policy.site("mlp.fc", 1),
                                stream=mantis._mantis.site_stream("mlp.fc", 1, 0))
        self.assertTrue(np.array_equal(got, want))
        self.assertFalse(np.array_equal(got, torch.nn.functional.linear(h, mlp.gate_proj.weight).detach().numpy()))
        for hd in handles:
            hd.remove()
        self.assertTrue(torch.equal(mlp.gate_proj(h), torch.nn.functional.linear(h, mlp.gate_proj.weight)))

    def test_attention(self):
        import torch
        import mantis.torch as mt
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(4, 6, 8, generator=g) for _ in range(3))
        k, v = k[:2], v[:2]  # grouped-query: 4 query heads on 2 kv heads
        got = mt.attention(q, k, v, "native")
        kk, vv = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
        s = (q @ kk.transpose(1, 2)) / 8 ** 0.5
        s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        want = torch.softmax(s, -1) @ vv
        self.assertTrue(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
        low = mt.attention(q, k, v, "lamp:3")
        self.assertGreater((low - want).abs().max().item(), 1e-3)  # ps3 scores: visibly different
        fn = mt.hf_attention("native")
        out, _ = fn(None, q[None], k[None], v[None], None, scaling=8 ** -0.5)
        self.assertEqual(tuple(out.shape), (1, 6, 4, 8))
        self.assertTrue(torch.allclose(out[0].transpose(0, 1), want, rtol=1e-5, atol=1e-6))
        # no batch row: the empty [B, T, H, D] result, as torch's attention gives
        for dtype in (torch.float32, torch.float64):
            query, key, value = (t[None][:0].to(dtype) for t in (q, k, v))
            out, _ = fn(None, query, key, value, None)
            self.assertEqual((tuple(out.shape), out.dtype), ((0, 6, 4, 8), dtype))


class GilRelease(unittest.TestCase):
    """Long calls release the GIL: another Python thread runs while they compute. The switch
    interval is set to 1000 s, so a thread waiting for the GIL gets it only when the running thread
    gives it up (a blocking or GIL-releasing call), not by time slicing: a call that kept the GIL
    would let the other thread count nothing. The pure-Python control shows exactly that. The
    repetitions below stop after 60 s, far inside the interval."""

    def test_long_calls_let_other_threads_run(self):
        import threading
        import time
        count, stop, started = [0], threading.Event(), threading.Event()

        def spin():
            started.set()
            while not stop.is_set():
                count[0] += 1
                time.sleep(0.0002)

        x = np.random.default_rng(3).standard_normal(1 << 21).astype(np.float32)
        a = np.random.default_rng(4).standard_normal((192, 192)).astype(np.float32)
        model = mantis.load_model(MODELS[0])
        calls = {
            "round": lambda: mantis.round(x, "ps4", mode="sr", seed=1),
            "quantize": lambda: mantis.quantize(x, "mxfp4"),
            "gemm": lambda: mantis.gemm(a, a, acc="ps8"),
            "logits": lambda: mantis.logits(model, list(range(1, 120)), "lamp:4"),
        }
        old = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        t = threading.Thread(target=spin)
        try:
            t.start()
            started.wait()
            c0 = count[0]
            sum(i * i for i in range(200000))  # holds the GIL for a while: the spinner must not run
            self.assertEqual(count[0], c0, "the spinner ran while the GIL was held: the test cannot tell")
            for name, call in calls.items():
                # Repeated until the spinner has run (it also needs a free core, which a loaded
                # machine may not give it during one short call): a call that kept the GIL never
                # lets it run, however often it is repeated.
                before, deadline = count[0], time.monotonic() + 60
                while count[0] == before and time.monotonic() < deadline:
                    call()
                with self.subTest(call=name):
                    self.assertGreater(count[0], before, f"mantis.{name} kept the GIL (60 s of calls)")
        finally:
            stop.set()
            sys.setswitchinterval(old)
            t.join()


if __name__ == "__main__":
    unittest.main(verbosity=2)
