#include "train/train.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <stdio.h>  // renameat2

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <toml++/toml.h>

#include "core/error.h"
#include "io/checkpoint.h"
#include "nn/forward.h"
#include "core/file.h"
#include "nn/metrics.h"
#include "core/philox.h"
#include "core/round_array.h"
#include "io/tokenizer.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif
#include "mantis_config.h"

namespace mantis {

namespace fs = std::filesystem;

std::string TrainConfig::hash() const { return sha256_hex(text); }

// ---------------------------------------------------------------------------------------------
// configuration

namespace {

struct TomlReader {
  const toml::table& root;
  const std::string& path;

  std::string line(const toml::node& n) const { return fmt::format("{}:{}", path, n.source().begin.line); }

  const toml::table* table(const char* name, std::initializer_list<const char*> keys) const {
    const toml::node* n = root.get(name);
    if (!n) return nullptr;
    if (!n->is_table()) throw InputError(fmt::format("{}: '{}' must be a table ([{}])", line(*n), name, name));
    for (auto&& [k, v] : *n->as_table()) {
      bool known = false;
      std::string list;
      for (const char* key : keys) known |= k.str() == key, list += (list.empty() ? "" : ", ") + std::string(key);
      if (!known)
        throw InputError(fmt::format("{}: unknown key '{}' in [{}] (known: {})", line(v), k.str(), name, list));
    }
    return n->as_table();
  }
  template <class V>
  void get(const toml::table* t, const char* table_name, const char* key, V& out) const {
    if (!t) return;
    const toml::node* n = t->get(key);
    if (!n) return;
    auto bad = [&](const char* what) {
      return InputError(fmt::format("{}: '{}' in [{}] must be {}", line(*n), key, table_name, what));
    };
    if constexpr (std::is_same_v<V, bool>) {
      if (!n->is_boolean()) throw bad("true or false");
      out = n->as_boolean()->get();
    } else if constexpr (std::is_same_v<V, std::string>) {
      if (!n->is_string()) throw bad("a string");
      out = n->as_string()->get();
    } else if constexpr (std::is_floating_point_v<V>) {
      if (n->is_integer()) out = V(n->as_integer()->get());
      else if (n->is_floating_point()) out = V(n->as_floating_point()->get());
      else throw bad("a number");
      if (!std::isfinite(double(out))) throw bad("finite");
    } else {
      if (!n->is_integer()) throw bad("an integer");
      const int64_t v = n->as_integer()->get();
      if (v < 0 || uint64_t(v) > uint64_t(std::numeric_limits<V>::max())) throw bad("a non-negative integer in range");
      out = V(v);
    }
  }
};

}  // namespace

TrainConfig train_config_from_toml(const std::string& text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}: malformed TOML: {}", path, e.source().begin.line, e.description()));
  }
  const TomlReader r{root, path};
  static const std::set<std::string> top = {"out", "model", "data", "train", "optimizer", "precision", "activation_quant"};
  for (auto&& [k, v] : root)
    if (!top.count(std::string(k.str())))
      throw InputError(fmt::format("{}: unknown key '{}' (known: out, [model], [data], [train], [optimizer], "
                                   "[precision], [activation_quant])", r.line(v), k.str()));
  TrainConfig c;
  c.text = text, c.path = path;
  if (const toml::node* o = root.get("out")) {
    if (!o->is_string()) throw InputError(fmt::format("{}: 'out' must be a string", r.line(*o)));
    c.out = o->as_string()->get();
  }
  const auto* model = r.table("model", {"arch", "layers", "heads", "kv_heads", "dim", "hidden", "ctx", "gelu_tanh", "tied",
                                        "norm_eps", "rope_theta", "init_seed"});
  std::string arch = "gpt2";
  r.get(model, "model", "arch", arch);
  if (arch != "gpt2" && arch != "llama")
    throw InputError(fmt::format("{}: [model] arch = '{}' (known: gpt2, llama)", path, arch));
  ModelConfig& m = c.model;
  m.arch = arch == "gpt2" ? Arch::gpt2 : Arch::llama;
  m.layers = 4, m.heads = 4, m.dim = 128, m.ctx = 128;
  r.get(model, "model", "layers", m.layers);
  r.get(model, "model", "heads", m.heads);
  m.kv_heads = m.heads;
  r.get(model, "model", "kv_heads", m.kv_heads);
  r.get(model, "model", "dim", m.dim);
  m.hidden = 4 * m.dim;
  r.get(model, "model", "hidden", m.hidden);
  r.get(model, "model", "ctx", m.ctx);
  r.get(model, "model", "gelu_tanh", m.gelu_tanh);
  r.get(model, "model", "tied", m.tied);
  r.get(model, "model", "norm_eps", m.norm_eps);
  r.get(model, "model", "rope_theta", m.rope_theta);
  r.get(model, "model", "init_seed", c.init_seed);

  const auto* data = r.table("data", {"tokenizer", "train", "validation"});
  r.get(data, "data", "tokenizer", c.tokenizer);
  r.get(data, "data", "train", c.train_data);
  r.get(data, "data", "validation", c.val_data);
  m.vocab = int(make_tokenizer(c.tokenizer)->vocab_size());
  validate(m);

  const auto* train = r.table("train", {"steps", "batch", "accum", "lr", "min_lr", "warmup", "grad_clip", "seed",
                                        "val_every", "val_seqs", "checkpoint_every"});
  r.get(train, "train", "steps", c.steps);
  r.get(train, "train", "batch", c.batch);
  r.get(train, "train", "accum", c.accum);
  r.get(train, "train", "lr", c.schedule.lr);
  c.schedule.min_lr = c.schedule.lr / 10;
  r.get(train, "train", "min_lr", c.schedule.min_lr);
  r.get(train, "train", "warmup", c.schedule.warmup);
  r.get(train, "train", "grad_clip", c.grad_clip);
  r.get(train, "train", "seed", c.seed);
  r.get(train, "train", "val_every", c.val_every);
  r.get(train, "train", "val_seqs", c.val_seqs);
  r.get(train, "train", "checkpoint_every", c.checkpoint_every);
  c.schedule.steps = c.steps;
  if (c.steps < 1 || c.batch < 1 || c.accum < 1 || c.val_seqs < 1)
    throw InputError(fmt::format("{}: [train] steps, batch, accum and val_seqs must be ≥ 1", path));
  if (!(c.schedule.lr > 0) || c.schedule.min_lr < 0 || c.grad_clip < 0)
    throw InputError(fmt::format("{}: [train] lr must be > 0, min_lr and grad_clip ≥ 0", path));

  // [optimizer]: `name` picks the registry's entry, which reads the other keys (optim/optimizer.h).
  c.optimizer.source = path;
  if (const toml::node* n = root.get("optimizer")) {
    if (!n->is_table()) throw InputError(fmt::format("{}: 'optimizer' must be a table ([optimizer])", r.line(*n)));
    for (auto&& [k, v] : *n->as_table()) {
      if (k.str() == "name") continue;
      OptionValue& o = c.optimizer.values[std::string(k.str())];
      o.where = r.line(v);
      if (v.is_boolean()) o.value = v.as_boolean()->get();
      else if (v.is_integer()) o.value = v.as_integer()->get();
      else if (v.is_floating_point()) o.value = v.as_floating_point()->get();
      else if (v.is_string()) o.value = v.as_string()->get();
    }
    r.get(n->as_table(), "optimizer", "name", c.optimizer.name);
  }
  check_optimizer(c.optimizer);

  const auto* prec = r.table("precision", {"policy"});
  r.get(prec, "precision", "policy", c.policy);
  const auto* aq = r.table("activation_quant", {"bits", "block", "rounding", "seed"});
  r.get(aq, "activation_quant", "bits", c.act_quant.bits);
  r.get(aq, "activation_quant", "block", c.act_quant.block);
  std::string rounding = "rne";
  r.get(aq, "activation_quant", "rounding", rounding);
  c.act_quant.rounding = rounding_from_string(rounding);
  r.get(aq, "activation_quant", "seed", c.act_quant.seed);
  try {
    validate(c.act_quant);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [activation_quant]: {}", path, e.what()));
  }
  return c;
}

