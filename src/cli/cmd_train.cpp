// mantis train CONFIG.toml [--resume OUT] — the training loop of train.h with a progress bar.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "common.h"
#include "train/train.h"

namespace mantis::cli {

namespace {

std::string clock(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02d}", t / 60, t % 60);
}

}  // namespace

int run_train(const TrainArgs& a) {
  namespace fs = std::filesystem;
  apply_threads(a.threads);
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
  const bool bar = !a.quiet && (a.progress || stderr_is_tty());
  const Stopwatch sw;
  uint64_t tokens0 = first * uint64_t(c.batch) * uint64_t(c.accum) * uint64_t(c.model.ctx);
  fmt::print("training {} ({} layers, d = {}, ctx {}, vocab {}) for {} steps of {} sequences; policy {}; out {}\n",
             c.model.arch == Arch::gpt2 ? "gpt2" : "llama", c.model.layers, c.model.dim, c.model.ctx, c.model.vocab,
             c.steps, c.batch * c.accum, c.policy, c.out);
  if (first > 0) fmt::print("resumed at step {}\n", first);
  std::fflush(stdout);
  tr.run([&](const StepRecord& r) {
    const double el = sw.seconds(), done = double(r.step + 1 - first), left = double(c.steps - r.step - 1);
    const double tps = double(r.tokens - tokens0) / el;
    if (bar) {
      const int w = 24, fill = int(double(w) * double(r.step + 1) / double(c.steps));
      fmt::print(stderr, "\r{:>6}/{} [{}{}] loss {:.4f}{} | {:.0f} tok/s | ETA {}   ", r.step + 1, c.steps,
                 std::string(size_t(fill), '#'), std::string(size_t(w - fill), '.'), r.loss,
                 std::isfinite(r.val_loss) ? fmt::format(" val {:.4f}", r.val_loss) : "", tps, clock(el / done * left));
    }
    if (std::isfinite(r.val_loss)) {
      if (bar) fmt::print(stderr, "\n");
      fmt::print("step {:>6}: loss {:.4f}  val {:.4f} (ppl {:.3f})  lr {:.3g}  |g| {:.3g}  {:.0f} tok/s\n", r.step + 1,
                 r.loss, r.val_loss, std::exp(r.val_loss), r.lr, r.grad_norm, tps);
      std::fflush(stdout);
    }
  });
  const auto& log = tr.log();
  const double val = log.empty() ? std::nan("") : log.back().val_loss;
  fmt::print("done: {} steps, {:.1f} s, validation loss {:.4f} (perplexity {:.3f}); optimizer state {} bytes; {}\n",
             tr.next_step(), sw.seconds(), val, std::exp(val), tr.optimizer().state_bytes(), c.out);
  return 0;
}

}  // namespace mantis::cli
