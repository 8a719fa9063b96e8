#include "train/routing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/philox.h"

namespace mantis {

namespace {

constexpr uint64_t kRandomStream = 0x6a4d;

class Routing final : public TrainController {
 public:
  Routing(const ControllerConfig& c, const ModelConfig& m)
      : c_(c), ids_(unit_ids(m, c.unit_block)), selected_(ids_.size(), false) {
    if (c_.name == "gnmr") gnmr_.emplace(c_.gnmr, ids_);
    if (c_.unit_block > 0)  // id k ↔ (projection, block), in ids_'s order
      for (size_t i = 0; i < size_t(m.layers) * kUnitCount; ++i) {
        blocks_.push_back(SavedBlocks{c_.unit_block, {}, c_.recover});
        blocks_.back().recovered.assign(blocks_.back().count(size_t(saved_cols(m, Unit(i % kUnitCount)))), 0);
        for (size_t b = 0; b < blocks_.back().recovered.size(); ++b) at_.push_back({i, b});
      }
    if (!c_.recover_policy.empty()) {
      Policy rp;
      try {
        rp = policy_from_spec(c_.recover_policy);
        rp.check(m);
      } catch (const InputError& e) {
        throw InputError(fmt::format("[controller.recover] policy {}: {}", c_.recover_policy, e.what()));
      }
      for (size_t i = 0; i < ids_.size(); ++i) {
        const int l = int(i / kUnitCount);
        const Site s = site_of(Unit(i % kUnitCount));
        recover_gemm_.push_back({rp.at(s, l, Pass::forward), rp.at(s, l, Pass::dx), rp.at(s, l, Pass::dw)});
      }
    }
  }

  void choose(uint64_t, std::vector<UnitPath>& paths) override {
    ran_recovery_ = selected_;
    for (size_t i = 0; i < paths.size() && !blocks_.empty(); ++i) paths[i].blocks = blocks_[i];
    for (size_t i = 0; i < selected_.size(); ++i)
      if (selected_[i]) recover(i, paths);
  }

  // rerun = true: the units selected at this step that ran the low path re-run it on the recovery path.
  bool rerun(uint64_t, std::vector<UnitPath>& paths) override {
    if (!c_.rerun) return false;
    bool any = false;
    for (size_t i = 0; i < selected_.size(); ++i)
      if (selected_[i] && !ran_recovery_[i]) recover(i, paths), any = true;
    reruns_ += any;
    return any;
  }

  void observe(uint64_t step, std::span<const UnitStep> units) override {
    const uint64_t t = step + 1;
    const size_t n = ids_.size();
    std::vector<GnmrUnitStep> r(n);
    if (gnmr_) {
      std::vector<double> norms(n);
      for (size_t i = 0; i < n; ++i) norms[i] = norm(units, i);
      r = gnmr_->step(norms);
    } else if (c_.name == "oracle") {
      // the largest relative RMS error of the low path's saved activation at this step; ties by id
      std::vector<double> damage(n);
      for (size_t i = 0; i < n; ++i) {
        const auto [ss, err] = blocks_.empty() ? std::pair{units[i].act.sum_sq, units[i].act.low_err_sq}
                                               : std::pair{units[at_[i].first].act.block_sum_sq.at(at_[i].second),
                                                           units[at_[i].first].act.block_low_err_sq.at(at_[i].second)};
        damage[i] = ss > 0 ? std::sqrt(err / ss) : 0.0;
      }
      std::vector<size_t> idx(order().begin(), order().end());
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return damage[a] > damage[b]; });
      for (size_t k = 0; k < std::min(n, size_t(c_.gnmr.max_recover)); ++k)
        if (damage[idx[k]] > 0) r[idx[k]].recovered = true;
    } else if (c_.name == "random") {
      std::vector<size_t> idx(n);
      for (size_t i = 0; i < n; ++i) idx[i] = i;
      const size_t k = std::min(n, size_t(c_.gnmr.max_recover));
      const uint64_t b = (t - 1) / c_.hold + 1;  // hold 1: b = t
      for (size_t i = 0; i < k; ++i) {
        const size_t j = i + size_t(random_word64(c_.seed, kRandomStream, b * n + i) % (n - i));
        std::swap(idx[i], idx[j]);
        r[idx[i]].recovered = true;
      }
    }
    std::string rec_ids;
    uint64_t recovered = 0, exceeded = 0;
    for (size_t i : order()) {
      const GnmrUnitStep& s = r[i];
      rows_.push_back(gnmr_row(t, ids_[i], s));
      norms_.push_back(fmt::format("{},{},{:.17g}", t, ids_[i], norm(units, i)));
      if (s.recovered) rec_ids += (rec_ids.empty() ? "" : " ") + ids_[i], ++recovered;
      exceeded += s.exceeds;
    }
    for (size_t i = 0; i < n; ++i) selected_[i] = r[i].recovered;
    summary_.push_back(fmt::format("{},{},{},{},{}", t, recovered, exceeded, n, rec_ids));
    last_recovered_ = recovered;
  }

