"""Verified reader of mantis result sets, and the number helpers its readers share.

A command's results (results.csv, results.json, ...) and DIR/manifest.json form one result set
(src/exp/study.h): manifest.json is written last and lists the SHA-256 of every file of the set under
"files". Readers hold every set to one rule (`read_result_set` here, which hands the reader the
bytes it hashed; read_result_set in src/exp/study.h for every C++ reader, whose comment states the
same rule in the same words):

  The result-set rule. A directory DIR holds a valid result set when
  1. DIR/manifest.json is a regular file (not a symbolic link) of at most 64 MiB holding one
     JSON object (RFC 8259: UTF-8 without a byte-order mark, no NaN or Infinity, no number
     beyond binary64's range, no unpaired surrogate), with no key twice in any object and at
     most 100 levels of nesting;
  2. its "files" is a non-empty object {name: SHA-256};
  3. every name is a relative path inside DIR: '/'-separated, not absolute, with no empty, '.'
     or '..' component, no backslash and no control character;
  4. every SHA-256 is a string of 64 lower-case hexadecimal digits;
  5. every file the reader reads is among the names;
  6. every name is a regular file reached from DIR without following a symbolic link, and its
     SHA-256 equals the listed one.
  Anything else is refused with one line naming the manifest or the file.

The refusal is ResultSetError (a SystemExit: a script that does not catch it exits with the
message on stderr and status 1). tests/test_result_set_rule.py holds both readers to the rule on
the same tampered sets.

JSON has no infinities or NaN, so mantis writes them as the strings "inf", "-inf" and "nan";
`load_result_set` turns those strings back into floats in every field except the few that hold
text (name, kind, rule, site, ...).

A reader parses the bytes read_result_set hands it (json_of, csv_rows; load_result_set and
load_result_set_csvs do both), never the file again by its path: a file replaced after its hash was
checked is not what the reader reads.

Used by tools/lamp_table.py, tools/figures.py, tools/optim_readme.py and notebooks/lamp.ipynb,
optim.ipynb, gnmr.ipynb; standard library only.
"""
import csv
import hashlib
import io
import json
import math
import os
import re
import stat

__all__ = ["ResultSetError", "read_result_set", "verify_result_set", "json_of", "csv_rows", "load_result_set",
           "load_result_set_csvs", "is_finite", "loglog_interp", "sig_figs", "round_to_interval", "fmt_num",
           "fmt_interval"]


def _one_line(s):
    """s as one line, escaped as the C++ side escapes an InputError's message (core/error.h:
    escape_control): C0 controls, DEL and C1 controls as \\xNN, U+2028 and U+2029 as \\uNNNN, and a
    byte that was not UTF-8 (a lone surrogate U+DC80..U+DCFF of os.fsdecode) as the \\xNN of that
    byte (another lone surrogate as \\uNNNN): nothing str.splitlines() splits at, nothing that
    cannot be encoded."""
    def esc(c):
        u = ord(c)
        if u < 0x20 or 0x7F <= u < 0xA0:
            return f"\\x{u:02x}"
        if 0xDC80 <= u <= 0xDCFF:
            return f"\\x{u - 0xDC00:02x}"
        if u in (0x2028, 0x2029) or 0xD800 <= u <= 0xDFFF:
            return f"\\u{u:04x}"
        return c
    return "".join(map(esc, s))


class ResultSetError(SystemExit):
    """A result set that must not be read (no manifest, a missing file, a hash that differs); its
    message is one line (_one_line), whatever names from the manifest or the caller it echoes."""

    def __init__(self, message):
        super().__init__(_one_line(str(message)))


