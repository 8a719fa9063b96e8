#!/bin/sh
# State bytes per parameter at GPT-2-small scale (124,439,808 parameters, HF layout via
# ModelConfig's defaults), measured through `mantis optim replay` for every registered optimizer
# on structured random gradients (`mantis optim synth`: Philox values, row scales that vary, so
# each matrix's rows are detectable blocks), beside the analytic figures of
# ../shared/reference/training-and-style-anchors.md §5. Writes experiments/optim/state-bytes.md.
#   usage: experiments/optim/state-bytes.sh [MANTIS_BINARY] [STEPS]   (from the source root)
# Needs ~1.5 GB of disk in $TMPDIR and a few GB of memory; minutes per optimizer on 2 cores.
set -eu
bin=${1:-build/src/cli/mantis}
steps=${2:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mantis-state-bytes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
out=experiments/optim/state-bytes.md

"$bin" optim synth --config gpt2-124m --steps "$steps" --seed 1 --params "$tmp/p.safetensors" \
  --grads "$tmp/g.safetensors" --write-config "$tmp/config.json"
: > "$tmp/results.jsonl"
for name in $("$bin" optim list | cut -f1); do
  echo "replay: $name" >&2
  "$bin" optim replay --optimizer "$name" --params "$tmp/p.safetensors" --grads "$tmp/g.safetensors" \
    --steps "$steps" --config "$tmp/config.json" --json >> "$tmp/results.jsonl"
done

/usr/bin/python3 - "$tmp/results.jsonl" "$out" "$steps" "$(git rev-parse HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# anchors §5 (GPT-2 small, HF layout, fp32 parameters)
analytic = {"adamw": "8.000", "adam8bit": "2.037", "adam4bit": "1.069", "adam-mini": "4.007",
            "adafactor": "0.010", "sm3": "0.010", "gefen": "1.013 (every matrix its row period)"}
with open(sys.argv[2], "w") as f:
    f.write("# Optimizer state bytes at GPT-2-small scale\n\n")
    f.write("Measured by `experiments/optim/state-bytes.sh` (commit %s): `mantis optim synth --config gpt2-124m "
            "--steps %s --seed 1`, then `mantis optim replay --json` of each registered optimizer with the model's "
            "config.json (roles known). state_bytes counts every stored tensor at its stored dtype plus the "
            "8-byte step count.\n\n" % (sys.argv[4], sys.argv[3]))
    f.write("| optimizer | parameters | state bytes | bytes / parameter | analytic (anchors §5) |\n")
    f.write("|---|---:|---:|---:|---|\n")
    for r in rows:
        f.write("| %s | %d | %d | %.3f | %s |\n" % (r["optimizer"], r["params"], r["state_bytes"],
                                                   r["bytes_per_param"], analytic.get(r["optimizer"], "—")))
    for r in rows:
        if "periods" in r:
            ps = r["periods"]
            ones = sum(1 for p in ps.values() if p == 1)
            f.write("\n%s: %d tensors, %d with period 1; periods: %s\n" % (r["optimizer"], len(ps), ones,
                    ", ".join("%s %d" % kv for kv in sorted(ps.items()))))
print("wrote", sys.argv[2])
PY
