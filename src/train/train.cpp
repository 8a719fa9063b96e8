#include "train/train.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <stdio.h>  // renameat2

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/windows.h"
#include "nn/forward.h"
#include "core/file.h"
#include "nn/metrics.h"
#include "core/philox.h"
#include "core/reduce.h"
#include "core/round_array.h"

#if MANTIS_HAVE_OPENMP
#include <omp.h>
#endif
#include "mantis_config.h"

namespace mantis {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kDataStream = 0x7a11;

std::string fmt_num(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : ""; }

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

// g[0] += g[1], then += g[2], … (sequence order, each element's sum the same as one pass per
// buffer), in blocks that stay in L1 across the buffers.
void sum_in_order(std::vector<GradMap<float>>& g) {
  constexpr size_t kBlock = 2048;
  for (auto& [name, v] : g[0]) {
    std::vector<const float*> src;
    for (size_t i = 1; i < g.size(); ++i) src.push_back(g[i].at(name).data());
    const size_t n = v.size(), nb = (n + kBlock - 1) / kBlock;
    float* dst = v.data();
#pragma omp parallel for schedule(static) if (nb > 1)
    for (size_t b = 0; b < nb; ++b) {
      const size_t j0 = b * kBlock, j1 = std::min(n, j0 + kBlock);
      for (const float* w : src)
        for (size_t j = j0; j < j1; ++j) dst[j] += w[j];
    }
  }
}

}  // namespace

Trainer::Trainer(TrainConfig c, TrainController* controller)
    : c_(std::move(c)), controller_(controller ? controller : &default_controller_) {
  policy_ = policy_from_spec(c_.policy);
  policy_.check(c_.model);
  // The data first: ctx is checked against it before the model (wpe is [ctx, dim]) is allocated.
  const auto tok = make_tokenizer(c_.tokenizer);
  train_ = load_tokens(c_.train_data, *tok);
  val_ = load_tokens(c_.val_data, *tok);
  const size_t T = size_t(c_.model.ctx);
  if (train_.tokens.size() <= T + 1)
    throw InputError(fmt::format("training data '{}' holds {} tokens; a sequence needs {}", c_.train_data,
                                 train_.tokens.size(), T + 1));
  try {
    val_starts_ = window_starts(val_.tokens.size(), size_t(c_.val_seqs), T + 1);
  } catch (const InputError& e) {
    throw InputError(fmt::format("validation data '{}': {}", c_.val_data, e.what()));
  }
  if (!controller && !c_.controller.name.empty()) {
    owned_ = make_controller(c_.controller, c_.model);
    controller_ = owned_.get();
  }
  model_ = c_.init_model ? *c_.init_model : init_model(c_.model, c_.init_seed);  // [model] init: as loaded
  if (c_.lora) {  // the base frozen: the optimizer, the clip and the checkpoints' adapters file see the adapters only
    model_.lora = init_lora(c_.model, *c_.lora, c_.lora_seed);
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (auto& [name, t] : model_.lora.params) shapes.emplace_back(name, t.shape), trained_.push_back(name);
    opt_ = make_optimizer(param_set(shapes), c_.optimizer);
  } else {
    for (auto& [name, shape] : parameter_shapes(c_.model)) trained_.push_back(name);
    opt_ = make_optimizer(model_, c_.optimizer);
  }
  if (!c_.out.empty()) remove_stale(c_.out);
}

