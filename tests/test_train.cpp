// test_train — the training loop: determinism across threads, bit-identical resume, controller
// hooks, bad input (the optimizers, schedule and clipping: test_optim).
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "core/file.h"
#include "mantis_config.h"
#include "testutil.h"
#include "core/round_array.h"
#include "exp/gnmr_replay.h"
#include "train/train.h"

using namespace mantis;
namespace fs = std::filesystem;

namespace {

using mantis::test::error_of;
const auto& scratch = mantis::test::scratch_dir;

const char* kTiny = R"(
[model]
arch = "ARCH"
layers = 2
heads = 4
kv_heads = KV
dim = 32
ctx = 48

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 6
batch = 3
accum = 2
lr = 3e-3
warmup = 2
val_every = 3
val_seqs = 2
checkpoint_every = 2
)";

TrainConfig tiny(const std::string& arch, const std::string& out, const std::string& extra = "") {
  std::string t = kTiny;
  t.replace(t.find("ARCH"), 4, arch);
  t.replace(t.find("KV"), 2, arch == "llama" ? "2" : "4");
  TrainConfig c = train_config_from_toml(t + extra, "tiny.toml");
  c.out = out;
  return c;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) v.push_back(l);
  return v;
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> f(1);
  for (char ch : line)
    if (ch == ',') f.emplace_back();
    else f.back().push_back(ch);
  return f;
}

bool same_params(const Model& a, const Model& b) {
  for (auto& [k, t] : a.params) {
    const auto& u = b.params.at(k).data;
    if (t.data.size() != u.size() || std::memcmp(t.data.data(), u.data(), u.size() * 4) != 0) return false;
  }
  return a.params.size() == b.params.size();
}

}  // namespace

TEST_CASE("training is bit-identical for 1 and 2 threads, and across a resume") {
  for (const char* arch : {"gpt2", "llama"}) {
    INFO(arch);
    const int saved = num_threads();
    set_num_threads(1);
    Trainer one(tiny(arch, (scratch() / (std::string(arch) + "-one")).string()));
    one.run();
    set_num_threads(2);
    Trainer two(tiny(arch, (scratch() / (std::string(arch) + "-two")).string()));
    two.run();
    set_num_threads(saved);
    CHECK(same_params(one.model(), two.model()));
    REQUIRE(one.log().size() == 6);
    for (size_t i = 0; i < 6; ++i) CHECK(one.log()[i].loss == two.log()[i].loss);
    CHECK(std::isfinite(one.log()[5].val_loss));
    CHECK(one.log()[5].loss < one.log()[0].loss);

    // interrupted after step 4 (its checkpoint), resumed to the end
    const std::string dir = (scratch() / (std::string(arch) + "-resume")).string();
    {
      Trainer part(tiny(arch, dir));
      part.run({}, 4);  // checkpoints at 2 and 4
      part.step();      // lost work: never checkpointed
    }
    Trainer rest(tiny(arch, dir));
    rest.resume(dir);
    CHECK(rest.next_step() == 4);
    rest.run();
    CHECK(same_params(rest.model(), one.model()));
    for (size_t i = 0; i < 6; ++i) CHECK(rest.log()[i].loss == one.log()[i].loss);
    const std::string a = read_file(dir + "/log.csv"), b = read_file((scratch() / (std::string(arch) + "-one")).string() + "/log.csv");
    // the seconds column (the 7th of 8) differs; everything else matches
    auto strip = [](const std::string& s) {
      std::string o;
      std::stringstream ss(s);
      for (std::string line; std::getline(ss, line);) {
        size_t c = 0;
        for (int i = 0; i < 6; ++i) c = line.find(',', c) + 1;
        const size_t e = line.find(',', c);
        REQUIRE(e != std::string::npos);
        o += line.substr(0, c) + line.substr(e) + "\n";
      }
      return o;
    };
    const bool logs_equal = strip(a) == strip(b);
    CHECK(logs_equal);
  }
}

TEST_CASE("the controller chooses saved-activation paths per step and sees every unit") {
  struct Recorder : TrainController {
    std::vector<std::pair<uint64_t, UnitStep>> seen;
    void choose(uint64_t step, std::vector<UnitPath>& paths) override {
      if (step >= 1) paths[1 * kUnitCount + int(Unit::fc)].saved = SavedQuant{4, 8, Rounding::sr, 3};
    }
    void observe(uint64_t step, std::span<const UnitStep> units) override {
      for (auto& u : units) seen.emplace_back(step, u);
    }
  } rec;
  TrainConfig c = tiny("llama", "");
  Trainer t(c, &rec);
  t.step();
  t.step();
  REQUIRE(rec.seen.size() == 2 * 2 * kUnitCount);
  for (auto& [step, u] : rec.seen) {
    CHECK(u.grad_norm > 0);
    CHECK(u.act.count > 0);
    const bool quantised = step == 1 && u.layer == 1 && u.unit == Unit::fc;
    CHECK((u.path.saved.bits == 4) == quantised);
    CHECK((u.act.err_sq > 0) == quantised);
  }
  // all units at 4 bits, or through a scaled scheme: different but finite runs
  TrainConfig q = tiny("gpt2", "", "[activation_quant]\nbits = 4\nblock = 16\n");
  TrainConfig m = tiny("gpt2", "", "[activation_quant]\nscheme = \"mxfp4\"\nrounding = \"sr\"\n");
  REQUIRE(m.act_quant.scheme);
  CHECK(m.act_quant.label() == "mxfp4");
  Trainer tq(q), tf(tiny("gpt2", "")), tm(m);
  for (int s = 0; s < 3; ++s) {
    const auto a = tq.step(), b = tf.step(), c = tm.step();
    CHECK(std::isfinite(a.loss));
    CHECK(std::isfinite(c.loss));
    if (s > 0) CHECK(a.loss != b.loss);
    if (s > 0) CHECK(c.loss != b.loss);
  }
}

TEST_CASE("the shipped training configurations parse, their optimizer settings as written") {
  for (const char* f : {"experiments/train-gpt2-bytes.toml", "experiments/train-llama-bytes.toml",
                        "experiments/train-tiny.toml", "models/gpt2-bytes/train.toml", "models/llama-bytes/train.toml"}) {
    INFO(f);
    const TrainConfig c = load_train_config(std::string(MANTIS_SOURCE_DIR) + "/" + f);
    CHECK(c.optimizer.name == "adamw");
    for (auto& [k, v] : c.optimizer.values) CHECK((std::holds_alternative<double>(v.value) || std::holds_alternative<int64_t>(v.value)));
  }
}

TEST_CASE("training: bad configurations, a resume from another run, a diverging run") {
  auto err = [](const std::string& text) { return error_of([&] { train_config_from_toml(text, "bad.toml"); }); };
  CHECK_THAT(err("[model]\nlayer = 2\n"), Catch::Contains("bad.toml:2: unknown key 'layer' in [model]"));
  CHECK_THAT(err("[trian]\n"), Catch::Contains("unknown key 'trian'"));
  CHECK_THAT(err("[model]\narch = \"rnn\"\n"), Catch::Contains("arch = 'rnn'"));
  CHECK_THAT(err("[train]\nlr = \"fast\"\n"), Catch::Contains("'lr' in [train] must be a number"));
  CHECK_THAT(err("[model]\ndim = 30\nheads = 4\n"), Catch::Contains("not divisible"));
  CHECK_THAT(err("[activation_quant]\nbits = 9\n"), Catch::Contains("bits = 9"));
  CHECK_THAT(err("[activation_quant]\nbits = 4\nscheme = \"mxfp4\"\n"), Catch::Contains("replaces bits"));
  CHECK_THAT(err("[activation_quant]\nscheme = \"mxfp5\"\n"), Catch::Contains("unknown scheme 'mxfp5'"));
  CHECK_THAT(err("[data]\ntokenizer = \"sp\"\n"), Catch::Contains("unknown tokenizer 'sp'"));
  CHECK_THAT(err("[train]\nsteps = 0\n"), Catch::Contains("must be ≥ 1"));
  CHECK_THAT(err("[optimizer]\nname = \"lion\"\n"), Catch::Contains("bad.toml: [optimizer] name = 'lion' (known: adamw"));
  CHECK_THAT(err("[optimizer]\nbeta1 = [0.9]\n"), Catch::Contains("bad.toml:2: 'beta1' in [optimizer] must be a number"));
  CHECK_THAT(err("[optimizer]\nmomentum = 0.9\n"), Catch::Contains("bad.toml:2: unknown key 'momentum' in [optimizer]"));
  CHECK_THAT(err("optimizer = 1\n"), Catch::Contains("bad.toml:1: 'optimizer' must be a table"));
  CHECK_THROWS_WITH(Trainer(tiny("gpt2", "", "[precision]\npolicy = \"lamp:99\"\n")), Catch::Contains("99"));

  const std::string dir = (scratch() / "mismatch").string();
  {
    Trainer t(tiny("gpt2", dir));
    t.step();
    t.save_checkpoint();
  }
  Trainer other(tiny("gpt2", dir, "[optimizer]\nweight_decay = 0.2\n"));
  CHECK_THROWS_WITH(other.resume(dir), Catch::Contains("different configuration"));
  CHECK_THROWS_WITH(other.resume((scratch() / "nothing").string()), Catch::Contains("no checkpoint"));
  // a corrupt optimizer state is caught by its checksum
  {
    const std::string ck = dir + "/" + read_file(dir + "/latest");
    std::string bin = read_file(ck + "/optimizer.bin");
    bin[17] ^= 1;
    write_file_atomic(ck + "/optimizer.bin", bin);
    Trainer same(tiny("gpt2", dir));
    CHECK_THROWS_WITH(same.resume(dir), Catch::Contains("SHA-256 mismatch"));
  }

  // divergence: the loss becomes non-finite; the error names the last good checkpoint
  const std::string div = (scratch() / "diverge").string();
  TrainConfig dc = tiny("gpt2", div);
  dc.schedule.lr = 1e30, dc.grad_clip = 0, dc.checkpoint_every = 1;
  Trainer d(dc);
  std::string msg;
  try {
    d.run();
  } catch (const InputError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains("not finite"));
  CHECK_THAT(msg, Catch::Contains("checkpoint-"));
  REQUIRE(fs::exists(div + "/latest"));
  CHECK(fs::exists(div + "/" + read_file(div + "/latest") + "/model.safetensors"));
}

