#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job on the shipped
# default (experiments/mu-sweep.toml: error of strictly accumulated dot products and GEMMs
# for μ = 1..23), writing results/mu-sweep/{results.csv,results.json}.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/src/cli/mantis sweep experiments/mu-sweep.toml --out results/mu-sweep "$@"
