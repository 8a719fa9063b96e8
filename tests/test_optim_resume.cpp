// test_optim_resume — every registered optimizer through a checkpoint: a run interrupted after its
// checkpoint and resumed in a fresh Trainer ends bit-identical (parameters, every state tensor's
// name, dtype, shape and bytes, state_bytes, the losses) to the uninterrupted run, for a tiny
// gpt2 and a tiny llama model. Generic over optimizers(): an optimizer added to the registry is
// covered without an edit here. Rule for test-only entries: this executable registers none, and
// names beginning "test-" (the convention of the other tests' stand-ins) are skipped. Every other
// optimizer must train a whole model (GefenMuon included: its rest group takes the vectors).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "testutil.h"
#include "train/train.h"

using namespace mantis;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny(const std::string& arch, const std::string& optimizer, const std::string& out) {
  const std::string t = fmt::format(R"([model]
arch = "{}"
layers = 1
heads = 4
kv_heads = {}
dim = 32
ctx = 32

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 4
batch = 2
lr = 3e-3
warmup = 1
val_seqs = 2
checkpoint_every = 2

[optimizer]
name = "{}"
)", arch, arch == "llama" ? 2 : 4, optimizer);
  TrainConfig c = train_config_from_toml(t, "tiny.toml");
  c.out = out;
  return c;
}

bool same_params(const Model& a, const Model& b) {
  if (a.params.size() != b.params.size()) return false;
  for (auto& [k, t] : a.params) {
    const auto& u = b.params.at(k).data;
    if (t.data.size() != u.size() || std::memcmp(t.data.data(), u.data(), u.size() * 4) != 0) return false;
  }
  return true;
}

void check_same_state(const Optimizer& a, const Optimizer& b) {
  const auto x = a.state(), y = b.state();
  REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("state tensor " << x[i].name);
    CHECK(x[i].name == y[i].name);
    CHECK(x[i].dtype == y[i].dtype);
    CHECK(x[i].shape == y[i].shape);
    CHECK(x[i].bytes == y[i].bytes);
  }
  CHECK(a.steps() == b.steps());
  CHECK(a.state_bytes() == b.state_bytes());
  uint64_t total = 8;  // the step count
  for (auto& t : x) total += t.bytes.size();
  CHECK(a.state_bytes() == total);  // exact: every stored tensor at its dtype
}

}  // namespace

TEST_CASE("every registered optimizer: checkpoint round trip and bit-identical resume (gpt2, llama)") {
  std::vector<std::string> names;
  for (auto& e : optimizers())
    if (!e.name.starts_with("test-")) names.push_back(e.name);
  REQUIRE(!names.empty());
  for (const std::string& name : names)
    for (const char* arch : {"gpt2", "llama"}) {
      INFO(name << " on " << arch);
      const std::string tag = name + "-" + arch;
      const std::string whole = (mantis::test::scratch_dir() / ("whole-" + tag)).string(),
                        dir = (mantis::test::scratch_dir() / ("resume-" + tag)).string();
      Trainer one(tiny(arch, name, whole));
      one.run();
      {
        Trainer part(tiny(arch, name, dir));
        part.run({}, 2);  // its checkpoint at step 2
        part.step();      // lost work: never checkpointed
      }
      Trainer rest(tiny(arch, name, dir));
      rest.resume(dir);
      REQUIRE(rest.next_step() == 2);
      CHECK(rest.optimizer().name() == name);
      rest.run();
      CHECK(same_params(rest.model(), one.model()));
      check_same_state(rest.optimizer(), one.optimizer());
      REQUIRE(rest.log().size() == one.log().size());
      for (size_t i = 0; i < one.log().size(); ++i) {
        CHECK(rest.log()[i].loss == one.log()[i].loss);
        CHECK(rest.log()[i].state_bytes == one.log()[i].state_bytes);  // through trainer.json
      }
      CHECK(one.log().back().state_bytes == one.optimizer().state_bytes());
      // log.csv's last column: state_bytes after each step
      const std::string csv = read_file(dir + "/log.csv");
      CHECK(csv.starts_with("step,loss_nats,val_loss_nats,lr,grad_norm,tokens,seconds,state_bytes\n"));
      CHECK(csv.ends_with("," + std::to_string(one.optimizer().state_bytes()) + "\n"));
      // the checkpoint records the optimizer's name and exact state bytes
      const auto j = nlohmann::json::parse(read_file(dir + "/checkpoint-00000004/trainer.json"));
      CHECK(j["optimizer"]["name"] == name);
      CHECK(j["optimizer"]["state_bytes"] == one.optimizer().state_bytes());
    }
}