TrainConfig load_train_config(const std::string& path) { return train_config_from_toml(read_text_file(path, "training configuration"), path); }

// ---------------------------------------------------------------------------------------------
// the trainer

namespace {

uint64_t philox64(uint64_t seed, uint64_t stream, uint64_t k) {
  return uint64_t(random_word(seed, stream, 2 * k)) << 32 | random_word(seed, stream, 2 * k + 1);
}

constexpr uint64_t kDataStream = 0x7a11;

std::string fmt_num(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : ""; }
std::string exact(double x) { return std::isfinite(x) ? fmt::format("{:.17g}", x) : ""; }  // round-trips

// A checkpoint directory: these files, each covered by manifest.json (its size and SHA-256), and
// the manifest by its own SHA-256 of the rest of it — so no file can change unnoticed.
constexpr const char* kManifest = "manifest.json";
constexpr const char* kCheckpointFiles[] = {"config.json", "model.safetensors", "optimizer.bin", "trainer.json"};

// The manifest's hashed content: its compact dump without the "sha256" member.
std::string manifest_digest(nlohmann::ordered_json m) {
  m.erase("sha256");
  return sha256_hex(m.dump());
}

// The checkpoint OUT/latest names (surrounding whitespace ignored), or nothing when there is none.
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

// The tail of a message that stops a run.
std::string stopped(const std::string& out) {
  std::string last = "none yet";
  try {
    if (auto n = latest_checkpoint(out)) last = out + "/" + *n;
  } catch (const InputError& e) {
    last = e.what();
  }
  return "stopped — last good checkpoint: " + last;
}

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

// optimizer.bin: the state tensors' bytes back to back, in state() order. trainer.json's
// "optimizer" object indexes them: "format": 2, "tensors": [{name, dtype, shape, values}], values
// the element count. Format 1 (no "format"; mantis before typed state): every tensor binary32,
// {name, values} only, its shape that of the optimizer's tensor of that name.
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
    if (!files.is_object() || files.size() != std::size(kCheckpointFiles))
      throw InputError(fmt::format("{}: \"files\" must list exactly the {} checkpoint files", mf, std::size(kCheckpointFiles)));
    for (const char* name : kCheckpointFiles) {
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

// A killed run's temporaries: in OUT and in each checkpoint directory (older layouts wrote there).
void remove_stale(const std::string& out) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return;
  remove_stale_temporaries(out);
  for (auto& e : fs::directory_iterator(out, ec))
    if (e.is_directory(ec) && e.path().filename().string().starts_with("checkpoint-"))
      remove_stale_temporaries(e.path().string());
}

}  // namespace

