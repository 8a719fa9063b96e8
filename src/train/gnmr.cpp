#include "train/gnmr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/toml.h"

namespace mantis {

namespace {

// One of `names` (the first is index 0); InputError "PATH:LINE: [controller] KEY = 'v' (known: …)".
bool choice(const toml::table& t, const std::string& path, const char* key, const char* off, const char* on,
            bool dflt) {
  const toml::node* n = t.get(key);
  if (!n) return dflt;
  if (n->is_string()) {
    const std::string v = n->as_string()->get();
    if (v == off) return false;
    if (v == on) return true;
  }
  throw InputError(fmt::format("{}: [controller] {} must be \"{}\" or \"{}\"", toml_where(path, *n), key, off, on));
}

template <class V>
void number(const toml::table& t, const std::string& path, const char* key, V& out) {
  const toml::node* n = t.get(key);
  if (!n) return;
  if constexpr (std::is_floating_point_v<V>) {
    if (n->is_integer()) out = V(n->as_integer()->get());
    else if (n->is_floating_point() && std::isfinite(n->as_floating_point()->get())) out = n->as_floating_point()->get();
    else throw InputError(fmt::format("{}: [controller] {} must be a finite number", toml_where(path, *n), key));
  } else {
    const int64_t v = n->is_integer() ? n->as_integer()->get() : -1;
    if (v < 0 || uint64_t(v) > uint64_t(std::numeric_limits<V>::max()))
      throw InputError(fmt::format("{}: [controller] {} must be a non-negative integer in range", toml_where(path, *n), key));
    out = V(v);
  }
}

// x[⌊h⌋] + (h − ⌊h⌋)(x[⌊h⌋+1] − x[⌊h⌋]), h = (n−1)q, over x sorted ascending; NaN when empty.
double quantile_of(std::vector<double> x, double q) {
  if (x.empty()) return kUndefined;
  std::sort(x.begin(), x.end());
  const double h = double(x.size() - 1) * q;
  const size_t lo = size_t(std::floor(h));
  if (lo + 1 >= x.size()) return x.back();
  return x[lo] + (h - double(lo)) * (x[lo + 1] - x[lo]);
}

// value / threshold, with the threshold-0 rule of the header; NaN when either is undefined.
double ratio(double value, double threshold) {
  if (std::isnan(value) || std::isnan(threshold)) return kUndefined;
  if (threshold == 0) return value > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return value / threshold;
}

std::string num(double x) { return std::isnan(x) ? "" : fmt::format("{:.17g}", x); }

}  // namespace

GnmrOptions gnmr_options_from_toml(const toml::table& t, const std::string& path) {
  GnmrOptions o;
  number(t, path, "alpha", o.alpha);
  number(t, path, "beta", o.beta);
  number(t, path, "delta", o.delta);
  number(t, path, "max_recover", o.max_recover);
  number(t, path, "lock", o.lock);
  number(t, path, "warmup", o.warmup);
  number(t, path, "ema_decay", o.ema_decay);
  number(t, path, "quantile", o.quantile);
  o.combine_and = choice(t, path, "combine", "or", "and", o.combine_and);
  o.history_low_path = choice(t, path, "history", "all", "low_path", o.history_low_path);
  o.mean_ema = choice(t, path, "mean", "cumulative", "ema", o.mean_ema);
  o.priority_score = choice(t, path, "priority", "locked_first", "score", o.priority_score);
  o.threshold_quantile = choice(t, path, "threshold", "fixed", "quantile", o.threshold_quantile);
  try {
    validate(o);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: [controller]: {}", path, e.what()));
  }
  return o;
}

void validate(const GnmrOptions& o) {
  if (!(o.alpha > 0) || !(o.beta > 0) || !std::isfinite(o.alpha) || !std::isfinite(o.beta))
    throw InputError(fmt::format("alpha and beta must be finite and > 0 (alpha {}, beta {})", o.alpha, o.beta));
  if (o.delta < 1) throw InputError(fmt::format("delta must be ≥ 1 (it is {})", o.delta));
  if (o.max_recover < 0 || o.lock < 0) throw InputError("max_recover and lock must be ≥ 0");
  if (!(o.ema_decay >= 0 && o.ema_decay < 1))
    throw InputError(fmt::format("ema_decay must be in [0, 1) (it is {})", o.ema_decay));
  if (!(o.quantile >= 0 && o.quantile <= 1))
    throw InputError(fmt::format("quantile must be in [0, 1] (it is {})", o.quantile));
}

Gnmr::Gnmr(GnmrOptions o, std::vector<std::string> ids) : o_(o), ids_(std::move(ids)), u_(ids_.size()), last_(ids_.size()) {
  validate(o_);
  if (std::set<std::string>(ids_.begin(), ids_.end()).size() != ids_.size())
    throw InputError("GNMR: the unit ids are not distinct");
  order_.resize(ids_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return ids_[a] < ids_[b]; });
}

