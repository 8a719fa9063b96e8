#include "nn/policy.h"

#include "nn/streams.h"  // kStreamMaxLayer

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>
#include <toml++/toml.h>

#include "core/file.h"
#include "core/toml.h"
#include "core/philox.h"
#include "core/round_array.h"

namespace mantis {

namespace {

constexpr const char* kSiteNames[kSiteCount] = {"attn.qkv", "attn.qk", "attn.pv", "attn.proj", "mlp.fc",
                                                "mlp.proj", "lm_head", "ln", "softmax", "gelu", "silu"};

const char* kGemmKeys =
    "accumulation, accumulator, align_bits, block, input, input_a, input_b, output, promote_every, rounding, seed, "
    "split_k, sr_bits, sr_packed, tensor_core; sub-tables dx, dw";
const char* kNonlinearKeys = "input, output, rounding, seed, sr_bits, sr_packed";

// "layer.<n>.<site>" → (n, site); "<site>" → (−1, site); nullopt otherwise.
std::optional<std::pair<int, Site>> parse_site_name(std::string_view name) {
  int layer = -1;
  if (name.starts_with("layer.")) {
    name.remove_prefix(6);
    const size_t dot = name.find('.');
    if (dot == 0 || dot == std::string_view::npos) return std::nullopt;
    const auto [p, ec] = std::from_chars(name.data(), name.data() + dot, layer);
    if (ec != std::errc() || p != name.data() + dot || layer < 0 || layer > kStreamMaxLayer) return std::nullopt;
    name.remove_prefix(dot + 1);
  }
  const auto s = site_from_string(name);
  if (!s) return std::nullopt;
  return std::pair{layer, *s};
}

// input_a / input_b: a scheme (a preset, or a .toml with an 'element' key) or a format.
OperandQuant operand_quant(const std::string& name) {
  OperandQuant q;
  const auto presets = scheme_presets();
  std::string lower = name;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool toml_scheme = name.ends_with(".toml") && read_text_file(name, "input file").find("element") != std::string::npos;
  if (std::find(presets.begin(), presets.end(), lower) != presets.end() || toml_scheme) q.scheme = scheme_lookup(name);
  else q.format = format_lookup(name);
  return q;
}

SitePolicy parse_site(Site site, const toml::table& t, const std::string& source, const std::string& where) {
  auto line = [&](const toml::node& n) { return fmt::format("{}:{}", source, n.source().begin.line); };
  const bool gemm_site = is_gemm(site);
  for (auto&& [k, v] : t) {
    static const char* gemm_keys[] = {"accumulation", "accumulator", "align_bits", "block",   "input",      "input_a",
                                      "input_b",      "output",      "rounding",   "seed",    "sr_bits",    "tensor_core",
                                      "promote_every", "split_k",  "sr_packed"};
    static const char* nl_keys[] = {"input", "output", "rounding", "seed", "sr_bits", "sr_packed"};
    bool known = gemm_site && !where.ends_with(".dx") && !where.ends_with(".dw") && (k.str() == "dx" || k.str() == "dw");
    if (gemm_site) { for (auto* g : gemm_keys) known |= k.str() == g; }
    else { for (auto* g : nl_keys) known |= k.str() == g; }
    if (!known)
      throw InputError(fmt::format("{}: unknown key '{}' in site {} (known for {} sites: {})", line(v), k.str(), where,
                                   gemm_site ? "GEMM" : "nonlinearity", gemm_site ? kGemmKeys : kNonlinearKeys));
  }
  auto get_str = [&](const char* key) -> std::optional<std::string> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_string()) throw InputError(fmt::format("{}: '{}' in site {} must be a string", line(*n), key, where));
    return n->as_string()->get();
  };
  auto get_int = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int64_t> {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (!n->is_integer()) throw InputError(fmt::format("{}: '{}' in site {} must be an integer", line(*n), key, where));
    const int64_t v = n->as_integer()->get();
    if (v < lo || v > hi)
      throw InputError(fmt::format("{}: '{}' = {} in site {} out of range {}..{}", line(*n), key, v, where, lo, hi));
    return v;
  };
  // Any InputError from the core (format lookup, GemmSpec validation) gets this entry's file:line.
  auto at_line = [&](const char* key, auto&& fn) {
    const toml::node* n = t.get(key);
    try {
      return fn();
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: site {}: {}", n ? line(*n) : line(t), where, e.what()));
    }
  };
  auto get_format = [&](const char* key, bool must_fit_float) -> std::optional<Format> {
    const auto s = get_str(key);
    if (!s) return std::nullopt;
    Format f = at_line(key, [&] { return format_lookup(*s); });
    if (must_fit_float && !fits_float(f))
      throw InputError(fmt::format("{}: {} format '{}' of site {} does not fit binary32 (the forward pass rounds "
                                   "binary32 values)", line(*t.get(key)), key, f.name, where));
    return f;
  };

