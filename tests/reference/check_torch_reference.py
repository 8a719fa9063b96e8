#!/usr/bin/python3
"""Re-runs torch_reference.py into a temporary directory and compares with the committed outputs.

Weights, tokens, targets and configs must be byte-identical; the logits, gradients and AdamW
parameters (and the losses in index.json) may move by rounding across torch/BLAS builds: float32
within 1e-5 x max(1, max |committed|), float64 within 1e-12 x max(1, max |committed|) (about 170
and 9000 unit roundoffs: other summation orders of the 150-position sums stay inside, seen up to 5e-6
and 3e-14; a wrong formula does not). Exit status 77
(Meson: SKIP) when PyTorch or NumPy is missing, 1 on a difference, 0 when everything agrees.

Not every AdamW parameter is determined. GPT-2's key bias (the middle third of every
attn.c_attn.bias) adds q . b_k to every score of a query row, a shift softmax ignores: its gradient
is exactly zero in exact arithmetic, and what a run computes is rounding noise. The same holds, in
the run's precision, for the few parameters whose true gradient is below the noise (|g| <= 64 u
max |g|, u the unit roundoff). AdamW divides by sqrt(v) and turns that noise into steps of up to lr
of either sign, so those parameters can differ between runs by up to 2 x steps x lr. So the key-bias
gradient is checked to be noise (in the committed and the fresh run), and the AdamW comparison holds
the undetermined parameters only to that bound and every other one to the tolerance above.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch  # noqa: F401  (only to know it is there)
except ImportError as e:
    print(f"SKIP: {e} (apt-get install python3-torch python3-numpy; run with /usr/bin/python3)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
committed = os.path.normpath(os.path.join(here, "..", "data", "reference"))
sys.path.insert(0, here)
from torch_reference import ADAMW, parameter_shapes  # noqa: E402  (the optimizer and the flat layout)

failures = 0
DTYPE = {"f32": "<f4", "f64": "<f8"}
TOL = {"f32": 1e-5, "f64": 1e-12}
# A noise gradient relative to max |g|: the key bias shows 1e-8 .. 4e-8 (float32, u = 6e-8) and
# 2e-17 .. 7e-17 (float64, u = 1.1e-16); 64 u leaves room for other summation orders over the T = 150
# positions and stays far below every determined bias gradient (> 1e-4 x max |g|).
NOISE = {"f32": 64 * 2.0**-24, "f64": 64 * 2.0**-53}
# Per step |m_hat / sqrt(v_hat)| <= 1.012 for betas (0.9, 0.95) and t <= 10 (Cauchy-Schwarz on the
# two moving averages), so each run moves an undetermined parameter by at most 1.012 x steps x lr.
UNDETERMINED_TOL = 2 * 1.02 * ADAMW["steps"] * ADAMW["lr"]


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


def compare(what, a, b, tol):
    scale = max(1.0, float(np.abs(a).max())) if a.size else 1.0
    err = (float(np.abs(a - b).max()) if a.size else 0.0) if a.shape == b.shape else float("inf")
    if err > tol * scale:
        fail(f"{what}: max |difference| {err:.3e} > {tol * scale:.3e}")
    else:
        print(f"ok {what}: max |difference| {err:.3e}")


def key_bias_mask(d):
    """True at the key-bias entries of model directory d's flat parameter layout (none for llama)."""
    c = json.load(open(os.path.join(committed, d, "config.json")))
    shapes = parameter_shapes(c)
    mask = np.zeros(sum(int(np.prod(s)) for _, s in shapes), dtype=bool)
    off = 0
    for name, shape in shapes:
        if name.endswith("attn.c_attn.bias"):  # [q | k | v], C each
            mask[off + c["dim"]:off + 2 * c["dim"]] = True
        off += int(np.prod(shape))
    return mask