namespace {

// A copy of every file of a directory, to restore it after each corruption.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> s;
  for (auto& e : fs::directory_iterator(dir)) s[e.path().filename().string()] = read_file(e.path().string());
  return s;
}
void restore(const std::string& dir, const std::map<std::string, std::string>& s) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (auto& [name, bytes] : s) write_file_atomic(dir + "/" + name, bytes);
}
std::string resume_error(const std::string& dir) {
  Trainer t(tiny("gpt2", dir));
  try {
    t.resume(dir);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(resumed)";
}
// What a deliberate editor would do: rewrite trainer.json and make the manifest agree with it, so
// only the range checks behind the hashes can catch the edit.
void forge_trainer_json(const std::string& ck, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_file(ck + "/trainer.json"));
  edit(j);
  const std::string text = j.dump(1);
  write_file_atomic(ck + "/trainer.json", text);
  auto m = nlohmann::ordered_json::parse(read_file(ck + "/manifest.json"));
  m["files"]["trainer.json"] = {{"bytes", text.size()}, {"sha256", sha256_hex(text)}};
  if (j["step"].is_number_integer() && j["step"].get<int64_t>() >= 0) m["step"] = j["step"].get<uint64_t>();
  m.erase("sha256");
  m["sha256"] = sha256_hex(m.dump());
  write_file_atomic(ck + "/manifest.json", m.dump(1));
}

}  // namespace

TEST_CASE("resume: every file of a checkpoint is verified, every trainer.json field range-checked") {
  const std::string dir = (scratch() / "verify").string();
  {
    Trainer t(tiny("gpt2", dir));
    t.run({}, 4);  // checkpoints at 2 and 4
  }
  const std::string ck = dir + "/checkpoint-00000004", older = dir + "/checkpoint-00000002";
  const auto good = snapshot(ck);
  REQUIRE(good.count("manifest.json"));
  CHECK(resume_error(dir) == "(resumed)");

  // single-bit flips anywhere in the weights, the header included
  const std::string& st = good.at("model.safetensors");
  for (size_t i = 0; i < 25; ++i) {
    const size_t pos = 3 + i * (st.size() - 4) / 24;
    INFO("byte " << pos);
    std::string bad = st;
    bad[pos] ^= char(1 << (i % 8));
    write_file_atomic(ck + "/model.safetensors", bad);
    CHECK_THAT(resume_error(dir), Catch::Contains(ck + "/model.safetensors: SHA-256 mismatch"));
  }
  restore(ck, good);
  fs::copy_file(older + "/model.safetensors", ck + "/model.safetensors", fs::copy_options::overwrite_existing);
  CHECK_THAT(resume_error(dir), Catch::Contains(ck + "/model.safetensors: SHA-256 mismatch"));
  restore(ck, good);
  std::string cfg = good.at("config.json");
  cfg.replace(cfg.find("\"norm_eps\": 1e-05"), 17, "\"norm_eps\": 2e-05");
  write_file_atomic(ck + "/config.json", cfg);
  CHECK_THAT(resume_error(dir), Catch::Contains(ck + "/config.json: SHA-256 mismatch"));
  for (const char* edit : {"\"step\": 4", "\"steps\": 4"}) {
    INFO(edit);
    restore(ck, good);
    std::string tj = good.at("trainer.json");
    const size_t at = tj.find(edit);
    REQUIRE(at != std::string::npos);
    tj.replace(at, std::strlen(edit), std::string(edit).replace(std::strlen(edit) - 1, 1, "-1"));
    write_file_atomic(ck + "/trainer.json", tj);
    CHECK_THAT(resume_error(dir), Catch::Contains(ck + "/trainer.json: SHA-256 mismatch"));
  }
  restore(ck, good);
  std::string man = good.at("manifest.json");
  man.replace(man.find("\"step\": 4"), 9, "\"step\": 5");
  write_file_atomic(ck + "/manifest.json", man);
  CHECK_THAT(resume_error(dir), Catch::Contains(ck + "/manifest.json: SHA-256 mismatch"));
  restore(ck, good);
  fs::remove(ck + "/manifest.json");  // an older mantis's checkpoint: not resumed, but still a model
  CHECK_THAT(resume_error(dir), Catch::Contains(ck + ": no manifest.json"));
  CHECK_NOTHROW(load_model(ck));

  // edits that agree with the manifest
  auto forged = [&](const std::function<void(nlohmann::json&)>& edit) {
    restore(ck, good);
    forge_trainer_json(ck, edit);
    return resume_error(dir);
  };
  CHECK_THAT(forged([](auto& j) { j["step"] = -1; }), Catch::Contains("trainer.json: \"step\" must be a non-negative integer, got -1"));
  CHECK_THAT(forged([](auto& j) { j["step"] = 6; }), Catch::Contains("manifest.json: step is 6, expected 4"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["steps"] = 9; }), Catch::Contains("optimizer.steps is 9, expected 4"));
  CHECK_THAT(forged([](auto& j) { j["sequences_done"] = 1; }), Catch::Contains("sequences_done is 1, expected 24"));
  CHECK_THAT(forged([](auto& j) { j["log"][1][1] = "garbage"; }),
             Catch::Contains("log row 1 loss is \"garbage\", not a finite number"));
  CHECK_THAT(forged([](auto& j) { j["log"][0][3] = "1e999"; }), Catch::Contains("log row 0 lr is \"1e999\""));
  CHECK_THAT(forged([](auto& j) { j["log"].erase(0); }), Catch::Contains("the number of log rows is 3, expected 4"));
  CHECK_THAT(forged([](auto& j) { j["units"][0] = "7,0,attn"; }), Catch::Contains("units row 0 is \"7,0,attn\""));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["values"] = uint64_t(1) << 62; }),
             Catch::Contains("optimizer.bin: truncated"));
  {  // a step beyond the run, in a directory of that name: printed "done" before, with nothing saved
    restore(ck, good);
    forge_trainer_json(ck, [](auto& j) { j["step"] = 9; });
    const std::string beyond = dir + "/checkpoint-00000009";
    fs::rename(ck, beyond);
    write_file_atomic(dir + "/latest", "checkpoint-00000009");
    CHECK_THAT(resume_error(dir), Catch::Contains(beyond + "/trainer.json: step 9 is beyond the configured 6 steps"));
    fs::remove_all(beyond);
    write_file_atomic(dir + "/latest", "checkpoint-00000004");
  }
  restore(ck, good);
  CHECK(resume_error(dir) == "(resumed)");

  // a finished run resumes to a no-op
  const std::string done = (scratch() / "verify-done").string();
  Trainer(tiny("gpt2", done)).run();
  Trainer again(tiny("gpt2", done));
  again.resume(done);
  CHECK(again.next_step() == 6);
  again.run();
  CHECK(again.log().size() == 6);
}

