// Committed results reproduce bit for bit: the shipped models' training logs (first steps), a
// handful of cells of each committed LAMP sweep, and rows of the committed μ-sweep. A change that
// alters any rounding, random stream, order of operations or data slicing fails here even when
// every semantic test still passes. Runs the built binary (MANTIS_BIN) from the source root.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

#include "cliutil.h"
#include "mantis_config.h"

using namespace mantis_test_cli;

// Children here may run long (Meson timeout 900 s).
static const int kChildDeadline = child_deadline_seconds = 850;
using nlohmann::json;

namespace {

const fs::path kRoot = MANTIS_SOURCE_DIR;

// The sanitizer job (MANTIS_TEST_SCALE < 1) re-runs one case of each list, the release job all.
bool reduced() {
  const char* s = std::getenv("MANTIS_TEST_SCALE");
  return s && *s && std::atof(s) < 1.0;
}

// Runs mantis from the source root (configs name models/ and experiments/ relative to it).
Result run_at_root(const std::vector<std::string>& args) {
  const fs::path here = fs::current_path();
  fs::current_path(kRoot);
  Result r = run(args);
  fs::current_path(here);
  return r;
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> v;
  std::stringstream ss(line);
  for (std::string f; std::getline(ss, f, ',');) v.push_back(f);
  if (!line.empty() && line.back() == ',') v.emplace_back();
  return v;
}

// A result JSON without what depends on the machine (wall time).
json without_timing(json j) {
  if (j.is_object()) {
    for (const char* k : {"seconds", "elapsed_s"}) j.erase(k);
    for (auto& [k, v] : j.items()) v = without_timing(v);
  } else if (j.is_array()) {
    for (auto& v : j) v = without_timing(v);
  }
  return j;
}

json read_json(const fs::path& p) {
  INFO("reading " << p);
  REQUIRE(fs::exists(p));
  return json::parse(slurp(p));
}

}  // namespace

TEST_CASE("the shipped training logs: the first steps re-run bit for bit") {
  const int steps = 3;  // inside the warm-up, where the learning rate does not depend on `steps`
  for (const std::string model : {"gpt2-bytes", "llama-bytes"}) {
    INFO("models/" << model);
    std::string toml = slurp(kRoot / "models" / model / "train.toml");
    toml = std::regex_replace(toml, std::regex(R"((^|\n)steps = \d+)"), "$1steps = " + std::to_string(steps));
    REQUIRE(toml.find("steps = " + std::to_string(steps)) != std::string::npos);
    const fs::path cfg = write_config("reproduce-" + model + ".toml", toml);
    const fs::path out = scratch_dir() / ("reproduce-" + model);
    const Result r = run_at_root({"train", cfg.string(), "--out", out.string(), "--quiet"});
    INFO("stderr: " << flat(r.err));
    REQUIRE(r.status == 0);
    const auto shipped = lines(slurp(kRoot / "models" / model / "log.csv"));
    const auto rerun = lines(slurp(out / "log.csv"));
    REQUIRE(rerun.size() == size_t(steps) + 1);
    REQUIRE(shipped.size() > rerun.size());
    // Every column of the shipped log, compared by name; the rerun may add state_bytes (logged
    // since issue 11), which the shipped logs predate.
    const auto header = split_csv(shipped[0]), rheader = split_csv(rerun[0]);
    std::vector<std::string> want = header;
    if (std::find(header.begin(), header.end(), "state_bytes") == header.end()) want.push_back("state_bytes");
    REQUIRE(rheader == want);
    const size_t sb = rheader.size() - 1;
    std::string state_bytes;
    for (size_t i = 1; i < rerun.size(); ++i) {
      const auto a = split_csv(shipped[i]), b = split_csv(rerun[i]);
      REQUIRE(a.size() == header.size());
      REQUIRE(b.size() == rheader.size());
      for (size_t c = 0; c < header.size(); ++c) {
        if (header[c] == "seconds") continue;
        // The last step of a run always validates; the shipped run's step `steps` − 1 did not.
        if (header[c] == "val_loss_nats" && i + 1 == rerun.size()) continue;
        INFO("row " << i << " column " << header[c]);
        CHECK(b[c] == a[c]);  // printed with 9 significant digits: a binary32 value exactly
      }
      // AdamW's state does not change size: every row the same, as the checkpoint records it
      if (i == 1) state_bytes = b[sb];
      CHECK(b[sb] == state_bytes);
    }
    const auto tj = nlohmann::json::parse(slurp(out / "checkpoint-00000003" / "trainer.json"));
    CHECK(state_bytes == std::to_string(tj["optimizer"]["state_bytes"].get<uint64_t>()));
  }
}

TEST_CASE("committed LAMP cells re-run bit for bit") {
  // Cheap cells covering FP32-recompute strict (with the random control) and relaxed LAMP, a
  // uniform ps<μ> cell, both model families, and μ = 4.
  const std::vector<std::pair<std::string, std::vector<int>>> sweeps = {
      {"gpt2-bytes", {279, 296, 259}},
      {"llama-bytes", {30, 259}},
  };
  for (const auto& [name, cells] : sweeps) {
    const fs::path committed = kRoot / "experiments/lamp" / ("results-" + name) / "cells";
    for (size_t n = 0; n < (reduced() ? 1 : cells.size()); ++n) {
      const int cell = cells[n];
      INFO(name << " cell " << cell);
      const fs::path out = scratch_dir() / ("lamp-" + name + "-" + std::to_string(cell));
      const Result r = run_at_root({"lamp", "sweep", "experiments/lamp/" + name + ".toml", "--cell",
                                    std::to_string(cell), "--out", out.string(), "--quiet"});
      INFO("stderr: " << flat(r.err));
      REQUIRE(r.status == 0);
      const json want = without_timing(read_json(committed / (std::to_string(cell) + ".json")));
      const json got = without_timing(read_json(out / "cells" / (std::to_string(cell) + ".json")));
      CHECK(got["key"] == want["key"]);
      CHECK(got.dump() == want.dump());
    }
  }
}

TEST_CASE("committed mu-sweep rows re-run bit for bit") {
  // A subset of experiments/mu-sweep.toml: the inputs of a (length or shape, trial) do not depend
  // on the other lengths, shapes or μ in the configuration, so its rows equal the committed ones.
  const fs::path cfg = write_config("reproduce-mu.toml", R"(mu = [2, 4, 23]
lengths = [16, 4096]
gemm_shapes = [[64, 64, 256]]
trials = 20
gemm_trials = 10
seed = 1
rounding = "rne"
distribution = "uniform01"
)");
  const fs::path out = scratch_dir() / "reproduce-mu";
  const Result r = run_at_root({"sweep", cfg.string(), "--out", out.string()});
  INFO("stderr: " << flat(r.err));
  REQUIRE(r.status == 0);
  const json want = read_json(kRoot / "experiments/mu-sweep/results.json")["results"];
  const json got = read_json(out / "results.json")["results"];
  REQUIRE(got.size() == 3 * 3);
  for (const auto& row : got) {
    INFO(row.dump());
    const auto it = std::find_if(want.begin(), want.end(), [&](const json& w) {
      return w["mu"] == row["mu"] && w["kind"] == row["kind"] && w["shape"] == row["shape"];
    });
    REQUIRE(it != want.end());
    CHECK(it->dump() == row.dump());
  }
}
