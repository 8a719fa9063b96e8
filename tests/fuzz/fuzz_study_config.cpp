// fuzz_study_config — the studies' TOML configurations, each input read by every reader: the
// μ-sweep and the policy sweep (exp/mu_sweep.h, exp/policy_sweep.h), the LAMP sweep
// (exp/lamp_sweep.h), the optimizer study (exp/optim_study.h), the GNMR study (exp/gnmr_study.h)
// and the GNMR replay's [controller] (exp/gnmr_replay.h); a configuration that loads lists its cells.
#include "exp/gnmr_replay.h"
#include "exp/gnmr_study.h"
#include "exp/lamp_sweep.h"
#include "exp/mu_sweep.h"
#include "exp/optim_study.h"
#include "exp/policy_sweep.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(study_config) {
  const std::string path = fuzz::put("study.toml", data, size);
  fuzz::refused([&] { (void)mu_sweep_cells(read_mu_sweep(path)); });
  fuzz::refused([&] { (void)is_policy_sweep(path); });
  fuzz::refused([&] { (void)policy_sweep_cells(read_policy_sweep(path)); });
  fuzz::refused([&] { (void)lamp_sweep_cells(read_lamp_sweep(path)); });
  fuzz::refused([&] { (void)optim_study_cells(read_optim_study(path)); });
  fuzz::refused([&] { (void)gnmr_study_cells(read_gnmr_study(path)); });
  fuzz::refused([&] { (void)gnmr_replay_config(path); });
  return 0;
}
