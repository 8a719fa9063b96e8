// test_study_cli — the study commands end to end (MANTIS_BIN): what a study refuses, it refuses the
// same way whether it is run or emitted as a Slurm script (--emit-slurm), before anything is
// written.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "cliutil.h"
#include "mantis_config.h"

using namespace mantis_test_cli;

namespace {

const fs::path kRoot = MANTIS_SOURCE_DIR;

// A study configuration that every run and every emit must refuse: `args` run it (with --out DIR
// added), the same with --emit-slurm; both exit 2 with the same one line naming `needle`, and
// neither writes the script or the output directory.
void refused_alike(const std::vector<std::string>& args, const std::string& needle) {
  const fs::path out = scratch_dir() / "refused-out", script = scratch_dir() / "refused.sh";
  fs::remove_all(out), fs::remove(script);
  std::vector<std::string> run_args = args, emit_args = args;
  run_args.insert(run_args.end(), {"--out", out.string(), "-q"});
  emit_args.insert(emit_args.end(), {"--out", out.string(), "--emit-slurm", script.string(), "--slurm-shards", "2"});
  const Result ran = run(run_args), emitted = run(emit_args);
  {
    INFO("run: " << flat(ran.err));
    check_error(ran, {needle});
  }
  {
    INFO("emit: " << flat(emitted.err));
    check_error(emitted, {needle});
  }
  CHECK(emitted.err == ran.err);  // the same validation, the same message
  CHECK_FALSE(fs::exists(script));
  CHECK_FALSE(fs::exists(out));
}

// The same configuration, valid: it emits a script (and nothing else).
void emits(const std::vector<std::string>& args) {
  const fs::path out = scratch_dir() / "emit-out", script = scratch_dir() / "emit.sh";
  fs::remove_all(out), fs::remove(script);
  std::vector<std::string> a = args;
  a.insert(a.end(), {"--out", out.string(), "--emit-slurm", script.string(), "--slurm-shards", "2"});
  const Result r = run(a);
  INFO(flat(r.err));
  CHECK(r.status == 0);
  CHECK(fs::exists(script));
  CHECK_FALSE(fs::exists(out));
}

std::string policy_sweep(const std::string& model, const std::string& data, int ctx) {
  return "model = \"" + model + "\"\ndata = \"" + data + "\"\nseqs = 2\nctx = " + std::to_string(ctx) +
         "\nsites = [\"mlp.fc\"]\nmu = [3]\n";
}

std::string gnmr_study(const std::string& model, const std::string& arm) {
  return "models = [\"" + model + "\"]\nseeds = [1]\n[train]\nsteps = 2\n[[arm]]\nname = \"a\"\nconfig = \"\"\"\n" +
         arm + "\n\"\"\"\n";
}

}  // namespace

TEST_CASE("sweep / mu-sweep: a run's checks refuse an emit alike", "[study][slurm]") {
  const std::string model = (kRoot / "models" / "llama-bytes").string();
  emits({"sweep", write_config("ps.toml", policy_sweep(model, "test", 16)).string()});
  refused_alike({"sweep", write_config("ps.toml", policy_sweep(model + "-missing", "test", 16)).string()},
                "llama-bytes-missing");
  refused_alike({"sweep", write_config("ps.toml", policy_sweep(model, "nosuchsplit", 16)).string()}, "nosuchsplit");
  refused_alike({"sweep", write_config("ps.toml", policy_sweep(model, "test", 100000)).string()}, "ctx 100000");
  const std::string mu = "mu = [23]\nlengths = [16]\nrounding = \"sr\"\n";
  emits({"mu-sweep", write_config("mu.toml", mu).string()});
  refused_alike({"mu-sweep", write_config("mu.toml", mu + "sr_bits = 32\n").string()}, "sr_bits");
}

TEST_CASE("lamp sweep: a run's checks refuse an emit alike", "[study][slurm]") {
  const std::string model = (kRoot / "models" / "llama-bytes").string();
  const std::string cfg = "seqs = 2\nctx = 16\nmu = [4]\nstrict_tau = [1]\nrelaxed_tau = [0.3]\n";
  emits({"lamp", "sweep", write_config("lamp.toml", "model = \"" + model + "\"\n" + cfg).string()});
  refused_alike({"lamp", "sweep", write_config("lamp.toml", "model = \"" + model + "-missing\"\n" + cfg).string()},
                "llama-bytes-missing");
}

TEST_CASE("gnmr study: a run's checks refuse an emit alike", "[study][slurm]") {
  const std::string model = (kRoot / "tests" / "data" / "gnmr-small-model.toml").string();
  emits({"gnmr", "study", write_config("g.toml", gnmr_study(model, "")).string()});
  refused_alike({"gnmr", "study", write_config("g.toml", gnmr_study(model + ".missing", "")).string()}, ".missing");
  refused_alike({"gnmr", "study", write_config("g.toml", gnmr_study(model, "[controller]\nname = \"nope\"")).string()},
                "nope");
  refused_alike({"gnmr", "study", write_config("g.toml", gnmr_study(model, "[activation_quant")).string()},
                "gnmr-small-model.toml");
  refused_alike({"gnmr", "study", write_config("g.toml", gnmr_study(model, "[activation_quant]\nbits = 99")).string()},
                "bits = 99");
  refused_alike({"gnmr", "study", write_config("g.toml", gnmr_study(model, "[controller]\nname = \"gnmr\"\nalpha = nan\n"
                                                                           "[controller.recover]\nbits = 8")).string()},
                "alpha");
}

TEST_CASE("optim-study: a run's checks refuse an emit alike", "[study][slurm]") {
  std::string model = slurp(kRoot / "tests" / "data" / "optim-small-model.toml");
  const fs::path good = write_config("om.toml", model);
  const std::string study = "optimizers = [\"adamw\"]\n[train]\nsteps = 2\nctx = 24\n";
  emits({"optim-study", write_config("o.toml", "models = [\"" + good.string() + "\"]\n" + study).string()});
  const size_t at = model.find("kjv/test");
  REQUIRE(at != std::string::npos);
  const fs::path bad = write_config("om-bad.toml", model.replace(at, 8, "kjv/nosuchsplit"));
  refused_alike({"optim-study", write_config("o.toml", "models = [\"" + bad.string() + "\"]\n" + study).string()},
                "nosuchsplit");
  refused_alike({"optim-study", write_config("o.toml", "models = [\"" + good.string() + ".missing\"]\n" + study).string()},
                ".missing");
}