TEST_CASE("resume: a `latest` with a trailing newline is read; garbage in it is named") {
  const std::string dir = (scratch() / "latest-newline").string();
  {
    Trainer t(tiny("llama", dir));
    t.run({}, 2);
  }
  write_file_atomic(dir + "/latest", "checkpoint-00000002\n");
  Trainer t(tiny("llama", dir));
  t.resume(dir);
  CHECK(t.next_step() == 2);
  write_file_atomic(dir + "/latest", "../../etc");
  CHECK_THROWS_WITH(t.resume(dir), Catch::Contains("latest: \"../../etc\" is not a checkpoint name"));
}

TEST_CASE("training: a non-finite update stops with the step named and leaves nothing half-made") {
  const std::string dir = (scratch() / "overflow").string();
  TrainConfig c = tiny("gpt2", dir);
  c.schedule.lr = 1e39, c.schedule.warmup = 0, c.checkpoint_every = 1;
  Trainer t(c);
  std::string msg;
  try {
    t.run();
  } catch (const InputError& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::Contains("step 0: the update (lr 1e+39) made the parameters non-finite (tensor "));
  CHECK_THAT(msg, Catch::Contains("last good checkpoint: none yet"));
  CHECK(msg.find('\n') == std::string::npos);
  std::error_code ec;  // (the directory need not exist at all)
  for (auto& e : fs::directory_iterator(dir, ec)) CHECK(e.path().filename().string().find("checkpoint") == std::string::npos);
}

// A FIFO (or any non-directory) at a checkpoint's name was swapped out and removed, exit 0 (issue 32,
// an audit of item 3): only an interrupted run's checkpoint directory may be replaced there.
TEST_CASE("training: a special file or a file at a checkpoint's name is refused and left as it was") {
  const std::string dir = (scratch() / "ckpt-special").string();
  fs::create_directories(dir);
  const std::string ck = dir + "/checkpoint-00000001";
  REQUIRE(::mkfifo(ck.c_str(), 0600) == 0);
  TrainConfig c = tiny("gpt2", dir);
  c.steps = 1;
  CHECK_THAT(error_of([&] { Trainer(c).run(); }), Catch::Contains(ck + " is a FIFO (named pipe), not a checkpoint directory"));
  CHECK(fs::is_fifo(ck));
  fs::remove(ck);
  write_file_atomic(ck, "a file");
  CHECK_THAT(error_of([&] { Trainer(c).run(); }), Catch::Contains(ck + " is a file, not a checkpoint directory"));
  CHECK(read_file(ck) == "a file");
  fs::remove(ck);
  fs::create_directories(ck);  // an interrupted run's directory: swapped out
  Trainer(c).run();
  CHECK(fs::exists(ck + "/config.json"));
}

TEST_CASE("training: a huge ctx is refused before the model is allocated") {
  TrainConfig c = tiny("gpt2", "");
  c.model.ctx = 16777216;  // the largest a TOML may give; wpe alone would be 2^24 × 32 floats (2 GB)
  CHECK_THROWS_WITH(Trainer(c), Catch::Contains("a sequence needs 16777217"));
}

TEST_CASE("temporaries of killed runs are removed when a run directory is opened") {
  const std::string dir = (scratch() / "stale").string();
  {
    Trainer t(tiny("gpt2", dir));
    t.run({}, 2);
  }
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(dead > 0);
  ::waitpid(dead, nullptr, 0);
  const std::string ck = dir + "/checkpoint-00000002";
  const std::vector<std::string> stale = {dir + fmt::format("/.log.csv.{}.0.tmp", dead),
                                          ck + fmt::format("/.optimizer.bin.{}.12.tmp", dead),
                                          dir + fmt::format("/.checkpoint-00000004.{}.1.tmp", dead)};
  const std::vector<std::string> kept = {dir + fmt::format("/.log.csv.{}.0.tmp", ::getpid()),  // a live writer's
                                         dir + "/.notes.tmp", dir + fmt::format("/.x.{}.tmp", dead)};
  fs::create_directories(stale[2]);
  write_file_atomic(stale[2] + "/config.json", "{}");
  for (auto& f : {stale[0], stale[1], kept[0], kept[1], kept[2]}) write_file_atomic(f, "partial");
  Trainer t(tiny("gpt2", dir));  // opening the run directory
  for (auto& f : stale) CHECK_FALSE(fs::exists(f));
  for (auto& f : kept) CHECK(fs::exists(f));
  CHECK(remove_stale_temporaries(dir) == 0);
  for (auto& f : kept) fs::remove(f);
  t.resume(dir);
  CHECK(t.next_step() == 2);
}

namespace {

// A test optimizer with state of several dtypes, as Gefen's will be: per parameter u8 codes of
// a momentum (per-block f32 scales, blocks of 16) and an i16 count of sign flips; an f64 running
// sum of the learning rates; a u32 counter. Its update depends on all of them.
class MixedOptimizer final : public Optimizer {
 public:
  explicit MixedOptimizer(const ParamSet& ps) {
    for (auto& p : ps.params) {
      Slot s{p.name, std::vector<uint64_t>(p.shape.begin(), p.shape.end()), {}, {}, {}};
      const size_t n = StateTensor{p.name, DType::u8, s.shape, {}}.numel();
      s.code.assign(n, 128), s.scale.assign((n + 15) / 16, 0.0f), s.flips.assign(s.scale.size(), 0);
      slots_.push_back(std::move(s));
    }
  }
  std::string name() const override { return "test-mixed"; }
  uint64_t steps() const override { return t_; }
  uint64_t state_bytes() const override {
    uint64_t b = 8 + 8 + 4;
    for (auto& s : slots_) b += s.code.size() + 4 * s.scale.size() + 2 * s.flips.size();
    return b;
  }
  void step(Model& m, const GradMap<float>& g, double lr) override {
    ++t_, ++calls_, lr_sum_ += lr;
    for (auto& s : slots_) {
      float* p = m.params.at(s.name).data.data();
      const auto& gr = g.at(s.name);
      for (size_t b = 0; b < s.scale.size(); ++b) {
        const size_t lo = 16 * b, hi = std::min(gr.size(), lo + 16);
        float mom[16], absmax = 0;
        for (size_t i = lo; i < hi; ++i) {
          mom[i - lo] = 0.9f * (float(int(s.code[i]) - 128) * s.scale[b]) + gr[i];
          absmax = std::max(absmax, std::abs(mom[i - lo]));
        }
        s.scale[b] = absmax / 127;
        for (size_t i = lo; i < hi; ++i) {
          const int q = absmax > 0 ? int(std::lround(mom[i - lo] / s.scale[b])) : 0;
          s.flips[b] += int16_t((q < 0) != (int(s.code[i]) < 128));
          s.code[i] = uint8_t(q + 128);
          p[i] -= float(lr_sum_ / double(calls_)) * float(q) * s.scale[b] * (1 + 1e-3f * float(s.flips[b] % 7));
        }
      }
    }
  }
  std::vector<StateTensor> state() const override {
    std::vector<StateTensor> out;
    for (auto& s : slots_) {
      out.push_back(StateTensor::of<uint8_t>(s.name + ".code", s.shape, s.code));
      out.push_back(StateTensor::of<float>(s.name + ".scale", {s.scale.size()}, s.scale));
      out.push_back(StateTensor::of<int16_t>(s.name + ".flips", {s.flips.size()}, s.flips));
    }
    out.push_back(StateTensor::of<double>("lr_sum", {}, std::span<const double>(&lr_sum_, 1)));
    out.push_back(StateTensor::of<uint32_t>("calls", {1}, std::span<const uint32_t>(&calls_, 1)));
    return out;
  }
  void load_state(const std::vector<StateTensor>& st, uint64_t steps) override {
    for (auto& s : slots_) {
      expect_state(st, s.name + ".code", DType::u8, s.shape).copy_to(std::span<uint8_t>(s.code));
      expect_state(st, s.name + ".scale", DType::f32, {s.scale.size()}).copy_to(std::span<float>(s.scale));
      expect_state(st, s.name + ".flips", DType::i16, {s.flips.size()}).copy_to(std::span<int16_t>(s.flips));
    }
    expect_state(st, "lr_sum", DType::f64, {}).copy_to(std::span<double>(&lr_sum_, 1));
    expect_state(st, "calls", DType::u32, {1}).copy_to(std::span<uint32_t>(&calls_, 1));
    expect_state_count(st, 3 * slots_.size() + 2);
    t_ = steps;
  }

