#include "train/state.h"

#include <fmt/format.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/file.h"

namespace mantis {

namespace fs = std::filesystem;

namespace {

// A checkpoint directory: these files, each covered by manifest.json (its size and SHA-256), and
// the manifest by its own SHA-256 of the rest of it — so no file can change unnoticed.
constexpr const char* kManifest = "manifest.json";
constexpr const char* kCheckpointFiles[] = {"config.json", "model.safetensors", "optimizer.bin", "trainer.json"};
// A LoRA run's (train/config.h [lora]) checkpoints also hold this, covered by the manifest too.
constexpr const char* kAdaptersFile = "adapters.safetensors";

// The manifest's hashed content: its compact dump without the "sha256" member.
std::string manifest_digest(nlohmann::ordered_json m) {
  m.erase("sha256");
  return sha256_hex(m.dump());
}

std::string exact(double x) { return std::isfinite(x) ? fmt::format("{:.17g}", x) : ""; }  // round-trips

// A JSON value for a message: short, one line.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "…" : s;
}

// trainer.json's field readers: the type and the range checked, the offender named.
uint64_t get_u64(const nlohmann::json& j, const char* key, const std::string& file) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned())
    throw InputError(fmt::format("{}: \"{}\" must be a non-negative integer, got {}", file, key, shown(v)));
  return v.get<uint64_t>();
}
void expect_equal(uint64_t got, uint64_t want, const char* what, const std::string& file) {
  if (got != want) throw InputError(fmt::format("{}: {} is {}, expected {}", file, what, got, want));
}
// A logged value as exact() wrote it: "" (only where allowed: not run) or a finite number.
double logged_number(const nlohmann::json& v, bool may_be_empty, const std::string& what, const std::string& file) {
  const std::string s = v.is_string() ? v.get<std::string>() : "?";
  if (s.empty() && may_be_empty) return std::nan("");
  double x = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (!v.is_string() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(x))
    throw InputError(fmt::format("{}: {} is {}, not a finite number", file, what, shown(v)));
  return x;
}

// optimizer.bin (header comment)
constexpr uint64_t kOptimizerFormat = 2;
static_assert(std::endian::native == std::endian::little, "optimizer.bin is little-endian");

