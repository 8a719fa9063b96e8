#!/usr/bin/python3
"""The Python module's arguments (python/mantis/native.cpp, class Call: the one conversion layer).

Every public callable, constructor and method of mantis and mantis.torch, called with bad
arguments, returns normally or raises one line of mantis.Error that starts with the call's name —
never a pybind11 TypeError, another exception type, a multi-line message, a wrapped integer or a
silent default. Each integer parameter is refused one past each end of its range (the message
names the range) and accepted at both ends. The cases of issue 32, item 11 are here by name.

Run by Meson with PYTHONPATH=<build>/python; exit 77 (SKIP) where numpy is missing."""
import os
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError:
    print("numpy missing: SKIP")
    sys.exit(77)

import mantis

try:
    import torch
    import mantis.torch as mt
except ImportError:
    torch = mt = None

ROOT = os.path.abspath(os.environ.get("MANTIS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..")))
MODEL = os.path.join(ROOT, "models", "gpt2-bytes")
U64 = "0..18446744073709551615"


def one_line(test, msg):
    """msg is one line: nothing str.splitlines() would split at, no control character."""
    test.assertEqual(len(msg.splitlines()), 1, repr(msg))
    test.assertFalse(any(ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0 for ch in msg), repr(msg))


def refused(test, call, fn, *needles):
    """fn() raises one line of mantis.Error that starts with 'call: ' and holds each needle."""
    with test.assertRaises(mantis.Error) as e:
        fn()
    msg = str(e.exception)
    one_line(test, msg)
    test.assertTrue(msg.startswith(call + ": "), msg)
    for n in needles:
        test.assertIn(n, msg)
    return msg


def outcome(test, call, fn):
    """fn() returns, or raises one line of mantis.Error starting with 'call: ': None, else what
    went wrong (for a list of failures)."""
    try:
        fn()
    except mantis.Error as e:
        msg = str(e)
        if len(msg.splitlines()) != 1 or not msg.startswith(call + ": "):
            return f"mantis.Error not one line of '{call}: ': {msg!r}"
    except Exception as e:  # noqa: BLE001 — any other exception is the finding
        return f"{type(e).__name__}: {str(e)[:300]!r}"
    return None


def setUpModule():
    # a value a sweep accepts may be written to (eval's out=): into a directory of our own
    global _CWD, _TMP
    _CWD, _TMP = os.getcwd(), tempfile.TemporaryDirectory(prefix="mantis-args-")
    os.chdir(_TMP.name)


def tearDownModule():
    os.chdir(_CWD)
    _TMP.cleanup()