double Trainer::gradient_pass(const std::vector<UnitPath>& paths, std::vector<std::vector<UnitActivation>>& acts) {
  const ModelConfig& mc = c_.model;
  const size_t T = size_t(mc.ctx), nseq = size_t(c_.batch) * size_t(c_.accum);
  const uint64_t k0 = step_ * nseq;
  check_paths(paths, mc, step_);
  // The step's policy: the run's, or with the controller's GEMM overrides as layer entries.
  Policy routed;
  const bool overrides = has_overrides(paths);
  if (overrides) routed = with_overrides(policy_, paths);
  const Policy& policy = overrides ? routed : policy_;

  // One gradient buffer per sequence, kept across steps (no allocation, no page faults) and
  // zeroed by the thread that fills it.
  std::vector<GradMap<float>>& g = seq_grads_;
  const bool fresh = g.size() != nseq;
  if (fresh) g.assign(nseq, zero_grads<float>(model_));
  std::vector<LossSum> loss(nseq);
  acts.assign(nseq, {});
  const double scale = 1.0 / double(nseq * T);
  const size_t span = train_.tokens.size() - T;
  std::vector<std::exception_ptr> errors(nseq);  // an exception must not leave the parallel region
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < nseq; ++i) try {
    const uint64_t k = k0 + i;
    const size_t start = size_t(random_word64(c_.seed, kDataStream, k) % span);
    const Window win = window_at(train_.tokens, start, int(T));  // inputs, targets [T]
    const std::vector<int32_t>& in = win.inputs;
    const std::vector<int32_t>& tgt = win.targets;
    if (!fresh)
      for (auto& [name, v] : g[i]) std::fill(v.begin(), v.end(), 0.0f);
    BackwardOptions o;
    o.saved = [&](int l, Unit u) { return paths[size_t(l * kUnitCount + int(u))].saved; };
    o.low = [&](int l, Unit u) { return paths[size_t(l * kUnitCount + int(u))].low; };
    o.blocks = [&](int l, Unit u) { return &paths[size_t(l * kUnitCount + int(u))].blocks; };
    o.step = k;
    o.activations = &acts[i];
    o.base_weight_grads = !c_.lora;  // frozen: only the adapters' gradients are used
    loss[i] = sequence_backward<float>(model_, in, tgt, salted(policy, k), scale, g[i], o);
  } catch (...) {
    errors[i] = std::current_exception();
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  sum_in_order(g);
  double loss_sum = 0;
  int64_t count = 0;
  for (auto& l : loss) loss_sum += l.sum, count += l.count;
  return loss_sum / double(count);
}

namespace {
bool controller_blocks(const std::vector<UnitPath>& paths) {
  return std::any_of(paths.begin(), paths.end(), [](const UnitPath& p) { return p.blocks.block > 0; });
}
}  // namespace

StepRecord Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& mc = c_.model;
  const size_t T = size_t(mc.ctx), nseq = size_t(c_.batch) * size_t(c_.accum);
  std::vector<UnitPath> paths(size_t(mc.layers * kUnitCount), UnitPath{c_.act_quant, {}, {}, {}, {}});
  controller_->choose(step_, paths);
  std::vector<std::vector<UnitActivation>> acts;
  double mean_loss = gradient_pass(paths, acts);
  GradMap<float>& grads = seq_grads_[0];

  // per-unit report (before clipping)
  std::vector<UnitStep> units;
  const std::vector<ParamInfo> infos = controller_blocks(paths) ? parameter_infos(mc) : std::vector<ParamInfo>{};
  for (int l = 0; l < mc.layers; ++l)
    for (int u = 0; u < kUnitCount; ++u) {
      UnitStep us{l, Unit(u), paths[size_t(l * kUnitCount + u)], 0, {}};
      double ss = 0;
      for (auto& name : unit_parameters(mc, l, Unit(u)))
        for (const std::string& n : c_.lora ? std::vector<std::string>{name + ".lora_A", name + ".lora_B"}
                                            : std::vector<std::string>{name})
          if (auto it = grads.find(n); it != grads.end()) ss += sum_squares(it->second.data(), it->second.size());
      us.grad_norm = std::sqrt(ss);
      for (auto& a : acts) {  // sequences in order
        const UnitActivation& b = a[size_t(l * kUnitCount + u)];
        us.act.absmax = std::max(us.act.absmax, b.absmax);
        us.act.sum_sq += b.sum_sq, us.act.err_sq += b.err_sq, us.act.low_err_sq += b.low_err_sq;
        us.act.count += b.count;
        us.act.block_sum_sq.resize(b.block_sum_sq.size()), us.act.block_low_err_sq.resize(b.block_sum_sq.size());
        for (size_t k = 0; k < b.block_sum_sq.size(); ++k)
          us.act.block_sum_sq[k] += b.block_sum_sq[k], us.act.block_low_err_sq[k] += b.block_low_err_sq[k];
      }
      if (const int w = us.path.blocks.block; w > 0) {  // column blocks of the weight gradients [out, in]
        us.block_norms.assign(us.path.blocks.count(size_t(saved_cols(mc, Unit(u)))), 0.0);
        for (const ParamInfo& p : infos)
          if (p.layer == l && unit_of(p.role) == Unit(u) && p.shape.size() == 2) {
            const std::vector<float>& gw = grads.at(p.name);
            const size_t in = size_t(p.shape[1]);
            for (size_t i = 0; i < gw.size(); ++i) us.block_norms[(i % in) / size_t(w)] += double(gw[i]) * double(gw[i]);
          }
        for (double& v : us.block_norms) v = std::sqrt(v);
      }
      units.push_back(us);
    }
  controller_->observe(step_, units);
  if (controller_->rerun(step_, paths)) mean_loss = gradient_pass(paths, acts);  // the same step, new paths

  const double norm = clip_grads(trained_, grads, c_.grad_clip);
  if (!std::isfinite(mean_loss) || !std::isfinite(norm))
    throw InputError(fmt::format("step {}: {} is not finite (loss {}, gradient norm {}); {}", step_,
                                 std::isfinite(mean_loss) ? "the gradient norm" : "the loss", mean_loss, norm,
                                 stopped(c_.out)));
  const double lr = c_.schedule.at(step_);
  if (c_.lora) {  // the optimizer's parameters are the adapters (its set's names)
    Model adapters;
    adapters.params.swap(model_.lora.params);
    opt_->step(adapters, grads, lr);
    adapters.params.swap(model_.lora.params);
  } else {
    opt_->step(model_, grads, lr);
  }
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
  rec.state_bytes = opt_->state_bytes();
  rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& u : units) {
    const double rms = u.act.count ? std::sqrt(u.act.sum_sq / double(u.act.count)) : 0;
    const double qerr = u.act.sum_sq > 0 ? std::sqrt(u.act.err_sq / u.act.sum_sq) : 0;
    unit_rows_.push_back(fmt::format("{},{},{},{},{},{},{},{}", step_, u.layer, to_string(u.unit), u.path.saved.label(),
                                     fmt_num(u.grad_norm), fmt_num(rms), fmt_num(u.act.absmax), fmt_num(qerr)));
  }
  log_.push_back(rec);
  ++step_;
  if (observer_) observer_(rec, grads, *opt_);
  return rec;
}

