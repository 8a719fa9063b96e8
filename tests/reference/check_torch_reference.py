#!/usr/bin/python3
"""Re-runs torch_reference.py into a temporary directory and compares with the committed outputs.

Weights, tokens, targets and configs must be byte-identical; the logits, gradients and AdamW
parameters (and the losses in index.json) may move by rounding across torch/BLAS builds: float32
within 1e-5 x max(1, max |committed|), float64 within 1e-12 x max(1, max |committed|). Exit status 77
(Meson: SKIP) when PyTorch or NumPy is missing, 1 on a difference, 0 when everything agrees.
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
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, os.path.join(here, "torch_reference.py"), "--out", tmp], check=True,
                   stdout=subprocess.DEVNULL)
    index = json.load(open(os.path.join(committed, "index.json")))
    fresh = {m["name"]: m for m in json.load(open(os.path.join(tmp, "index.json")))["models"]}
    for m in index["models"]:
        d = m["dir"]
        for f in ("model.safetensors", "config.json", "tokens.i32", "targets.i32"):
            a = open(os.path.join(committed, d, f), "rb").read()
            b = open(os.path.join(tmp, d, f), "rb").read()
            if a != b:
                fail(f"{d}/{f} differs from the committed file")
        for f, dtype, tol in (("logits.f32", "<f4", 1e-5), ("logits.f64", "<f8", 1e-12),
                              ("grads.f32", "<f4", 1e-5), ("grads.f64", "<f8", 1e-12),
                              ("adamw_params.f32", "<f4", 1e-5), ("adamw_params.f64", "<f8", 1e-12)):
            a = np.fromfile(os.path.join(committed, d, f), dtype=dtype)
            b = np.fromfile(os.path.join(tmp, d, f), dtype=dtype)
            scale = max(1.0, float(np.abs(a).max()))
            err = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
            if err > tol * scale:
                fail(f"{d}/{f}: max |difference| {err:.3e} > {tol * scale:.3e}")
            else:
                print(f"ok {d}/{f}: max |difference| {err:.3e}")
        n = fresh.get(m["name"], {})
        for key, a, b, tol in (("loss_f32", [m["loss_f32"]], [n.get("loss_f32")], 1e-5),
                               ("loss_f64", [m["loss_f64"]], [n.get("loss_f64")], 1e-12),
                               ("adamw.losses_f32", m["adamw"]["losses_f32"],
                                n.get("adamw", {}).get("losses_f32"), 1e-5),
                               ("adamw.losses_f64", m["adamw"]["losses_f64"],
                                n.get("adamw", {}).get("losses_f64"), 1e-12)):
            a = np.asarray(a, dtype=np.float64)
            b = np.asarray(b if b is not None else [], dtype=np.float64)
            scale = max(1.0, float(np.abs(a).max()))
            err = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
            if err > tol * scale:
                fail(f"{d} {key}: max |difference| {err:.3e} > {tol * scale:.3e}")
            else:
                print(f"ok {d} {key}: max |difference| {err:.3e}")
        other = {k: v for k, v in n.get("adamw", {}).items() if not k.startswith("losses")}
        mine = {k: v for k, v in m["adamw"].items() if not k.startswith("losses")}
        if other != mine:
            fail(f"{d} adamw hyperparameters / paths differ: {mine} vs {other}")
sys.exit(1 if failures else 0)