class IssueCases(unittest.TestCase):
    """Issue 32, item 11: each was a pybind11 multi-line TypeError, another exception or a wrong
    number in the message."""

    def setUp(self):
        self.x = np.ones(4, np.float32)
        self.a = np.ones((2, 3), np.float32)

    def test_random_word_arguments(self):
        x = self.x
        refused(self, "round", lambda: mantis.round(x, "bf16", mode="sr", seed=-1), "seed = -1 is outside " + U64)
        refused(self, "round", lambda: mantis.round(x, "bf16", index0=-1), "index0 = -1 is outside " + U64)
        refused(self, "round", lambda: mantis.round(x, "bf16", seed=2 ** 64), "seed = 18446744073709551616 is outside")
        refused(self, "round", lambda: mantis.round(x, "bf16", sr_bits=2 ** 40), "sr_bits = 1099511627776 is outside 1..32")
        refused(self, "round", lambda: mantis.round(x, "bf16", mode=None), "mode must be a string, got NoneType None")
        refused(self, "round", lambda: mantis.round(x, "bf16", seed=1.0), "seed must be an integer in " + U64, "float 1.0")
        refused(self, "round", lambda: mantis.round(x, "bf16", seed=True), "seed must be an integer", "bool True")
        refused(self, "round", lambda: mantis.round(x, "bf16", seed=2 ** 200), "an integer of 201 bits")
        # numpy integers are integers, with their value
        y = mantis.round(x, "bf16", mode="sr", seed=np.uint64(2 ** 64 - 1), stream=np.int8(3))
        self.assertTrue(np.array_equal(y, mantis.round(x, "bf16", mode="sr", seed=2 ** 64 - 1, stream=3)))

    def test_gemm_arguments(self):
        a = self.a
        refused(self, "GemmSpec", lambda: mantis.GemmSpec(mantis.Format("ps4"), bogus=1),
                "unknown keyword argument 'bogus'", "acc, mode")
        refused(self, "gemm", lambda: mantis.gemm(a, a.T, acc="ps4", bogus=1), "unknown keyword argument 'bogus'")
        refused(self, "gemm", lambda: mantis.gemm(a, a.T, mantis.GemmSpec("ps4"), acc="ps4"), "not both")
        refused(self, "GemmSpec", lambda: mantis.GemmSpec(), "missing argument 'acc'")
        refused(self, "GemmSpec", lambda: mantis.GemmSpec("ps4", block=2 ** 31), "block = 2147483648 is outside")
        # out_dtype: a name or a numpy dtype; None is not float64 by default
        c = mantis.gemm(a, a.T, acc="ps4", out_dtype=np.float32)
        self.assertEqual(c.dtype, np.float32)
        self.assertEqual(mantis.gemm(a, a.T, acc="ps4", out_dtype=np.dtype("float64")).dtype, np.float64)
        refused(self, "gemm", lambda: mantis.gemm(a, a.T, acc="ps4", out_dtype=None),
                "out_dtype must be float64 or float32")
        refused(self, "gemm", lambda: mantis.gemm(a, a.T, acc="ps4", out_dtype=np.int32), "out_dtype must be")
        refused(self, "gemm", lambda: mantis.gemm(a, a.T, acc="ps4", reference=1), "reference must be True or False")

    def test_threads(self):
        refused(self, "set_threads", lambda: mantis.set_threads(2 ** 40), "n = 1099511627776 is outside 1..4096")
        refused(self, "set_threads", lambda: mantis.set_threads(), "missing argument 'n'")
        refused(self, "threads", lambda: mantis.threads(1), "takes at most 0 positional arguments, got 1")

    def test_eval_arguments(self):
        refused(self, "eval", lambda: mantis.eval(MODEL, seqs=2 ** 31), "seqs = 2147483648 is outside 1..1000000")
        msg = refused(self, "eval", lambda: mantis.eval(MODEL, seqs=-1), "seqs = -1 is outside 1..1000000")
        self.assertNotIn("18446744073709551615", msg)
        refused(self, "eval", lambda: mantis.eval(MODEL, ctx=-1), "ctx = -1 is outside 0..16777216")
        refused(self, "eval", lambda: mantis.eval(3), "model must be a path")
        refused(self, "eval", lambda: mantis.eval(MODEL, progress="yes"), "progress must be True or False")

    def test_site_arguments(self):
        p = mantis.Policy("lamp:4")
        e = p.site("attn.qk")
        refused(self, "site_gemm", lambda: mantis.site_gemm(self.a, self.a, e, stream=-1), "stream = -1 is outside " + U64)
        refused(self, "site_gemm", lambda: mantis.site_gemm(self.a, self.a, e, divisor=float("nan")), "divisor")
        refused(self, "site_gemm", lambda: mantis.site_gemm(self.a, self.a, "attn.qk"), "entry must be a mantis.SitePolicy")
        refused(self, "Policy.site", lambda: p.site("attn.qk", layer=2 ** 31),
                "layer = 2147483648 is outside -1..1073741822")
        refused(self, "Policy.site", lambda: p.site("attn.qk", layer=-2), "layer = -2 is outside")
        refused(self, "Policy.site", lambda: p.site(None), "name must be a string")
        refused(self, "Policy.site", lambda: p.site("nope"), "'nope' is not a site")
        refused(self, "Policy.site", lambda: p.site("attn.qk", 0, 1), "too many positional arguments")

    def test_user_text_is_escaped(self):
        # a policy key with a newline once gave a two-line message
        msg = refused(self, "Policy", lambda: mantis.Policy({"site": {"attn.qk\nx": {"accumulation": "strict"}}}))
        self.assertIn("\\x0a", msg)
        refused(self, "round", lambda: mantis.round(self.x, "bf16\n\x1b[31mred"), "\\x0a", "\\x1b")
        refused(self, "round", lambda: mantis.round(self.x, "bf16", **{"se\ned": 1}),
                "unknown keyword argument 'se\\x0aed'")
        refused(self, "round", lambda: mantis.round(self.x, "bf16\u2028"), "\\u2028")
        refused(self, "round", lambda: mantis.round(self.x, "bf16\udcff"), "fmt is not valid Unicode text")
        refused(self, "round", lambda: mantis.round(self.x, "bf16", **{"\udcff": 1}), "unknown keyword argument")
        refused(self, "round", lambda: mantis.round(self.x, "bf16\0"), "fmt contains a NUL character")
        refused(self, "load_model", lambda: mantis.load_model(b"/nonexistent/\xff\n"), "\\xff", "\\x0a")
        refused(self, "Format", lambda: mantis.Format(name="t", mantissa_bits="3\n", exponent_bits=4), "must be an integer")
        refused(self, "Format", lambda: mantis.Format(name="t", mantissa_bits=object()), "cannot write object")

    def test_shapes_and_classes(self):
        refused(self, "Model", lambda: mantis.Model(), "not constructed directly", "load_model")
        refused(self, "SitePolicy", lambda: mantis.SitePolicy(), "not constructed directly")
        refused(self, "round", lambda: mantis.round([[1.0], [2.0, 3.0]], "bf16"), "x cannot be read as an array")
        refused(self, "round", lambda: mantis.round(self.x, "bf16", out=[0.0] * 4), "out must be a numpy array")
        refused(self, "logits", lambda: mantis.logits(MODEL, [1, 2], policy=3), "Policy: spec must be")
        refused(self, "logits", lambda: mantis.logits(MODEL, [True, False]), "tokens has dtype bool")
        refused(self, "logits", lambda: mantis.logits(MODEL, np.array([2 ** 63], np.uint64)), "is not a token id")

    @unittest.skipIf(torch is None, "python3-torch missing")
    def test_torch_attention(self):
        q = torch.ones(4, 6, 8)
        kv = torch.ones(2, 6, 8)
        # no kv heads: once a ZeroDivisionError; a T mismatch: once a torch RuntimeError
        refused(self, "attention", lambda: mt.attention(q, kv[:0], kv[:0], "native"), "do not share 0 key/value heads")
        refused(self, "attention", lambda: mt.attention(q, kv[:, :5], kv[:, :5], "native"), "do not fit")
        refused(self, "attention", lambda: mt.attention(q[0], kv, kv, "native"), "q has shape (6, 8); expected [H, T, D]")
        refused(self, "attention", lambda: mt.attention(q, kv, kv, "native", layer=2 ** 31), "layer = 2147483648")
        refused(self, "attention", lambda: mt.attention(q, kv, kv, "native", causal=None), "causal must be True or False")
        refused(self, "attention", lambda: mt.attention(q, kv, kv), "missing a required argument: 'policy'")
        refused(self, "attention", lambda: mt.attention(q, kv, kv, "native", bogus=1),
                "unexpected keyword argument 'bogus'")
        refused(self, "linear", lambda: mt.linear(torch.tensor(1.0), torch.ones(2, 1), None, None), "x has shape ()")
        refused(self, "linear", lambda: mt.linear(torch.ones(2, 3), torch.ones(4, 3), None,
                                                  mantis.Policy("native").site("mlp.fc"), stream=-1), "stream = -1")
        refused(self, "apply_policy", lambda: mt.apply_policy(torch.nn.Linear(2, 2), "native", sites="mlp.fc"),
                "sites must be a list")
        refused(self, "apply_policy", lambda: mt.apply_policy(torch.nn.Linear(2, 2), "native", sites=["nope"]),
                "'nope' is not a site")
        fn = mt.hf_attention("native")
        refused(self, "hf_attention", lambda: fn(None, q[None], kv[None], kv[None], None, scaling="x"),
                "scaling must be a finite number")
        # value with fewer batch rows: once an IndexError; with more: the extra rows ignored; no batch
        # row: a torch RuntimeError, whatever the other shapes
        two, q0 = torch.ones(2, 2, 6, 8), q[None][:0]
        for query, key, value, dim in ((q.expand(2, -1, -1, -1), two, two[:1], "B"),
                                       (q.expand(2, -1, -1, -1), two, torch.ones(3, 2, 6, 8), "B"),
                                       (q[None], kv[None], kv[None, :1], "Hkv"),
                                       (q[None], kv[None], kv[None, :, :5], "T"),
                                       (q[None, :, :5], kv[None], kv[None], "T"),
                                       (q[None], kv[None, ..., :4], kv[None, ..., :4], "D"),
                                       (q0, kv[None], kv[None], "B"),
                                       (q0, two[:0, :, :5], two[:0, :, :5], "T"),
                                       (q0, two[:0], two[:0, ..., :4], "D")):
            refused(self, "hf_attention", lambda: fn(None, query, key, value), f"differ in {dim}")
        refused(self, "hf_attention", lambda: fn(None, q0[:, :3], two[:0], two[:0]),
                "3 query heads do not share 2 key/value heads")
        refused(self, "hf_attention", lambda: fn(None, q0[..., :0], two[:0, ..., :0], two[:0, ..., :0]),
                "the head dimension D is 0")