# fields whose string values are text, never a spelled-out number
_TEXT_FIELDS = {"name", "kind", "rule", "site", "file", "spec", "tokenizer", "generator", "git_commit",
                "mantis_version", "config", "config_file", "config_sha256", "sha256", "model", "method"}
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _numbers(v, key=None):
    """v with "inf"/"-inf"/"nan" strings (outside text fields) as floats, recursively."""
    if isinstance(v, dict):
        return {k: _numbers(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers(x, key) for x in v]
    if isinstance(v, str) and key not in _TEXT_FIELDS and v in _SPECIAL:
        return _SPECIAL[v]
    return v


def _sha256(path, keep):
    """(SHA-256 of the file at path, its bytes where keep else None): a file the reader reads is
    hashed from the bytes it is then given, never read a second time."""
    h = hashlib.sha256()
    blocks = []
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                if keep:
                    blocks.append(block)
    except OSError as e:
        raise ResultSetError(f"{path}: cannot be read: {e.strerror}") from None
    return h.hexdigest(), b"".join(blocks) if keep else None


def json_of(raw, path, what="results"):
    """The JSON document raw (bytes of a result set's file, as read_result_set returns them; path
    names the file in a refusal); ResultSetError when it is not UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultSetError(f"{path}: malformed JSON ({what}): {e}") from None
    except RecursionError:  # deeper than the parser's recursion reaches
        raise ResultSetError(f"{path}: malformed JSON ({what}): nested too deeply") from None


def csv_rows(raw, path):
    """The rows of the CSV document raw (bytes of a result set's file, as read_result_set returns
    them; path names the file in a refusal) as dicts keyed by its header (csv.DictReader, values
    as text); ResultSetError when it is not UTF-8 CSV."""
    try:
        return list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))
    except (csv.Error, UnicodeDecodeError) as e:
        raise ResultSetError(f"{path}: malformed CSV: {e}") from None


_MANIFEST_MAX_BYTES = 64 << 20
_MANIFEST_MAX_DEPTH = 100
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Malformed(ValueError):
    pass


def _unique_keys(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _Malformed(f'the key "{k}" twice in one object')
        seen.add(k)
    return dict(pairs)


def _finite_float(s):
    x = float(s)
    if math.isinf(x):
        raise _Malformed(f"the number {s[:40]} is beyond binary64's range")
    return x


def _binary64_int(s):
    x = int(s)
    try:
        float(x)
    except OverflowError:
        raise _Malformed(f"the number {s[:40]}… is beyond binary64's range") from None
    return x


def _no_constant(s):
    raise _Malformed(f"{s} is not JSON")


def _nesting(v, limit):
    """Levels of nesting of v (a scalar 0, a container 1 + its deepest element), counted up to limit + 1."""
    if not isinstance(v, (dict, list)):
        if isinstance(v, str):
            v.encode("utf-8")  # an unpaired surrogate raises UnicodeEncodeError
        return 0
    d = 0
    for k, e in (v.items() if isinstance(v, dict) else enumerate(v)):
        if isinstance(k, str):
            k.encode("utf-8")
        if d >= limit:
            break
        d = max(d, _nesting(e, limit - 1))
    return d + 1


def _parse_manifest(mpath):
    """Rule 1: the manifest's JSON, refusing what two readers could read two ways."""
    try:
        with open(mpath, "rb") as f:
            raw = f.read(_MANIFEST_MAX_BYTES + 1)
    except OSError as e:
        raise ResultSetError(f"{mpath}: cannot read the manifest: {e.strerror}") from None
    if len(raw) > _MANIFEST_MAX_BYTES:
        raise ResultSetError(f"{mpath}: the manifest is larger than {_MANIFEST_MAX_BYTES} bytes")
    try:
        if raw.startswith(b"\xef\xbb\xbf"):
            raise _Malformed("a byte-order mark before the JSON")
        m = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_float=_finite_float,
                       parse_int=_binary64_int, parse_constant=_no_constant)
        if _nesting(m, _MANIFEST_MAX_DEPTH) > _MANIFEST_MAX_DEPTH:
            raise _Malformed(f"more than {_MANIFEST_MAX_DEPTH} levels of nesting")
    except RecursionError:
        raise ResultSetError(f"{mpath}: malformed manifest (more than {_MANIFEST_MAX_DEPTH} levels of nesting)") from None
    except (ValueError, UnicodeError) as e:  # JSONDecodeError, _Malformed, UnicodeDecodeError / EncodeError
        raise ResultSetError(f"{mpath}: malformed manifest ({e})") from None
    return m