  SitePolicy p;
  if (auto r = get_str("rounding")) p.rounding = at_line("rounding", [&] { return rounding_from_string(*r); });
  if (auto v = get_int("seed", 0, INT64_MAX)) p.seed = uint64_t(*v);
  if (auto v = get_int("sr_bits", kSrBitsMin, kSrBitsMax)) p.sr_bits = int(*v);
  if (const toml::node* n = t.get("sr_packed")) {
    if (!n->is_boolean()) throw InputError(fmt::format("{}: 'sr_packed' in site {} must be true or false", line(*n), where));
    p.sr_packed = n->as_boolean()->get();
    at_line("sr_packed", [&] { validate_sr_packed(p.sr_packed, p.sr_bits, is_stochastic(p.rounding)); return 0; });
  }
  p.input = get_format("input", true);
  p.output = get_format("output", true);
  if (!gemm_site) return p;
  for (const char* key : {"input_a", "input_b"})
    if (auto v = get_str(key)) {
      if (p.input)
        throw InputError(fmt::format("{}: site {}: '{}' and 'input' both round the operand; give one", line(*t.get(key)),
                                     where, key));
      auto& q = key[6] == 'a' ? p.input_a : p.input_b;
      q = at_line(key, [&] { return operand_quant(*v); });
      if (q->format && !fits_float(*q->format))
        throw InputError(fmt::format("{}: {} format '{}' of site {} does not fit binary32 (the forward pass rounds "
                                     "binary32 values)", line(*t.get(key)), key, q->format->name, where));
      if (q->scheme && p.sr_packed)
        throw InputError(fmt::format("{}: site {}: sr_packed is not implemented for scaled operands (scheme {}); "
                                     "use one word per rounding there", line(*t.get(key)), where, q->scheme->name));
    }