# Values that are wrong for most parameters: integers past the usual limits, other types, text
# with control characters, containers.
BAD = [-1, 2 ** 31, 2 ** 63, 2 ** 64, -2 ** 64, 2 ** 200, 1.5, float("nan"), None, True, "", "x\ny\x1b",
       b"bytes", object(), [1], {"a": 1}, np.float32(1), np.bool_(False), np.array([1, 2]), np.zeros((2, 2), object)]


def surface():
    """Every public callable with valid arguments: (call name as messages give it, callable,
    positional arguments, keyword arguments)."""
    x, a, v = np.ones(4, np.float32), np.ones((2, 3), np.float32), np.ones(3, np.float32)
    policy = mantis.Policy({"site": {"mlp.fc": {"accumulation": "strict", "accumulator": "ps6", "output": "ps6"}}})
    entry = policy.site("mlp.fc")
    model = mantis.load_model(MODEL)
    rows = [
        ("formats", mantis.formats, (), {}),
        ("schemes", mantis.schemes, (), {}),
        ("roundings", mantis.roundings, (), {}),
        ("sites", mantis.sites, (), {}),
        ("threads", mantis.threads, (), {}),
        ("set_threads", mantis.set_threads, (), {"n": mantis.threads()}),
        ("Format", mantis.Format, (), {"name": "bf16"}),
        ("Format", mantis.Format, (), {"toml": 'name = "t"\nmantissa_bits = 3\nexponent_bits = 4', "source": "s"}),
        ("Scheme", mantis.Scheme, (), {"name": "mxfp4"}),
        ("Scheme.from_toml", mantis.Scheme.from_toml, (), {"text": 'element = "fp4_e2m1"\nscale = "e8m0"\nblock = [1, 32]',
                                                             "source": "s"}),
        ("GemmSpec", mantis.GemmSpec, (), {"acc": "ps6", "mode": "sr", "accumulation": "blocked", "block": 4,
                                            "align_bits": 24, "input": "e4m3", "input_mode": "rne", "sr_bits": 8,
                                            "seed": 1, "stream": 2}),
        ("round", mantis.round, (), {"x": x, "fmt": "bf16", "mode": "sr", "seed": 1, "stream": 2, "index0": 3,
                                     "out": np.empty(4, np.float32), "sr_bits": 8}),
        ("round_reference", mantis.round_reference, (), {"x": x, "fmt": "bf16", "mode": "sr", "seed": 1, "stream": 2,
                                                         "index0": 3, "sr_bits": 8}),
        ("quantize", mantis.quantize, (), {"x": x, "scheme": "mxfp4", "mode": "sr", "seed": 1, "stream": 2,
                                           "out": np.empty(4, np.float32), "sr_bits": 8, "stats": True}),
        ("gemm", mantis.gemm, (), {"a": a, "b": a.T.copy(), "spec": "ps6", "out_dtype": "float32", "reference": False}),
        ("gemm", mantis.gemm, (a, a.T.copy()), {"acc": "ps6", "block": 4, "accumulation": "blocked", "seed": 1}),
        ("dot", mantis.dot, (), {"x": v, "y": v, "spec": "ps6", "reference": True}),
        ("dot", mantis.dot, (v, v), {"acc": "ps6", "mode": "sr", "sr_bits": 8, "stream": 1}),
        ("load_model", mantis.load_model, (), {"path": MODEL}),
        ("logits", mantis.logits, (), {"model": model, "tokens": [1, 2, 3], "policy": policy}),
        ("site_gemm", mantis.site_gemm, (), {"x": a, "w": a, "entry": entry, "w_transposed": True,
                                             "bias": np.ones(2, np.float32), "divisor": 2.0, "stream": 5}),
        ("Policy", mantis.Policy, (), {"spec": "lamp:4"}),
        ("Policy.site", policy.site, (), {"name": "mlp.fc", "layer": 0}),
        ("Model.parameter", model.parameter, (), {"name": model.parameter_names()[0]}),
        ("Model.parameter_names", model.parameter_names, (), {}),
        ("Model.sha256", model.sha256, (), {}),
        # eval's arguments are refused before any window runs (the valid call itself is not made)
        ("eval", mantis.eval, (), {"model": MODEL, "policy": "native", "data": "kjv/test", "seqs": 1, "ctx": 8,
                                   "tokenizer": "", "out": None, "progress": False}),
    ]
    if mt is not None:
        t, w = torch.ones(2, 3), torch.ones(4, 3)
        q, kv = torch.ones(2, 3, 4), torch.ones(1, 3, 4)
        rows += [
            ("round", mt.round, (), {"x": t, "fmt": "bf16", "mode": "sr", "seed": 1, "stream": 2, "index0": 3,
                                     "sr_bits": 8}),
            ("quantize", mt.quantize, (), {"x": t, "scheme": "mxfp4", "mode": "sr", "seed": 1, "stream": 2, "sr_bits": 8}),
            ("linear", mt.linear, (), {"x": t, "weight": w, "bias": torch.ones(4), "entry": entry, "w_transposed": True,
                                       "stream": 3}),
            ("apply_policy", mt.apply_policy, (), {"model": torch.nn.Linear(3, 3), "policy": policy, "sites": ["mlp.fc"]}),
            ("attention", mt.attention, (), {"q": q, "k": kv, "v": kv, "policy": policy, "layer": 0, "causal": True}),
            ("hf_attention", mt.hf_attention, (), {"policy": policy}),
            ("hf_attention", mt.hf_attention(policy), (), {"module": None, "query": q[None], "key": kv[None],
                                                           "value": kv[None], "attention_mask": None, "scaling": 0.5,
                                                           "dropout": 0.0}),
        ]
    return rows


