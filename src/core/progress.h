// progress — the one progress reporter of every long command (eval, sweeps, bench, train, verify).
//
// On a terminal (stderr is a tty): a bar redrawn in place at most every 0.2 s. Elsewhere (batch
// logs): one plain line "LABEL: DONE/TOTAL UNIT (P %), R UNIT/s, elapsed T, ETA T[, NOTE]" at most
// every `interval` seconds and once when the work is finished. Quiet: nothing. Only stderr is
// written, so a command's results on stdout stay the same in every mode.
#pragma once

#include <chrono>
#include <exception>
#include <cstdint>
#include <string>
#include <string_view>

namespace mantis {

// Wall-clock seconds since construction.
struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

enum class ProgressMode {
  automatic,  // bar on a terminal, plain lines otherwise
  bar,        // the bar even when stderr is not a terminal (--progress)
  plain,
  quiet,      // --quiet
};
ProgressMode progress_mode(bool quiet, bool force_bar = false);

// "1:05", "1:02:03"; "--:--" for a negative or non-finite time.
std::string clock_text(double seconds);

class Progress {
 public:
  Progress(std::string label, uint64_t total, ProgressMode mode, std::string unit = "", double interval = 10);
  ~Progress();  // finish(); on an exception only the bar's line is ended (an error is one line)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Work already done before this process (a resumed run): not counted in the rate.
  void start_at(uint64_t done0) { done0_ = done_ = done0; }
  // `done` of `total` units are finished; `note` is shown after the numbers (loss, current cell).
  void update(uint64_t done, std::string_view note = {});
  // Ends a bar's line so that other output starts on a fresh one (the bar resumes at the next update).
  void interrupt();
  // Stops without a final line (the work failed: its error is the last word).
  void abandon() {
    interrupt();
    finished_ = true;
  }
  // The final line (plain) or the bar's end; idempotent.
  void finish(std::string_view note = {});

  bool shows_bar() const { return mode_ == ProgressMode::bar; }
  bool quiet() const { return mode_ == ProgressMode::quiet; }

 private:
  std::string text(uint64_t done, std::string_view note) const;
  double elapsed() const;

  std::string label_, unit_;
  uint64_t total_, done_ = 0, done0_ = 0;
  ProgressMode mode_;
  double interval_, last_ = -1;
  bool open_line_ = false, finished_ = false;
  int exceptions_;  // std::uncaught_exceptions() at construction
  std::string note_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace mantis