const std::vector<GnmrUnitStep>& Gnmr::step(std::span<const double> norms) {
  if (norms.size() != ids_.size())
    throw InputError(fmt::format("GNMR step {}: {} norms for {} units", t_ + 1, norms.size(), ids_.size()));
  for (size_t i = 0; i < norms.size(); ++i)
    if (!std::isfinite(norms[i]) || norms[i] < 0)
      throw InputError(fmt::format("GNMR step {}: unit {}: gradient norm {} is not a finite non-negative number", t_ + 1,
                                   ids_[i], norms[i]));
  const uint64_t t = ++t_;
  const size_t n = ids_.size();
  std::vector<GnmrUnitStep>& r = last_;
  // scores, then the windows and histories move on
  for (size_t i = 0; i < n; ++i) {
    Unit& u = u_[i];
    GnmrUnitStep& s = r[i];
    s = GnmrUnitStep{};
    const double m = u.count == 0 ? kUndefined : o_.mean_ema ? u.ema : u.sum / double(u.count);
    if (u.count > 0 && m != 0) s.gnmr = norms[i] / m;
    if (!std::isnan(s.gnmr) && u.window.size() == size_t(o_.delta)) {
      double w = 0;
      for (double v : u.window) w += v;
      const double wm = w / double(o_.delta);
      if (wm != 0) s.dgnmr = s.gnmr / wm;
    }
    if (!std::isnan(s.gnmr)) {
      if (u.window.size() == size_t(o_.delta)) u.window.erase(u.window.begin());
      u.window.push_back(s.gnmr);
    }
    if (!o_.history_low_path || !u.selected) {
      u.sum += norms[i];
      u.ema = u.count == 0 ? norms[i] : o_.ema_decay * u.ema + (1 - o_.ema_decay) * norms[i];
      ++u.count;
    }
  }
  double alpha = o_.alpha, beta = o_.beta;
  if (o_.threshold_quantile) {
    std::vector<double> g, d;
    for (auto& s : r) {
      if (!std::isnan(s.gnmr)) g.push_back(s.gnmr);
      if (!std::isnan(s.dgnmr)) d.push_back(s.dgnmr);
    }
    alpha = quantile_of(std::move(g), o_.quantile), beta = quantile_of(std::move(d), o_.quantile);
  }
  std::vector<double> score(n, -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < n; ++i) {
    const double a = ratio(r[i].gnmr, alpha), b = ratio(r[i].dgnmr, beta);
    for (double x : {a, b})
      if (!std::isnan(x)) score[i] = std::max(score[i], x);
    if (t > o_.warmup) {
      const bool ea = !std::isnan(a) && r[i].gnmr > alpha, eb = !std::isnan(b) && r[i].dgnmr > beta;
      r[i].exceeds = o_.combine_and ? ea && eb : ea || eb;
    }
  }
  // candidates in priority order; ties by id (order_ is byte order, and stable_sort keeps it)
  std::vector<size_t> cand;
  for (size_t i : order_)
    if (r[i].exceeds || u_[i].lock > 0) cand.push_back(i);
  std::stable_sort(cand.begin(), cand.end(), [&](size_t a, size_t b) {
    if (!o_.priority_score) {
      const bool la = u_[a].lock > 0, lb = u_[b].lock > 0;
      if (la != lb) return la;
    }
    return score[a] > score[b];
  });
  if (cand.size() > size_t(o_.max_recover)) cand.resize(size_t(o_.max_recover));
  for (size_t i : cand) r[i].recovered = true;
  for (size_t i = 0; i < n; ++i) {
    Unit& u = u_[i];
    if (r[i].recovered && r[i].exceeds) u.lock = o_.lock;
    else if (u.lock > 0 && !r[i].exceeds) --u.lock;
    r[i].lock = u.lock;
    u.held_since = r[i].recovered ? (u.selected ? u.held_since : t) : 0;
    u.selected = r[i].recovered;
  }
  return r;
}

