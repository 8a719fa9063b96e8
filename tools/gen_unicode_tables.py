#!/usr/bin/env python3
"""Generate src/io/unicode_tables.inc: the code-point classes of the GPT-2 pre-tokenizer.

The GPT-2 pre-tokenizer regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
needs three classes of code points: letters (\\p{L} = Lu Ll Lt Lm Lo), numbers (\\p{N} = Nd Nl No)
and whitespace (\\s). Everything else is "other". The table lists the code point where each run
of equal class starts (sorted, first entry 0), so a lookup is one binary search.

Whitespace is \\s as the reference encoder (npm gpt-3-encoder, a JavaScript /u regex) defines it:
ECMAScript WhiteSpace + LineTerminator = U+0009..U+000D, U+FEFF, U+2028, U+2029 and every Zs
code point. (Python's `regex` module, which OpenAI's encoder used, differs on U+0085 (\\s there)
and U+FEFF (not \\s there).)

Sources (--source):
  node         the classes of the machine's `node` /u regex itself: \\p{L}, \\p{N}, \\s. The
               reference encoder runs on this engine, so this table reproduces it exactly.
               This is what the committed table uses.
  unicodedata  Python's unicodedata categories (L*, N*, Zs) + the fixed ECMAScript list above.
               Python 3.11's unicodedata is Unicode 14.0; node 20 is Unicode 17.0, so this
               source misses ~14,000 letters/numbers assigned in Unicode 15-17.

--check-node compares the generated classes with node's regex and exits 1 on any difference.
Output is written atomically (temp file + os.replace). Standard library only (+ `node`).

    python3 tools/gen_unicode_tables.py --source node            # regenerate the committed file
    python3 tools/gen_unicode_tables.py --source unicodedata --check-node --out /tmp/u.inc
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unicodedata

OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
NAMES = {OTHER: "other", LETTER: "letter", NUMBER: "number", SPACE: "space"}
MAX_CP = 0x110000
ECMA_SPACE_EXTRA = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0xFEFF, 0x2028, 0x2029]

# Prints [[first, class], ...] run starts over all code points (surrogates: other), and versions.
NODE_SCRIPT = r"""
const L = /^\p{L}$/u, N = /^\p{N}$/u, S = /^\s$/u;
const runs = []; let prev = -1;
for (let c = 0; c < 0x110000; c++) {
  let k = 0;
  if (c < 0xD800 || c > 0xDFFF) {
    const s = String.fromCodePoint(c);
    k = L.test(s) ? 1 : N.test(s) ? 2 : S.test(s) ? 3 : 0;
  }
  if (k !== prev) { runs.push([c, k]); prev = k; }
}
console.log(JSON.stringify({node: process.version, unicode: process.versions.unicode,
                            icu: process.versions.icu, runs}));
"""


def die(msg):
    print(f"gen_unicode_tables: {msg}", file=sys.stderr)
    sys.exit(2)


def from_node():
    try:
        p = subprocess.run(["node", "-e", NODE_SCRIPT], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"cannot run node: {e}")
    d = json.loads(p.stdout)
    desc = f"node {d['node']} regex /u classes (Unicode {d['unicode']}, ICU {d['icu']})"
    return [(a, k) for a, k in d["runs"]], desc


def expand(runs):
    cls = bytearray(MAX_CP)
    for i, (a, k) in enumerate(runs):
        b = runs[i + 1][0] if i + 1 < len(runs) else MAX_CP
        cls[a:b] = bytes([k]) * (b - a)
    return cls


def compress(cls):
    runs, prev = [], -1
    for c in range(MAX_CP):
        if cls[c] != prev:
            runs.append((c, cls[c]))
            prev = cls[c]
    return runs


def from_unicodedata():
    cls = bytearray(MAX_CP)
    for c in range(MAX_CP):
        if 0xD800 <= c <= 0xDFFF:
            continue
        cat = unicodedata.category(chr(c))
        if cat[0] == "L":
            cls[c] = LETTER
        elif cat[0] == "N":
            cls[c] = NUMBER
        elif cat == "Zs":
            cls[c] = SPACE
    for c in ECMA_SPACE_EXTRA:
        cls[c] = SPACE
    desc = f"Python {sys.version.split()[0]} unicodedata (Unicode {unicodedata.unidata_version}) + ECMAScript \\s"
    return compress(cls), desc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", choices=["node", "unicodedata"], default="node")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "src", "io", "unicode_tables.inc"))
    ap.add_argument("--check-node", action="store_true",
                    help="compare with node's regex classes; exit 1 on any difference")
    args = ap.parse_args()

    runs, desc = from_node() if args.source == "node" else from_unicodedata()
    if runs[0][0] != 0:
        die("table does not start at code point 0")

    if args.check_node:
        mine = expand(runs)
        ref = expand(from_node()[0])
        diff = [c for c in range(MAX_CP) if mine[c] != ref[c]]
        if diff:
            print(f"{len(diff)} code points differ from node, e.g. " +
                  ", ".join(f"U+{c:04X} {NAMES[mine[c]]}/{NAMES[ref[c]]}" for c in diff[:8]),
                  file=sys.stderr)
            status = 1
        else:
            print("identical to node's regex classes", file=sys.stderr)
            status = 0
    else:
        status = 0

    counts = {k: 0 for k in NAMES}
    for i, (a, k) in enumerate(runs):
        b = runs[i + 1][0] if i + 1 < len(runs) else MAX_CP
        counts[k] += b - a
    lines = [
        "// Generated by tools/gen_unicode_tables.py --source " + args.source + " -- do not edit.",
        "// Source: " + desc + ".",
        "// Code-point classes of the GPT-2 pre-tokenizer: 0 other, 1 letter (\\p{L}), 2 number (\\p{N}),",
        "// 3 whitespace (\\s, ECMAScript). Entry {first, class}: the class holds from `first` up to the",
        "// next entry's first - 1 (the last entry up to U+10FFFF). Surrogates are other.",
        f"// {len(runs)} runs; {counts[LETTER]} letters, {counts[NUMBER]} numbers, {counts[SPACE]} whitespace.",
        f'inline constexpr char kUnicodeTableSource[] = "{desc}";'.replace("\\s", "\\\\s"),
        "inline constexpr UnicodeClassRun kUnicodeClassRuns[] = {",
    ]
    row = []
    for a, k in runs:
        row.append(f"{{0x{a:05X}, {k}}},")
        if len(row) == 8:
            lines.append("    " + " ".join(row))
            row = []
    if row:
        lines.append("    " + " ".join(row))
    lines.append("};")
    text = "\n".join(lines) + "\n"

    out = os.path.abspath(args.out)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix="." + os.path.basename(out) + ".",
                               suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"wrote {out}: {len(runs)} runs ({desc})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