 private:
  struct Slot {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> code;
    std::vector<float> scale;
    std::vector<int16_t> flips;
  };
  std::vector<Slot> slots_;
  double lr_sum_ = 0;
  uint32_t calls_ = 0;
  uint64_t t_ = 0;
};

const std::string kMixed = "[optimizer]\nname = \"test-mixed\"\n";

void register_mixed() {
  static const bool done = [] {
    register_optimizer({"test-mixed", "test_train's mixed-dtype state", {},
                        [](const OptimizerOptions& o) { OptionReader(o, {}); },
                        [](const ParamSet& p, const OptimizerOptions&) -> std::unique_ptr<Optimizer> {
                          return std::make_unique<MixedOptimizer>(p);
                        }});
    return true;
  }();
  (void)done;
}

bool same_state(const Optimizer& a, const Optimizer& b) {
  const auto x = a.state(), y = b.state();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].name != y[i].name || x[i].dtype != y[i].dtype || x[i].shape != y[i].shape || x[i].bytes != y[i].bytes)
      return false;
  return a.steps() == b.steps() && a.state_bytes() == b.state_bytes();
}

}  // namespace

TEST_CASE("optimizer state of mixed dtypes goes through a checkpoint exactly; resume stays bit-identical") {
  register_mixed();
  const std::string whole = (scratch() / "mixed-whole").string(), dir = (scratch() / "mixed-resume").string();
  Trainer one(tiny("gpt2", whole, kMixed));
  one.run();
  {
    Trainer part(tiny("gpt2", dir, kMixed));
    part.run({}, 4);
    part.step();  // lost work
  }
  Trainer rest(tiny("gpt2", dir, kMixed));
  rest.resume(dir);
  CHECK(rest.next_step() == 4);
  {
    Trainer at4(tiny("gpt2", whole + "-4", kMixed));
    at4.run({}, 4);
    CHECK(same_state(rest.optimizer(), at4.optimizer()));
  }
  rest.run();
  CHECK(same_params(rest.model(), one.model()));
  CHECK(same_state(rest.optimizer(), one.optimizer()));
  for (size_t i = 0; i < 6; ++i) CHECK(rest.log()[i].loss == one.log()[i].loss);

  // what trainer.json records: each tensor's dtype and shape, and the real byte total
  const auto j = nlohmann::json::parse(read_file(dir + "/checkpoint-00000006/trainer.json"));
  const auto& o = j["optimizer"];
  CHECK(o["format"] == 2);
  CHECK(o["state_bytes"] == one.optimizer().state_bytes());
  std::set<std::string> dtypes;
  for (auto& t : o["tensors"]) dtypes.insert(t["dtype"].get<std::string>());
  CHECK(dtypes == std::set<std::string>{"f32", "f64", "i16", "u32", "u8"});
  CHECK(o["tensors"].back()["name"] == "calls");
  CHECK(o["tensors"].back()["shape"] == nlohmann::json::array({1}));
  CHECK(o["tensors"][o["tensors"].size() - 2]["shape"] == nlohmann::json::array());
}

TEST_CASE("optimizer.bin: a malformed dtype or shape is a one-line error; the older binary32 layout still resumes") {
  const std::string dir = (scratch() / "optim-format").string();
  {
    Trainer t(tiny("gpt2", dir));
    t.run({}, 4);
  }
  const std::string ck = dir + "/checkpoint-00000004";
  const auto good = snapshot(ck);
  auto forged = [&](const std::function<void(nlohmann::json&)>& edit) {
    restore(ck, good);
    forge_trainer_json(ck, edit);
    const std::string e = resume_error(dir);
    CHECK(e.find('\n') == std::string::npos);
    return e;
  };
  const nlohmann::json t0 = nlohmann::json::parse(good.at("trainer.json"))["optimizer"]["tensors"][0];
  const std::string name = t0["name"];
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["dtype"] = "f33"; }),
             Catch::Contains("trainer.json: optimizer tensor '" + name + "': dtype \"f33\" (known: f64, f32, f16, bf16"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["dtype"] = 7; }), Catch::Contains("dtype 7 (known:"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["shape"] = {3}; }),
             Catch::Contains("optimizer tensor '" + name + "': shape [3] does not hold its"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["shape"] = "[2,3]"; }),
             Catch::Contains("shape \"[2,3]\" does not hold its"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["shape"] = {uint64_t(1) << 40, uint64_t(1) << 40, 0}; }),
             Catch::Contains("does not hold its"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["shape"] = {-1}; }), Catch::Contains("does not hold its"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["format"] = 3; }), Catch::Contains("optimizer.format is 3 (known: 1, 2)"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["tensors"][0]["dtype"] = "i32"; }),  // well formed, not AdamW's
             Catch::Contains("optimizer state: tensor '" + name + "' is i32 ["));
  CHECK_THAT(forged([](auto& j) {  // wte's moment, flat
               for (auto& t : j["optimizer"]["tensors"])
                 if (t["name"] == "wte.m") t["shape"] = {t["values"]};
             }),
             Catch::Contains("optimizer state: tensor 'wte.m' is f32 [8192], expected f32 [256, 32]"));
  CHECK_THAT(forged([](auto& j) { j["optimizer"]["state_bytes"] = 12; }), Catch::Contains("optimizer.state_bytes is 12, expected"));

  // format 1 (before dtypes and shapes were recorded): binary32, flat; resumed bit-identically
  restore(ck, good);
  forge_trainer_json(ck, [](auto& j) {
    j["optimizer"].erase("format");
    for (auto& t : j["optimizer"]["tensors"]) t.erase("dtype"), t.erase("shape");
  });
  Trainer old(tiny("gpt2", dir));
  old.resume(dir);
  old.run();
  Trainer whole(tiny("gpt2", (scratch() / "optim-format-whole").string()));
  whole.run();
  CHECK(same_params(old.model(), whole.model()));
}

TEST_CASE("the controller routes a unit's GEMMs to other formats: bit-identical to that static layer entry") {
  const std::string file = (scratch() / "route.toml").string();
  write_file_atomic(file, R"([site."layer.1.mlp.fc"]
input = "bf16"
output = "bf16"
[site."layer.1.mlp.fc".dx]
input = "e4m3"
[site."layer.1.mlp.fc".dw]
accumulation = "strict"
accumulator = "bf16"
rounding = "sr"
seed = 5
)");
  const Policy st = load_policy(file);
  const std::pair<int, Site> at{1, Site::mlp_fc};
  struct Router : TrainController {
    std::optional<SitePolicy> fwd, dx, dw;
    std::vector<UnitStep> seen;
    void choose(uint64_t, std::vector<UnitPath>& paths) override {
      auto& p = paths[1 * kUnitCount + int(Unit::fc)];
      p.forward = fwd, p.dx = dx, p.dw = dw;
    }
    void observe(uint64_t, std::span<const UnitStep> units) override { seen.assign(units.begin(), units.end()); }
  };
  auto run = [](const std::string& policy, TrainController* ctl) {
    Trainer t(tiny("llama", "", "[precision]\npolicy = \"" + policy + "\"\n"), ctl);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(t.step().loss);
    return std::pair{losses, t.model()};
  };
  Router to_low;
  to_low.fwd = st.layer.at(at), to_low.dx = st.grad_layer[0].at(at), to_low.dw = st.grad_layer[1].at(at);
  const auto [routed, routed_model] = run("native", &to_low);
  const auto [fixed, fixed_model] = run(file, nullptr);
  const auto [native, native_model] = run("native", nullptr);
  CHECK(routed == fixed);
  CHECK(same_params(routed_model, fixed_model));
  CHECK_FALSE(same_params(routed_model, native_model));
  REQUIRE(to_low.seen.size() == 2 * kUnitCount);
  CHECK(to_low.seen[1 * kUnitCount + int(Unit::fc)].path.dw->accumulator->name == "bf16");
  CHECK_FALSE(to_low.seen[0].path.forward);

  // an override replaces the run's entry there as a whole: native overrides undo the file's
  Router to_native;
  to_native.fwd = to_native.dx = to_native.dw = SitePolicy{};
  const auto [undone, undone_model] = run(file, &to_native);
  CHECK(undone == native);
  CHECK(same_params(undone_model, native_model));

  // an invalid override is refused before the step runs
  Router bad;
  bad.dw = SitePolicy{};
  bad.dw->accumulation = Accumulation::strict;  // no accumulator
  Trainer t(tiny("llama", ""), &bad);
  CHECK_THROWS_WITH(t.step(), Catch::StartsWith("step 0: unit layer.1.mlp.fc: dw override: ") && !Catch::Contains("\n"));
  CHECK(t.next_step() == 0);
  CHECK(t.log().empty());
  struct Shrinker : TrainController {
    void choose(uint64_t, std::vector<UnitPath>& paths) override { paths.pop_back(); }
  } shrink;
  Trainer t2(tiny("gpt2", ""), &shrink);
  CHECK_THROWS_WITH(t2.step(), "step 0: the controller left 7 unit paths, expected 8 (2 layers × 4 units)");
}