  nlohmann::json state() const override {
    return {{"name", c_.name}, {"gnmr", gnmr_ ? gnmr_->state() : nlohmann::json(nullptr)}, {"selected", selected_},
            {"rows", rows_}, {"norms", norms_}, {"summary", summary_}, {"last_recovered", last_recovered_}, {"reruns", reruns_}};
  }

  void load_state(const nlohmann::json& s) override {
    try {
      if (s.at("name").get<std::string>() != c_.name)
        throw InputError(fmt::format("controller '{}', expected '{}'", s.at("name").get<std::string>(), c_.name));
      const auto sel = s.at("selected").get<std::vector<bool>>();
      if (sel.size() != ids_.size()) throw InputError(fmt::format("{} units, expected {}", sel.size(), ids_.size()));
      auto rows = s.at("rows").get<std::vector<std::string>>();
      auto norms = s.at("norms").get<std::vector<std::string>>();
      auto summary = s.at("summary").get<std::vector<std::string>>();
      if (rows.size() != summary.size() * ids_.size() || norms.size() != rows.size())
        throw InputError(fmt::format("{} rows for {} steps of {} units", rows.size(), summary.size(), ids_.size()));
      if (gnmr_) {
        gnmr_->load_state(s.at("gnmr"));
        if (gnmr_->steps() != summary.size())
          throw InputError(fmt::format("GNMR at step {}, the log at {}", gnmr_->steps(), summary.size()));
      }
      selected_ = sel, rows_ = std::move(rows), norms_ = std::move(norms), summary_ = std::move(summary);
      last_recovered_ = s.at("last_recovered").get<uint64_t>();
      reruns_ = s.value("reruns", uint64_t(0));  // absent before the option existed: no re-runs
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("controller state: {}", e.what()));
    } catch (const InputError& e) {
      throw InputError(fmt::format("controller state: {}", e.what()));
    }
  }

  std::vector<std::pair<std::string, std::string>> logs() const override {
    std::string rows = std::string(kGnmrHeader) + "\n", summary = "step,recovered,exceeded,units,recovered_units\n",
                norms = "step,unit,grad_norm\n";
    for (auto& r : rows_) rows += r + "\n";
    for (auto& r : norms_) norms += r + "\n";
    for (auto& r : summary_) summary += r + "\n";
    return {{"controller.csv", rows}, {"norms.csv", norms}, {"recovery.csv", summary}};
  }

  std::vector<std::string> summary() const override {
    uint64_t rec = 0;
    for (auto& r : summary_) rec += std::stoull(r.substr(r.find(',') + 1));
    std::vector<std::string> v{fmt::format("{}: {} unit-steps recovered of {} ({:.3f} %)", c_.name, rec,
                                           summary_.size() * ids_.size(),
                                           summary_.empty() ? 0.0 : 100.0 * double(rec) / double(summary_.size() * ids_.size()))};
    if (c_.rerun) v.push_back(fmt::format("{}: {} steps re-run with their selected units recovered", c_.name, reruns_));
    if (gnmr_)
      for (auto& h : gnmr_->held())
        v.push_back(fmt::format("{} holds a recovery slot since step {} (to the end)", ids_[h.unit], h.since));
    return v;
  }

  std::string progress() const override { return fmt::format("rec {}/{}", last_recovered_, ids_.size()); }

 private:
  // Unit i's gradient norm (a block's: its columns of the projection's).
  double norm(std::span<const UnitStep> units, size_t i) const {
    return blocks_.empty() ? units[i].grad_norm : units[at_[i].first].block_norms.at(at_[i].second);
  }

  // Unit i takes the recovery path in paths.
  void recover(size_t i, std::vector<UnitPath>& paths) const {
    if (!blocks_.empty()) {
      paths[at_[i].first].blocks.recovered[at_[i].second] = 1;
      return;
    }
    UnitPath& p = paths[i];
    if (c_.name == "oracle") p.low = p.saved;  // its damage stays measured
    p.saved = c_.recover;
    if (!recover_gemm_.empty()) {
      const auto& [f, dx, dw] = recover_gemm_[i];
      p.forward = f, p.dx = dx, p.dw = dw;
    }
  }

  const std::vector<size_t>& order() {
    if (order_.empty()) {
      order_.resize(ids_.size());
      for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
      std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return ids_[a] < ids_[b]; });
    }
    return order_;
  }

  ControllerConfig c_;
  std::vector<std::string> ids_;
  std::vector<size_t> order_;
  std::optional<Gnmr> gnmr_;
  std::vector<std::tuple<SitePolicy, SitePolicy, SitePolicy>> recover_gemm_;  // [unit]: forward, dx, dw
  std::vector<SavedBlocks> blocks_;               // unit_block > 0: [projection], none recovered
  std::vector<std::pair<size_t, size_t>> at_;     // unit_block > 0: [unit] → (projection, block)
  std::vector<bool> selected_;   // at the last observed step: the recovery path at the next
  std::vector<bool> ran_recovery_;  // at the current step (set by choose)
  uint64_t reruns_ = 0;          // steps re-run (rerun = true)
  std::vector<std::string> rows_, norms_, summary_;  // controller.csv, norms.csv, recovery.csv lines
  uint64_t last_recovered_ = 0;
};

}  // namespace

