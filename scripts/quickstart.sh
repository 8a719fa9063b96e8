#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job on the shipped
# default: the trained LLaMA-style byte model (models/llama-bytes) evaluated under LAMP's uniform
# low-precision policy (attention scores in ps4, experiments/policies/lamp-ps4.toml) against its
# FP32 run on 32 windows of the held-out test text; prints KL, top-1 flips, perplexities and
# writes results/eval-llama-bytes-ps4/{results.csv,results.json,manifest.json}.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/src/cli/mantis eval --model models/llama-bytes --policy experiments/policies/lamp-ps4.toml \
  --data test --seqs 32 --out results/eval-llama-bytes-ps4 "$@"
