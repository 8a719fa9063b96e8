#!/usr/bin/python3
"""The result-set rule (src/exp/study.h, tools/results.py) held by both readers on the same sets.

Run by Meson: python3 tests/test_result_set_rule.py SRC_ROOT MANTIS_BIN.

From a copy of the committed tests/data/lamp-small, each case below builds a set (many of them with
a tampered results.csv that the tampering tries to pass off), then
- the C++ reader, `mantis merge DIR` (exp/merge.cpp: read_result_set with results.csv), must exit 2
  with one line "mantis: error: …" and nothing on stdout — or exit 0 for a valid set (ACCEPTED);
- tools/results.py, `verify_result_set(DIR, ["results.csv"])`, must raise ResultSetError with a
  one-line message — or return the manifest for a valid set.
The two must agree on every case.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from script_checks import check, finish

src, mantis = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tools"))
from results import ResultSetError, load_result_set, verify_result_set  # noqa: E402

SET = os.path.join(src, "tests", "data", "lamp-small")


def sha(b):
    return hashlib.sha256(b).hexdigest()


def manifest(d):
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def write_manifest(d, m=None, text=None):
    p = os.path.join(d, "manifest.json")
    if os.path.islink(p):
        os.remove(p)
    with open(p, "w", encoding="utf-8") as f:
        f.write(text if text is not None else json.dumps(m, indent=1) + "\n")


def tamper_csv(d):
    """results.csv with one more row, and the bytes it now holds."""
    p = os.path.join(d, "results.csv")
    with open(p, "rb") as f:
        last = f.read().rstrip(b"\n").split(b"\n")[-1]
    with open(p, "ab") as f:
        f.write(b"99" + last[last.index(b","):] + b"\n")  # the last row again, as cell 99
    with open(p, "rb") as f:
        return f.read()


def files_set(d, files):
    m = manifest(d)
    m["files"] = files
    write_manifest(d, m)


# Each case: (name, what it does to a fresh copy in directory d, under the scratch directory tmp).
def empty_files(d, tmp):
    tamper_csv(d)
    files_set(d, {})


def no_csv_listed(d, tmp):
    tamper_csv(d)
    m = manifest(d)
    del m["files"]["results.csv"]
    write_manifest(d, m)


def outside_file(tmp, name):
    """A file outside every set, and its SHA-256."""
    p = os.path.join(tmp, name)
    with open(p, "wb") as f:
        f.write(b"a,b\n1,2\n")
    return p, sha(b"a,b\n1,2\n")


def dotdot(d, tmp):
    # an untampered set plus a file outside it, listed through ../ with its true hash
    p, h = outside_file(tmp, "outside.csv")
    m = manifest(d)
    m["files"]["../outside.csv"] = h
    write_manifest(d, m)


def dotdot_inside(d, tmp):
    m = manifest(d)
    m["files"]["cells/../results.csv"] = m["files"]["results.csv"]
    write_manifest(d, m)


def absolute(d, tmp):
    p, h = outside_file(tmp, "abs.csv")
    m = manifest(d)
    m["files"][os.path.abspath(p)] = h
    write_manifest(d, m)


def link_out(d, tmp, name):
    """d/name moved out of the set (to tmp/<case>-name), a symbolic link to it left in its place."""
    outside = os.path.join(tmp, os.path.basename(d) + "-" + name)
    shutil.move(os.path.join(d, name), outside)
    os.symlink(outside, os.path.join(d, name))


def symlink_outside(d, tmp):
    # results.csv a link to a file outside the set with the listed content: the hash alone passes
    link_out(d, tmp, "results.csv")


def symlink_dir(d, tmp):
    # a listed file under a directory that is a link out of the set
    outside = os.path.join(tmp, "linked-dir")
    os.makedirs(outside, exist_ok=True)
    with open(os.path.join(outside, "x.csv"), "wb") as f:
        f.write(b"a\n1\n")
    os.symlink(outside, os.path.join(d, "sub"))
    m = manifest(d)
    m["files"]["sub/x.csv"] = sha(b"a\n1\n")
    write_manifest(d, m)


def manifest_symlink(d, tmp):
    link_out(d, tmp, "manifest.json")


def listed_missing(d, tmp):
    m = manifest(d)
    m["files"]["extra.csv"] = sha(b"")
    write_manifest(d, m)


def listed_directory(d, tmp):
    os.makedirs(os.path.join(d, "adir"))
    m = manifest(d)
    m["files"]["adir"] = sha(b"")
    write_manifest(d, m)


def changed_byte(d, tmp):
    p = os.path.join(d, "results.csv")
    with open(p, "rb") as f:
        b = bytearray(f.read())
    b[len(b) // 2] ^= 0x01
    with open(p, "wb") as f:
        f.write(b)


def no_manifest(d, tmp):
    os.remove(os.path.join(d, "manifest.json"))


def not_json(d, tmp):
    write_manifest(d, text='{"files": {"results.csv": ')


def not_object(d, tmp):
    write_manifest(d, text='["results.csv"]\n')


def no_files(d, tmp):
    m = manifest(d)
    del m["files"]
    write_manifest(d, m)


def files_not_object(d, tmp):
    files_set(d, ["results.csv", "results.json"])


def sha_not_string(d, tmp):
    m = manifest(d)
    m["files"]["results.csv"] = 12345
    write_manifest(d, m)


def sha_null(d, tmp):
    m = manifest(d)
    m["files"]["results.json"] = None
    write_manifest(d, m)


def sha_upper(d, tmp):
    m = manifest(d)
    m["files"]["results.csv"] = m["files"]["results.csv"].upper()
    write_manifest(d, m)


def duplicate_key(d, tmp):
    # two entries for results.csv: readers that keep the first and readers that keep the last
    # would disagree on which hash holds
    forged = tamper_csv(d)
    m = manifest(d)
    good = m["files"]["results.csv"]
    text = json.dumps(m, indent=1)
    text = text.replace(f'"results.csv": "{good}"', f'"results.csv": "{good}", "results.csv": "{sha(forged)}"', 1)
    write_manifest(d, text=text)


def control_name(d, tmp):
    m = manifest(d)
    m["files"]["results\n.csv"] = m["files"]["results.csv"]
    write_manifest(d, m)


# Names with the characters str.splitlines() splits at beyond C0 (U+0085 NEL, U+2028, U+2029) and a
# C1 control: echoed in the refusal, they must not break its line.
SEPARATED = "a\u2028b\x85c\u2029d\x9b"


def separator_name(d, tmp):
    m = manifest(d)
    m["files"][SEPARATED] = m["files"]["results.csv"]  # listed, missing
    write_manifest(d, m)


def separator_name_bad_sha(d, tmp):
    m = manifest(d)
    m["files"][SEPARATED] = "x"
    write_manifest(d, m)


def separator_key_twice(d, tmp):
    raw_manifest(d, json.dumps(SEPARATED) + ": 1, " + json.dumps(SEPARATED) + ": 2")


def empty_name(d, tmp):
    m = manifest(d)
    m["files"][""] = sha(b"")
    write_manifest(d, m)


def raw_manifest(d, before_files):
    """The manifest's text with `before_files` (raw JSON text) inserted as its first member."""
    text = open(os.path.join(d, "manifest.json"), encoding="utf-8").read()
    write_manifest(d, text="{" + before_files + ", " + text.lstrip()[1:])