std::vector<std::string> unit_ids(const ModelConfig& m, int unit_block) {
  std::vector<std::string> ids;
  for (int l = 0; l < m.layers; ++l)
    for (int u = 0; u < kUnitCount; ++u)
      if (unit_block <= 0) {
        ids.push_back(fmt::format("layer.{}.{}", l, to_string(Unit(u))));
      } else {
        const int64_t nb = (saved_cols(m, Unit(u)) + unit_block - 1) / unit_block;
        for (int64_t b = 0; b < nb; ++b) ids.push_back(fmt::format("layer.{}.{}.b{}", l, to_string(Unit(u)), b));
      }
  return ids;
}

std::unique_ptr<TrainController> make_controller(const ControllerConfig& c, const ModelConfig& m) {
  if (c.name != "gnmr" && c.name != "random" && c.name != "static" && c.name != "oracle")
    throw InputError(fmt::format("[controller] name = '{}' (known: {})", c.name, kControllerNames));
  if (c.hold < 1) throw InputError("[controller] hold must be at least 1 (steps each random draw is kept)");
  if (c.unit_block < 0) throw InputError(fmt::format("[controller] unit_block = {} (0: a unit per projection; > 0: columns per unit)", c.unit_block));
  if (c.unit_block > 0 && !c.recover_policy.empty())
    throw InputError("[controller] unit_block recovers column blocks of saved activations: a [controller.recover] policy "
                     "(whole GEMMs) cannot apply to them; drop one of the two");
  return std::make_unique<Routing>(c, m);
}

}  // namespace mantis
