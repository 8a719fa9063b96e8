"""Run a PyTorch measurement with every thread pool pinned to the same count.

torch.set_num_threads(n) sizes PyTorch's own pool only: Debian's torch calls OpenBLAS, which keeps a
pool of its own (as many threads as cores, fixed when the library loads). A "1-thread" PyTorch run
then uses every core, and 2-thread runs oversubscribe. So each measurement runs in a child process
whose environment sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS to n before torch is imported,
and which also calls torch.set_num_threads(n).

Usage in a benchmark script's main(): `th = pinned.child_threads()` first (None in the parent; in
the child it removes its own arguments from sys.argv), then parse the arguments; in the child
`return pinned.run_child(th, lambda torch: seconds)`; in the parent `pinned.measure(__file__, n,
sys.argv[1:])` per thread count n returns what the child printed.
"""
import json
import os
import subprocess
import sys

_FLAG = "--pinned-child"


def measure(script, threads, args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, script, _FLAG, str(threads)] + list(args), env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"error: the measurement exited {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def child_threads():
    if len(sys.argv) > 2 and sys.argv[1] == _FLAG:
        threads = int(sys.argv[2])
        del sys.argv[1:3]
        return threads
    return None


def blas_library():
    """The BLAS shared library this process has mapped (after a matrix product), or None."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line.lower() and line.rstrip().endswith(".so.3")
                or "openblas" in line.lower()}
    return sorted(libs)[0] if libs else None


def run_child(threads, fn):
    import torch
    torch.set_num_threads(threads)
    torch.ones(64, 64) @ torch.ones(64, 64)  # loads the BLAS
    lib = blas_library() or ""
    if "openblas" not in lib:
        # Debian's libblas3 (the reference BLAS) is 10-15x slower: a comparison with it is meaningless.
        sys.exit(f"error: PyTorch's BLAS is {lib or 'unknown'}, not OpenBLAS "
                 "(apt-get install libopenblas0-pthread)")
    print(json.dumps(fn(torch)))
    return 0
