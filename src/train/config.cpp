#include "train/config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/file.h"
#include "core/toml.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"

namespace mantis {

std::string TrainConfig::hash() const {
  return init.empty() ? sha256_hex(text) : sha256_hex(text + "\n[model] init sha256 " + init_sha256);
}

// ---------------------------------------------------------------------------------------------
// configuration

namespace {

struct TomlReader {
  const toml::table& root;
  const std::string& path;

  std::string line(const toml::node& n) const { return toml_where(path, n); }

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

namespace {

// The init checkpoint, its load errors prefixed with the configuration that named it.
Model prefixed_init(const std::string& init, const std::string& path) {
  try {
    return load_model(init);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [model] init: {}", path, e.what()));
  }
}

}  // namespace

namespace {

constexpr std::initializer_list<const char*> kSavedKeys = {"bits", "block", "rounding", "seed", "scheme"};

// [activation_quant] or [controller.recover]: a SavedQuant (nn/backward.h); `t` null: the default.
SavedQuant saved_quant(const TomlReader& r, const toml::table* t, const char* name) {
  SavedQuant q;
  r.get(t, name, "bits", q.bits);
  r.get(t, name, "block", q.block);
  std::string scheme, rounding = "rne";
  r.get(t, name, "scheme", scheme);
  r.get(t, name, "rounding", rounding);
  r.get(t, name, "seed", q.seed);
  try {
    if (!scheme.empty()) q.scheme = scheme_lookup(scheme);
    q.rounding = rounding_from_string(rounding);
    validate(q);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [{}]: {}", r.path, name, e.what()));
  }
  return q;
}

// [controller] (train/routing.h): name, the GNMR keys, seed, hold, rerun, and the [controller.recover] table.
ControllerConfig controller(const TomlReader& r, const toml::node& n) {
  if (!n.is_table()) throw InputError(fmt::format("{}: 'controller' must be a table ([controller])", r.line(n)));
  const toml::table& t = *n.as_table();
  check_controller_keys(t, r.path);
  ControllerConfig c;
  r.get(&t, "controller", "name", c.name);
  if (c.name != "gnmr" && c.name != "random" && c.name != "static" && c.name != "oracle")
    throw InputError(fmt::format("{}: [controller] name = '{}' (known: {})", r.path, c.name, kControllerNames));
  r.get(&t, "controller", "seed", c.seed);
  r.get(&t, "controller", "hold", c.hold);
  r.get(&t, "controller", "rerun", c.rerun);
  r.get(&t, "controller", "unit_block", c.unit_block);
  if (c.hold < 1) throw InputError(fmt::format("{}: [controller] hold = {} (steps each random draw is kept: at least 1)", r.path, c.hold));
  c.gnmr = gnmr_options_from_toml(t, r.path);
  const toml::table* rec = nullptr;
  if (const toml::node* rn = t.get("recover")) {
    if (!rn->is_table()) throw InputError(fmt::format("{}: 'recover' must be a table ([controller.recover])", r.line(*rn)));
    rec = rn->as_table();
    check_known_keys(*rec, r.path, {"bits", "block", "rounding", "seed", "scheme", "policy"}, " in [controller.recover]");
    r.get(rec, "controller.recover", "policy", c.recover_policy);
  }
  c.recover = saved_quant(r, rec, "controller.recover");
  if (c.unit_block > 0 && !c.recover_policy.empty())
    throw InputError(fmt::format("{}: [controller] unit_block recovers column blocks of saved activations: a [controller.recover] "
                                 "policy (whole GEMMs) cannot apply to them; drop one of the two", r.path));
  return c;
}

}  // namespace

TrainConfig train_config_from_toml(const std::string& text, const std::string& path) {
  const toml::table root = parse_toml(text, path);
  const TomlReader r{root, path};
  static const std::set<std::string> top = {"out",       "model",     "data",           "train",
                                            "optimizer", "precision", "activation_quant", "controller", "lora"};
  for (auto&& [k, v] : root)
    if (!top.count(std::string(k.str())))
      throw InputError(fmt::format("{}: unknown key '{}' (known: out, [model], [data], [train], [optimizer], "
                                   "[precision], [activation_quant], [controller], [lora])", r.line(v), k.str()));
  TrainConfig c;
  c.text = text, c.path = path;
  if (const toml::node* o = root.get("out")) {
    if (!o->is_string()) throw InputError(fmt::format("{}: 'out' must be a string", r.line(*o)));
    c.out = o->as_string()->get();
  }
  const auto* model = r.table("model", {"arch", "layers", "heads", "kv_heads", "dim", "hidden", "ctx", "gelu_tanh", "tied",
                                        "norm_eps", "rope_theta", "init_seed", "init"});
  r.get(model, "model", "init", c.init);
  if (model && model->get("init") && c.init.empty())
    throw InputError(fmt::format("{}: [model] init must name a checkpoint (it is empty)", r.line(*model->get("init"))));
  if (!c.init.empty())
    for (auto&& [k, v] : *model)
      if (k.str() != "init")
        throw InputError(fmt::format("{}: [model] '{}' cannot stand beside init (the model, its shape and its values "
                                     "come from the init checkpoint)", r.line(v), k.str()));
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
  if (!c.init.empty()) {
    auto init = std::make_shared<Model>(prefixed_init(c.init, path));
    if (init->cfg.vocab != m.vocab)
      throw InputError(fmt::format("{}: [model] init {} has vocabulary {}, but tokenizer '{}' has {}", path, c.init,
                                   init->cfg.vocab, c.tokenizer, m.vocab));
    m = init->cfg;
    c.init_sha256 = model_sha256(*init);
    c.init_model = std::move(init);
  }
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
  c.act_quant = saved_quant(r, r.table("activation_quant", kSavedKeys), "activation_quant");
  if (const toml::node* n = root.get("controller")) c.controller = controller(r, *n);
  if (const auto* lt = r.table("lora", {"rank", "alpha", "units", "seed"})) {
    if (c.init.empty())
      throw InputError(fmt::format("{}: [lora] fine-tunes a trained model: give [model] init = \"CHECKPOINT\"", path));
    LoraSpec spec;
    spec.units = {Unit::qkv, Unit::proj, Unit::fc, Unit::down};
    r.get(lt, "lora", "rank", spec.rank);
    r.get(lt, "lora", "alpha", spec.alpha);
    r.get(lt, "lora", "seed", c.lora_seed);
    if (const toml::node* u = lt->get("units")) {
      const toml::array* a = u->as_array();
      if (!a || a->empty()) throw InputError(fmt::format("{}: [lora] units must be a non-empty array of unit names", r.line(*u)));
      spec.units.clear();
      for (const toml::node& e : *a) {
        if (!e.is_string()) throw InputError(fmt::format("{}: [lora] units: each entry is a unit name (a string)", r.line(e)));
        try {
          spec.units.push_back(unit_from_name(e.as_string()->get()));
        } catch (const InputError& err) {
          throw InputError(fmt::format("{}: [lora] units: {}", r.line(e), err.what()));
        }
      }
    }
    try {
      init_lora(m, spec, c.lora_seed);  // rank and alpha checked against the model's shapes
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: [lora]: {}", path, e.what()));
    }
    c.lora = spec;
    if (c.controller.unit_block > 0)
      throw InputError(fmt::format("{}: [controller] unit_block does not apply with [lora]: an adapter's B gradient reads every "
                                   "input column, so no column block owns a part of it (use unit_block = 0)", path));
  }
  return c;
}

TrainConfig load_train_config(const std::string& path) { return train_config_from_toml(read_text_file(path, "training configuration"), path); }

}  // namespace mantis
