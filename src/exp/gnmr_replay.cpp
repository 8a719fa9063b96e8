#include "exp/gnmr_replay.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/toml.h"

namespace mantis {

GnmrOptions gnmr_replay_config(const std::string& path) {
  const toml::table root = parse_toml(read_text_file(path, "controller configuration"), path);
  const toml::node* n = root.get("controller");
  if (!n || !n->is_table()) throw InputError(fmt::format("{}: no [controller] table", path));
  const toml::table& t = *n->as_table();
  check_controller_keys(t, path);
  const toml::node* name = t.get("name");
  if (!name || !name->is_string() || name->as_string()->get() != "gnmr")
    throw InputError(fmt::format("{}: [controller] name must be \"gnmr\" for a replay", path));
  return gnmr_options_from_toml(t, path);
}

namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> f(1);
  for (char c : line)
    if (c == ',') f.emplace_back();
    else f.back().push_back(c);
  return f;
}

}  // namespace

GnmrReplayResult gnmr_replay(const GnmrOptions& o, const std::string& norms_path, const std::string& out_path) {
  check_output_path(out_path, "gnmr replay: --out");
  const std::string text = read_text_file(norms_path, "norm stream");
  // rows: (step, unit) → norm, every line checked
  std::map<std::pair<uint64_t, std::string>, double> rows;
  std::set<std::string> units;
  uint64_t last_step = 0;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1, ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string at = fmt::format("{}:{}", norms_path, line_no);
    if (line_no == 1) {
      if (line != "step,unit,grad_norm")
        throw InputError(fmt::format("{}: the header must be step,unit,grad_norm (it is '{}')", at, line));
      continue;
    }
    if (line.empty()) {
      if (pos >= text.size()) break;  // the final newline
      throw InputError(fmt::format("{}: empty line", at));
    }
    const auto f = split(line);
    if (f.size() != 3) throw InputError(fmt::format("{}: {} fields, expected 3 (step,unit,grad_norm)", at, f.size()));
    char* e = nullptr;
    errno = 0;
    const unsigned long long step = std::strtoull(f[0].c_str(), &e, 10);
    if (f[0].empty() || f[0][0] == '-' || *e || errno || step < 1)
      throw InputError(fmt::format("{}: step '{}' is not an integer ≥ 1", at, f[0]));
    if (f[1].empty() || f[1].find('"') != std::string::npos)
      throw InputError(fmt::format("{}: the unit id must be non-empty, without '\"'", at));
    errno = 0;
    const double norm = std::strtod(f[2].c_str(), &e);
    if (f[2].empty() || *e || !std::isfinite(norm) || norm < 0)
      throw InputError(fmt::format("{}: grad_norm '{}' is not a finite number ≥ 0", at, f[2]));
    if (!rows.emplace(std::pair{uint64_t(step), f[1]}, norm).second)
      throw InputError(fmt::format("{}: unit {} at step {} appears twice", at, f[1], step));
    units.insert(f[1]);
    last_step = std::max(last_step, uint64_t(step));
  }
  if (rows.empty()) throw InputError(fmt::format("{}: no rows", norms_path));
  if (rows.size() != last_step * units.size())
    for (uint64_t s = 1; s <= last_step; ++s)
      for (auto& u : units)
        if (!rows.count({s, u}))
          throw InputError(fmt::format("{}: unit {} has no norm at step {} (every unit at every step 1..{})", norms_path,
                                       u, s, last_step));
  Gnmr g(o, std::vector<std::string>(units.begin(), units.end()));
  GnmrReplayResult r;
  r.steps = last_step, r.units = units.size();
  std::string out = std::string(kGnmrHeader) + "\n";
  std::vector<double> norms(units.size());
  auto it = rows.begin();  // (step, unit) order: units in byte order within a step, as ids
  for (uint64_t s = 1; s <= last_step; ++s) {
    for (double& n : norms) n = (it++)->second;
    for (auto& u : g.step(norms)) {
      r.recovered += u.recovered, r.exceeded += u.exceeds;
      r.eligible += s > o.warmup;
    }
    out += gnmr_rows(g);
  }
  for (auto& h : g.held()) r.held.push_back(fmt::format("{} since step {}", g.ids()[h.unit], h.since));
  write_file_atomic(out_path, out);
  return r;
}

}  // namespace mantis