class Surface(unittest.TestCase):
    def test_every_public_name_is_swept(self):
        # a callable added to the API without a row here fails this test
        names = {row[0].split(".")[0] for row in surface()} | {"Error", "version", "SitePolicy"}
        self.assertEqual(set(mantis.__all__) - names, set())
        methods = {n for n in dir(mantis.Model) if not n.startswith("_") and callable(getattr(mantis.Model, n))}
        self.assertEqual({f"Model.{n}" for n in methods} - {row[0] for row in surface()}, set())
        if mt is not None:
            self.assertEqual(set(mt.__all__) - {row[0] for row in surface()} - {"SITES"}, set())

    def test_valid_calls_return(self):
        for call, fn, args, kwargs in surface():
            if call == "eval":
                continue  # runs a model; tests/test_python.py compares it with the CLI
            with self.subTest(call=call):
                fn(*args, **kwargs)

    def test_bad_values_and_bad_calls(self):
        failures = []
        for call, fn, args, kwargs in surface():
            tries = [(f"{p}={b!r:.40}", args, {**kwargs, p: b}) for p in kwargs for b in BAD]
            tries += [("an unknown keyword", args, {**kwargs, "bogus_keyword": 1}),
                      ("a surplus positional", tuple(kwargs.values()) + (1,), {}),
                      ("no arguments at all", (), {})]
            tries += [(f"without {p}", args, {k: v for k, v in kwargs.items() if k != p}) for p in kwargs]
            for what, a, k in tries:
                problem = outcome(self, call, lambda: fn(*a, **k))
                if problem:
                    failures.append(f"{call}({what}): {problem}")
        mantis.set_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        self.assertEqual(failures, [], "\n".join(failures))


