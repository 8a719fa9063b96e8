#!/usr/bin/python3
"""Reader side of atomic result sets (tools/results.py), and tools/lamp_table.py on a full and a
partial set. Run by tests/run_notebook.sh: python3 tests/test_results_py.py SRC_ROOT [PARTIAL_OUT]
(PARTIAL_OUT: where to leave the partial set, a directory that must not exist).

- the committed tests/data/lamp-small loads, and its inf/nan strings would come back as floats;
- a copy whose results.csv (or results.json) got one more byte after the manifest is refused,
  naming the file; so is a copy without manifest.json, one missing a listed file, a directory whose
  name holds line separators or is not UTF-8 (one line, escaped), and a results.json nested 100,000
  levels deep; every refusal is one line (str.splitlines());
- a results.json replaced right after the reader hashed it is not what the reader parses; nor is a
  CSV file of load_result_set_csvs, tools/optim_readme.py's summary.csv or tools/figures.py's
  curves.csv (each drawn or printed from the bytes hashed), and a file the drawing needs that the
  manifest does not list (figures.py: curves.csv, results.json) is refused in one line naming it;
- lamp_table.py prints every section of the full set, and of a partial set (a copy with cells
  removed from results.json and the manifest rewritten as the merge would: partial, cells_missing,
  new hashes), saying PARTIAL at the top;
- loglog_interp and round_to_interval on known values.
"""
import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import types

from script_checks import check, finish

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(src, "tools"))
import lamp_table  # noqa: E402
import results  # noqa: E402
import optim_readme  # noqa: E402
from results import (ResultSetError, csv_rows, fmt_interval, load_result_set, load_result_set_csvs,  # noqa: E402
                     loglog_interp, round_to_interval, sig_figs)

try:
    import matplotlib  # noqa: F401
except ImportError:  # figures.py exits at import without it
    figures = None
else:
    import figures

SET = os.path.join(src, "tests", "data", "lamp-small")
OPTIM_SET = os.path.join(src, "tests", "data", "optim-small")


def refused(d, name):
    """True when load_result_set(d) raises ResultSetError whose message names `name`."""
    try:
        load_result_set(d)
    except ResultSetError as e:
        msg = str(e)
        check(len(msg.splitlines()) == 1, f"one-line error, got {msg!r}")
        return name in msg
    except Exception as e:  # noqa: BLE001 — anything but ResultSetError is a failure of the reader
        check(False, f"load_result_set crashed: {type(e).__name__}: {str(e)[:100]}")
    return False


def rewrite_results_json(d, blob, **fields):
    """d/results.json replaced by blob, and the manifest rewritten as a writer would: its hash, and
    `fields` set."""
    with open(os.path.join(d, "results.json"), "wb") as f:
        f.write(blob)
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    m.update(fields)
    m["files"]["results.json"] = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(d, "manifest.json"), "w") as f:
        f.write(json.dumps(m, indent=1) + "\n")


def tables(d):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lamp_table.main([d])
    return out.getvalue()


def listed(d):
    """The manifest's {name: SHA-256} of set d."""
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["files"]