TEST_CASE("[model] init: training starts from a saved model at step 0; a changed init is refused on resume") {
  const fs::path dir = scratch() / "init";
  fs::create_directories(dir);
  // a tiny model, trained 2 steps, saved: the init
  const std::string first = (dir / "first").string();
  {
    Trainer t(tiny("gpt2", first));
    t.run({}, 2);
  }
  const std::string init = first + "/checkpoint-00000002";
  const Model saved = load_model(init);
  const std::string cfg = std::string(R"([model]
init = ")") + init + R"("

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 4
batch = 2
lr = 1e-3
warmup = 1
val_seqs = 2
checkpoint_every = 2
)";
  TrainConfig c = train_config_from_toml(cfg, "init.toml");
  CHECK(c.model == saved.cfg);
  CHECK(c.init_sha256 == model_sha256(saved));
  CHECK(c.hash() != sha256_hex(cfg));  // the init's identity is part of the configuration's
  const std::string out = (dir / "tuned").string();
  c.out = out;
  {
    Trainer t(c);
    CHECK(t.next_step() == 0);
    CHECK(t.optimizer().steps() == 0);  // a fresh optimizer
    CHECK(same_params(t.model(), saved));
    t.run({}, 2);
    CHECK(!same_params(t.model(), saved));
  }
  // resume with the same init: continues; with a changed init: refused
  {
    Trainer t(train_config_from_toml(cfg, "init.toml"));
    t.resume(out);
    CHECK(t.next_step() == 2);
  }
  Model changed = saved;
  changed.params.at("wte").data[0] += 1;
  CHECK(model_sha256(changed) != model_sha256(saved));
  save_model(changed, init);
  {
    Trainer t(train_config_from_toml(cfg, "init.toml"));
    CHECK_THAT(error_of([&] { t.resume(out); }), Catch::Contains("config SHA-256 differs"));
  }
  // shape keys beside init, a missing init, another vocabulary: one line each
  CHECK_THAT(error_of([&] { train_config_from_toml("[model]\ninit = \"" + init + "\"\nlayers = 2\n", "bad.toml"); }),
             Catch::Contains("bad.toml:3: [model] 'layers' cannot stand beside init"));
  CHECK_THAT(error_of([&] { train_config_from_toml("[model]\ninit = \"" + (dir / "nope").string() + "\"\n", "bad.toml"); }),
             Catch::Contains("bad.toml: [model] init: "));
  CHECK_THAT(error_of([&] { train_config_from_toml("[model]\ninit = \"\"\n", "bad.toml"); }),
             Catch::Contains("bad.toml:2: [model] init must name a checkpoint (it is empty)"));
  ModelConfig other = saved.cfg;
  other.vocab = 300;
  save_model(init_model(other, 1), (dir / "v300").string());
  CHECK_THAT(error_of([&] { train_config_from_toml("[model]\ninit = \"" + (dir / "v300").string() + "\"\n", "bad.toml"); }),
             Catch::Contains("has vocabulary 300, but tokenizer 'bytes' has 256"));
}

TEST_CASE("[controller]: GNMR routes units to the recovery path; replay of the run's norms gives its decisions; "
          "bit-identical across threads and resume") {
  const std::string ctl = R"(
[activation_quant]
bits = 4

[controller]
name = "NAME"
warmup = 1
max_recover = 3
lock = 1
alpha = 1.02
beta = 1.02
delta = 1
seed = 9

[controller.recover]
bits = 0
)";
  auto cfg = [&](const std::string& name, const std::string& out) {
    std::string t = ctl;
    t.replace(t.find("NAME"), 4, name);
    return tiny("gpt2", out, t);
  };
  const std::string one = (scratch() / "gnmr-one").string(), two = (scratch() / "gnmr-two").string(),
                    res = (scratch() / "gnmr-resume").string();
  const int saved = num_threads();
  set_num_threads(1);
  Trainer a(cfg("gnmr", one));
  a.run();
  set_num_threads(2);
  Trainer b(cfg("gnmr", two));
  b.run();
  {
    Trainer part(cfg("gnmr", res));
    part.run({}, 4);
    part.step();  // lost
  }
  Trainer c(cfg("gnmr", res));
  c.resume(res);
  c.run();
  set_num_threads(saved);
  CHECK(same_params(a.model(), b.model()));
  CHECK(same_params(a.model(), c.model()));
  for (const char* f : {"/controller.csv", "/recovery.csv", "/norms.csv", "/units.csv"}) {
    INFO(f);
    CHECK(read_file(one + f) == read_file(two + f));
    CHECK(read_file(one + f) == read_file(res + f));
  }
  // The decisions: some units recovered, never more than the budget; a unit recovered at step t
  // (1-based) ran the recovery path (exact: bits 0) at t + 1 and only those did.
  const auto rec = lines(read_file(one + "/controller.csv"));
  REQUIRE(rec.size() == 1 + 6 * 8);
  std::set<std::pair<int, std::string>> recovered;  // (trainer step, "L,SITE") that ran the recovery path
  for (size_t i = 1; i < rec.size(); ++i) {
    const auto f = split_csv(rec[i]);
    if (f[6] == "1") {
      const std::string id = f[1].substr(6);  // "layer.L.SITE" → "L.SITE"
      const size_t dot = id.find('.');
      recovered.insert({std::stoi(f[0]), id.substr(0, dot) + "," + id.substr(dot + 1)});
    }
  }
  CHECK(!recovered.empty());
  const auto summary = a.controller().summary();
  REQUIRE(!summary.empty());
  CHECK(summary[0].starts_with(fmt::format("gnmr: {} unit-steps recovered of 48", recovered.size())));
  for (const auto& l : lines(read_file(one + "/recovery.csv")))
    if (l[0] != 's') CHECK(std::stoi(split_csv(l)[1]) <= 3);
  const auto units = lines(read_file(one + "/units.csv"));
  for (size_t i = 1; i < units.size(); ++i) {
    const auto f = split_csv(units[i]);  // step (0-based), layer, unit, bits, …
    const bool rec_path = recovered.count({std::stoi(f[0]), f[1] + "," + f[2]}) > 0;  // selected at step (0-based) = t
    INFO(units[i]);
    CHECK(f[3] == (rec_path ? "0" : "4"));
  }
  // The run's own norms replayed through `gnmr replay`'s library call give its controller.csv.
  const GnmrOptions o = gnmr_replay_config(one + "/config.toml");
  gnmr_replay(o, one + "/norms.csv", one + "/replayed.csv");
  CHECK(read_file(one + "/replayed.csv") == read_file(one + "/controller.csv"));

  // The controls: random at the same budget (3 a step, the same draws on resume), static (none).
  Trainer r(cfg("random", (scratch() / "gnmr-random").string()));
  r.run();
  for (const auto& l : lines(read_file((scratch() / "gnmr-random").string() + "/recovery.csv")))
    if (l[0] != 's') CHECK(split_csv(l)[1] == "3");
  Trainer s(cfg("static", (scratch() / "gnmr-static").string()));
  s.run();
  for (const auto& l : lines(read_file((scratch() / "gnmr-static").string() + "/recovery.csv")))
    if (l[0] != 's') CHECK(split_csv(l)[1] == "0");

  // The oracle: at the first step every unit runs the low path, so its 3 picks are the 3 largest
  // quant_rel_rms of units.csv's step 0; afterwards 3 a step (every unit has damage), the same on
  // 1 and 2 threads.
  const std::string o1 = (scratch() / "oracle-1").string(), o2 = (scratch() / "oracle-2").string();
  set_num_threads(1);
  Trainer oa(cfg("oracle", o1));
  oa.run();
  set_num_threads(2);
  Trainer ob(cfg("oracle", o2));
  ob.run();
  set_num_threads(saved);
  CHECK(read_file(o1 + "/controller.csv") == read_file(o2 + "/controller.csv"));
  CHECK(same_params(oa.model(), ob.model()));
  std::vector<std::pair<double, std::string>> damage;  // step 0: (quant_rel_rms, "layer.L.SITE")
  for (const auto& l : lines(read_file(o1 + "/units.csv")))
    if (l.starts_with("0,")) {
      const auto f = split_csv(l);
      damage.push_back({std::stod(f[7]), "layer." + f[1] + "." + f[2]});
    }
  REQUIRE(damage.size() == 8);
  std::sort(damage.rbegin(), damage.rend());
  const auto first = split_csv(lines(read_file(o1 + "/recovery.csv"))[1]);
  CHECK(first[1] == "3");
  for (int k = 0; k < 3; ++k) CHECK(first[4].find(damage[size_t(k)].second) != std::string::npos);
  CHECK(damage[2].first > damage[3].first);  // the test's picks are not decided by a tie
  for (const auto& l : lines(read_file(o1 + "/recovery.csv")))
    if (l[0] != 's') CHECK(split_csv(l)[1] == "3");
}