class IntegerLimits(unittest.TestCase):
    """Each integer parameter: refused one past each end of its range (the message names the
    range), accepted at each end."""

    def test_limits(self):
        x = np.ones(3, np.float32)
        a = np.ones((2, 2), np.float32)
        p = mantis.Policy("native")
        entry = p.site("mlp.fc")
        u64 = (0, 2 ** 64 - 1)
        cases = [
            ("round", lambda v: mantis.round(x, "bf16", mode="sr", seed=v), u64),
            ("round", lambda v: mantis.round(x, "bf16", mode="sr", stream=v), u64),
            ("round", lambda v: mantis.round(x, "bf16", mode="sr", index0=v), u64),
            ("round", lambda v: mantis.round(x, "bf16", mode="sr", sr_bits=v), (1, 32)),
            ("round_reference", lambda v: mantis.round_reference(x, "bf16", mode="sr", index0=v), u64),
            ("quantize", lambda v: mantis.quantize(x, "mxfp8_e4m3", mode="sr", seed=v), u64),
            ("quantize", lambda v: mantis.quantize(x, "mxfp8_e4m3", mode="sr", sr_bits=v), (1, 32)),
            ("GemmSpec", lambda v: mantis.GemmSpec("ps6", seed=v), u64),
            ("GemmSpec", lambda v: mantis.GemmSpec("ps6", stream=v), u64),
            ("GemmSpec", lambda v: mantis.GemmSpec("ps6", sr_bits=v), (1, 32)),
            ("GemmSpec", lambda v: mantis.GemmSpec("ps6", block=v), (1, 2 ** 30)),
            ("GemmSpec", lambda v: mantis.GemmSpec("ps6", align_bits=v), (-2 ** 31, 2 ** 31 - 1)),
            ("set_threads", lambda v: mantis.set_threads(v), (1, 4096)),
            ("site_gemm", lambda v: mantis.site_gemm(a, a, entry, stream=v), u64),
            ("Policy.site", lambda v: p.site("mlp.fc", layer=v), (-1, 2 ** 30 - 2)),
            ("site_stream", lambda v: mantis._mantis.site_stream("mlp.fc", v), (-1, 2 ** 30 - 2)),
            ("site_stream", lambda v: mantis._mantis.site_stream("mlp.fc", 0, v), (0, 4095)),
            ("eval", lambda v: mantis.eval(MODEL, seqs=v), (1, 1000000)),
            ("eval", lambda v: mantis.eval(MODEL, ctx=v), (0, 2 ** 24)),
        ]
        for call, fn, (lo, hi) in cases:
            with self.subTest(call=call, range=(lo, hi)):
                for v in (lo - 1, hi + 1):
                    refused(self, call, lambda: fn(v), f"= {v} is outside {lo}..{hi}")
                if call == "eval":
                    continue  # accepted values run an evaluation
                for v in (lo, hi):
                    try:
                        fn(v)
                    except mantis.Error as e:  # the library may refuse the value itself (one line)
                        one_line(self, str(e))
                        self.assertNotIn("is outside", str(e))
        mantis.set_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
