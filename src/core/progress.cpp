#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace mantis {

ProgressMode progress_mode(bool quiet, bool force_bar) {
  if (quiet) return ProgressMode::quiet;
  if (force_bar || ::isatty(2) == 1) return ProgressMode::bar;
  return ProgressMode::plain;
}

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = long(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02d}", t / 60, t % 60);
}

Progress::Progress(std::string label, uint64_t total, ProgressMode mode, std::string unit, double interval)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      mode_(mode == ProgressMode::automatic ? progress_mode(false) : mode), interval_(interval),
      exceptions_(std::uncaught_exceptions()) {}

Progress::~Progress() {
  try {
    if (std::uncaught_exceptions() > exceptions_) interrupt();
    else finish(note_);
  } catch (...) {  // a destructor must not throw (stderr failing is not worth a terminate)
  }
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string Progress::text(uint64_t done, std::string_view note) const {
  const double t = elapsed(), frac = total_ ? double(done) / double(total_) : 1.0;
  const double fresh = double(done - std::min(done, done0_));  // this process's share
  const double rate = t > 0 ? fresh / t : 0;
  const double eta = fresh > 0 ? t * double(total_ - std::min(done, total_)) / fresh : NAN;
  const std::string u = unit_.empty() ? "" : " " + unit_;
  std::string s;
  if (mode_ == ProgressMode::bar) {
    constexpr int w = 24;
    const int fill = int(double(w) * std::min(frac, 1.0));
    s = fmt::format("{}: {}/{} [{}{}] {:.3g}{}/s | ETA {}", label_, done, total_, std::string(size_t(fill), '#'),
                    std::string(size_t(w - fill), '.'), rate, u, clock_text(eta));
  } else {
    s = fmt::format("{}: {}/{}{} ({:.1f} %), {:.3g}{}/s, elapsed {}, ETA {}", label_, done, total_, u, 100 * frac,
                    rate, u, clock_text(t), clock_text(eta));
  }
  if (!note.empty()) s += fmt::format("{}{}", mode_ == ProgressMode::bar ? " | " : ", ", note);
  return s;
}

void Progress::update(uint64_t done, std::string_view note) {
  done_ = done;
  note_ = note;
  if (mode_ == ProgressMode::quiet || finished_) return;
  const double t = elapsed();
  if (mode_ == ProgressMode::bar) {
    if (last_ >= 0 && t - last_ < 0.2 && done < total_) return;
    last_ = t;
    std::fprintf(stderr, "\r%s   ", text(done, note).c_str());
    std::fflush(stderr);
    open_line_ = true;
  } else {
    if (t - std::max(last_, 0.0) < interval_ || done >= total_) return;  // the final line comes from finish()
    last_ = t;
    std::fprintf(stderr, "%s\n", text(done, note).c_str());
    std::fflush(stderr);
  }
}

void Progress::interrupt() {
  if (open_line_) std::fputc('\n', stderr);
  open_line_ = false;
}

void Progress::finish(std::string_view note) {
  if (finished_) return;
  finished_ = true;
  if (mode_ == ProgressMode::bar) {
    interrupt();
  } else if (mode_ == ProgressMode::plain) {
    std::fprintf(stderr, "%s\n", text(done_, note.empty() ? std::string_view(note_) : note).c_str());
    std::fflush(stderr);
  }
}

}  // namespace mantis