std::vector<Gnmr::Held> Gnmr::held() const {
  std::vector<Held> h;
  for (size_t i : order_)
    if (u_[i].selected && t_ - u_[i].held_since + 1 > uint64_t(o_.lock) + 1) h.push_back({i, u_[i].held_since});
  return h;
}

nlohmann::json Gnmr::state() const {
  nlohmann::json units = nlohmann::json::array();
  for (size_t i = 0; i < ids_.size(); ++i) {
    const Unit& u = u_[i];
    units.push_back({{"id", ids_[i]}, {"sum", u.sum}, {"count", u.count}, {"ema", u.ema}, {"window", u.window},
                     {"lock", u.lock}, {"selected", u.selected}, {"held_since", u.held_since}});
  }
  return {{"step", t_}, {"units", units}};
}

void Gnmr::load_state(const nlohmann::json& s) {
  try {
    const uint64_t t = s.at("step").get<uint64_t>();
    const auto& ju = s.at("units");
    if (!ju.is_array() || ju.size() != ids_.size())
      throw InputError(fmt::format("{} units, expected {}", ju.size(), ids_.size()));
    std::vector<Unit> u(ids_.size());
    for (size_t i = 0; i < u.size(); ++i) {
      const auto& j = ju[i];
      if (j.at("id").get<std::string>() != ids_[i])
        throw InputError(fmt::format("unit {} is '{}', expected '{}'", i, j.at("id").get<std::string>(), ids_[i]));
      u[i].sum = j.at("sum").get<double>(), u[i].count = j.at("count").get<uint64_t>();
      u[i].ema = j.at("ema").get<double>(), u[i].window = j.at("window").get<std::vector<double>>();
      u[i].lock = j.at("lock").get<int>(), u[i].selected = j.at("selected").get<bool>();
      u[i].held_since = j.at("held_since").get<uint64_t>();
      if (u[i].count > t || u[i].window.size() > size_t(o_.delta) || u[i].lock < 0 || u[i].lock > o_.lock ||
          u[i].held_since > t || !std::isfinite(u[i].sum) || !std::isfinite(u[i].ema))
        throw InputError(fmt::format("unit '{}' is out of range", ids_[i]));
    }
    u_ = std::move(u);
    t_ = t;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("GNMR state: {}", e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("GNMR state: {}", e.what()));
  }
}

std::string gnmr_row(uint64_t step, const std::string& id, const GnmrUnitStep& s) {
  return fmt::format("{},{},{},{},{},{},{}", step, id, num(s.gnmr), num(s.dgnmr), int(s.exceeds), s.lock,
                     int(s.recovered));
}

std::string gnmr_rows(const Gnmr& g) {
  std::string out;
  for (size_t i : g.order()) out += gnmr_row(g.steps(), g.ids()[i], g.last()[i]) + "\n";
  return out;
}

void check_controller_keys(const toml::table& t, const std::string& path) {
  for (auto&& [k, v] : t) {
    bool known = k.str() == "name" || k.str() == "seed" || k.str() == "hold" || k.str() == "rerun" || k.str() == "unit_block" ||
                 k.str() == "recover";
    for (const char* key : kGnmrKeys) known |= k.str() == key;
    if (!known) throw InputError(fmt::format("{}: unknown key '{}' in [controller]", toml_where(path, v), k.str()));
  }
}

}  // namespace mantis