TEST_CASE("[controller]: bad tables are one-line errors naming the key") {
  auto err = [](const std::string& extra) { return error_of([&] { tiny("gpt2", "", extra); }); };
  CHECK_THAT(err("[controller]\nname = \"gnmx\"\n"), Catch::Contains("[controller] name = 'gnmx' (known: gnmr, random, static, oracle)"));
  CHECK_THAT(err("[controller]\nname = \"gnmr\"\nalfa = 1\n"), Catch::Contains("unknown key 'alfa' in [controller]"));
  CHECK_THAT(err("[controller]\nname = \"gnmr\"\nmean = \"median\"\n"), Catch::Contains("mean must be \"cumulative\" or \"ema\""));
  CHECK_THAT(err("[controller]\nname = \"gnmr\"\n[controller.recover]\nbits = 1\n"), Catch::Contains("[controller.recover]"));
  CHECK_THAT(err("[controller]\nname = \"gnmr\"\n[controller.recover]\nbitz = 8\n"),
             Catch::Contains("unknown key 'bitz' in [controller.recover]"));
  CHECK_THAT(error_of([&] { Trainer t(tiny("gpt2", "", "[controller]\nname = \"gnmr\"\n[controller.recover]\npolicy = \"nosuch\"\n")); }),
             Catch::Contains("[controller.recover] policy nosuch"));
}

TEST_CASE("random routing: a Fisher-Yates prefix of Philox draws, each draw kept for `hold` steps") {
  TrainConfig c = tiny("gpt2", "");
  const size_t n = size_t(c.model.layers) * kUnitCount;
  auto selections = [&](uint64_t hold, uint64_t steps) {
    ControllerConfig cc;
    cc.name = "random", cc.gnmr.max_recover = 3, cc.seed = 9, cc.hold = hold;
    cc.recover.bits = 8;  // the marker of a recovered unit below
    auto ctl = make_controller(cc, c.model);
    std::vector<UnitStep> us(n);
    for (size_t i = 0; i < n; ++i) us[i].layer = int(i / kUnitCount), us[i].unit = Unit(i % kUnitCount), us[i].grad_norm = 1;
    std::vector<std::set<size_t>> sel;
    for (uint64_t step = 0; step < steps; ++step) {
      ctl->observe(step, us);
      std::vector<UnitPath> paths(n);
      ctl->choose(step + 1, paths);
      std::set<size_t> s;
      for (size_t i = 0; i < n; ++i)
        if (paths[i].saved.bits == 8) s.insert(i);
      sel.push_back(s);
    }
    return sel;
  };
  // the reference: draw b takes Philox64(seed, 0x6a4d, b·U + i), b = ⌊(t − 1) / hold⌋ + 1
  auto draw = [&](uint64_t b) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    std::set<size_t> s;
    for (size_t i = 0; i < 3; ++i) {
      std::swap(idx[i], idx[i + size_t(random_word64(9, 0x6a4d, b * n + i) % (n - i))]);
      s.insert(idx[i]);
    }
    return s;
  };
  const auto every = selections(1, 8), held = selections(4, 8);
  for (uint64_t t = 1; t <= 8; ++t) {
    INFO("step " << t);
    CHECK(every[t - 1].size() == 3);
    CHECK(every[t - 1] == draw(t));
    CHECK(held[t - 1] == draw((t - 1) / 4 + 1));
  }
  CHECK(held[0] != held[4]);  // the test's seed changes the set between the two blocks
  CHECK_THAT(error_of([&] { tiny("gpt2", "", "[controller]\nname = \"random\"\nhold = 0\n"); }),
             Catch::Contains("[controller] hold = 0"));
}

TEST_CASE("rerun: a re-run step equals that step run with the new paths; the first pass is what is observed") {
  // Direct: unit layer.1.fc on 8-bit saved activations and BF16 forward GEMM at step 1. Re-run:
  // step 1 runs the default, then re-runs with that path. Same parameters, same losses.
  auto routed = [](UnitPath& p) {
    p.saved = SavedQuant{8, 0, Rounding::rne, 0};
    p.forward = SitePolicy{};
    p.forward->input = format_lookup("bf16");
  };
  struct Direct : TrainController {
    std::function<void(UnitPath&)> f;
    void choose(uint64_t step, std::vector<UnitPath>& paths) override {
      if (step == 1) f(paths[1 * kUnitCount + int(Unit::fc)]);
    }
  } direct;
  direct.f = routed;
  struct Rerun : TrainController {
    std::function<void(UnitPath&)> f;
    std::vector<std::pair<uint64_t, bool>> seen;  // (step, layer.1.fc's first pass was routed)
    void observe(uint64_t step, std::span<const UnitStep> units) override {
      seen.emplace_back(step, units[1 * kUnitCount + int(Unit::fc)].path.saved.bits == 8);
    }
    bool rerun(uint64_t step, std::vector<UnitPath>& paths) override {
      if (step == 1) f(paths[1 * kUnitCount + int(Unit::fc)]);
      return step == 1 || step == 2;  // step 2: a re-run with the paths unchanged is the same step
    }
  } again;
  again.f = routed;
  auto run = [](TrainController* ctl) {
    Trainer t(tiny("llama", ""), ctl);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(t.step().loss);
    return std::pair{losses, t.model()};
  };
  const auto [dl, dm] = run(&direct);
  const auto [rl, rm] = run(&again);
  const auto [nl, nm] = run(nullptr);
  CHECK(dl == rl);
  CHECK(same_params(dm, rm));
  CHECK_FALSE(same_params(dm, nm));
  CHECK(again.seen == std::vector<std::pair<uint64_t, bool>>{{0, false}, {1, false}, {2, false}});

  // Routing's rerun = true: exactly the units selected at t that ran the low path at t switch.
  TrainConfig c = tiny("gpt2", "");
  const size_t n = size_t(c.model.layers) * kUnitCount;
  for (bool on : {false, true}) {
    ControllerConfig cc;
    cc.name = "random", cc.gnmr.max_recover = 3, cc.seed = 9, cc.rerun = on;
    cc.recover.bits = 8;
    auto ctl = make_controller(cc, c.model);
    std::vector<UnitStep> us(n);
    for (size_t i = 0; i < n; ++i) us[i].layer = int(i / kUnitCount), us[i].unit = Unit(i % kUnitCount), us[i].grad_norm = 1;
    std::set<size_t> before;  // recovered entering the step
    for (uint64_t step = 0; step < 6; ++step) {
      INFO("rerun " << on << " step " << step);
      std::vector<UnitPath> paths(n);
      ctl->choose(step, paths);
      std::set<size_t> ran;
      for (size_t i = 0; i < n; ++i)
        if (paths[i].saved.bits == 8) ran.insert(i);
      CHECK(ran == before);
      ctl->observe(step, us);
      const bool re = ctl->rerun(step, paths);
      std::vector<UnitPath> next(n);
      ctl->choose(step + 1, next);  // the selection at this step, as the next step runs it
      std::set<size_t> sel, fresh;
      for (size_t i = 0; i < n; ++i)
        if (next[i].saved.bits == 8) sel.insert(i), fresh.insert(i);
      for (size_t i : before) fresh.erase(i);
      CHECK(re == (on && !fresh.empty()));
      for (size_t i = 0; i < n; ++i) CHECK((paths[i].saved.bits == 8) == (before.count(i) || (on && fresh.count(i))));
      before = sel;
    }
  }
  // through a configuration: a run re-runs, says so, and differs from the one that does not
  const std::string ctl = "[activation_quant]\nbits = 2\n[controller]\nname = \"random\"\nmax_recover = 1\nseed = 3\n";
  const std::string recover = "[controller.recover]\nbits = 8\n";
  TrainConfig off = tiny("llama", "", ctl + recover), on = tiny("llama", "", ctl + "rerun = true\n" + recover);
  REQUIRE(on.controller.rerun);
  Trainer a(off), b(on);
  for (int s = 0; s < 3; ++s) {
    CHECK(a.step().loss == Approx(b.step().loss).epsilon(0.05));
    // step 0 re-runs its selected unit with 8-bit saved activations: other weight gradients
    if (s == 0) CHECK_FALSE(same_params(a.model(), b.model()));
  }
  CHECK_FALSE(same_params(a.model(), b.model()));
  const auto summary = b.controller().summary();
  REQUIRE(summary.size() == 2);
  // a step re-runs when its draw (the reference of the random-routing test) is a new unit
  const uint64_t u = uint64_t(on.model.layers) * kUnitCount;
  uint64_t reruns = 0, prev = u;
  for (uint64_t t = 1; t <= 3; ++t) {
    const uint64_t d = random_word64(3, 0x6a4d, t * u) % u;
    reruns += d != prev, prev = d;
  }
  CHECK(summary[1] == fmt::format("random: {} steps re-run with their selected units recovered", reruns));
}

