// mu_sweep — mantissa-width sweep of strictly accumulated dot products and GEMMs
// (experiments/mu-sweep.toml).
//
// For each μ in the config and each vector length n: `trials` pairs of random binary32 vectors,
// the strictly accumulated dot product in ps<μ> (gemm.h), and its relative error against the exact
// dot product (summed exactly with MPFR, kept as a double-double). For each GEMM shape M×N×K: the
// relative Frobenius-norm error of the strict ps<μ> GEMM against a binary64 GEMM of the same data.
// The data of (n, trial) and of (shape, trial) do not depend on μ, so every μ sees the same inputs.
// One cell per μ (study.h): the rows of that μ. With an output directory the cells are stored in
// OUT/cells/<i>.json under a key of everything they depend on (so a run resumes, shards with
// --shard k/N or --cell i, and merges with --merge); without one they are kept in memory.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/format.h"
#include "core/progress.h"
#include "core/sample.h"
#include "exp/study.h"  // CellChoice

namespace mantis {

struct MuSweepConfig {
  std::vector<int> mu;
  std::vector<uint64_t> lengths;
  std::vector<std::array<uint64_t, 3>> shapes;
  int trials = 20;
  int gemm_trials = -1;  // default: trials
  uint64_t seed = 1;
  Rounding rounding = Rounding::rne;
  Distribution dist = Distribution::uniform01;
  std::optional<int> sr_bits;
  std::string path, sr_where;  // the config file; "file:line" of sr_bits (or the file)
};
MuSweepConfig read_mu_sweep(const std::string& path);

struct MuSweepRow {
  int mu;
  bool gemm;
  std::array<uint64_t, 3> shape;  // dot: {1, 1, n}
  int trials;
  double med, min, max, gamma;
};

struct MuSweepOptions : CellChoice {
  std::string config;
  std::string out;  // non-empty: OUT/cells/, and OUT/results.csv, results.json, manifest.json (one result set)
  ProgressMode progress = ProgressMode::automatic;
};
struct MuSweepResult {
  std::vector<MuSweepRow> rows;  // per μ merged: the dot rows, then the GEMM rows
  std::string report;            // the terminal tables (merged), or what this run computed
  size_t cells = 0, computed = 0;
  bool merged = false;
  std::vector<size_t> missing;   // --allow-partial merges: the cells (μ indices) absent
  double seconds = 0;
  int threads = 1;
};
// The cells' names, ps<μ>, in order.
std::vector<std::string> mu_sweep_cells(const MuSweepConfig& c);
// InputError (before anything is computed) for a bad configuration, a cell choice without --out, or
// a stored cell of another key.
MuSweepResult run_mu_sweep(const MuSweepOptions& o);
// What run_mu_sweep checks before its first cell (the configuration, the cell choice, every μ's
// GEMM settings), checked by the same code; nothing is written (--emit-slurm calls it).
void validate_mu_sweep(const MuSweepOptions& o);

}  // namespace mantis
