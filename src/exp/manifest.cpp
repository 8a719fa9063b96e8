#include "exp/manifest.h"

#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/file.h"
#include "core/threads.h"
#include "io/tokenizer.h"
#include "train/config.h"
#include "mantis_build.h"
#include "mantis_config.h"
#include "mantis_git.h"

namespace mantis {

namespace {
struct CommandLine {
  std::string text, started = utc_now();
  std::vector<std::string> args;
};
CommandLine& recorded() {
  static CommandLine c;
  return c;
}

// The value of the first "KEY\t: value" line of /proc/cpuinfo (x86: "model name", "flags"; ARM:
// "Features", "CPU part"); empty where there is none.
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    if (k != key) continue;
    const size_t v = line.find_first_not_of(' ', colon + 1);
    return v == std::string::npos ? "" : line.substr(v);
  }
  return "";
}

// Vector and arithmetic extensions: what decides which code paths -march=native compiled.
bool isa_flag(const std::string& f) {
  static const char* prefixes[] = {"sse", "ssse3", "avx", "fma", "f16c", "bmi", "amx", "popcnt", "asimd", "sve", "neon",
                                   "fp16", "bf16"};
  for (const char* p : prefixes)
    if (f.rfind(p, 0) == 0) return true;
  return false;
}
}  // namespace

void set_command_line(int argc, const char* const* argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  set_command_line(s);
  recorded().args.assign(argv, argv + argc);
}
void set_command_line(const std::string& command) {
  recorded().text = command;
  recorded().started = utc_now();
}
const std::string& command_line() { return recorded().text; }
const std::vector<std::string>& command_args() { return recorded().args; }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

ojson build_json() {
  ojson isa = ojson::array();
  // The compiler's predefined macros: what this binary may execute (not what the CPU offers).
  for (const char* f : {
#ifdef __SSE4_2__
           "sse4.2",
#endif
#ifdef __AVX__
           "avx",
#endif
#ifdef __AVX2__
           "avx2",
#endif
#ifdef __FMA__
           "fma",
#endif
#ifdef __F16C__
           "f16c",
#endif
#ifdef __AVX512F__
           "avx512f",
#endif
#ifdef __AVX512BW__
           "avx512bw",
#endif
#ifdef __AVX512VL__
           "avx512vl",
#endif
#ifdef __AVX512BF16__
           "avx512bf16",
#endif
#ifdef __AVX512FP16__
           "avx512fp16",
#endif
#ifdef __ARM_NEON
           "neon",
#endif
#ifdef __ARM_FEATURE_SVE
           "sve",
#endif
           ""})
    if (*f) isa.push_back(f);
  return {{"type", MANTIS_BUILD_TYPE},
          {"compiler", MANTIS_COMPILER},
          {"flags", MANTIS_CXX_FLAGS},
          {"native", bool(MANTIS_NATIVE)},
          {"isa", isa}};
}

ojson cpu_json() {
  std::string model = cpuinfo("model name");
  if (model.empty()) model = cpuinfo("CPU part");
  std::string flags = cpuinfo("flags");
  if (flags.empty()) flags = cpuinfo("Features");
  ojson isa = ojson::array();
  std::istringstream words(flags);
  for (std::string f; words >> f;)
    if (isa_flag(f)) isa.push_back(f);
  return {{"model", model}, {"isa", isa}, {"hardware_threads", std::thread::hardware_concurrency()}};
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

ojson data_sources_json(const TokenData& d) {
  ojson a = ojson::array();
  for (auto& s : d.sources) {
    a.push_back({{"name", s.name}, {"file", s.origin}, {"sha256", s.sha256}, {"tokens", s.tokens}});
    if (s.kind != SourceKind::shard && s.kind != SourceKind::corpus) a.back()["kind"] = to_string(s.kind);
  }
  return a;
}

ojson training_data_key(const std::string& train_config_path) {
  const TrainConfig t = load_train_config(train_config_path);
  const auto tok = make_tokenizer(t.tokenizer);
  auto sources = [&](const std::string& split) {
    ojson a = data_sources_json(load_tokens(split, *tok));
    for (auto& s : a) s.erase("file");
    return a;
  };
  return {{"train", sources(t.train_data)}, {"validation", sources(t.val_data)}};
}

ojson manifest_header(const std::string& generator) {
  ojson m;
  m["generator"] = generator;
  m["mantis_version"] = MANTIS_VERSION;
  m["git_commit"] = MANTIS_GIT_COMMIT;
  m["command"] = command_line();
  m["started_utc"] = recorded().started;
  m["host"] = host_name();
  m["threads"] = num_threads();
  m["build"] = build_json();
  m["cpu"] = cpu_json();
  return m;
}

}  // namespace mantis