def _plain_relative_path(name):
    """Rule 3: a relative path of plain components."""
    if not name or name.startswith("/") or any(c == "\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def read_result_set(d, reads):
    """(manifest, {name: bytes}) of result set `d` under the result-set rule (above), `reads` being
    the files the caller reads: their bytes, each hashed from the bytes returned (a file replaced
    after its hash was checked cannot be read in its place; as read_result_set in study.h).
    `reads` may be a function of the manifest (once rules 1 to 4 hold) that names them, for a
    reader whose files depend on what wrote the set: one read of the manifest either way.
    ResultSetError for anything the rule refuses."""
    if not os.path.isdir(d):
        raise ResultSetError(f"{d}: not a directory (expected a result set: its results and manifest.json)")
    mpath = os.path.join(d, "manifest.json")
    if not os.path.lexists(mpath):
        raise ResultSetError(f"{mpath}: no manifest: the result set is incomplete (an interrupted run?) or was "
                             "not written by a result-set writer; merge it again")
    if os.path.islink(mpath) or not os.path.isfile(mpath):
        raise ResultSetError(f"{mpath}: not a regular file ("
                             f"{'a symbolic link' if os.path.islink(mpath) else 'a directory or special file'}): "
                             "a result set's manifest is one")
    man = _parse_manifest(mpath)
    if not isinstance(man, dict):
        raise ResultSetError(f"{mpath}: not a JSON object")
    files = man.get("files")
    if not isinstance(files, dict) or not files:
        raise ResultSetError(f"{mpath}: lists no files (\"files\": {{name: sha256}}): written before result sets "
                             "carried them, or changed; write the set again")
    for name, want in files.items():
        if not _plain_relative_path(name):
            raise ResultSetError(f"{mpath}: lists '{name}', which is not a path inside the result set")
        if not isinstance(want, str) or not _SHA256.fullmatch(want):
            raise ResultSetError(f"{mpath}: the SHA-256 of '{name}' is not 64 lower-case hex digits")
    if callable(reads):
        reads = list(reads(man))
    for name in reads:
        if name not in files:
            raise ResultSetError(f"{mpath}: {name} is not part of this result set (the manifest does not list it)")
    content = {}
    for name, want in files.items():
        # every component from d down, without following a link
        path = d
        parts = name.split("/")
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            last = i == len(parts) - 1
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                raise ResultSetError(f"{path}: listed in {mpath} but missing (an interrupted or mixed result set)") \
                    from None
            except OSError as e:
                raise ResultSetError(f"{path}: cannot be read: {e.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                raise ResultSetError(f"{path}: a symbolic link, not a file of the result set ({mpath} lists {name})")
            if not (stat.S_ISREG(st.st_mode) if last else stat.S_ISDIR(st.st_mode)):
                raise ResultSetError(f"{path}: not a {'regular file' if last else 'directory'} ({mpath} lists {name})")
        got, raw = _sha256(path, name in reads)
        if got != want:
            raise ResultSetError(f"{path}: SHA-256 {got[:12]}… differs from the manifest's {want[:12]}…: changed "
                                 "after the set was written (an interrupted or mixed result set)")
        if raw is not None:
            content[name] = raw
    return man, content


def verify_result_set(d, reads=()):
    """The manifest of result set `d` under the result-set rule (above), `reads` being the files the
    caller reads (read_result_set, their bytes dropped); ResultSetError otherwise."""
    return read_result_set(d, reads)[0]


def load_result_set(d):
    """(manifest, cells) of result set `d` (a `mantis lamp sweep` output directory), verified.

    Every file listed in manifest["files"] must exist with its SHA-256, and results.json must be
    one of them. Numbers spelled "inf"/"-inf"/"nan" come back as floats. A partial set
    (manifest["partial"]) is returned as is: its cells are those present.
    """
    man, cells, _ = load_result_set_csvs(d, ())
    return man, cells


def load_result_set_csvs(d, names):
    """(manifest, cells, {name: rows}): load_result_set's manifest and cells, and the rows
    (csv_rows) of the CSV files `names` of the set, all from one read_result_set: what is parsed
    is what was hashed. Each of `names` must be listed in the manifest."""
    names = list(names)
    man, content = read_result_set(d, ["results.json"] + [n for n in names if n != "results.json"])
    res = json_of(content["results.json"], os.path.join(d, "results.json"), "results")
    if not isinstance(res, dict) or not isinstance(res.get("cells"), list):
        raise ResultSetError(f"{os.path.join(d, 'results.json')}: no \"cells\" array")
    man = _numbers(man)
    man.setdefault("partial", False)
    man.setdefault("cells_missing", [])
    return man, _numbers(res["cells"]), {n: csv_rows(content[n], os.path.join(d, n)) for n in names}


def is_finite(*xs):
    """True when every x is a real, finite number (None, strings, inf and NaN are not)."""
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in xs)


def loglog_interp(points, x):
    """Value at rate x of the curve through `points` [(rate, value), ...], linear in log–log.

    Points whose rate or value is not finite and positive are dropped (they have no place on log
    axes); several points at the same rate are merged into their geometric mean. None when x is
    not positive, when no point remains, or when x lies outside the range of the remaining
    rates (no extrapolation). The points need not be sorted, nor the curve monotone.
    """
    if not is_finite(x) or x <= 0:
        return None
    by_rate = {}
    for r, v in points:
        if is_finite(r, v) and r > 0 and v > 0:
            by_rate.setdefault(r, []).append(math.log(v))
    pts = sorted((math.log(r), sum(vs) / len(vs)) for r, vs in by_rate.items())
    if not pts:
        return None
    lx = math.log(x)
    if lx < pts[0][0] or lx > pts[-1][0]:
        # tolerate a rate equal to an end point up to rounding
        if math.isclose(lx, pts[0][0], abs_tol=1e-12):
            return math.exp(pts[0][1])
        if math.isclose(lx, pts[-1][0], abs_tol=1e-12):
            return math.exp(pts[-1][1])
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= lx <= x1:
            return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))
    return math.exp(pts[0][1])  # a single point, at x