Trainer::Trainer(TrainConfig c, TrainController* controller)
    : c_(std::move(c)), controller_(controller ? controller : &default_controller_) {
  policy_ = policy_from_spec(c_.policy);
  policy_.check(c_.model);
  // The data first: ctx is checked against it before the model (wpe is [ctx, dim]) is allocated.
  const auto tok = make_tokenizer(c_.tokenizer);
  train_ = load_tokens(c_.train_data, *tok, data_root());
  val_ = load_tokens(c_.val_data, *tok, data_root());
  const size_t T = size_t(c_.model.ctx);
  if (train_.tokens.size() <= T + 1)
    throw InputError(fmt::format("training data '{}' holds {} tokens; a sequence needs {}", c_.train_data,
                                 train_.tokens.size(), T + 1));
  try {
    val_starts_ = window_starts(val_.tokens.size(), size_t(c_.val_seqs), T + 1);
  } catch (const InputError& e) {
    throw InputError(fmt::format("validation data '{}': {}", c_.val_data, e.what()));
  }
  model_ = init_model(c_.model, c_.init_seed);
  opt_ = make_optimizer(model_, c_.optimizer);
  if (!c_.out.empty()) remove_stale(c_.out);
}

StepRecord Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& mc = c_.model;
  const size_t T = size_t(mc.ctx), nseq = size_t(c_.batch) * size_t(c_.accum);
  const uint64_t k0 = step_ * nseq;
  std::vector<SavedQuant> paths(size_t(mc.layers * kUnitCount), c_.act_quant);
  controller_->choose(step_, paths);
  for (auto& p : paths) validate(p);

  std::vector<GradMap<float>> g(nseq);
  std::vector<LossSum> loss(nseq);
  std::vector<std::vector<UnitActivation>> acts(nseq);
  const double scale = 1.0 / double(nseq * T);
  const size_t span = train_.tokens.size() - T;
  std::vector<std::exception_ptr> errors(nseq);  // an exception must not leave the parallel region
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < nseq; ++i) try {
    const uint64_t k = k0 + i;
    const size_t start = size_t(philox64(c_.seed, kDataStream, k) % span);
    std::vector<int32_t> in(T), tgt(T);  // [T]
    for (size_t t = 0; t < T; ++t) {
      in[t] = int32_t(train_.tokens[start + t]);
      tgt[t] = int32_t(train_.tokens[start + t + 1]);
    }
    g[i] = zero_grads<float>(model_);
    BackwardOptions o;
    o.saved = [&](int l, Unit u) { return paths[size_t(l * kUnitCount + int(u))]; };
    o.step = k;
    o.activations = &acts[i];
    loss[i] = sequence_backward<float>(model_, in, tgt, salted(policy_, k), scale, g[i], o);
  } catch (...) {
    errors[i] = std::current_exception();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  GradMap<float>& grads = g[0];
  for (size_t i = 1; i < nseq; ++i)  // sequence order
    for (auto& [name, v] : grads) {
      const auto& w = g[i].at(name);
      for (size_t j = 0; j < v.size(); ++j) v[j] += w[j];
    }
  double loss_sum = 0;
  int64_t count = 0;
  for (auto& l : loss) loss_sum += l.sum, count += l.count;
  const double mean_loss = loss_sum / double(count);

  // per-unit report (before clipping)
  std::vector<UnitStep> units;
  for (int l = 0; l < mc.layers; ++l)
    for (int u = 0; u < kUnitCount; ++u) {
      UnitStep us{l, Unit(u), paths[size_t(l * kUnitCount + u)], 0, {}};
      double ss = 0;
      for (auto& name : unit_parameters(mc, l, Unit(u)))
        for (float x : grads.at(name)) ss += double(x) * double(x);
      us.grad_norm = std::sqrt(ss);
      for (auto& a : acts) {
        const UnitActivation& b = a[size_t(l * kUnitCount + u)];
        us.act.absmax = std::max(us.act.absmax, b.absmax);
        us.act.sum_sq += b.sum_sq, us.act.err_sq += b.err_sq, us.act.count += b.count;
      }
      units.push_back(us);
    }
  controller_->observe(step_, units);

  const double norm = clip_grads(model_, grads, c_.grad_clip);
  if (!std::isfinite(mean_loss) || !std::isfinite(norm))
    throw InputError(fmt::format("step {}: {} is not finite (loss {}, gradient norm {}); {}", step_,
                                 std::isfinite(mean_loss) ? "the gradient norm" : "the loss", mean_loss, norm,
                                 stopped(c_.out)));
  const double lr = c_.schedule.at(step_);
  opt_->step(model_, grads, lr);
  try {  // an overflowing update (a huge lr) stops here, not half-way through writing a checkpoint
    validate(model_);
  } catch (const InputError& e) {
    throw InputError(fmt::format("step {}: the update (lr {}) made the parameters non-finite ({}); {}", step_, lr,
                                 e.what(), stopped(c_.out)));
  }

  StepRecord rec;
  rec.step = step_;
  rec.loss = mean_loss;
  rec.val_loss = std::nan("");
  rec.lr = lr;
  rec.grad_norm = norm;
  rec.tokens = (step_ + 1) * nseq * T;
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& u : units) {
    const double rms = u.act.count ? std::sqrt(u.act.sum_sq / double(u.act.count)) : 0;
    const double qerr = u.act.sum_sq > 0 ? std::sqrt(u.act.err_sq / u.act.sum_sq) : 0;
    unit_rows_.push_back(fmt::format("{},{},{},{},{},{},{},{}", step_, u.layer, to_string(u.unit), u.path.bits,
                                     fmt_num(u.grad_norm), fmt_num(rms), fmt_num(u.act.absmax), fmt_num(qerr)));
  }
  log_.push_back(rec);
  ++step_;
  return rec;
}