TEST_CASE("unit_block: a unit per column block of each saved activation; selection, norms, damage, replay, determinism") {
  TrainConfig c = tiny("gpt2", "");  // C = 32, H = 128: blocks of 12 → qkv, proj, fc 3 each, down 11
  const std::vector<std::string> ids = unit_ids(c.model, 12);
  REQUIRE(ids.size() == size_t(c.model.layers) * (3 + 3 + 3 + 11));
  CHECK(ids.front() == "layer.0.attn.qkv.b0");
  CHECK(ids[3] == "layer.0.attn.proj.b0");
  CHECK(ids.back() == "layer.1.mlp.proj.b10");
  const size_t n = ids.size(), np = size_t(c.model.layers) * kUnitCount;
  std::vector<std::pair<size_t, size_t>> at;  // unit → (projection, block), the ids' order
  for (size_t i = 0; i < np; ++i)
    for (size_t b = 0; b < (i % kUnitCount == size_t(Unit::down) ? 11u : 3u); ++b) at.push_back({i, b});
  REQUIRE(at.size() == n);
  // steps with per-block norms and damage: block k has norm k + 1 and damage k + 1 (all distinct)
  std::vector<UnitStep> us(np);
  for (size_t i = 0; i < np; ++i) {
    us[i].layer = int(i / kUnitCount), us[i].unit = Unit(i % kUnitCount), us[i].grad_norm = 1;
    const size_t nb = i % kUnitCount == size_t(Unit::down) ? 11 : 3;
    us[i].block_norms.assign(nb, 0), us[i].act.block_sum_sq.assign(nb, 1), us[i].act.block_low_err_sq.assign(nb, 0);
  }
  for (size_t k = 0; k < n; ++k) {
    us[at[k].first].block_norms[at[k].second] = double(k + 1);
    us[at[k].first].act.block_low_err_sq[at[k].second] = double((k * 7) % n + 1);
  }
  auto selected = [&](TrainController& ctl, uint64_t step) {  // the blocks the next step recovers
    std::vector<UnitPath> paths(np);
    ctl.choose(step, paths);
    check_paths(paths, c.model, step);
    std::set<size_t> s;
    for (size_t k = 0; k < n; ++k) {
      const SavedBlocks& b = paths[at[k].first].blocks;
      REQUIRE(b.block == 12);
      CHECK(b.recover.bits == 8);
      if (b.recovered.at(at[k].second)) s.insert(k);
    }
    for (auto& p : paths) CHECK(p.saved.bits == 0);  // the projection's own path is untouched
    return s;
  };
  ControllerConfig cc;
  cc.gnmr.max_recover = 3, cc.seed = 9, cc.unit_block = 12, cc.recover.bits = 8;
  // random: the Fisher-Yates prefix over the block units (the random-routing test's reference)
  cc.name = "random";
  auto rnd = make_controller(cc, c.model);
  rnd->observe(0, us);
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  std::set<size_t> want;
  for (size_t i = 0; i < 3; ++i) {
    std::swap(idx[i], idx[i + size_t(random_word64(9, 0x6a4d, 1 * n + i) % (n - i))]);
    want.insert(idx[i]);
  }
  CHECK(selected(*rnd, 1) == want);
  // oracle: the 3 blocks of largest relative damage
  cc.name = "oracle";
  auto ora = make_controller(cc, c.model);
  ora->observe(0, us);
  std::vector<size_t> by_damage(n);
  for (size_t k = 0; k < n; ++k) by_damage[k] = k;
  std::sort(by_damage.begin(), by_damage.end(), [&](size_t a, size_t b) { return (a * 7) % n > (b * 7) % n; });
  CHECK(selected(*ora, 1) == std::set<size_t>(by_damage.begin(), by_damage.begin() + 3));
  // gnmr: the blocks' norms are what it sees and logs
  cc.name = "gnmr";
  auto gn = make_controller(cc, c.model);
  gn->observe(0, us);
  const auto logs = gn->logs();
  REQUIRE(logs[1].first == "norms.csv");
  CHECK_THAT(logs[1].second, Catch::Contains("\n1,layer.0.attn.proj.b2,6\n"));
  CHECK_THAT(logs[1].second, Catch::Contains("\n1,layer.1.mlp.proj.b10,40\n"));
  // a whole-unit policy cannot recover a block
  cc.recover_policy = "bf16";
  CHECK_THROWS_WITH(make_controller(cc, c.model), Catch::Contains("unit_block"));
  CHECK_THAT(error_of([&] { tiny("gpt2", "", "[controller]\nname = \"random\"\nunit_block = 8\n[controller.recover]\npolicy = \"bf16\"\n"); }),
             Catch::Contains("unit_block recovers column blocks"));

  // A run: the norms it logs are the blocks' columns of the weight gradients; replay gives its
  // decisions; a recovered block's units.csv row keeps its projection's own label; 1 and 2 threads
  // and a resume give the same bits.
  const std::string ctl = R"(
[activation_quant]
bits = 3

[controller]
name = "gnmr"
warmup = 1
max_recover = 5
lock = 1
alpha = 1.02
beta = 1.02
delta = 1
unit_block = 12

[controller.recover]
bits = 8
)";
  const std::string one = (scratch() / "blocks-one").string(), two = (scratch() / "blocks-two").string(),
                    res = (scratch() / "blocks-resume").string();
  auto cfg = [&](const std::string& out) {
    TrainConfig t = tiny("gpt2", out, ctl);
    t.grad_clip = 0;  // the observer sees the gradients the controller saw
    return t;
  };
  REQUIRE(cfg(one).controller.unit_block == 12);
  const int saved = num_threads();
  set_num_threads(1);
  Trainer a(cfg(one));
  std::vector<std::map<std::string, double>> norms;  // per step: block id → norm from the gradients
  a.set_observer([&](const StepRecord&, const GradMap<float>& g, const Optimizer&) {
    std::map<std::string, double> m;
    for (int l = 0; l < c.model.layers; ++l)
      for (int u = 0; u < kUnitCount; ++u)
        for (const ParamInfo& p : parameter_infos(c.model))
          if (p.layer == l && unit_of(p.role) == Unit(u) && !p.bias) {
            const auto& v = g.at(p.name);
            const int64_t in = p.shape[1];
            for (int64_t col = 0; col < in; ++col)  // column-major: another order than the trainer's
              for (int64_t row = 0; row < p.shape[0]; ++row)
                m[fmt::format("layer.{}.{}.b{}", l, to_string(Unit(u)), col / 12)] += double(v[size_t(row * in + col)]) * double(v[size_t(row * in + col)]);
          }
    for (auto& [k, v] : m) v = std::sqrt(v);
    norms.push_back(m);
  });
  a.run();
  set_num_threads(2);
  Trainer b(cfg(two));
  b.run();
  {
    Trainer part(cfg(res));
    part.run({}, 4);
    part.step();  // lost
  }
  Trainer r(cfg(res));
  r.resume(res);
  r.run();
  set_num_threads(saved);
  CHECK(same_params(a.model(), b.model()));
  CHECK(same_params(a.model(), r.model()));
  for (const char* f : {"/controller.csv", "/recovery.csv", "/norms.csv", "/units.csv"}) {
    INFO(f);
    CHECK(read_file(one + f) == read_file(two + f));
    CHECK(read_file(one + f) == read_file(res + f));
  }
  REQUIRE(norms.size() == 6);
  const auto rows = lines(read_file(one + "/norms.csv"));
  REQUIRE(rows.size() == 1 + 6 * n);
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto f = split_csv(rows[i]);
    INFO(rows[i]);
    CHECK(std::stod(f[2]) == Approx(norms.at(std::stoul(f[0]) - 1).at(f[1])).epsilon(1e-12));
  }
  size_t recovered = 0;
  for (const auto& l : lines(read_file(one + "/recovery.csv")))
    if (l[0] != 's') {
      const auto f = split_csv(l);
      CHECK(std::stoi(f[1]) <= 5);
      CHECK(f[3] == std::to_string(n));
      recovered += std::stoul(f[1]);
    }
  CHECK(recovered > 0);
  for (const auto& l : lines(read_file(one + "/units.csv")))
    if (l[0] != 's') CHECK(split_csv(l)[3] == "3");
  gnmr_replay(gnmr_replay_config(one + "/config.toml"), one + "/norms.csv", one + "/replayed.csv");
  CHECK(read_file(one + "/replayed.csv") == read_file(one + "/controller.csv"));
  // the recovered blocks moved the run: the same configuration with nobody recovered differs
  std::string none = ctl;
  none.replace(none.find("\"gnmr\""), 6, "\"static\"");
  TrainConfig sc = tiny("gpt2", "", none);
  sc.grad_clip = 0;
  Trainer st(sc);
  st.run();
  CHECK_FALSE(same_params(a.model(), st.model()));
}

