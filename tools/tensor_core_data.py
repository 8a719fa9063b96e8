#!/usr/bin/env python3
"""Measured tensor-core outputs (github north-numerical-computing/MATLAB-tensor-core, BSD-2):
read a checkout's model_validation/ sets, check them against mantis, or pick the stratified subset
committed as tests/data/tensor_core/.

  tools/tensor_core_data.py check  CHECKOUT      every test of every set through mantis.gemm; per-set table
  tools/tensor_core_data.py subset CHECKOUT OUT  write the committed subset (deterministic)

A set is (GPU, input format, output format): a_/b_ files hold K binary32 words (hex) per test, the
values exact in the input format; c_ the addend (binary32 bits; rounded to nearest-even fp16 for an
fp16 output, as the authors' harness does with __float2half); d_ what the GPU produced. The H100 and
H200 FP8 -> fp32 sets were measured with wgmma and C = 0 (the authors' validation script), so their
c_ file is not used: the subset stores C = 0 for them.
"""
import os
import random
import struct
import sys

GPUS = ["V100", "A100", "A2", "Ada", "L40S", "H100", "H200", "B200"]
INPUTS = {"fp16": (11, -14), "bf16": (8, -126), "tf32": (11, -126), "E4M3": (4, -6), "E5M2": (3, -14)}
OUTPUTS = {"fp32": (24, -126), "fp16": (11, -14)}


def f32(word):
    return struct.unpack("<f", struct.pack("<I", word))[0]


def sets(root):
    """(gpu, input, output, tests) per set present, tests = [(a words, b words, c word, d word)]."""
    for g in GPUS:
        for i in INPUTS:
            for o in OUTPUTS:
                d = os.path.join(root, g, i)
                fd = os.path.join(d, f"d_{g}_{o}.txt")
                if not os.path.exists(fd):
                    continue
                A = [[int(w, 16) for w in l.split()] for l in open(os.path.join(d, f"a_{g}_{i}.txt")) if l.strip()]
                B = [[int(w, 16) for w in l.split()] for l in open(os.path.join(d, f"b_{g}_{i}.txt")) if l.strip()]
                C = [int(l.strip(), 2) for l in open(os.path.join(d, f"c_{g}_fp32.txt")) if l.strip()]
                D = [int(l.strip(), 2) for l in open(fd) if l.strip()]
                if not (len(A) == len(B) == len(D) <= len(C)):
                    sys.exit(f"{d}: a/b/c/d line counts differ ({len(A)}, {len(B)}, {len(C)}, {len(D)})")
                if g in ("H100", "H200") and i.startswith("E") and o == "fp32":
                    C = [0] * len(D)  # wgmma with C = 0
                yield g, i, o, list(zip(A, B, C[: len(D)], D))


def exponent(x):
    import math
    return math.frexp(abs(x))[1] - 1 if x != 0 else None


def strata(inp, out, t):
    """The categories a test belongs to (for the stratified subset)."""
    p, emin = INPUTS[inp]
    po, emino = OUTPUTS[out]
    a, b, c, d = t
    cats = set()
    vals = [f32(w) for w in a + b]
    if any(v == 0 for v in vals):
        cats.add("zero input")
    if any(v != 0 and abs(v) < 2.0 ** emin for v in vals):
        cats.add("subnormal input")
    dv, cv = f32(d), f32(c)
    if dv == 0:
        cats.add("zero output")
    elif abs(dv) < 2.0 ** emino:
        cats.add("subnormal output")
    if cv == 0:
        cats.add("zero addend")
    elif abs(cv) < 2.0 ** emino:
        cats.add("subnormal addend")
    return cats


def subset(root, outdir, per_set=120):
    os.makedirs(outdir, exist_ok=True)
    for g, i, o, tests in sets(root):
        rng = random.Random(f"{g}/{i}/{o}")
        pick = set()
        # Every zero / subnormal case of a category with at most 40 (a sample of 40 from larger ones:
        # FP8 inputs are often zero or subnormal), and the 8 most extreme
        # output and product exponents at each end.
        cats = {}
        for n, t in enumerate(tests):
            for c in strata(i, o, t):
                cats.setdefault(c, []).append(n)
        for c, ns in sorted(cats.items()):
            pick.update(rng.sample(ns, min(40, len(ns))))
        def dexp(n):
            e = exponent(f32(tests[n][3]))
            return e if e is not None else -10**6
        def pexp(n):
            a, b = tests[n][0], tests[n][1]
            es = [exponent(f32(x) * f32(y)) for x, y in zip(a, b) if f32(x) * f32(y) != 0]
            return max(es) if es else -10**6
        for key in (dexp, pexp):
            order = sorted(range(len(tests)), key=key)
            nz = [n for n in order if key(n) > -10**6]
            pick.update(nz[:8] + nz[-8:])
        rest = [n for n in range(len(tests)) if n not in pick]
        pick.update(rng.sample(rest, max(0, per_set - len(pick))))
        path = os.path.join(outdir, f"{g.lower()}_{i.lower()}_{o}.txt")
        with open(path, "w") as f:
            f.write(f"# {g} {i.lower()} -> {o}: {len(pick)} of the {len(tests)} measured tests "
                    f"(model_validation/{g}/{i}/); see README.md\n")
            f.write(f"# categories: " + ", ".join(f"{c} {len(v)}" for c, v in sorted(cats.items())) + "\n")
            f.write("# test-number | A words | B words | C word | D word (hex binary32)\n")
            for n in sorted(pick):
                a, b, c, d = tests[n]
                f.write(f"{n} | {' '.join(f'{w:08x}' for w in a)} | {' '.join(f'{w:08x}' for w in b)} | "
                        f"{c:08x} | {d:08x}\n")
        print(f"{path}: {len(pick)} tests; {', '.join(f'{c} {len(v)}' for c, v in sorted(cats.items()))}")


def check(root):
    import numpy as np
    import mantis
    total = good = 0
    rows = []
    for g, i, o, tests in sets(root):
        ok = 0
        for a, b, c, d in tests:
            A = np.array([[f32(w) for w in a]], dtype=np.float32)
            B = np.array([[f32(w)] for w in b], dtype=np.float32)
            C = np.array([[f32(c)]], dtype=np.float32)
            D = mantis.gemm(A, B, c=C, acc=o, input=i.lower(), accumulation="tensor_core", tensor_core=g.lower())
            want = f32(d)
            got = float(D[0, 0])
            ok += (got == want and np.signbit(got) == np.signbit(want)) or (got != got and want != want)
        rows.append((g, i.lower(), o, ok, len(tests)))
        total += len(tests)
        good += ok
    print(f"{'GPU':6} {'input':6} {'output':6} {'reproduced':>12}")
    for g, i, o, ok, n in rows:
        print(f"{g:6} {i:6} {o:6} {ok:>6}/{n:<5}{'' if ok == n else '  MISMATCH'}")
    print(f"{len(rows)} sets, {sum(r[3] == r[4] for r in rows)} bit for bit; {good}/{total} tests")
    return 0 if good == total else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        sys.exit(check(os.path.join(sys.argv[2], "model_validation")))
    if len(sys.argv) >= 4 and sys.argv[1] == "subset":
        subset(os.path.join(sys.argv[2], "model_validation"), sys.argv[3])
        sys.exit(0)
    sys.exit(__doc__)