double Trainer::validation_loss() {
  const size_t T = size_t(c_.model.ctx);
  std::vector<double> sums(val_starts_.size());
  for (size_t w = 0; w < val_starts_.size(); ++w) {
    std::vector<int32_t> in(T);  // [T]
    for (size_t t = 0; t < T; ++t) in[t] = int32_t(val_.tokens[val_starts_[w] + t]);
    const Matrix<float> logits = forward<float>(model_, in);  // [T,V]
    double s = 0;
    for (size_t t = 0; t < T; ++t)
      s += nll(std::span<const float>(logits.row(Eigen::Index(t)).data(), size_t(logits.cols())),
               int32_t(val_.tokens[val_starts_[w] + t + 1]));
    sums[w] = s;
  }
  double total = 0;
  for (double s : sums) total += s;
  return total / double(val_starts_.size() * T);
}

void Trainer::write_logs() const {
  std::error_code ec;
  fs::create_directories(c_.out, ec);
  std::string log = "step,loss,val_loss,lr,grad_norm,tokens,seconds\n";
  for (auto& r : log_)
    log += fmt::format("{},{},{},{},{},{},{:.4f}\n", r.step, fmt_num(r.loss), fmt_num(r.val_loss), fmt_num(r.lr),
                       fmt_num(r.grad_norm), r.tokens, r.seconds);
  write_file_atomic(c_.out + "/log.csv", log);
  std::string units = "step,layer,unit,bits,grad_norm,act_rms,act_absmax,quant_rel_rms\n";
  for (auto& u : unit_rows_) units += u + "\n";
  write_file_atomic(c_.out + "/units.csv", units);
}

