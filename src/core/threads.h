// threads — the CPU thread count and exception-safe OpenMP regions.
//
// Results never depend on the thread count (every kernel fixes its own order of operations);
// only the time does.
#pragma once

#include <exception>
#include <mutex>

namespace mantis {

// Threads used by the CPU kernels (OpenMP); 0 = OpenMP's default. Callers accept 1..kMaxThreads
// (the CLI's --threads, Python's set_threads).
inline constexpr int kMaxThreads = 4096;
void set_num_threads(int n);
int num_threads();

// An exception must never leave an OpenMP region (that is std::terminate: the process aborts).
// Every region whose body can throw runs the body through run(); the first exception is kept,
// and rethrow() after the region raises it on the calling thread.
class ParallelErrors {
 public:
  template <class F>
  void run(F&& body) noexcept {
    try {
      body();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace mantis