  // tensor_core = "<GPU>": that GPU's matrix unit; "<preset>": the superseded model's parameters
  // (gemm.h tensor_core_presets), each unless given
  if (auto tc = get_str("tensor_core"); tc && is_matrix_unit_name(*tc)) {
    if (auto a = get_str("accumulation"); a && *a != "tensor_core")
      throw InputError(fmt::format("{}: site {}: tensor_core = \"{}\" with accumulation = \"{}\"", line(*t.get("tensor_core")),
                                   where, *tc, *a));
    p.accumulation = Accumulation::tensor_core;
    p.tensor_core = *tc;
    p.accumulator = format_lookup("fp32");
  } else if (tc) {
    const TensorCorePreset& pr = at_line("tensor_core", [&]() -> const TensorCorePreset& { return tensor_core_preset(*tc); });
    if (auto a = get_str("accumulation"); a && *a != "tensor_core")
      throw InputError(fmt::format("{}: site {}: tensor_core = \"{}\" with accumulation = \"{}\"", line(*t.get("tensor_core")),
                                   where, *tc, *a));
    p.accumulation = Accumulation::tensor_core;
    p.block = pr.block, p.align_bits = pr.align_bits;
    p.accumulator = format_lookup(pr.accumulator);
    if (!t.get("rounding")) p.rounding = pr.mode;
  }
  if (auto a = get_str("accumulation"); a && *a != "native")
    p.accumulation = at_line("accumulation", [&] {
      try {
        return accumulation_from_string(*a);
      } catch (const InputError&) {
        throw InputError(fmt::format("unknown accumulation '{}' (known: native, strict, unfused, blocked, promoted, "
                                     "tensor_core)", *a));
      }
    });
  if (auto f = get_format("accumulator", false)) p.accumulator = f;
  if (p.accumulation && !p.accumulator)
    throw InputError(fmt::format("{}: site {}: accumulation = '{}' needs an accumulator format", line(t), where,
                                 to_string(*p.accumulation)));
  if (!p.accumulation && p.accumulator)
    throw InputError(fmt::format("{}: site {}: an accumulator needs accumulation = strict, unfused, blocked, promoted or tensor_core "
                                 "(native accumulates in binary32)", line(*t.get("accumulator")), where));
  if (auto b = get_int("block", 1, kGemmMaxBlock)) {
    if (p.accumulation != Accumulation::blocked && p.accumulation != Accumulation::promoted &&
        p.accumulation != Accumulation::tensor_core)
      throw InputError(fmt::format("{}: site {}: 'block' needs accumulation = \"blocked\", \"promoted\" or "
                                   "\"tensor_core\"", line(*t.get("block")), where));
    p.block = int(*b);
  }
  if (auto f = get_int("align_bits", 0, 52)) {
    if (p.accumulation != Accumulation::tensor_core)
      throw InputError(fmt::format("{}: site {}: 'align_bits' needs accumulation = \"tensor_core\"",
                                   line(*t.get("align_bits")), where));
    p.align_bits = int(*f);
  }
  if (auto v = get_int("promote_every", 0, kGemmMaxBlock)) p.promote_every = int(*v);
  if (auto v = get_int("split_k", 1, kGemmMaxSplitK)) p.split_k = int(*v);
  if ((t.get("promote_every") || t.get("split_k")) && p.tensor_core.empty())
    throw InputError(fmt::format("{}: site {}: 'promote_every' and 'split_k' need tensor_core = a GPU",
                                 line(*(t.get("promote_every") ? t.get("promote_every") : t.get("split_k"))), where));
  if (p.accumulation) at_line("accumulator", [&] { validate(p.gemm_spec(0)); return 0; });
  else if (p.input || p.output) at_line("rounding", [&] { validate_sr_bits(p.sr_bits); return 0; });
  return p;
}

// The keys [lamp], [lamp_activation] and [lamp_layernorm] share: tau (≥ 0, inf allowed) and
// recompute ("fp32" or a format that fits binary32). Errors without location (the caller adds it).
void parse_tau_recompute(const toml::table& t, double& tau, std::optional<Format>& recompute) {
  if (const toml::node* x = t.get("tau")) {
    if (x->is_integer()) tau = double(x->as_integer()->get());
    else if (x->is_floating_point()) tau = x->as_floating_point()->get();
    else throw InputError("'tau' must be a number");
    if (!(tau >= 0)) throw InputError(fmt::format("tau = {} must be ≥ 0 (inf allowed)", tau));
  }
  if (const toml::node* x = t.get("recompute")) {
    if (!x->is_string()) throw InputError("'recompute' must be a format name");
    const std::string f = x->as_string()->get();
    if (f != "fp32") {
      recompute = format_lookup(f);
      if (!fits_float(*recompute)) throw InputError(fmt::format("recompute format {} does not fit binary32", f));
    }
  }
}

