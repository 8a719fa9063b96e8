#include "exp/merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "exp/study.h"

namespace mantis {

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}
bool has(const std::string& s, const std::string& t) { return s.find(t) != std::string::npos; }

// RFC 4180 fields of one line (quotes around a field, "" inside them for a quote).
std::vector<std::string> csv_fields(const std::string& line, const std::string& where) {
  std::vector<std::string> f(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') f.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else f.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      f.emplace_back();
    } else {
      f.back() += c;
    }
  }
  if (quoted) throw InputError(fmt::format("{}: unterminated quoted field", where));
  return f;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

bool numeric(const std::string& s) {
  if (s.empty()) return false;
  if (s == "inf" || s == "-inf" || s == "nan") return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// Columns that say what a row is, not what was measured (numbers among them: design values).
const std::set<std::string> kDesign = {"cell", "mu", "tau", "seed", "random_control", "M", "N", "K", "trials", "layer",
                                       "step", "block", "steps", "gemm_trials"};

}  // namespace

std::string metric_unit(const std::string& column) {
  // The unit is the name's last suffix (study.h), before a bracketed qualifier (val_loss_nats[kjv/test]).
  const std::string c = column.substr(0, column.find('['));
  if (c == "seconds" || ends_with(c, "_seconds") || ends_with(c, "_s")) return "s";
  if (c == "bytes_per_param") return "bytes/param";
  if (c == "bytes" || ends_with(c, "_bytes")) return "bytes";
  if (ends_with(c, "_nats")) return "nats";
  if (c == "tokens" || ends_with(c, "_tokens")) return "tokens";
  if (ends_with(c, "_elements")) return "elements";
  if (has(c, "spikes") || ends_with(c, "_count")) return "count";
  if (c.rfind("ppl", 0) == 0 || has(c, "_ppl")) return "perplexity";
  if (has(c, "rate") || has(c, "ratio") || has(c, "rel_err") || has(c, "fraction") || c == "gamma") return "1";
  if (has(c, "logit")) return "logit";
  static const std::set<std::string> counts = {"overflow", "nan", "inf", "units", "recovered", "exceeded", "eligible",
                                               "params", "nonfinite_positions", "positions", "windows", "flips",
                                               "seqs"};
  if (counts.count(c)) return "count";
  return "unknown";
}

std::string merge_result_sets(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw InputError("merge: no result directories given");
  std::string out = "source,generator,git_commit,row,model,policy,mu,site,design,metric,value,unit\n";
  for (const std::string& dir : dirs) {
    // the set under the result-set rule (study.h), results.csv among its files and read as verified
    ResultSet set = read_result_set(dir, {"results.csv"});
    const ojson& manifest = set.manifest;
    const std::string csv_path = dir + "/results.csv";
    const std::string& text = set.files["results.csv"];
    std::vector<std::string> lines;
    for (size_t a = 0, b; a < text.size(); a = b + 1) {
      b = text.find('\n', a);
      if (b == std::string::npos) b = text.size();
      if (b > a) lines.push_back(text.substr(a, b - a));
    }
    if (lines.empty()) throw InputError(fmt::format("{}: empty results.csv", csv_path));
    const auto header = csv_fields(lines[0], csv_path + ":1");
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 1; i < lines.size(); ++i) {
      rows.push_back(csv_fields(lines[i], fmt::format("{}:{}", csv_path, i + 1)));
      if (rows.back().size() != header.size())
        throw InputError(fmt::format("{}:{}: {} fields, the header has {}", csv_path, i + 1, rows.back().size(),
                                     header.size()));
    }
    // a column is a metric when every non-empty value is a number and it is not a design column
    std::vector<bool> metric(header.size(), true);
    for (size_t c = 0; c < header.size(); ++c) {
      if (kDesign.count(header[c])) metric[c] = false;
      for (const auto& r : rows)
        if (!r[c].empty() && !numeric(r[c])) metric[c] = false;
    }
    auto str = [&](const char* key) {
      const auto it = manifest.find(key);
      return it != manifest.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    const std::string generator = str("generator"), commit = str("git_commit");
    const std::string set_model = str("model"), set_policy = str("policy");
    auto column = [&](const std::vector<std::string>& r, const char* name) {
      const auto it = std::find(header.begin(), header.end(), name);
      return it == header.end() ? std::string() : r[size_t(it - header.begin())];
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      std::string design;
      for (size_t c = 0; c < header.size(); ++c)
        if (!metric[c] && !r[c].empty() && header[c] != "model" && header[c] != "policy" && header[c] != "mu" &&
            header[c] != "site")
          design += (design.empty() ? "" : ";") + header[c] + "=" + r[c];
      const std::string model = column(r, "model").empty() ? set_model : column(r, "model");
      const std::string policy = column(r, "policy").empty() ? set_policy : column(r, "policy");
      const std::string prefix =
          fmt::format("{},{},{},{},{},{},{},{},{}", csv_field(dir), csv_field(generator), csv_field(commit), i,
                      csv_field(model), csv_field(policy), csv_field(column(r, "mu")), csv_field(column(r, "site")),
                      csv_field(design));
      for (size_t c = 0; c < header.size(); ++c)
        if (metric[c] && !r[c].empty())
          out += fmt::format("{},{},{},{}\n", prefix, csv_field(header[c]), r[c], metric_unit(header[c]));
    }
  }
  return out;
}

}  // namespace mantis