void Trainer::save_checkpoint() {
  if (c_.out.empty()) throw InputError("training: no output directory (set out = \"…\" or --out)");
  const std::string name = fmt::format("checkpoint-{:08d}", step_);
  const std::string dir = c_.out + "/" + name;
  std::error_code ec;
  fs::create_directories(c_.out, ec);
  if (ec) throw InputError(fmt::format("cannot create {}: {}", c_.out, ec.message()));
  write_file_atomic(c_.out + "/config.toml", c_.text);
  // Built under a temporary name and renamed into place whole: no half-made checkpoint is ever
  // visible, and a failure leaves none behind.
  const std::string tmp = temporary_path(dir);
  try {
    if (!fs::create_directory(tmp, ec)) throw InputError(fmt::format("cannot create {}: {}", tmp, ec.message()));
    save_model(model_, tmp);
    nlohmann::ordered_json tensors;
    const std::string bin = encode_optimizer_state(opt_->state(), tensors);
    write_file_atomic(tmp + "/optimizer.bin", bin);
    nlohmann::ordered_json j;
    j["step"] = step_;
    j["sequences_done"] = step_ * uint64_t(c_.batch) * uint64_t(c_.accum);
    j["config_sha256"] = c_.hash();
    j["optimizer"] = {{"name", opt_->name()}, {"steps", opt_->steps()}, {"state_bytes", opt_->state_bytes()},
                      {"file", "optimizer.bin"}, {"sha256", sha256_hex(bin)}, {"format", kOptimizerFormat},
                      {"tensors", tensors}};
    j["data"] = {{"seed", c_.seed}, {"rule", "sequence k starts at philox64(seed, 0x7a11, k) mod (n - ctx)"}};
    nlohmann::ordered_json log = nlohmann::ordered_json::array();
    for (auto& r : log_)
      log.push_back({r.step, exact(r.loss), exact(r.val_loss), exact(r.lr), exact(r.grad_norm), r.tokens, r.seconds});
    j["log"] = log;
    j["units"] = unit_rows_;
    write_file_atomic(tmp + "/trainer.json", j.dump(1) + "\n");
    nlohmann::ordered_json manifest;
    manifest["format"] = "mantis checkpoint";
    manifest["step"] = step_;
    manifest["files"] = nlohmann::ordered_json::object();
    for (const char* f : kCheckpointFiles) {
      const std::string bytes = read_file(tmp + "/" + f);  // what is on disk is what is hashed
      manifest["files"][f] = {{"bytes", bytes.size()}, {"sha256", sha256_hex(bytes)}};
    }
    manifest["sha256"] = manifest_digest(manifest);
    write_file_atomic(tmp + "/" + kManifest, manifest.dump(1) + "\n");
    // An older directory of this name (an interrupted run's, never named by `latest` since) is
    // swapped out atomically, then removed.
    const bool exists = fs::exists(dir, ec);
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), exists ? RENAME_EXCHANGE : RENAME_NOREPLACE) != 0)
      throw InputError(fmt::format("{}: cannot rename {} into place: {}", dir, tmp, std::strerror(errno)));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(tmp, ec);  // the swapped-out older directory, if any
  sync_directory(c_.out);
  write_logs();
  write_file_atomic(c_.out + "/latest", name);
  // keep the newest two checkpoints
  std::vector<std::string> old;
  for (auto& e : fs::directory_iterator(c_.out, ec))
    if (e.is_directory() && e.path().filename().string().starts_with("checkpoint-")) old.push_back(e.path().filename().string());
  std::sort(old.begin(), old.end());
  for (size_t i = 0; i + 2 < old.size(); ++i) fs::remove_all(c_.out + "/" + old[i], ec);
}