def _decade(x):
    return math.floor(math.log10(abs(x)))


def sig_figs(x, lo, hi, default=3):
    """Significant figures of x that the interval [lo, hi] supports.

    Rule: keep the digits of x down to the decade of the interval's half-width (hi − lo)/2 —
    for x = 20.5 in [15.9, 28.7] the half-width 6.4 sits in the units, so x keeps 2 figures (21);
    for x = 0.0124 in [0.0086, 0.0168] the half-width 0.0041 sits in the thousandths (0.012).
    At least 1 and at most 4 figures: a point smaller than the spread keeps its leading digit,
    an interval of zero width (hi == lo: nothing varies over windows) keeps 4. Without a finite
    interval (None, inf, NaN) `default` figures.
    """
    if not is_finite(x) or x == 0:
        return default
    if not is_finite(lo, hi):
        return default
    h = abs(hi - lo) / 2
    if h == 0:
        return 4
    return max(1, min(4, _decade(x) - _decade(h) + 1))


def _round_sig(x, n):
    return float(f"{x:.{n - 1}e}") if is_finite(x) and x != 0 else x


def round_to_interval(x, lo, hi):
    """x rounded to the significant figures its interval supports (sig_figs); non-finite x as is."""
    if not is_finite(x) or x == 0:
        return x
    return round(x, -(_decade(x) - sig_figs(x, lo, hi) + 1))


def _positional(x):
    return -3 <= _decade(x) < 4


def fmt_num(x, n=3, sci=None):
    """x with n significant figures: positional for 1e-3 ≤ |x| < 1e4, else 1.2e-05-style
    scientific (sci=True/False forces either); "inf", "-inf", "nan" and "—" (None) for the rest."""
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    n = max(1, n)
    x = _round_sig(x, n)
    e = _decade(x)
    if (sci is None and _positional(x)) or sci is False:
        return f"{x:.{max(0, n - 1 - e)}f}"
    return f"{x:.{n - 1}e}"


def _fmt_at_decade(x, last, sci=None):
    """x rounded to decade `last` (its last digit there), but to at least its own leading figure
    and at most 6 significant figures."""
    if not is_finite(x) or x == 0:
        return fmt_num(x)
    last = min(last, _decade(x))  # never fewer than one figure of its own
    r = round(x, -last)
    return fmt_num(r, max(1, min(6, _decade(r) - last + 1)), sci)


def fmt_interval(x, lo, hi, scale=1.0, suffix=""):
    """"x [lo, hi]" with x rounded by round_to_interval and the ends to the same decade as x's
    last digit (each keeps at least one figure). `scale` multiplies all three first (100 for %)."""
    def s(v):
        return v * scale if is_finite(v) else v
    x, lo, hi = s(x), s(lo), s(hi)
    if not is_finite(x) or x == 0:
        body = fmt_num(x) + suffix
        if is_finite(lo) or is_finite(hi):
            body += f" [{fmt_num(lo)}, {fmt_num(hi)}]"
        return body
    last = _decade(x) - sig_figs(x, lo, hi) + 1  # the decade of x's last kept digit
    body = _fmt_at_decade(x, last) + suffix
    if lo is None or hi is None:
        return body
    sci = not _positional(round(x, -last))  # the ends in the point's style: 1.04e+04 [9.40e+03, …]
    return body + f" [{_fmt_at_decade(lo, last, sci)}, {_fmt_at_decade(hi, last, sci)}]"