LampSpec parse_lamp(const toml::node& n, const std::string& source) {
  auto line = [&](const toml::node& x) { return fmt::format("{}:{}", source, x.source().begin.line); };
  if (!n.is_table()) throw InputError(fmt::format("{}: 'lamp' must be a table ([lamp])", line(n)));
  const toml::table& t = *n.as_table();
  static const char* keys[] = {"rule", "tau", "length_scaling", "random", "seed", "recompute"};
  // (an init-capture: clang before 16 cannot capture a structured binding; the fuzz build uses clang 14)
  for (auto&& [k, v] : t)
    if (std::none_of(std::begin(keys), std::end(keys), [&k = k](const char* x) { return k.str() == x; }))
      throw InputError(fmt::format("{}: unknown key '{}' in [lamp] (known: rule, tau, length_scaling, random, seed, "
                                   "recompute)", line(v), k.str()));
  LampSpec s;
  try {
    if (const toml::node* r = t.get("rule")) {
      if (!r->is_string()) throw InputError("'rule' must be a string");
      s.rule = lamp_rule_from_string(r->as_string()->get());
    }
    parse_tau_recompute(t, s.tau, s.recompute);
    for (auto [key, dst] : {std::pair<const char*, bool*>{"length_scaling", &s.length_scaled}, {"random", &s.random_control}})
      if (const toml::node* x = t.get(key)) {
        if (!x->is_boolean()) throw InputError(fmt::format("'{}' must be true or false", key));
        *dst = x->as_boolean()->get();
      }
    if (const toml::node* x = t.get("seed")) {
      if (!x->is_integer() || x->as_integer()->get() < 0) throw InputError("'seed' must be a non-negative integer");
      s.seed = uint64_t(x->as_integer()->get());
    }
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [lamp]: {}", line(t), e.what()));
  }
  return s;
}

LampSiteSpec parse_lamp_site(const toml::node& n, const std::string& source, const char* name) {
  auto line = [&](const toml::node& x) { return fmt::format("{}:{}", source, x.source().begin.line); };
  if (!n.is_table()) throw InputError(fmt::format("{}: '{}' must be a table ([{}])", line(n), name, name));
  const toml::table& t = *n.as_table();
  for (auto&& [k, v] : t)
    if (k.str() != "tau" && k.str() != "recompute")
      throw InputError(fmt::format("{}: unknown key '{}' in [{}] (known: tau, recompute)", line(v), k.str(), name));
  LampSiteSpec s;
  try {
    parse_tau_recompute(t, s.tau, s.recompute);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [{}]: {}", line(t), name, e.what()));
  }
  return s;
}

}  // namespace

const char* to_string(Site s) { return kSiteNames[int(s)]; }

bool is_gemm(Site s) { return int(s) <= int(Site::lm_head); }

std::optional<Site> site_from_string(std::string_view name) {
  for (int i = 0; i < kSiteCount; ++i)
    if (name == kSiteNames[i]) return Site(i);
  return std::nullopt;
}