def unlist(d, name):
    """d's manifest without `name` among its files (the other hashes as they were)."""
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        m = json.load(f)
    del m["files"][name]
    with open(os.path.join(d, "manifest.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(m, indent=1) + "\n")


@contextlib.contextmanager
def swap_after_hash(d, name, replacement):
    """results.py's hashlib patched so that d/name is replaced by the bytes `replacement` the moment
    its listed SHA-256 has been computed (hashlib's digest is the moment): a reader that opened the
    file again would read the replacement. Yields a list that holds name once the swap happened."""
    want = listed(d)[name]
    swapped = []

    class SwapAfterHash:
        def __init__(self, data=b""):
            self.h = hashlib.sha256(data)

        def update(self, data):
            self.h.update(data)

        def hexdigest(self):
            got = self.h.hexdigest()
            if got == want and not swapped:
                with open(os.path.join(d, name), "wb") as f:
                    f.write(replacement)
                swapped.append(name)
            return got

    results.hashlib = types.SimpleNamespace(sha256=SwapAfterHash)
    try:
        yield swapped
    finally:
        results.hashlib = hashlib


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def refusal(fn, *args):
    """The one-line message of the ResultSetError fn(*args) raises, or None (a failed check) when it
    raises none."""
    try:
        fn(*args)
    except ResultSetError as e:
        msg = str(e)
        check(len(msg.splitlines()) == 1, f"one-line error, got {msg!r}")
        return msg
    check(False, f"{getattr(fn, '__name__', fn)}{args} raised no ResultSetError")
    return None


man, cells = load_result_set(SET)
check(not man["partial"] and len(cells) == man["cells"], "the committed set is complete")
check(all("kl_interval" in c and "per_layer" in c for c in cells), "cells have kl_interval and per_layer")

with tempfile.TemporaryDirectory() as tmp:
    for victim in ("results.csv", "results.json"):
        d = os.path.join(tmp, "append-" + victim)
        shutil.copytree(SET, d)
        with open(os.path.join(d, victim), "ab") as f:
            f.write(b" ")
        check(refused(d, victim), f"a set whose {victim} was modified after the manifest is refused naming it")
    d = os.path.join(tmp, "no-manifest")
    shutil.copytree(SET, d)
    os.remove(os.path.join(d, "manifest.json"))
    check(refused(d, "manifest.json"), "a set without manifest.json is refused")
    d = os.path.join(tmp, "no-csv")
    shutil.copytree(SET, d)
    os.remove(os.path.join(d, "results.csv"))
    check(refused(d, "results.csv"), "a set missing a listed file is refused")
    # a directory name with characters str.splitlines() splits at (U+2028, NEL) and a C1 control
    d = os.path.join(tmp, "no\u2028such\x85set\x9b")
    check(refused(d, "no\\u2028such\\x85set\\x9b"), "a missing set's name is escaped in its refusal")
    d = os.path.join(tmp, os.fsdecode(b"not-utf8-\xff"))  # the byte comes back as \xff, not a lone surrogate
    check(refused(d, "not-utf8-\\xff"), "a name that is not UTF-8 is escaped in its refusal")

    # results.json replaced right after the reader hashed it (hashlib's digest is the moment): the
    # cells returned must be those hashed, not the replacement's
    d = os.path.join(tmp, "swapped")
    shutil.copytree(SET, d)
    with swap_after_hash(d, "results.json", b'{"cells": []}\n') as swapped:
        _, got = load_result_set(d)
    check(swapped, "results.json was swapped after its hash")
    check(len(got) == len(cells), f"the cells read are those hashed ({len(got)} of {len(cells)} cells read)")

    # the CSV files of a set, each swapped right after its hash: load_result_set_csvs hands back the
    # rows of the bytes hashed
    for name in ("summary.csv", "gefen_error.csv"):
        d = os.path.join(tmp, "swapped-" + name)
        shutil.copytree(OPTIM_SET, d)
        hashed = csv_rows(read_bytes(os.path.join(d, name)), name)
        with swap_after_hash(d, name, b"model,optimizer\nswapped,swapped\n") as swapped:
            _, _, rows = load_result_set_csvs(d, ("summary.csv", "gefen_error.csv"))
        check(swapped and read_bytes(os.path.join(d, name)).startswith(b"model,optimizer\nswapped"),
              f"{name} was swapped after its hash")
        check(len(hashed) > 1 and rows[name] == hashed,
              f"load_result_set_csvs: the rows of {name} are those hashed "
              f"({len(rows[name])} rows, {len(hashed)} hashed)")
    d = os.path.join(tmp, "csv-unlisted")
    shutil.copytree(OPTIM_SET, d)
    unlist(d, "gefen_error.csv")
    msg = refusal(load_result_set_csvs, d, ("summary.csv", "gefen_error.csv"))
    check(msg is not None and "gefen_error.csv" in msg,
          f"a CSV file the manifest does not list is refused naming it: {msg}")

    # tools/optim_readme.py prints from the summary.csv hashed: the same tables as from the set
    # untouched (after the first line, which names the directory)
    def readme(d):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            optim_readme.main(d)
        return out.getvalue().splitlines()[1:]
    d = os.path.join(tmp, "readme-swapped")
    shutil.copytree(OPTIM_SET, d)
    with swap_after_hash(d, "summary.csv", b"model,optimizer\n") as swapped:
        printed = readme(d)
    want = readme(OPTIM_SET)
    check(swapped, "summary.csv was swapped after its hash (optim_readme)")
    check(any("| adamw |" in line for line in want) and printed == want,
          "optim_readme.py prints the tables of the summary.csv hashed, not of its replacement")

    if figures is None:
        print("note: matplotlib is not installed: tools/figures.py not checked")
    else:
        # tools/figures.py draws curves.csv from the bytes hashed: what curves() gets is their rows
        drawn = []
        draw_curves = figures.curves

        def recording_curves(d, rows, *args, **kw):
            drawn.append(rows)
            return draw_curves(d, rows, *args, **kw)
        d = os.path.join(tmp, "figures-swapped")
        shutil.copytree(OPTIM_SET, d)
        hashed = csv_rows(read_bytes(os.path.join(d, "curves.csv")), "curves.csv")
        figures.curves = recording_curves
        try:
            with swap_after_hash(d, "curves.csv", b"step,val_loss_nats\n1,99\n") as swapped:
                pngs = figures.draw(d, tmp)
        finally:
            figures.curves = draw_curves
        check(swapped, "curves.csv was swapped after its hash (figures)")
        check(len(drawn) == 1 and len(hashed) > 1 and drawn[0] == hashed,
              "figures.py draws the rows of the curves.csv hashed, not of its replacement")
        check(pngs == [os.path.join(tmp, "figures-swapped-val-curves.png")] and os.path.getsize(pngs[0]) > 0,
              f"figures.py wrote the curves' PNG: {pngs}")
        # a file the drawing needs that the manifest does not list: refused naming it, nothing drawn
        d = os.path.join(tmp, "figures-unlisted")
        shutil.copytree(OPTIM_SET, d)
        unlist(d, "curves.csv")
        msg = refusal(figures.draw, d, tmp)
        check(msg is not None and "no curves.csv to draw" in msg,
              f"figures.py refuses a set whose manifest does not list curves.csv, naming it: {msg}")
        # results.json changed and no longer listed: read unverified before, refused now
        d = os.path.join(tmp, "figures-json-unlisted")
        shutil.copytree(SET, d)
        unlist(d, "results.json")
        with open(os.path.join(d, "results.json"), "w", encoding="utf-8") as f:
            f.write('{"cells": []}\n')
        msg = refusal(figures.draw, d, tmp)
        check(msg is not None and "no results.json to draw" in msg,
              f"figures.py refuses a set whose manifest does not list results.json, naming it: {msg}")
        check(not os.path.exists(os.path.join(tmp, "figures-json-unlisted-kl-vs-recompute.png")),
              "nothing drawn of an unlisted results.json")

    # a results.json nested deeper than Python's parser recurses, listed with its true hash
    d = os.path.join(tmp, "deep")
    shutil.copytree(SET, d)
    rewrite_results_json(d, b'{"cells": ' + b"[" * 100000 + b"]" * 100000 + b"}")
    check(refused(d, "results.json"), "a results.json nested 100,000 levels deep is refused naming it")

    # a partial set, written as the merge would write one: every cell of mu = 10 gone, and the
    # strict mu = 4 tau = 1 cell; "inf"/"nan" strings in place of numbers of one cell
    d = os.path.join(tmp, "partial")
    shutil.copytree(SET, d)
    res = json.load(open(os.path.join(d, "results.json")))
    keep, missing = [], []
    for c in res["cells"]:
        if c["mu"] == 10 or (c["mu"] == 4 and c["rule"] == "strict" and c["tau"] == 1):
            missing.append(c["cell"])
        else:
            keep.append(c)
    bad = next(c for c in keep if c["kind"] == "lamp" and c["rule"] == "relaxed" and not c["random_control"])
    bad["kl"], bad["kl_interval"], bad["kl_ratio"], bad["kl_ratio_interval"] = "inf", ["nan", "inf"], 0.0, [0, 0]
    res["cells"] = keep
    rewrite_results_json(d, (json.dumps(res, indent=1) + "\n").encode(), partial=True, cells_missing=missing)
    pm, pc = load_result_set(d)
    pbad = next(c for c in pc if c["cell"] == bad["cell"])
    check(pm["partial"] and pm["cells_missing"] == missing, "partial manifest read")
    check(math.isinf(pbad["kl"]) and math.isnan(pbad["kl_interval"][0]), "'inf'/'nan' strings read as floats")
    check(isinstance(pbad["name"], str) and isinstance(pbad["rule"], str), "text fields stay text")
    out = tables(d)
    check(out.splitlines()[2].startswith("**PARTIAL"), "a partial set says so at the top")
    if len(sys.argv) > 2:  # keep the partial set (run_notebook.sh runs the notebook on it too)
        shutil.copytree(d, sys.argv[2])
    if os.environ.get("VERBOSE"):
        print(out)

full = tables(SET)
check("PARTIAL" not in full, "a complete set is not called partial")
for s in ("uniform ps<μ> KL", "best rule cell", "strict rule, μ = 4", "relaxed rule, μ = 4", "| recompute | paper |",
          "Per-layer recompute rate", "| 0.300 % | 12× |"):
    check(s in full, f"lamp_table.py prints '{s}'")

check(abs(loglog_interp([(0.01, 100), (0.1, 10)], 10 ** -1.5) - 10 ** 1.5) < 1e-9, "loglog_interp midpoint")
check(loglog_interp([(0.01, 100), (0.1, 10)], 0.2) is None, "loglog_interp: no extrapolation")
check(loglog_interp([(0.01, 100), (0.1, math.inf), (0.0, 5)], 0.05) is None, "loglog_interp drops non-finite/zero")
check(round_to_interval(20.5155, 15.934, 28.69) == 21, "round_to_interval: 2 figures")
check(round_to_interval(0.0124139, 0.0086, 0.01682) == 0.012, "round_to_interval: small values")
check(sig_figs(1234.5678, 1234.5, 1234.6) == 4 and sig_figs(0.3, 0.1, 10) == 1, "sig_figs clamps to 1..4")
check(fmt_interval(1178.8, 592.6, 2640) == "1000 [600, 3000]", "fmt_interval ends keep a figure of their own")

finish("results.py / lamp_table.py checks passed")
