// manifest — what every result a command writes records about the run that made it (eval, the
// sweeps, bench, train): the command line, the source commit, the build (type, compiler, flags,
// the ISA it was compiled for), the machine (CPU model and ISA flags from /proc/cpuinfo, host
// name), the threads; each command adds its configuration and data hashes, seeds and timings.
// The result files' SHA-256s ("files") are added where the set is written (study.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "io/dataset.h"

namespace mantis {

using ojson = nlohmann::ordered_json;

// The process's command line, recorded once by the front end (main, or a Python binding); the
// time of this call is the manifests' "started_utc".
void set_command_line(int argc, const char* const* argv);
void set_command_line(const std::string& command);
const std::string& command_line();
const std::vector<std::string>& command_args();  // argv as given (set_command_line(argc, argv))

std::string utc_now();  // "2026-12-01T12:00:00Z"

ojson build_json();  // {"type", "compiler", "flags", "native", "isa": [compiled-in ISA extensions]}
ojson cpu_json();    // {"model", "isa": [SIMD-related flags of /proc/cpuinfo], "hardware_threads"}
std::string host_name();

// The data a command read: [{"name", "file", "sha256", "tokens"[, "kind"]}, …] (dataset.h TokenSource).
// "kind" is absent for the two kinds that existed before it (a .tok shard, a corpus's text; the file
// name tells them apart), so the study keys written then stay valid; present for npy, llmc and text.
ojson data_sources_json(const TokenData& d);
// What a training configuration's data is, for study keys: {"train": […], "validation": […]} of
// data_sources_json without "file" — not where this checkout keeps it, so a cell keyed by it is
// valid in any clone.
ojson training_data_key(const std::string& train_config_path);

// The fields every manifest starts with: generator, mantis_version, git_commit, command,
// started_utc, host, threads, build, cpu.
ojson manifest_header(const std::string& generator);

}  // namespace mantis