std::string site_names() {
  std::string s;
  for (auto* n : kSiteNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

GemmSpec SitePolicy::gemm_spec(uint64_t stream) const {
  GemmSpec s;
  s.acc = accumulator.value_or(Format{});
  s.acc_mode = rounding;
  s.accumulation = accumulation.value_or(Accumulation::strict);
  s.block = block;
  s.align_bits = align_bits;
  s.tensor_core = tensor_core;
  s.promote_every = promote_every;
  s.split_k = split_k;
  if (!tensor_core.empty()) s.acc_mode = Rounding::rne;  // the unit rounds its own way
  s.input = input;
  s.input_mode = rounding;
  s.sr_bits = sr_bits;
  s.sr_packed = sr_packed;
  s.seed = seed;
  s.stream = stream;
  return s;
}

const SitePolicy& Policy::at(Site site, int l, Pass pass) const {
  const auto& lay = pass == Pass::forward ? layer : grad_layer[int(pass) - 1];
  const auto& al = pass == Pass::forward ? all : grad_all[int(pass) - 1];
  if (l >= 0 && !lay.empty())
    if (auto it = lay.find({l, site}); it != lay.end()) return it->second;
  return al[int(site)];
}

bool Policy::forward_is_native() const {
  if (lamp || lamp_activation || lamp_layernorm) return false;
  for (auto& p : all)
    if (!p.is_native()) return false;
  for (auto& [k, p] : layer)
    if (!p.is_native()) return false;
  return true;
}

bool Policy::is_native() const {
  if (!forward_is_native()) return false;
  for (int g = 0; g < 2; ++g) {
    for (auto& p : grad_all[g])
      if (!p.is_native()) return false;
    for (auto& [k, p] : grad_layer[g])
      if (!p.is_native()) return false;
  }
  return true;
}

void validate(const SitePolicy& p, Site site) {
  const char* n = to_string(site);
  if (p.accumulation && !is_gemm(site))
    throw InputError(fmt::format("policy: site {} is a nonlinearity: it has no accumulation", n));
  if (p.accumulation.has_value() != p.accumulator.has_value())
    throw InputError(fmt::format("policy: site {}: an accumulation needs an accumulator format and vice versa", n));
  for (const auto* f : {&p.input, &p.output})
    if (*f) {
      validate(**f);
      if (!fits_float(**f))
        throw InputError(fmt::format("policy: site {}: format {} does not fit binary32", n, (*f)->name));
    }
  if ((p.input_a || p.input_b) && !is_gemm(site))
    throw InputError(fmt::format("policy: site {} is a nonlinearity: input_a / input_b are for GEMM sites", n));
  if ((p.input_a || p.input_b) && p.input)
    throw InputError(fmt::format("policy: site {}: input and input_a / input_b both round the operands", n));
  for (const auto* q : {&p.input_a, &p.input_b})
    if (*q) {
      if ((*q)->format.has_value() == (*q)->scheme.has_value())
        throw InputError(fmt::format("policy: site {}: an operand takes a format or a scheme", n));
      if ((*q)->format) {
        validate(*(*q)->format);
        if (!fits_float(*(*q)->format))
          throw InputError(fmt::format("policy: site {}: format {} does not fit binary32", n, (*q)->format->name));
      } else {
        validate(*(*q)->scheme);
        const Format& e = (*q)->scheme->element;
        if (p.rounding == Rounding::sr && p.sr_bits > 52 - e.precision())
          throw InputError(fmt::format("policy: site {}: sr_bits {} > 52 − p = {} for scheme {}'s element {}", n,
                                       p.sr_bits, 52 - e.precision(), (*q)->scheme->name, e.name));
        if (p.sr_packed)
          throw InputError(fmt::format("policy: site {}: sr_packed is not implemented for scaled operands (scheme {}); "
                                       "use one word per rounding there", n, (*q)->scheme->name));
      }
    }
  validate_sr_bits(p.sr_bits);
  try {
    validate_sr_packed(p.sr_packed, p.sr_bits, is_stochastic(p.rounding));
  } catch (const InputError& e) {
    throw InputError(fmt::format("policy: site {}: {}", n, e.what()));
  }
  try {
    if (p.accumulation) validate(p.gemm_spec(0));
  } catch (const InputError& e) {
    throw InputError(fmt::format("policy: site {}: {}", n, e.what()));
  }
}

void Policy::check(const ModelConfig& c) const {
  for (int pass = 0; pass < kPassCount; ++pass) {
    const auto& al = pass == 0 ? all : grad_all[pass - 1];
    const auto& lay = pass == 0 ? layer : grad_layer[pass - 1];
    for (int i = 0; i < kSiteCount; ++i) validate(al[i], Site(i));
    for (auto& [k, p] : lay) validate(p, k.second);
    for (auto& [k, p] : lay)
      if (k.first >= c.layers)
        throw InputError(fmt::format("policy: site layer.{}.{}, but the model has {} layers (0..{})", k.first,
                                     to_string(k.second), c.layers, c.layers - 1));
  }
  // LAMP's recomputed products replace binary32 values: their format must fit binary32 (checked
  // here, before any parallel pass could meet it)
  auto fits = [](const std::optional<Format>& f, const char* table) {
    if (f && !fits_float(*f))
      throw InputError(fmt::format("policy: [{}] recompute = \"{}\" does not fit binary32 (LAMP recomputes binary32 "
                                   "values: μ ≤ 23 and binary32's exponent range); omit it for the FP32 product",
                                   table, f->name));
  };
  if (lamp) fits(lamp->recompute, "lamp");
  if (lamp_activation) fits(lamp_activation->recompute, "lamp_activation");
  if (lamp_layernorm) fits(lamp_layernorm->recompute, "lamp_layernorm");
  const Site wrong = c.arch == Arch::gpt2 ? Site::silu : Site::gelu;
  bool set = !all[int(wrong)].is_native();
  for (auto& [k, p] : layer) set |= k.second == wrong && !p.is_native();
  if (set)
    throw InputError(c.arch == Arch::gpt2
                         ? "policy: site 'silu' is llama's activation; a gpt2 model's is 'gelu'"
                         : "policy: site 'gelu' is gpt2's activation; a llama model's is 'silu'");
}

Policy policy_from_toml(const std::string& text, const std::string& source) {
  const toml::table t = parse_toml(text, source);
  auto line = [&](const toml::node& n) { return toml_where(source, n); };
  for (auto&& [k, v] : t)
    if (k.str() != "site" && k.str() != "lamp" && k.str() != "lamp_activation" && k.str() != "lamp_layernorm")
      throw InputError(fmt::format("{}: unknown key '{}' (known: site, as [site.\"<name>\"] tables, [lamp], "
                                   "[lamp_activation], [lamp_layernorm])", line(v), k.str()));
  Policy pol;
  if (const toml::node* l = t.get("lamp")) pol.lamp = parse_lamp(*l, source);
  if (const toml::node* l = t.get("lamp_activation")) pol.lamp_activation = parse_lamp_site(*l, source, "lamp_activation");
  if (const toml::node* l = t.get("lamp_layernorm")) pol.lamp_layernorm = parse_lamp_site(*l, source, "lamp_layernorm");
  const toml::node* sites = t.get("site");
  if (!sites) return pol;
  if (!sites->is_table())
    throw InputError(fmt::format("{}: 'site' must hold [site.\"<name>\"] tables", line(*sites)));
  std::map<std::pair<int, Site>, std::string> spelled;  // each site once, however its layer is written
  for (auto&& [k, v] : *sites->as_table()) {
    const auto ls = parse_site_name(k.str());
    if (!ls)
      throw InputError(fmt::format("{}: unknown site '{}' (valid: {}; or layer.<n>.<site> for one layer; quote "
                                   "dotted names: [site.\"attn.qk\"])", line(v), k.str(), site_names()));
    const auto [l, site] = *ls;
    if (const auto [it, fresh] = spelled.emplace(*ls, std::string(k.str())); !fresh)
      throw InputError(fmt::format("{}: site '{}' is site '{}' again (layer {}): give each site one table", line(v),
                                   k.str(), it->second, l));
    if (l >= 0 && site == Site::lm_head)
      throw InputError(fmt::format("{}: site '{}': lm_head is not inside a layer; use [site.\"lm_head\"]", line(v), k.str()));
    if (!v.is_table())
      throw InputError(fmt::format("{}: site '{}' must be a table ([site.\"{}\"] with keys {})", line(v), k.str(),
                                   k.str(), is_gemm(site) ? kGemmKeys : kNonlinearKeys));
    SitePolicy p = parse_site(site, *v.as_table(), source, std::string(k.str()));
    if (l < 0) pol.all[int(site)] = p;
    else pol.layer[{l, site}] = p;
    for (int g = 0; g < 2; ++g) {  // the backward GEMMs: sub-tables dx, dw
      const char* name = g == 0 ? "dx" : "dw";
      const toml::node* sub = v.as_table()->get(name);
      if (!sub) continue;
      if (!sub->is_table())
        throw InputError(fmt::format("{}: site '{}': '{}' must be a table ([site.\"{}\".{}] with keys {})", line(*sub),
                                     k.str(), name, k.str(), name, kGemmKeys));
      SitePolicy q = parse_site(site, *sub->as_table(), source, std::string(k.str()) + "." + name);
      if (l < 0) pol.grad_all[g][int(site)] = q;
      else pol.grad_layer[g][{l, site}] = q;
    }
  }
  return pol;
}

Policy load_policy(const std::string& path) {
  return policy_from_toml(read_text_file(path, "policy file"), path);
}

Policy lamp_policy(int mu) {
  if (mu < 1 || mu > 23) throw InputError(fmt::format("lamp_policy: μ = {} out of range 1..23", mu));
  Policy p;
  SitePolicy& qk = p.all[int(Site::attn_qk)];
  qk.accumulation = Accumulation::strict;
  qk.accumulator = format_lookup(fmt::format("ps{}", mu));
  qk.output = qk.accumulator;
  return p;
}

Policy salted(const Policy& p, uint64_t salt) {
  Policy q = p;
  auto salt_one = [&](SitePolicy& s) { s.seed = random_word64(s.seed, salt, 0); };
  for (auto& s : q.all) salt_one(s);
  for (auto& [k, s] : q.layer) salt_one(s);
  for (int g = 0; g < 2; ++g) {
    for (auto& s : q.grad_all[g]) salt_one(s);
    for (auto& [k, s] : q.grad_layer[g]) salt_one(s);
  }
  if (q.lamp) q.lamp->seed = random_word64(q.lamp->seed, salt, 0);
  return q;
}

Policy policy_from_spec(const std::string& spec) {
  if (spec == "native") return {};
  if (spec.starts_with("lamp:")) {
    const std::string mu = spec.substr(5);
    if (mu.empty() || mu.size() > 2 || !std::all_of(mu.begin(), mu.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw InputError(fmt::format("policy '{}': expected lamp:<μ> with μ = 1..23", spec));
    return lamp_policy(std::stoi(mu));
  }
  return load_policy(spec);
}

std::string describe(const Policy& pol) {
  auto one = [](const std::string& name, Site site, const SitePolicy& p) {
    std::vector<std::string> parts;
    if (p.accumulation)
      parts.push_back(fmt::format("{} acc {}{}", to_string(*p.accumulation), p.accumulator->name,
                                  !p.tensor_core.empty()
                                      ? fmt::format(" ({}{}{})", p.tensor_core,
                                                    p.promote_every ? fmt::format(", promoted every {}", p.promote_every) : "",
                                                    p.split_k > 1 ? fmt::format(", split-K {}", p.split_k) : "")
                                  : *p.accumulation == Accumulation::tensor_core
                                      ? fmt::format(" (k_b = {}, F = {})", p.block, p.align_bits)
                                  : *p.accumulation == Accumulation::blocked || *p.accumulation == Accumulation::promoted
                                      ? fmt::format(" (k_b = {})", p.block)
                                      : ""));
    else if (is_gemm(site))
      parts.push_back("native acc");
    if (p.input) parts.push_back("input " + p.input->name);
    if (p.input_a) parts.push_back("input_a " + p.input_a->name());
    if (p.input_b) parts.push_back("input_b " + p.input_b->name());
    if (p.output) parts.push_back("output " + p.output->name);
    if (p.is_native()) parts.push_back("binary32");
    else if (p.rounding == Rounding::sr || p.rounding == Rounding::sre)
      parts.push_back(fmt::format("{} (seed {}, sr_bits {}{})", to_string(p.rounding), p.seed, p.sr_bits,
                                  p.sr_packed ? ", packed" : ""));
    else
      parts.push_back(to_string(p.rounding));
    return fmt::format("{}: {}\n", name, fmt::join(parts, ", "));
  };
  std::string out;
  for (int i = 0; i < kSiteCount; ++i)
    if (!pol.all[i].is_native()) out += one(kSiteNames[i], Site(i), pol.all[i]);
  for (auto& [k, p] : pol.layer) out += one(fmt::format("layer.{}.{}", k.first, to_string(k.second)), k.second, p);
  for (int g = 0; g < 2; ++g) {
    const char* pass = g == 0 ? ".dx" : ".dw";
    for (int i = 0; i < kSiteCount; ++i)
      if (!pol.grad_all[g][i].is_native()) out += one(kSiteNames[i] + std::string(pass), Site(i), pol.grad_all[g][i]);
    for (auto& [k, p] : pol.grad_layer[g])
      out += one(fmt::format("layer.{}.{}{}", k.first, to_string(k.second), pass), k.second, p);
  }
  if (pol.lamp)
    out += fmt::format("lamp: {} tau {}{}{}, recompute in {}\n", to_string(pol.lamp->rule), pol.lamp->tau,
                       pol.lamp->length_scaled ? ", length-scaled" : "",
                       pol.lamp->random_control ? fmt::format(", random control (seed {})", pol.lamp->seed) : "",
                       pol.lamp->recompute ? pol.lamp->recompute->name : "fp32");
  for (auto [name, spec] : {std::pair{"lamp_activation", &pol.lamp_activation}, {"lamp_layernorm", &pol.lamp_layernorm}})
    if (*spec) out += fmt::format("{}: tau {}, recompute in {}\n", name, (*spec)->tau,
                                  (*spec)->recompute ? (*spec)->recompute->name : "fp32");
  return out.empty() ? "native\n" : out;
}

SitePolicy lamp_recompute_site(const std::optional<Format>& f) {
  SitePolicy r;
  if (f) r.accumulation = Accumulation::strict, r.accumulator = r.output = f;
  return r;
}

SitePlan plan_site(const SitePolicy& p) {
  SitePlan s;
  if (p.accumulation) s.gemm = plan_gemm(p.gemm_spec(0));
  auto step = [&](const std::optional<Format>& f) -> std::optional<RoundStep> {
    if (!f) return std::nullopt;
    require_fits_float(*f);  // the passes round binary32 values in place
    return RoundStep{plan_round(*f, p.rounding, p.sr_bits, p.seed, p.sr_packed), max_finite(*f)};
  };
  s.input = step(p.input);
  s.output = step(p.output);
  auto operand = [&](const std::optional<OperandQuant>& q, bool transposed) -> std::optional<OperandStep> {
    if (!q) return std::nullopt;
    OperandStep o{step(q->format), q->scheme, p.rounding, p.sr_bits, p.seed};
    if (o.scheme && transposed) std::swap(o.scheme->block_rows, o.scheme->block_cols);
    return o;
  };
  s.input_a = operand(p.input_a, false);
  s.input_b = operand(p.input_b, true);
  s.random = !p.is_native() && (p.rounding == Rounding::sr || p.rounding == Rounding::sre);
  return s;
}

PolicyPlan::PolicyPlan(const Policy& policy, const ModelConfig& c) : policy_(policy), cfg_(c), layers_(c.layers) {
  validate(c);  // the configuration first: its sizes index the plan
  policy_.check(c);
  std::map<const SitePolicy*, uint32_t> seen;  // entries shared by layers compile once
  index_.resize(size_t(kPassCount) * size_t(layers_ + 1) * kSiteCount);
  for (int pass = 0; pass < kPassCount; ++pass)
    for (int l = -1; l < layers_; ++l)
      for (int s = 0; s < kSiteCount; ++s) {
        const SitePolicy& e = policy_.at(Site(s), l, Pass(pass));
        auto [it, fresh] = seen.emplace(&e, uint32_t(plans_.size()));
        if (fresh) plans_.push_back(plan_site(e));
        index_[(size_t(pass) * size_t(layers_ + 1) + size_t(l + 1)) * kSiteCount + size_t(s)] = it->second;
      }
  const std::optional<Format> none;
  lamp_[0] = plan_site(lamp_recompute_site(policy_.lamp ? policy_.lamp->recompute : none));
  lamp_[1] = plan_site(lamp_recompute_site(policy_.lamp_activation ? policy_.lamp_activation->recompute : none));
  lamp_[2] = plan_site(lamp_recompute_site(policy_.lamp_layernorm ? policy_.lamp_layernorm->recompute : none));
}

}  // namespace mantis