double Trainer::validation_loss() { return mean_loss(val_.tokens, val_starts_); }

double Trainer::validation_loss_on(const std::string& spec) const {
  const TokenData d = load_tokens(spec, *make_tokenizer(c_.tokenizer));
  try {
    return mean_loss(d.tokens, window_starts(d.tokens.size(), size_t(c_.val_seqs), size_t(c_.model.ctx) + 1));
  } catch (const InputError& e) {
    throw InputError(fmt::format("validation data '{}': {}", spec, e.what()));
  }
}

double Trainer::mean_loss(const std::vector<uint32_t>& tokens, const std::vector<size_t>& starts) const {
  const size_t T = size_t(c_.model.ctx);
  std::vector<double> sums(starts.size());
  for (size_t w = 0; w < starts.size(); ++w) {
    const Window win = window_at(tokens, starts[w], int(T));  // inputs, targets [T]
    const Matrix<float> logits = forward<float>(model_, win.inputs);  // [T,V]
    double s = 0;
    for (size_t t = 0; t < T; ++t)
      s += nll(std::span<const float>(logits.row(Eigen::Index(t)).data(), size_t(logits.cols())), win.targets[t]);
    sums[w] = s;
  }
  double total = 0;
  for (double s : sums) total += s;
  return total / double(starts.size() * T);
}