std::string encode_optimizer_state(const std::vector<StateTensor>& st, nlohmann::ordered_json& index) {
  std::string bin;
  index = nlohmann::ordered_json::array();
  for (auto& t : st) {
    index.push_back({{"name", t.name}, {"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"values", t.numel()}});
    bin.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return bin;
}

// The tensors `o` (trainer.json's "optimizer") indexes in `bin`; `opt` gives format 1's shapes.
std::vector<StateTensor> decode_optimizer_state(const std::string& bin, const nlohmann::json& o, const Optimizer& opt,
                                                const std::string& ck, const std::string& tf) {
  const uint64_t format = o.contains("format") ? get_u64(o, "format", tf) : 1;
  if (format != 1 && format != kOptimizerFormat)
    throw InputError(fmt::format("{}: optimizer.format is {} (known: 1, {})", tf, format, kOptimizerFormat));
  std::map<std::string, std::vector<uint64_t>> v1_shapes;
  if (format == 1)
    for (auto& t : opt.state()) v1_shapes[t.name] = t.shape;
  std::vector<StateTensor> st;
  size_t off = 0;
  for (auto& e : o.at("tensors")) {
    StateTensor t;
    t.name = e.at("name").get<std::string>();
    const std::string what = fmt::format("optimizer tensor '{}'", escape_control(t.name.substr(0, 80)));
    if (format != 1) {
      const auto d = dtype_from_string(e.at("dtype").is_string() ? e.at("dtype").get<std::string>() : "");
      if (!d) throw InputError(fmt::format("{}: {}: dtype {} (known: {})", tf, what, shown(e.at("dtype")), dtype_names()));
      t.dtype = *d;
    }
    const uint64_t n = get_u64(e, "values", tf), size = dtype_size(t.dtype);
    if (n > (bin.size() - off) / size) throw InputError(fmt::format("{}/optimizer.bin: truncated", ck));
    if (format == 1) {
      const auto it = v1_shapes.find(t.name);
      t.shape = it != v1_shapes.end() && StateTensor{t.name, t.dtype, it->second, {}}.numel() == n
                    ? it->second : std::vector<uint64_t>{n};
    } else {
      const auto& sh = e.at("shape");
      uint64_t count = 1;
      bool ok = sh.is_array();
      for (size_t i = 0; ok && i < sh.size(); ++i) {
        ok = sh[i].is_number_unsigned();
        if (ok) t.shape.push_back(sh[i].get<uint64_t>());
        ok = ok && (t.shape.back() == 0 || count <= UINT64_MAX / t.shape.back());
        if (ok) count *= t.shape.back();
      }
      if (!ok || count != n)
        throw InputError(fmt::format("{}: {}: shape {} does not hold its {} values", tf, what, shown(sh), n));
    }
    t.bytes.resize(n * size);
    std::memcpy(t.bytes.data(), bin.data() + off, t.bytes.size());
    off += t.bytes.size();
    st.push_back(std::move(t));
  }
  if (off != bin.size()) throw InputError(fmt::format("{}/optimizer.bin: {} trailing bytes", ck, bin.size() - off));
  return st;
}

// Reads and verifies every file of checkpoint CK against its manifest; returns the files' bytes.
std::map<std::string, std::string> read_verified(const std::string& ck, uint64_t step) {
  const std::string mf = ck + "/" + kManifest;
  std::error_code ec;
  if (!fs::exists(mf, ec))
    throw InputError(fmt::format("{}: no {} (written by an older mantis, or incomplete): its files cannot be verified, "
                                 "so it is not resumed", ck, kManifest));
  nlohmann::ordered_json m;
  try {
    m = nlohmann::ordered_json::parse(read_file(mf));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: malformed: {}", mf, e.what()));
  }
  if (!m.is_object() || !m.contains("sha256") || !m["sha256"].is_string() || m["sha256"] != manifest_digest(m))
    throw InputError(fmt::format("{}: SHA-256 mismatch (corrupt checkpoint)", mf));
  std::map<std::string, std::string> out;
  try {
    expect_equal(get_u64(m, "step", mf), step, "step", mf);
    const auto& files = m.at("files");
    std::vector<std::string> names(std::begin(kCheckpointFiles), std::end(kCheckpointFiles));
    if (files.is_object() && files.contains(kAdaptersFile)) names.push_back(kAdaptersFile);
    if (!files.is_object() || files.size() != names.size())
      throw InputError(fmt::format("{}: \"files\" must list exactly the {} checkpoint files (and {} of a LoRA run)", mf,
                                   std::size(kCheckpointFiles), kAdaptersFile));
    for (const std::string& name : names) {
      const std::string path = ck + "/" + name;
      const auto& f = files.at(name);
      std::string bytes = read_file(path);
      if (bytes.size() != get_u64(f, "bytes", mf) || sha256_hex(bytes) != f.at("sha256").get<std::string>())
        throw InputError(fmt::format("{}: SHA-256 mismatch (corrupt checkpoint)", path));
      out.emplace(name, std::move(bytes));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: {}", mf, e.what()));
  }
  return out;
}

}  // namespace

void write_trainer_state(const std::string& dir, const TrainerState& s, const RunIdentity& run) {
  nlohmann::ordered_json tensors;
  const std::string bin = encode_optimizer_state(s.optimizer_state, tensors);
  write_file_atomic(dir + "/optimizer.bin", bin);
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["sequences_done"] = s.step * run.sequences_per_step;
  j["config_sha256"] = run.config_sha256;
  j["optimizer"] = {{"name", s.optimizer}, {"steps", s.optimizer_steps}, {"state_bytes", s.state_bytes},
                    {"file", "optimizer.bin"}, {"sha256", sha256_hex(bin)}, {"format", kOptimizerFormat},
                    {"tensors", tensors}};
  j["data"] = {{"seed", run.seed}, {"rule", "sequence k starts at philox64(seed, 0x7a11, k) mod (n - ctx)"}};
  nlohmann::ordered_json log = nlohmann::ordered_json::array();
  for (auto& r : s.log)
    log.push_back({r.step, exact(r.loss), exact(r.val_loss), exact(r.lr), exact(r.grad_norm), r.tokens, r.seconds,
                   r.state_bytes});
  j["log"] = log;
  j["units"] = s.units;
  if (!s.controller.is_null()) j["controller"] = s.controller;
  write_file_atomic(dir + "/trainer.json", j.dump(1) + "\n");
  nlohmann::ordered_json manifest;
  manifest["format"] = "mantis checkpoint";
  manifest["step"] = s.step;
  manifest["files"] = nlohmann::ordered_json::object();
  std::vector<std::string> names(std::begin(kCheckpointFiles), std::end(kCheckpointFiles));
  if (fs::exists(dir + "/" + kAdaptersFile)) names.push_back(kAdaptersFile);
  for (const std::string& f : names) {
    const std::string bytes = read_file(dir + "/" + f);  // what is on disk is what is hashed
    manifest["files"][f] = {{"bytes", bytes.size()}, {"sha256", sha256_hex(bytes)}};
  }
  manifest["sha256"] = manifest_digest(manifest);
  write_file_atomic(dir + "/" + kManifest, manifest.dump(1) + "\n");
}

TrainerState read_trainer_state(const std::string& ck, uint64_t at, const RunIdentity& run, const Optimizer& opt) {
  const auto files = read_verified(ck, at);
  const std::string tf = ck + "/trainer.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(files.at("trainer.json"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: malformed: {}", tf, e.what()));
  }
  TrainerState s;
  s.adapters = files.count(kAdaptersFile) > 0;
  try {
    if (j.at("config_sha256").get<std::string>() != run.config_sha256)
      throw InputError(fmt::format("{}: the checkpoint was written by a different configuration than {} (config "
                                   "SHA-256 differs); resume with the run's own config.toml",
                                   ck, run.config_path));
    const uint64_t step = get_u64(j, "step", tf);
    expect_equal(step, at, "step", tf);
    if (step > run.steps)  // (= steps: a finished run; resuming it does nothing)
      throw InputError(fmt::format("{}: step {} is beyond the configured {} steps", tf, step, run.steps));
    const uint64_t nseq = run.sequences_per_step, T = run.ctx;
    expect_equal(get_u64(j, "sequences_done", tf), step * nseq, "sequences_done", tf);  // step ≤ steps: no overflow
    expect_equal(get_u64(j.at("data"), "seed", tf), run.seed, "data.seed", tf);
    s.step = step;

    const std::string& bin = files.at("optimizer.bin");
    const auto& o = j.at("optimizer");
    if (o.at("name").get<std::string>() != opt.name() || o.at("file").get<std::string>() != "optimizer.bin")
      throw InputError(fmt::format("{}: optimizer {} / file {}, expected {} / optimizer.bin", tf, shown(o.at("name")),
                                   shown(o.at("file")), opt.name()));
    s.optimizer = opt.name();
    s.optimizer_steps = get_u64(o, "steps", tf);
    expect_equal(s.optimizer_steps, step, "optimizer.steps", tf);
    if (sha256_hex(bin) != o.at("sha256").get<std::string>())
      throw InputError(fmt::format("{}/optimizer.bin: SHA-256 mismatch (corrupt checkpoint)", ck));
    s.optimizer_state = decode_optimizer_state(bin, o, opt, ck, tf);
    s.state_bytes = 8;  // the step count
    for (auto& t : s.optimizer_state) s.state_bytes += t.bytes.size();
    expect_equal(get_u64(o, "state_bytes", tf), s.state_bytes, "optimizer.state_bytes", tf);

    const auto& jl = j.at("log");
    expect_equal(jl.size(), step, "the number of log rows", tf);
    for (uint64_t i = 0; i < step; ++i) {
      const auto& r = jl.at(i);
      const std::string row = fmt::format("log row {}", i);
      if (!r.is_array() || (r.size() != 7 && r.size() != 8))  // 7: before state_bytes was logged
        throw InputError(fmt::format("{}: {} must be [step, loss, val_loss, lr, grad_norm, tokens, seconds, "
                                     "state_bytes]", tf, row));
      StepRecord rec;
      if (!r[0].is_number_unsigned() || r[0].get<uint64_t>() != i || !r[5].is_number_unsigned() ||
          r[5].get<uint64_t>() != (i + 1) * nseq * T)
        throw InputError(fmt::format("{}: {}: step {} / tokens {}, expected {} / {}", tf, row, shown(r[0]),
                                     shown(r[5]), i, (i + 1) * nseq * T));
      rec.step = i, rec.tokens = (i + 1) * nseq * T;
      rec.loss = logged_number(r[1], false, row + " loss", tf);
      rec.val_loss = logged_number(r[2], true, row + " val_loss", tf);
      rec.lr = logged_number(r[3], false, row + " lr", tf);
      rec.grad_norm = logged_number(r[4], false, row + " grad_norm", tf);
      if (!r[6].is_number() || !(r[6].get<double>() >= 0))
        throw InputError(fmt::format("{}: {}: seconds {} must be a number ≥ 0", tf, row, shown(r[6])));
      rec.seconds = r[6].get<double>();
      if (r.size() == 8) {
        if (!r[7].is_number_unsigned() || r[7].get<uint64_t>() < 8)  // the step count alone is 8 bytes
          throw InputError(fmt::format("{}: {}: state_bytes {} must be an integer ≥ 8", tf, row, shown(r[7])));
        rec.state_bytes = r[7].get<uint64_t>();
      }
      s.log.push_back(rec);
    }
    const auto& ju = j.at("units");
    const uint64_t per_step = run.units_per_step;
    expect_equal(ju.size(), step * per_step, "the number of units rows", tf);
    for (size_t i = 0; i < ju.size(); ++i) {
      const std::string u = ju[i].is_string() ? ju[i].get<std::string>() : "";
      if (!u.starts_with(fmt::format("{},", i / per_step)) || u.find_first_of("\r\n") != std::string::npos)
        throw InputError(fmt::format("{}: units row {} is {}, not a units.csv row of step {}", tf, i, shown(ju[i]),
                                     i / per_step));
      s.units.push_back(u);
    }
    if (j.contains("controller")) s.controller = j.at("controller");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: {}", tf, e.what()));
  }
  return s;
}

std::optional<std::string> latest_checkpoint(const std::string& out) {
  const std::string file = out + "/latest";
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  std::string name = read_file(file);
  const size_t b = name.find_first_not_of(" \t\r\n"), e = name.find_last_not_of(" \t\r\n");
  name = b == std::string::npos ? "" : name.substr(b, e - b + 1);
  static const std::regex re("checkpoint-[0-9]{8,19}");  // also keeps the name inside OUT
  if (!std::regex_match(name, re))
    throw InputError(fmt::format("{}: \"{}\" is not a checkpoint name (checkpoint-<step>)", file, name.substr(0, 40)));
  return name;
}


void remove_stale(const std::string& out) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return;
  remove_stale_temporaries(out);
  for (auto& e : fs::directory_iterator(out, ec))
    if (e.is_directory(ec) && e.path().filename().string().starts_with("checkpoint-"))
      remove_stale_temporaries(e.path().string());
}

}  // namespace mantis
