#include "train.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <toml++/toml.h>

#include "checkpoint.h"
#include "forward.h"
#include "io.h"
#include "metrics.h"
#include "philox.h"
#include "round_array.h"
#include "tokenizer.h"

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

  const auto* opt = r.table("optimizer", {"name", "beta1", "beta2", "eps", "weight_decay"});
  std::string oname = "adamw";
  r.get(opt, "optimizer", "name", oname);
  if (oname != "adamw") throw InputError(fmt::format("{}: [optimizer] name = '{}' (known: adamw)", path, oname));
  r.get(opt, "optimizer", "beta1", c.adamw.beta1);
  r.get(opt, "optimizer", "beta2", c.adamw.beta2);
  r.get(opt, "optimizer", "eps", c.adamw.eps);
  r.get(opt, "optimizer", "weight_decay", c.adamw.weight_decay);

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

TrainConfig load_train_config(const std::string& path) { return train_config_from_toml(read_file(path), path); }

// ---------------------------------------------------------------------------------------------
// the trainer

namespace {

uint64_t philox64(uint64_t seed, uint64_t stream, uint64_t k) {
  return uint64_t(random_word(seed, stream, 2 * k)) << 32 | random_word(seed, stream, 2 * k + 1);
}

constexpr uint64_t kDataStream = 0x7a11;

std::string fmt_num(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : ""; }
std::string exact(double x) { return std::isfinite(x) ? fmt::format("{:.17g}", x) : ""; }  // round-trips

}  // namespace

Trainer::Trainer(TrainConfig c, TrainController* controller)
    : c_(std::move(c)), controller_(controller ? controller : &default_controller_) {
  model_ = init_model(c_.model, c_.init_seed);
  opt_ = make_adamw(model_, c_.adamw);
  policy_ = policy_from_spec(c_.policy);
  policy_.check(c_.model);
  const auto tok = make_tokenizer(c_.tokenizer);
  train_ = load_tokens(c_.train_data, *tok, data_root());
  val_ = load_tokens(c_.val_data, *tok, data_root());
  const size_t T = size_t(c_.model.ctx);
  if (train_.tokens.size() <= T + 1)
    throw InputError(fmt::format("training data '{}' holds {} tokens; a sequence needs {}", c_.train_data,
                                 train_.tokens.size(), T + 1));
  val_starts_ = window_starts(val_.tokens.size(), size_t(c_.val_seqs), T + 1);
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
  if (!std::isfinite(mean_loss) || !std::isfinite(norm)) {
    std::string last = "none yet";
    if (fs::exists(c_.out + "/latest")) last = c_.out + "/" + read_file(c_.out + "/latest");
    throw InputError(fmt::format("step {}: {} is not finite (loss {}, gradient norm {}); stopped — last good "
                                 "checkpoint: {}", step_, std::isfinite(mean_loss) ? "the gradient norm" : "the loss",
                                 mean_loss, norm, last));
  }
  const double lr = c_.schedule.at(step_);
  opt_->step(model_, grads, lr);

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
  fs::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("cannot create {}: {}", dir, ec.message()));
  write_file_atomic(c_.out + "/config.toml", c_.text);
  save_model(model_, dir);
  // optimizer.bin: every state tensor in name order, binary32 little-endian
  const auto st = opt_->state();
  std::string bin;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (auto& [k, v] : st) {
    tensors.push_back({{"name", k}, {"values", v.size()}});
    bin.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  write_file_atomic(dir + "/optimizer.bin", bin);
  nlohmann::ordered_json j;
  j["step"] = step_;
  j["sequences_done"] = step_ * uint64_t(c_.batch) * uint64_t(c_.accum);
  j["config_sha256"] = c_.hash();
  j["optimizer"] = {{"name", opt_->name()}, {"steps", opt_->steps()}, {"state_bytes", opt_->state_bytes()},
                    {"file", "optimizer.bin"}, {"sha256", sha256_hex(bin)}, {"tensors", tensors}};
  j["data"] = {{"seed", c_.seed}, {"rule", "sequence k starts at philox64(seed, 0x7a11, k) mod (n - ctx)"}};
  nlohmann::ordered_json log = nlohmann::ordered_json::array();
  for (auto& r : log_)
    log.push_back({r.step, exact(r.loss), exact(r.val_loss), exact(r.lr), exact(r.grad_norm), r.tokens, r.seconds});
  j["log"] = log;
  j["units"] = unit_rows_;
  write_file_atomic(dir + "/trainer.json", j.dump(1) + "\n");
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
  const std::string latest = dir + "/latest";
  if (!fs::exists(latest)) throw InputError(fmt::format("{}: no checkpoint to resume ({} is missing)", dir, latest));
  const std::string ck = dir + "/" + read_file(latest);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(ck + "/trainer.json"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}/trainer.json: malformed: {}", ck, e.what()));
  }
  try {
    if (j.at("config_sha256").get<std::string>() != c_.hash())
      throw InputError(fmt::format("{}: the checkpoint was written by a different configuration than {} (config "
                                   "SHA-256 differs); resume with the run's own config.toml",
                                   ck, c_.path));
    Model m = load_model(ck);
    if (m.cfg.layers != c_.model.layers || m.cfg.dim != c_.model.dim || m.cfg.vocab != c_.model.vocab)
      throw InputError(fmt::format("{}: model shape differs from the configuration", ck));
    const std::string bin = read_file(ck + "/optimizer.bin");
    const auto& o = j.at("optimizer");
    if (sha256_hex(bin) != o.at("sha256").get<std::string>())
      throw InputError(fmt::format("{}/optimizer.bin: SHA-256 mismatch (corrupt checkpoint)", ck));
    std::map<std::string, std::vector<float>> st;
    size_t off = 0;
    for (auto& t : o.at("tensors")) {
      const size_t n = t.at("values").get<size_t>();
      if (off + n * 4 > bin.size()) throw InputError(fmt::format("{}/optimizer.bin: truncated", ck));
      std::vector<float> v(n);
      std::memcpy(v.data(), bin.data() + off, n * 4);
      off += n * 4;
      st.emplace(t.at("name").get<std::string>(), std::move(v));
    }
    if (off != bin.size()) throw InputError(fmt::format("{}/optimizer.bin: {} trailing bytes", ck, bin.size() - off));
    opt_->load_state(st, o.at("steps").get<uint64_t>());
    model_ = std::move(m);
    step_ = j.at("step").get<uint64_t>();
    log_.clear();
    for (auto& r : j.at("log")) {
      auto num = [](const nlohmann::json& x) { return x.get<std::string>().empty() ? std::nan("") : std::stod(x.get<std::string>()); };
      StepRecord s;
      s.step = r.at(0).get<uint64_t>(), s.loss = num(r.at(1)), s.val_loss = num(r.at(2)), s.lr = num(r.at(3));
      s.grad_norm = num(r.at(4)), s.tokens = r.at(5).get<uint64_t>(), s.seconds = r.at(6).get<double>();
      log_.push_back(s);
    }
    unit_rows_ = j.at("units").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}/trainer.json: {}", ck, e.what()));
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
