#!/bin/sh
# `meson install` into a DESTDIR, then the installed pieces used from elsewhere (cwd /), with no
# environment pointing at the trees: the binary (formats, round, and the GPT-2 tokenizer, which needs
# the installed data found from the binary's own path), no source or build path inside the binary,
# libmantis.a or the Python module; a 10-line program compiled against the installed
# headers and libmantis.a through pkg-config; the Python module imported from the installed
# site-packages. Usage: run_install.sh MESON SOURCE_ROOT BUILD_ROOT PREFIX BINDIR LIBDIR.
# Exit 77 (SKIP) only when a tool it needs is missing.
set -eu
meson=$1 src=$2 build=$3 prefix=$4 bindir=$5 libdir=$6
fail() { echo "FAIL: $*" >&2; exit 1; }
for p in pkg-config c++; do
  command -v "$p" >/dev/null 2>&1 || { echo "SKIP: $p not installed"; exit 77; }
done
unset MANTIS_DATA_DIR MANTIS_SOURCE_DIR PYTHONPATH

d=$(mktemp -d /tmp/mantis-install-XXXXXX)
trap 'rm -rf "$d"' EXIT
DESTDIR=$d/root "$meson" install -C "$build" --no-rebuild --quiet >"$d/install.log" 2>&1 ||
  { cat "$d/install.log" >&2; fail "meson install"; }
root=$d/root$prefix
case $bindir in /*) bin=$d/root$bindir/mantis ;; *) bin=$root/$bindir/mantis ;; esac
case $libdir in /*) lib=$d/root$libdir ;; *) lib=$root/$libdir ;; esac
[ -x "$bin" ] || fail "no installed binary at $bin"
[ -f "$root/share/mantis/data/gpt2/encoder.json" ] || fail "no installed data under $root/share/mantis/data"
[ -f "$root/share/mantis/tools/figures.py" ] || fail "no installed figure scripts under $root/share/mantis/tools"

# Nothing of the source or build tree is compiled in (the build root holds the source root's path
# or is beside it: both are checked).
for f in "$bin" "$lib/libmantis.a" $(find "$root" -name '_mantis*.so'); do
  for p in "$src" "$build"; do
    ! grep -a -F -q "$p" "$f" || fail "$f contains the path $p"
  done
done

cd /
"$bin" formats | grep -q bf16 || fail "mantis formats"
[ "$(echo 1.1 | "$bin" round --format bf16)" = 0x1.1ap+0 ] || fail "mantis round --format bf16"
! "$bin" --help 2>&1 | grep -F -q "$src" || fail "mantis --help shows $src"
! "$bin" bench --help 2>&1 | grep -F -q "$src" || fail "mantis bench --help shows $src"
# The GPT-2 tokenizer's files: found from the binary, in <prefix>/share/mantis/data.
[ "$(printf 'Hello world' | "$bin" tokenize)" = "15496 995" ] || fail "mantis tokenize (installed data)"
# A copy outside any install or build tree finds no data: one line, exit 2; MANTIS_DATA_DIR fixes it.
mkdir "$d/alone" && cp "$bin" "$d/alone/mantis"
set +e
printf 'Hello world' | "$d/alone/mantis" tokenize >/dev/null 2>"$d/alone.err"
rc=$?
set -e
[ $rc = 2 ] && grep -q MANTIS_DATA_DIR "$d/alone.err" && [ "$(wc -l <"$d/alone.err")" = 1 ] ||
  { cat "$d/alone.err" >&2; fail "a binary without data: exit $rc"; }
[ "$(printf 'Hello world' | MANTIS_DATA_DIR=$root/share/mantis/data "$d/alone/mantis" tokenize)" = "15496 995" ] ||
  fail "MANTIS_DATA_DIR"
# ... but needs none for token files: an eval of a byte-level model on an llm.c token shard.
/usr/bin/python3 -c '
import struct, sys
ids = list(sys.argv[2].encode())
h = struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253))
open(sys.argv[1], "wb").write(h + struct.pack("<%dH" % len(ids), *ids))
' "$d/t.bin" "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$d/alone/mantis" eval --model "$src/models/llama-bytes" --data "$d/t.bin" --seqs 1 --ctx 32 --policy lamp:4 \
  --out "$d/ev" -q >/dev/null 2>"$d/ev.err" || { cat "$d/ev.err" >&2; fail "a binary without data on a token file"; }
# The installed binary draws its figures with the installed scripts (where matplotlib is).
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  MANTIS_NO_FIGURES= "$bin" eval --model "$src/models/llama-bytes" --data "$d/t.bin" --seqs 1 --ctx 32 --policy lamp:4 \
    --out "$d/ev2" -q >/dev/null 2>"$d/ev2.err" || { cat "$d/ev2.err" >&2; fail "the installed binary's eval"; }
  [ -s "$d/ev2/ev2-windows.png" ] || { cat "$d/ev2.err" >&2; fail "the installed binary drew no figure"; }
fi

# The C++ library through pkg-config, mantis.pc's prefix moved to where DESTDIR put it (only its
# own: --define-variable would move those of the packages it requires too).
cat >"$d/use.cpp" <<'EOF'
#include <cstdio>
#include "core/format.h"
#include "core/round_array.h"
int main() {
  const float in[1] = {1.1f};
  float out[1];
  mantis::round_array(in, out, 1, mantis::format_lookup("bf16"), mantis::RoundOptions{});
  std::printf("%a\n", double(out[0]));
  return out[0] == 0x1.1ap+0f ? 0 : 1;
}
EOF
mkdir "$d/pc" && sed "s|^prefix=.*|prefix=$root|" "$lib/pkgconfig/mantis.pc" >"$d/pc/mantis.pc"
flags=$(PKG_CONFIG_PATH=$d/pc pkg-config --cflags --libs mantis) ||
  fail "pkg-config mantis"
# shellcheck disable=SC2086  # the flags are words
c++ -std=c++20 -o "$d/use" "$d/use.cpp" $flags || fail "compiling against the installed library: $flags"
[ "$("$d/use")" = 0x1.1ap+0 ] || fail "the program linked against libmantis.a"

# The Python module from the installed site-packages (Debian's interpreter, which has numpy).
so=$(find "$root" -name '_mantis*.so' | head -n 1)
if [ -z "$so" ]; then
  echo "no Python module installed (built without it): not checked"
elif ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "no numpy for /usr/bin/python3: the Python module is not checked"
else
  site=$(dirname "$(dirname "$so")")
  PYTHONPATH=$site /usr/bin/python3 -c '
import sys, numpy as np, mantis
assert mantis.__file__.startswith(sys.argv[1]), mantis.__file__
y = mantis.round(np.array([1.1], dtype=np.float32), "bf16")
assert float(y[0]) == float.fromhex("0x1.1ap+0"), y
' "$site" || fail "the installed Python module"
fi
echo "ok: installed under $root"