def byte_order_mark(d, tmp):
    text = open(os.path.join(d, "manifest.json"), encoding="utf-8").read()
    write_manifest(d, text="\ufeff" + text)


def nan_literal(d, tmp):
    raw_manifest(d, '"x_nan": NaN')


def infinity_literal(d, tmp):
    raw_manifest(d, '"x_inf": -Infinity')


def float_overflow(d, tmp):
    raw_manifest(d, '"x_big": 1e400')


def int_overflow(d, tmp):
    raw_manifest(d, '"x_big": 1' + "0" * 400)


def unpaired_surrogate(d, tmp):
    raw_manifest(d, '"x_text": "a\\ud800b"')


def invalid_utf8(d, tmp):
    p = os.path.join(d, "manifest.json")
    raw = open(p, "rb").read()
    open(p, "wb").write(b'{"x_text": "a\xff", ' + raw.lstrip()[1:])


def nesting_101(d, tmp):
    raw_manifest(d, '"extra": ' + "[" * 100 + "]" * 100)  # with the manifest's object: 101 levels


def nesting_deep(d, tmp):
    raw_manifest(d, '"extra": ' + "[" * 5000 + "]" * 5000)


def not_a_directory(d, tmp):
    shutil.rmtree(d)
    with open(d, "w") as f:
        f.write("x\n")


