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
    out = subprocess.run([sys.executable, script, _FLAG, str(threads)] + list(args), env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def child_threads():
    if len(sys.argv) > 2 and sys.argv[1] == _FLAG:
        threads = int(sys.argv[2])
        del sys.argv[1:3]
        return threads
    return None


def run_child(threads, fn):
    import torch
    torch.set_num_threads(threads)
    print(json.dumps(fn(torch)))
    return 0
