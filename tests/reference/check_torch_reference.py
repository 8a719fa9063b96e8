#!/usr/bin/python3
"""Re-runs torch_reference.py into a temporary directory and compares with the committed outputs.

Weights, tokens and configs must be byte-identical; the logits may move by rounding across
torch/BLAS builds: float32 within 1e-5 of the logit scale, float64 within 1e-12. Exit status 77
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
    for m in index["models"]:
        d = m["dir"]
        for f in ("model.safetensors", "config.json", "tokens.i32"):
            a = open(os.path.join(committed, d, f), "rb").read()
            b = open(os.path.join(tmp, d, f), "rb").read()
            if a != b:
                fail(f"{d}/{f} differs from the committed file")
        for f, dtype, tol in (("logits.f32", "<f4", 1e-5), ("logits.f64", "<f8", 1e-12)):
            a = np.fromfile(os.path.join(committed, d, f), dtype=dtype)
            b = np.fromfile(os.path.join(tmp, d, f), dtype=dtype)
            scale = max(1.0, float(np.abs(a).max()))
            err = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
            if err > tol * scale:
                fail(f"{d}/{f}: max |difference| {err:.3e} > {tol * scale:.3e}")
            else:
                print(f"ok {d}/{f}: max |difference| {err:.3e}")
sys.exit(1 if failures else 0)