void Trainer::write_logs() const {
  std::error_code ec;
  fs::create_directories(c_.out, ec);
  std::string log = "step,loss_nats,val_loss_nats,lr,grad_norm,tokens,seconds,state_bytes\n";
  for (auto& r : log_)
    log += fmt::format("{},{},{},{},{},{},{:.4f},{}\n", r.step, fmt_num(r.loss), fmt_num(r.val_loss), fmt_num(r.lr),
                       fmt_num(r.grad_norm), r.tokens, r.seconds,
                       r.state_bytes ? std::to_string(r.state_bytes) : std::string());
  write_file_atomic(c_.out + "/log.csv", log);
  std::string units = "step,layer,unit,bits,grad_norm,act_rms,act_absmax,quant_rel_rms\n";
  for (auto& u : unit_rows_) units += u + "\n";
  write_file_atomic(c_.out + "/units.csv", units);
  for (auto& [name, content] : controller_->logs()) write_file_atomic(c_.out + "/" + name, content);
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
  // Only a directory (an interrupted run's checkpoint) is ever swapped out: anything else at its name
  // (a file, a FIFO, a link) is refused, untouched, before the checkpoint is built.
  const fs::file_status at = fs::symlink_status(dir, ec);
  if (fs::exists(at) && !fs::is_directory(at)) {
    const std::string kind = fs::is_symlink(at) ? "a symbolic link" : special_file_kind(dir);
    throw InputError(fmt::format("{} is {}, not a checkpoint directory: move it away", dir, kind.empty() ? "a file" : kind));
  }
  const std::string tmp = temporary_path(dir);
  try {
    if (!fs::create_directory(tmp, ec)) throw InputError(fmt::format("cannot create {}: {}", tmp, ec.message()));
    save_model(model_, tmp);
    if (c_.lora) {
      std::vector<TensorView> views;
      for (auto& [name, t] : model_.lora.params) views.push_back({name, t.shape, t.data});
      write_f32_tensors(tmp + "/adapters.safetensors", views,
                        {{"lora_rank", std::to_string(model_.lora.rank)}, {"lora_alpha", fmt::format("{:.17g}", model_.lora.alpha)}});
    }
    TrainerState s;
    s.step = step_, s.optimizer = opt_->name(), s.optimizer_steps = opt_->steps(), s.state_bytes = opt_->state_bytes();
    s.optimizer_state = opt_->state(), s.log = log_, s.units = unit_rows_, s.controller = controller_->state();
    write_trainer_state(tmp, s, identity());
    // An older directory of this name (an interrupted run's, never named by `latest` since) is
    // swapped out atomically, then removed.
    const bool exists = fs::is_directory(fs::symlink_status(dir, ec));
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
  TrainerState s = read_trainer_state(ck, at, identity(), *opt_);
  Model m = load_model(ck);
  if (!(m.cfg == c_.model)) throw InputError(fmt::format("{}/config.json: the model differs from the configuration", ck));
  if (s.adapters != c_.lora.has_value())
    throw InputError(fmt::format("{}: {} adapters.safetensors, but the run {} [lora]", ck, s.adapters ? "holds" : "has no",
                                 s.adapters ? "has no" : "has"));
  if (c_.lora) {
    m.lora = model_.lora;  // rank, alpha and the expected tensors, then the checkpoint's values
    const std::string af = ck + "/adapters.safetensors";
    const auto tensors = read_f32_tensors(af);
    if (tensors.size() != m.lora.params.size())
      throw InputError(fmt::format("{}: {} tensors, the run's [lora] has {}", af, tensors.size(), m.lora.params.size()));
    for (const NamedTensor& t : tensors) {
      auto it = m.lora.params.find(t.name);
      if (it == m.lora.params.end() || it->second.shape != t.shape)
        throw InputError(fmt::format("{}: tensor {} does not fit the run's [lora]", af, t.name));
      it->second.data = t.data;
    }
    try {
      validate(m.lora, m.cfg);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", af, e.what()));
    }
  }
  if (s.controller.is_null() != controller_->state().is_null())
    throw InputError(fmt::format("{}/trainer.json: {} controller state, but the run {} one", ck,
                                 s.controller.is_null() ? "no" : "a", s.controller.is_null() ? "has" : "has no"));
  if (!s.controller.is_null()) try {
      controller_->load_state(s.controller);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}/trainer.json: {}", ck, e.what()));
    }
  try {  // the last check; nothing below can fail
    opt_->load_state(s.optimizer_state, s.step);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}/optimizer.bin: {}", ck, e.what()));
  }
  model_ = std::move(m);
  step_ = s.step;
  log_ = std::move(s.log);
  unit_rows_ = std::move(s.units);
}

RunIdentity Trainer::identity() const {
  return {c_.hash(), c_.path, c_.steps, uint64_t(c_.batch) * uint64_t(c_.accum), uint64_t(c_.model.ctx),
          uint64_t(c_.model.layers) * kUnitCount, c_.seed};
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
    if (last && c_.lora && !c_.out.empty()) save_model(merge_lora(model_), c_.out + "/merged");  // for eval tools
  }
}

}  // namespace mantis