def untampered(d, tmp):
    pass


def nesting_100(d, tmp):
    raw_manifest(d, '"extra": ' + "[" * 99 + "]" * 99)  # with the manifest's object: 100 levels, allowed


def big_integer(d, tmp):
    raw_manifest(d, '"extra": 1' + "0" * 300)  # beyond 64 bits, within binary64: a number like any other


CASES = [(f.__name__, f) for f in (
    empty_files, no_csv_listed, dotdot, dotdot_inside, absolute, symlink_outside, symlink_dir, manifest_symlink,
    listed_missing, listed_directory, changed_byte, no_manifest, not_json, not_object, no_files, files_not_object,
    sha_not_string, sha_null, sha_upper, duplicate_key, control_name, separator_name, separator_name_bad_sha,
    separator_key_twice, empty_name, byte_order_mark, nan_literal,
    infinity_literal, float_overflow, int_overflow, unpaired_surrogate, invalid_utf8, nesting_101, nesting_deep,
    not_a_directory)]
ACCEPTED = [(f.__name__, f) for f in (untampered, nesting_100, big_integer)]


def cpp_verdict(d):
    r = subprocess.run([mantis, "merge", d], capture_output=True, text=True, errors="backslashreplace", timeout=120,
                       env=dict(os.environ, MANTIS_NO_FIGURES="1"))
    if r.returncode == 0:
        return "accepted", r.stdout
    one_line = r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and \
        r.stderr.startswith("mantis: error: ")
    return ("refused" if one_line else f"bad refusal (exit {r.returncode}: {r.stderr!r})"), r.stderr


def py_verdict(d, reads):
    try:
        verify_result_set(d, reads)
    except ResultSetError as e:
        msg = str(e)
        return ("refused" if len(msg.splitlines()) == 1 else f"bad refusal ({msg!r})"), msg
    except Exception as e:  # noqa: BLE001 — anything but ResultSetError is a failure of the reader
        return f"crashed ({type(e).__name__}: {e})", ""
    return "accepted", ""


with tempfile.TemporaryDirectory() as tmp:
    for name, make in ACCEPTED + CASES:
        d = os.path.join(tmp, name)
        shutil.copytree(SET, d, ignore=shutil.ignore_patterns("cells"))
        make(d, tmp)
        want = "refused" if (name, make) in CASES else "accepted"
        c, cmsg = cpp_verdict(d)
        p, pmsg = py_verdict(d, ["results.csv"])
        print(f"{name:18} mantis merge: {c:9} results.py: {p:9} | {cmsg.strip()[:110]} | {pmsg[:110]}")
        check(c == want, f"{name}: mantis merge {c}, expected {want}")
        check(p == want, f"{name}: results.py {p}, expected {want}")

    # the reader names what it reads: results.py's load_result_set reads results.json
    d = os.path.join(tmp, "no-json-listed")
    shutil.copytree(SET, d, ignore=shutil.ignore_patterns("cells"))
    m = manifest(d)
    del m["files"]["results.json"]
    write_manifest(d, m)
    try:
        load_result_set(d)
        check(False, "load_result_set accepts a set whose manifest does not list results.json")
    except ResultSetError as e:
        check("results.json" in str(e) and len(str(e).splitlines()) == 1,
              f"load_result_set's refusal names results.json: {e}")
    check(py_verdict(d, ["results.csv"])[0] == "accepted", "a set without results.json verifies for a CSV reader")

finish(f"result-set rule: {len(CASES)} tampered sets refused by mantis merge and tools/results.py, {len(ACCEPTED)} "
       "valid ones accepted by both")
