// mantis train CONFIG.toml [--resume OUT] — the training loop of train.h with the progress
// reporter; OUT/manifest.json (exp/manifest.h) covers the run's logs when it ends.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "common.h"
#include "exp/manifest.h"
#include "exp/study.h"
#include "train/train.h"

namespace mantis::cli {

namespace {

struct TrainArgs {
  std::string config, resume, out;
};

int run_train(const TrainArgs& a) {
  namespace fs = std::filesystem;
  TrainConfig c = load_train_config(a.config);
  if (!a.out.empty()) c.out = a.out;
  if (!a.resume.empty()) {
    if (!a.out.empty() && a.out != a.resume) throw InputError("--resume DIR continues in DIR; do not also give --out");
    c.out = a.resume;
  }
  if (c.out.empty()) throw InputError(fmt::format("{}: no output directory: set out = \"…\" or pass --out DIR", a.config));
  if (a.resume.empty() && fs::exists(c.out + "/latest"))
    throw InputError(fmt::format("{} already holds a run (its 'latest' checkpoint); continue it with --resume {} or "
                                 "choose another --out", c.out, c.out));
  Trainer tr(c);
  if (!a.resume.empty()) tr.resume(a.resume);
  const uint64_t first = tr.next_step();
  const Stopwatch sw;
  uint64_t tokens0 = first * uint64_t(c.batch) * uint64_t(c.accum) * uint64_t(c.model.ctx);
  fmt::print("training {} ({} layers, d = {}, ctx {}, vocab {}) for {} steps of {} sequences; policy {}; out {}\n",
             c.model.arch == Arch::gpt2 ? "gpt2" : "llama", c.model.layers, c.model.dim, c.model.ctx, c.model.vocab,
             c.steps, c.batch * c.accum, c.policy, c.out);
  if (first > 0) fmt::print("resumed at step {}\n", first);
  std::fflush(stdout);
  {
    Progress progress("train", c.steps, shared().progress_mode(), "steps");
    progress.start_at(first);
    tr.run([&](const StepRecord& r) {
      const double tps = double(r.tokens - tokens0) / sw.seconds();
      const std::string rec = tr.controller().progress();
      progress.update(r.step + 1, fmt::format("loss {:.4f}{} | {:.0f} tok/s{}", r.loss,
                                              std::isfinite(r.val_loss) ? fmt::format(" val {:.4f}", r.val_loss) : "", tps,
                                              rec.empty() ? "" : " | " + rec));
      if (std::isfinite(r.val_loss)) {
        progress.interrupt();
        fmt::print("step {:>6}: loss {:.4f}  val {:.4f} (ppl {:.3f})  lr {:.3g}  |g| {:.3g}  {:.0f} tok/s\n", r.step + 1,
                   r.loss, r.val_loss, std::exp(r.val_loss), r.lr, r.grad_norm, tps);
        std::fflush(stdout);
      }
    });
  }
  const auto& log = tr.log();
  const double val = log.empty() ? std::nan("") : log.back().val_loss;

  // The run's manifest, over the files that describe it (the checkpoints carry their own).
  ojson man = manifest_header("mantis train");
  man["config_file"] = a.config;
  man["config_sha256"] = c.hash();
  man["config"] = c.text;
  man["data"] = {{"tokenizer", c.tokenizer}, {"train", {{"spec", c.train_data}, {"sources", data_sources_json(tr.train_data())}}},
                 {"validation", {{"spec", c.val_data}, {"sources", data_sources_json(tr.val_data())}}}};
  man["seeds"] = {{"init", c.init_seed}, {"data", c.seed}};
  if (!c.init.empty()) man["init"] = {{"path", c.init}, {"model_sha256", c.init_sha256}};
  man["optimizer"] = {{"name", tr.optimizer().name()}, {"state_bytes", tr.optimizer().state_bytes()}};
  man["steps"] = {{"first_this_process", first}, {"last", tr.next_step()}, {"configured", c.steps}};
  man["timings_s"] = {{"this_process", sw.seconds()}};
  std::vector<std::string> files;
  std::error_code ec;
  for (const char* f : {"config.toml", "log.csv", "units.csv", "latest"})
    if (fs::is_regular_file(fs::path(c.out) / f, ec)) files.push_back(f);
  for (auto& [f, content] : tr.controller().logs())
    if (fs::is_regular_file(fs::path(c.out) / f, ec)) files.push_back(f);
  write_manifest(c.out, files, man);

  fmt::print("done: {} steps, {:.1f} s, validation loss {:.4f} (perplexity {:.3f}); optimizer state {} bytes; {}\n",
             tr.next_step(), sw.seconds(), val, std::exp(val), tr.optimizer().state_bytes(), c.out);
  for (auto& line : tr.controller().summary()) fmt::print("controller: {}\n", line);
  report_figures(c.out);
  return 0;
}

}  // namespace

Runner setup_train(CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  sub.description(
      "train a model on the corpora (src/train/train.h): AdamW, warm-up + cosine, clipping, validation, atomic "
      "checkpoints, log.csv / units.csv, manifest.json; see experiments/train-*.toml");
  sub.add_option("config", a->config, "training configuration (TOML)")->required()->check(kPath);
  sub.add_option("--resume", a->resume, "continue the run in DIR from its latest checkpoint (bit-identical)")->check(kPath);
  add_out(sub, a->out, "output directory (overrides the config's out)");
  add_figures(sub);
  add_threads(sub);
  add_progress(sub, "no progress bar");
  return [a] { return run_train(*a); };
}

}  // namespace mantis::cli
