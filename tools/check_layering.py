#!/usr/bin/env python3
"""Check the layering of src/ (src/README.md): every `#include "layer/..."` in a file of
src/<layer>/ must name a layer below it. Prints one line per violation; exit 1 if any."""
import pathlib
import re
import sys

# Which layers each layer may include (besides itself). io may read nn only for the model.
ALLOWED = {
    "core": set(),
    "nn": {"core"},
    "io": {"core", "nn/model.h"},
    "optim": {"core", "nn"},
    "train": {"core", "nn", "io", "optim"},
    "exp": {"core", "nn", "io", "optim", "train"},
    "cuda_emu": set(),  # CUDA's execution model on the CPU: the kernels of cuda/ run on it
    "cuda": {"core", "nn", "optim", "cuda_emu"},
    "cli": {"core", "nn", "io", "optim", "train", "exp", "cuda"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main() -> int:
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "src")
    bad = []
    for f in sorted(src.rglob("*")):
        if f.suffix not in {".h", ".cpp", ".cu", ".cuh", ".inc"}:
            continue
        rel = f.relative_to(src)
        if len(rel.parts) < 2:
            bad.append(f"{rel}: a source file outside the layer folders")
            continue
        layer = rel.parts[0]
        if layer not in ALLOWED:
            bad.append(f"{rel}: unknown layer folder '{layer}' (add it to tools/check_layering.py and src/README.md)")
            continue
        for inc in INCLUDE.findall(f.read_text(encoding="utf-8")):
            target = inc.split("/")[0]
            if "/" not in inc or target not in ALLOWED or target == layer:
                continue  # generated headers (mantis_config.h) and same-layer includes
            allowed = ALLOWED[layer]
            if target not in allowed and inc not in allowed:
                bad.append(f"{rel}: includes \"{inc}\": {layer} may include only {', '.join(sorted(allowed)) or 'nothing'}")
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
