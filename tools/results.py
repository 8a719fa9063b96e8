"""Verified reader of mantis result sets, and the number helpers its readers share.

A command's results (results.csv, results.json, ...) and DIR/manifest.json form one result set
(src/exp/study.h): manifest.json is written last and lists the SHA-256 of every file of the set under
"files". A directory without a manifest, or with a listed file that is missing or whose SHA-256
differs, holds an interrupted or mixed set; `load_result_set` refuses it with a one-line error
naming the file (ResultSetError, a SystemExit: a script that does not catch it exits with the
message on stderr and status 1).

JSON has no infinities or NaN, so mantis writes them as the strings "inf", "-inf" and "nan";
`load_result_set` turns those strings back into floats in every field except the few that hold
text (name, kind, rule, site, ...).

Used by tools/lamp_table.py and notebooks/lamp.ipynb; standard library only.
"""
import hashlib
import json
import math
import os

__all__ = ["ResultSetError", "load_result_set", "is_finite", "loglog_interp", "sig_figs", "round_to_interval",
           "fmt_num", "fmt_interval"]


class ResultSetError(SystemExit):
    """A result set that must not be read (no manifest, a missing file, a hash that differs)."""


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


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ResultSetError(f"{path}: malformed JSON ({what}): {e}") from None
    except OSError as e:
        raise ResultSetError(f"{path}: cannot read {what}: {e.strerror}") from None


def verify_result_set(d):
    """The manifest of result set `d` after checking every file it lists; ResultSetError otherwise."""
    mpath = os.path.join(d, "manifest.json")
    if not os.path.isdir(d):
        raise ResultSetError(f"{d}: not a directory (expected a result set: results.json, manifest.json, ...)")
    if not os.path.isfile(mpath):
        raise ResultSetError(f"{mpath}: no manifest: the result set is incomplete (an interrupted run?) or was "
                             "not written by a result-set writer; merge it again")
    man = _read_json(mpath, "result-set manifest")
    files = man.get("files") if isinstance(man, dict) else None
    if not isinstance(files, dict) or not files:
        raise ResultSetError(f"{mpath}: the manifest lists no files (\"files\": {{name: sha256}}): written by an "
                             "older mantis? merge the set again")
    for name, want in files.items():
        path = os.path.join(d, name)
        if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            raise ResultSetError(f"{mpath}: lists '{name}', which is outside the result set")
        if not os.path.isfile(path):
            raise ResultSetError(f"{path}: listed in the manifest but missing: an interrupted or mixed result set")
        got = _sha256(path)
        if got != want:
            raise ResultSetError(f"{path}: SHA-256 {got[:12]}… differs from the manifest's {str(want)[:12]}…: the "
                                 "file was changed after the set was written (an interrupted or mixed set)")
    return man


def load_result_set(d):
    """(manifest, cells) of result set `d` (a `mantis lamp sweep` output directory), verified.

    Every file listed in manifest["files"] must exist with its SHA-256, and results.json must be
    one of them. Numbers spelled "inf"/"-inf"/"nan" come back as floats. A partial set
    (manifest["partial"]) is returned as is: its cells are those present.
    """
    man = verify_result_set(d)
    if "results.json" not in man["files"]:
        raise ResultSetError(f"{os.path.join(d, 'manifest.json')}: results.json is not part of this result set")
    res = _read_json(os.path.join(d, "results.json"), "results")
    if not isinstance(res, dict) or not isinstance(res.get("cells"), list):
        raise ResultSetError(f"{os.path.join(d, 'results.json')}: no \"cells\" array")
    man = _numbers(man)
    man.setdefault("partial", False)
    man.setdefault("cells_missing", [])
    return man, _numbers(res["cells"])


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