TEST_CASE("[controller.recover] policy: a recovered unit's GEMMs take that policy's entries at its layer") {
  TrainConfig c = tiny("gpt2", "");
  ControllerConfig cc;
  cc.name = "random", cc.gnmr.max_recover = 3, cc.seed = 4;
  cc.recover_policy = std::string(MANTIS_SOURCE_DIR) + "/experiments/policies/bf16-gemms.toml";
  auto ctl = make_controller(cc, c.model);
  const size_t n = size_t(c.model.layers) * kUnitCount;
  std::vector<UnitStep> us(n);
  for (size_t i = 0; i < n; ++i) us[i].layer = int(i / kUnitCount), us[i].unit = Unit(i % kUnitCount), us[i].grad_norm = 1;
  ctl->observe(0, us);
  std::vector<UnitPath> paths(n);
  ctl->choose(1, paths);
  check_paths(paths, c.model, 1);
  const Policy routed = with_overrides(policy_from_spec("native"), paths);
  size_t rerouted = 0;
  for (size_t i = 0; i < n; ++i) {
    const int l = int(i / kUnitCount);
    const Site s = site_of(Unit(i % kUnitCount));
    INFO("unit " << i);
    if (paths[i].forward) {
      ++rerouted;
      for (Pass p : {Pass::forward, Pass::dx, Pass::dw}) {
        const auto& in = routed.at(s, l, p).input;
        REQUIRE(in.has_value());
        CHECK(in->name == "bf16");
      }
    } else {
      CHECK(routed.at(s, l, Pass::forward).is_native());
    }
  }
  CHECK(rerouted == 3);
}

TEST_CASE("[lora]: only the adapters train; the base stays bit for bit; threads, resume, the adapters file, errors") {
  const fs::path dir = scratch() / "lora";
  fs::create_directories(dir);
  const std::string base_run = (dir / "base").string();
  {
    Trainer t(tiny("llama", base_run));
    t.run({}, 2);
  }
  const std::string init = base_run + "/checkpoint-00000002";
  const Model base = load_model(init);
  const std::string cfg = std::string("[model]\ninit = \"") + init + R"("

[data]
tokenizer = "bytes"
train = "kjv/test"
validation = "kjv/validation"

[train]
steps = 4
batch = 2
lr = 1e-2
warmup = 1
val_seqs = 2
checkpoint_every = 2

[lora]
rank = 2
alpha = 4
units = ["attn.qkv", "mlp.proj"]
)";
  auto config = [&](const std::string& out, const std::string& extra = "") {
    TrainConfig c = train_config_from_toml(cfg + extra, "lora.toml");
    c.out = out;
    return c;
  };
  const int saved = num_threads();
  set_num_threads(1);
  Trainer one(config((dir / "one").string()));
  one.run();
  set_num_threads(2);
  Trainer two(config((dir / "two").string()));
  two.run();
  set_num_threads(saved);
  // the base is untouched; the adapters (wq, wk, wv, w2 of both layers: 2 × 4 × 2 tensors) moved
  CHECK(same_params(one.model(), base));
  const Adapters& a = one.model().lora;
  CHECK(a.rank == 2);
  CHECK(a.alpha == 4);
  CHECK(a.params.size() == 16);
  for (auto& [name, t] : a.params)
    if (name.ends_with(".lora_B")) {
      INFO(name);
      bool moved = false;
      for (float v : t.data) moved |= v != 0;
      CHECK(moved);
    }
  CHECK(one.optimizer().state_bytes() == 8 + 2 * 4 * [&] {
          uint64_t n = 0;
          for (auto& [name, t] : a.params) n += t.data.size();
          return n;
        }());
  for (auto& [name, t] : a.params) CHECK(std::memcmp(t.data.data(), two.model().lora.params.at(name).data.data(), t.data.size() * 4) == 0);
  // units.csv: a unit's norm is its adapters' (attn.proj and mlp.fc have none: 0)
  for (const auto& l : lines(read_file((dir / "one").string() + "/units.csv")))
    if (l[0] != 's') {
      const auto f = split_csv(l);
      INFO(l);
      CHECK((std::stod(f[4]) > 0) == (f[2] == "attn.qkv" || f[2] == "mlp.proj"));
    }
  // merged/: the final adapters folded into the base; its logits agree with the adapted model's
  {
    const Model merged = load_model((dir / "one").string() + "/merged");
    CHECK(merged.lora.params.empty());
    const std::vector<int32_t> toks = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100};
    const Matrix<double> x = forward<double>(one.model(), toks), y = forward<double>(merged, toks);
    CHECK((x - y).cwiseAbs().maxCoeff() < 1e-5 * x.cwiseAbs().maxCoeff());
    CHECK((x - forward<double>(base, toks)).cwiseAbs().maxCoeff() > 1e-4);
  }
  // the checkpoint holds the adapters, covered by its manifest; a resume continues bit for bit
  const std::string ck = (dir / "one").string() + "/checkpoint-00000004";
  const auto tensors = read_f32_tensors(ck + "/adapters.safetensors");
  CHECK(tensors.size() == 16);
  CHECK(read_file(ck + "/manifest.json").find("adapters.safetensors") != std::string::npos);
  const std::string r = (dir / "resume").string();
  {
    Trainer part(config(r));
    part.run({}, 2);
  }
  Trainer rest(config(r));
  rest.resume(r);
  CHECK(rest.next_step() == 2);
  rest.run();
  for (auto& [name, t] : a.params) CHECK(std::memcmp(t.data.data(), rest.model().lora.params.at(name).data.data(), t.data.size() * 4) == 0);
  for (size_t i = 0; i < 4; ++i) CHECK(rest.log()[i].loss == one.log()[i].loss);
  // a run without [lora] refuses the LoRA checkpoint (its configuration differs), and the LoRA run
  // a corrupted adapters file
  CHECK_THAT(error_of([&] {
               std::string plain = cfg.substr(0, cfg.find("[lora]"));
               TrainConfig c = train_config_from_toml(plain, "plain.toml");
               c.out = r;
               Trainer t(c);
               t.resume(r);
             }),
             Catch::Contains("config SHA-256 differs"));
  {
    std::string bytes = read_file(r + "/checkpoint-00000004/adapters.safetensors");
    bytes[bytes.size() - 1] ^= 1;
    write_file_atomic(r + "/checkpoint-00000004/adapters.safetensors", bytes);
  }
  CHECK_THAT(error_of([&] {
               Trainer t(config(r));
               t.resume(r);
             }),
             Catch::Contains("adapters.safetensors: SHA-256 mismatch"));
  // configuration errors, one line each
  auto cfg_err = [&](const std::string& lora) {
    return error_of([&] { train_config_from_toml(cfg.substr(0, cfg.find("[lora]")) + lora, "bad.toml"); });
  };
  CHECK_THAT(cfg_err("[lora]\nrank = 0\n"), Catch::Contains("rank = 0"));
  CHECK_THAT(cfg_err("[lora]\nrank = 99\n"), Catch::Contains("rank 99 exceeds"));
  CHECK_THAT(cfg_err("[lora]\nunits = [\"mlp.gate\"]\n"), Catch::Contains("unit 'mlp.gate'"));
  CHECK_THAT(cfg_err("[lora]\nunits = []\n"), Catch::Contains("non-empty array"));
  CHECK_THAT(cfg_err("[lora]\nranks = 2\n"), Catch::Contains("unknown key 'ranks' in [lora]"));
  CHECK_THAT(cfg_err("[controller]\nname = \"gnmr\"\nunit_block = 8\n[lora]\nrank = 2\n"),
             Catch::Contains("unit_block does not apply with [lora]"));
  CHECK_THAT(error_of([&] { tiny("llama", "", "[lora]\nrank = 2\n"); }), Catch::Contains("give [model] init"));
}