with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, os.path.join(here, "torch_reference.py"), "--out", tmp], check=True,
                   stdout=subprocess.DEVNULL)
    index = json.load(open(os.path.join(committed, "index.json")))
    fresh = {m["name"]: m for m in json.load(open(os.path.join(tmp, "index.json")))["models"]}
    for m in index["models"]:
        d = m["dir"]
        load = lambda where, f: np.fromfile(os.path.join(where, d, f), dtype=DTYPE[f[-3:]])  # noqa: E731
        for f in ("model.safetensors", "config.json", "tokens.i32", "targets.i32"):
            a = open(os.path.join(committed, d, f), "rb").read()
            b = open(os.path.join(tmp, d, f), "rb").read()
            if a != b:
                fail(f"{d}/{f} differs from the committed file")
        key_bias = key_bias_mask(d)
        g64 = np.abs(load(committed, "grads.f64"))  # the most accurate gradient: decides what is noise
        for p in ("f32", "f64"):
            compare(f"{d}/logits.{p}", load(committed, f"logits.{p}"), load(tmp, f"logits.{p}"), TOL[p])
            compare(f"{d}/grads.{p}", load(committed, f"grads.{p}"), load(tmp, f"grads.{p}"), TOL[p])
            if key_bias.any():
                for where, g in (("committed", load(committed, f"grads.{p}")), ("fresh", load(tmp, f"grads.{p}"))):
                    ratio = float(np.abs(g[key_bias]).max() / np.abs(g).max()) if g.shape == key_bias.shape else np.inf
                    if ratio > NOISE[p]:
                        fail(f"{d}/grads.{p} ({where}): key-bias gradient {ratio:.3e} x max |g|, more than "
                             f"rounding noise ({NOISE[p]:.3e}); it is zero in exact arithmetic")
                    else:
                        print(f"ok {d}/grads.{p} ({where}): key-bias gradient {ratio:.3e} x max |g| (noise)")
            a, b = load(committed, f"adamw_params.{p}"), load(tmp, f"adamw_params.{p}")
            if a.shape != b.shape or a.shape != g64.shape:
                fail(f"{d}/adamw_params.{p}: {a.size} / {b.size} values for {g64.size} parameters")
                continue
            undetermined = key_bias | ((g64 > 0) & (g64 <= NOISE[p] * g64.max()))  # exact zeros: no noise
            compare(f"{d}/adamw_params.{p} ({int((~undetermined).sum())} determined)", a[~undetermined],
                    b[~undetermined], TOL[p])
            if undetermined.any():
                err = float(np.abs(a[undetermined] - b[undetermined]).max())
                if err > UNDETERMINED_TOL:
                    fail(f"{d}/adamw_params.{p} ({int(undetermined.sum())} undetermined): max |difference| "
                         f"{err:.3e} > {UNDETERMINED_TOL:.3e}, more than AdamW's steps allow")
                else:
                    print(f"ok {d}/adamw_params.{p} ({int(undetermined.sum())} undetermined): max |difference| "
                          f"{err:.3e} <= {UNDETERMINED_TOL:.3e}")
        n = fresh.get(m["name"], {})
        for key, a, b, tol in (("loss_f32", [m["loss_f32"]], [n.get("loss_f32")], 1e-5),
                               ("loss_f64", [m["loss_f64"]], [n.get("loss_f64")], 1e-12),
                               ("adamw.losses_f32", m["adamw"]["losses_f32"],
                                n.get("adamw", {}).get("losses_f32"), 1e-5),
                               ("adamw.losses_f64", m["adamw"]["losses_f64"],
                                n.get("adamw", {}).get("losses_f64"), 1e-12)):
            compare(f"{d} {key}", np.asarray(a, dtype=np.float64),
                    np.asarray(b if b is not None else [], dtype=np.float64), tol)
        other = {k: v for k, v in n.get("adamw", {}).items() if not k.startswith("losses")}
        mine = {k: v for k, v in m["adamw"].items() if not k.startswith("losses")}
        if other != mine:
            fail(f"{d} adamw hyperparameters / paths differ: {mine} vs {other}")
sys.exit(1 if failures else 0)