void Trainer::resume(const std::string& dir) {
  const auto name = latest_checkpoint(dir);
  if (!name) throw InputError(fmt::format("{}: no checkpoint to resume ({}/latest is missing)", dir, dir));
  const std::string ck = dir + "/" + *name;
  const uint64_t at = std::stoull(name->substr(name->find('-') + 1));  // ≤ 19 digits: fits
  const auto files = read_verified(ck, at);
  const std::string tf = ck + "/trainer.json";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(files.at("trainer.json"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: malformed: {}", tf, e.what()));
  }
  try {
    if (j.at("config_sha256").get<std::string>() != c_.hash())
      throw InputError(fmt::format("{}: the checkpoint was written by a different configuration than {} (config "
                                   "SHA-256 differs); resume with the run's own config.toml",
                                   ck, c_.path));
    const uint64_t step = get_u64(j, "step", tf);
    expect_equal(step, at, "step", tf);
    if (step > c_.steps)  // (= steps: a finished run; resuming it does nothing)
      throw InputError(fmt::format("{}: step {} is beyond the configured {} steps", tf, step, c_.steps));
    const uint64_t nseq = uint64_t(c_.batch) * uint64_t(c_.accum), T = uint64_t(c_.model.ctx);
    expect_equal(get_u64(j, "sequences_done", tf), step * nseq, "sequences_done", tf);  // step ≤ steps: no overflow
    expect_equal(get_u64(j.at("data"), "seed", tf), c_.seed, "data.seed", tf);

    Model m = load_model(ck);
    if (!(m.cfg == c_.model)) throw InputError(fmt::format("{}/config.json: the model differs from the configuration", ck));

    const std::string& bin = files.at("optimizer.bin");
    const auto& o = j.at("optimizer");
    if (o.at("name").get<std::string>() != opt_->name() || o.at("file").get<std::string>() != "optimizer.bin")
      throw InputError(fmt::format("{}: optimizer {} / file {}, expected {} / optimizer.bin", tf, shown(o.at("name")),
                                   shown(o.at("file")), opt_->name()));
    expect_equal(get_u64(o, "steps", tf), step, "optimizer.steps", tf);
    if (sha256_hex(bin) != o.at("sha256").get<std::string>())
      throw InputError(fmt::format("{}/optimizer.bin: SHA-256 mismatch (corrupt checkpoint)", ck));
    const std::vector<StateTensor> st = decode_optimizer_state(bin, o, *opt_, ck, tf);
    uint64_t st_bytes = 8;  // the step count
    for (auto& t : st) st_bytes += t.bytes.size();
    expect_equal(get_u64(o, "state_bytes", tf), st_bytes, "optimizer.state_bytes", tf);

    const auto& jl = j.at("log");
    expect_equal(jl.size(), step, "the number of log rows", tf);
    std::vector<StepRecord> log;
    for (uint64_t i = 0; i < step; ++i) {
      const auto& r = jl.at(i);
      const std::string row = fmt::format("log row {}", i);
      if (!r.is_array() || r.size() != 7)
        throw InputError(fmt::format("{}: {} must be [step, loss, val_loss, lr, grad_norm, tokens, seconds]", tf, row));
      StepRecord s;
      if (!r[0].is_number_unsigned() || r[0].get<uint64_t>() != i || !r[5].is_number_unsigned() ||
          r[5].get<uint64_t>() != (i + 1) * nseq * T)
        throw InputError(fmt::format("{}: {}: step {} / tokens {}, expected {} / {}", tf, row, shown(r[0]),
                                     shown(r[5]), i, (i + 1) * nseq * T));
      s.step = i, s.tokens = (i + 1) * nseq * T;
      s.loss = logged_number(r[1], false, row + " loss", tf);
      s.val_loss = logged_number(r[2], true, row + " val_loss", tf);
      s.lr = logged_number(r[3], false, row + " lr", tf);
      s.grad_norm = logged_number(r[4], false, row + " grad_norm", tf);
      if (!r[6].is_number() || !(r[6].get<double>() >= 0))
        throw InputError(fmt::format("{}: {}: seconds {} must be a number ≥ 0", tf, row, shown(r[6])));
      s.seconds = r[6].get<double>();
      log.push_back(s);
    }
    const auto& ju = j.at("units");
    const uint64_t per_step = uint64_t(c_.model.layers) * kUnitCount;
    expect_equal(ju.size(), step * per_step, "the number of units rows", tf);
    std::vector<std::string> units;
    for (size_t i = 0; i < ju.size(); ++i) {
      const std::string u = ju[i].is_string() ? ju[i].get<std::string>() : "";
      if (!u.starts_with(fmt::format("{},", i / per_step)) || u.find_first_of("\r\n") != std::string::npos)
        throw InputError(fmt::format("{}: units row {} is {}, not a units.csv row of step {}", tf, i, shown(ju[i]),
                                     i / per_step));
      units.push_back(u);
    }
    try {  // the last check; nothing below can fail
      opt_->load_state(st, step);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}/optimizer.bin: {}", ck, e.what()));
    }
    model_ = std::move(m);
    step_ = step;
    log_ = std::move(log);
    unit_rows_ = std::move(units);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: {}", tf, e.what()));
  }
}

void Trainer::run(const std::function<void(const StepRecord&)>& progress, uint64_t until) {
  const uint64_t end = until == 0 ? c_.steps : std::min(until, c_.steps);
  while (step_ < end) {
    StepRecord r = step();
    const bool last = step_ == c_.steps;
    if (last || (c_.val_every && step_ % c_.val_every == 0)) {
      r.val_loss = log_.back().val_loss = validation_loss();
    }
    if (progress) progress(r);
    if (!c_.out.empty() && (last || (c_.checkpoint_every && step_ % c_.checkpoint_every == 0))) save_checkpoint();
  }
}

}  // namespace mantis
