// test_study — what results are made of: cell keys, result sets, bootstrap intervals, range
// health of a forward pass, non-finite metrics, and exceptions inside parallel regions.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "exp/bootstrap.h"
#include "nn/forward.h"
#include "core/file.h"
#include "nn/metrics.h"
#include "nn/model.h"
#include "core/philox.h"
#include "nn/policy.h"
#include "core/round_array.h"
#include "exp/eval.h"
#include "exp/gnmr_study.h"
#include "exp/lamp_sweep.h"
#include "exp/merge.h"
#include "exp/mu_sweep.h"
#include "exp/optim_study.h"
#include "exp/policy_sweep.h"
#include "exp/slurm.h"
#include "exp/study.h"
#include "nn/tape.h"
#include "testutil.h"

using namespace mantis;
namespace fs = std::filesystem;

using mantis::test::scratch;
using mantis::test::error_of;

TEST_CASE("first_difference names the first differing field of two keys") {
  const ojson a = {{"model", {{"sha256", "ab"}}}, {"data", {{"ctx", 64}, {"window_starts", {0, 100, 200}}}},
                   {"cell", {{"tau", 0.5}}}};
  CHECK(first_difference(a, a).empty());
  ojson b = a;
  b["data"]["window_starts"][1] = 90;
  CHECK(first_difference(a, b) == "data.window_starts[1]: 100 in the cell, 90 now");
  b = a;
  b["cell"]["tau"] = 1;
  CHECK(first_difference(a, b) == "cell.tau: 0.5 in the cell, 1 now");
  b = a;
  b["cell"]["seed"] = 3;
  CHECK(first_difference(a, b) == "cell.seed: missing in the cell, 3 now");
  b = a;
  b["data"]["window_starts"].push_back(300);
  CHECK(first_difference(a, b) == "data.window_starts: 3 entries in the cell, 4 now");
  b = a;
  b["model"] = "x";
  CHECK(first_difference(a, b).rfind("model: ", 0) == 0);
}

TEST_CASE("json numbers keep inf and nan as strings, and read back") {
  CHECK(json_number(1.5) == ojson(1.5));
  CHECK(json_number(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(json_number(-std::numeric_limits<double>::infinity()) == "-inf");
  CHECK(json_number(std::nan("")) == "nan");
  CHECK(std::isinf(json_to_double("inf", "x")));
  CHECK(json_to_double(2, "x") == 2.0);
  CHECK_THAT(error_of([] { json_to_double("abc", "cells/3.json: kl"); }), Catch::Contains("cells/3.json: kl"));
  CHECK_THAT(error_of([] { json_to_double(ojson::array(), "kl"); }), Catch::Contains("expected a number"));
}

TEST_CASE("result sets: the manifest is written last and holds every file's SHA-256") {
  const fs::path d = scratch("set");
  write_result_set(d.string(), {{"results.csv", "a,b\n1,2\n"}, {"results.json", "{}\n"}}, ojson{{"generator", "t"}});
  const auto man = ojson::parse(read_file((d / "manifest.json").string()));
  CHECK(man["files"]["results.csv"] == sha256_hex("a,b\n1,2\n"));
  CHECK(man["files"]["results.json"] == sha256_hex("{}\n"));
  CHECK_NOTHROW(verify_result_set(d.string()));
  // a file replaced behind the manifest's back: a mixed set
  std::ofstream(d / "results.csv") << "a,b\n1,3\n";
  CHECK_THAT(error_of([&] { verify_result_set(d.string()); }), Catch::Contains("results.csv"));
  // an interrupted write leaves no manifest: refused, never read as complete
  fs::remove(d / "manifest.json");
  CHECK_THAT(error_of([&] { verify_result_set(d.string()); }), Catch::Contains("no manifest.json"));
  // a path the new set cannot replace is refused before the old manifest is touched
  write_result_set(d.string(), {{"results.csv", "x\n"}}, ojson::object());
  fs::remove(d / "results.csv");
  fs::create_directory(d / "results.csv");
  CHECK_THAT(error_of([&] { write_result_set(d.string(), {{"results.csv", "y\n"}}, ojson::object()); }),
             Catch::Contains("results.csv"));
  CHECK(fs::exists(d / "manifest.json"));
  CHECK(fs::is_directory(d / "results.csv"));
  fs::remove_all(d);
}

namespace {
// A study of n cells, cell i keyed {"cell": i} holding {"value": value(i)}; `computed` collects
// the cells it computes, in order.
StudyPlan counting_plan(size_t n, std::vector<size_t>& computed, std::function<double(size_t)> value) {
  StudyPlan plan;
  plan.label = "t", plan.cells = n, plan.unit = "cells";
  plan.name = [](size_t i) { return std::to_string(i); };
  plan.key = [](size_t i) { return ojson{{"cell", i}}; };
  plan.compute = [&computed, value](size_t i, const std::function<void()>& tick) {
    computed.push_back(i);
    tick();
    return ojson{{"value", value(i)}};
  };
  return plan;
}
}  // namespace

TEST_CASE("shards: k/N computes the cells i = k mod N, the merge reads them all; bad choices refused") {
  const fs::path d = scratch("shards");
  std::vector<size_t> computed;
  const StudyPlan plan = counting_plan(7, computed, [](size_t i) { return double(i * i); });
  StudyOptions o;
  o.out = d.string(), o.progress = ProgressMode::quiet, o.log = nullptr;
  parse_shard("1/3", o);
  CHECK((o.shard == 1 && o.shards == 3));
  StudyRun r = run_study(plan, o);
  CHECK_FALSE(r.merge);
  CHECK(computed == std::vector<size_t>{1, 4});
  // the merge refuses the missing cells of the shards not run yet
  StudyOptions m = o;
  m.shard = -1, m.shards = 0, m.merge_only = true;
  CHECK_THAT(error_of([&] { run_study(plan, m); }), Catch::Contains("missing"));
  for (int k : {0, 2, 1}) {  // shard 1 again: its cells are up to date, nothing recomputed
    o.shard = k;
    run_study(plan, o);
  }
  CHECK(computed == std::vector<size_t>{1, 4, 0, 3, 6, 2, 5});
  r = run_study(plan, m);
  REQUIRE(r.merge);
  REQUIRE(r.missing.empty());
  for (size_t i = 0; i < 7; ++i) CHECK(r.cells[i]->at("value") == double(i * i));
  for (const char* bad : {"3/3", "-1/3", "1/0", "1", "a/3", "1/3x", "1/", "/3"}) {
    INFO(bad);
    CellChoice c;
    CHECK_THAT(error_of([&] { parse_shard(bad, c); }), Catch::Contains("--shard"));
  }
  CellChoice both;
  both.cell = 2, both.shard = 0, both.shards = 2;
  CHECK_THAT(error_of([&] { check_cell_choice(7, both); }), Catch::Contains("--cell and --shard"));
  fs::remove_all(d);
}

TEST_CASE("cells are hashed: an edited cell is refused by the merge and on resume, and --overwrite says it recomputes it") {
  const fs::path d = scratch("hashed-cells");
  std::vector<size_t> computed;
  const StudyPlan plan = counting_plan(3, computed, [](size_t i) { return double(i) + 0.5; });
  StudyOptions o;
  o.out = d.string(), o.progress = ProgressMode::quiet, o.log = nullptr;
  REQUIRE(run_study(plan, o).merge);
  // each cell's SHA-256 beside it, as sha256sum writes it
  for (size_t i = 0; i < 3; ++i) {
    const std::string cell = cell_path(o.out, i);
    CHECK(read_file(cell + ".sha256") == sha256_hex(read_file(cell)) + "  " + std::to_string(i) + ".json\n");
  }
  StudyOptions merge = o;
  merge.merge_only = true;
  auto one_line = [](const std::string& e) { return e.find('\n') == std::string::npos; };
  // an edited value: the key still matches, the hash does not
  const std::string cell1 = cell_path(o.out, 1), original = read_file(cell1);
  std::string edited = original;
  edited.replace(edited.find("1.5"), 3, "9.5");
  write_file_atomic(cell1, edited);
  for (const StudyOptions& run : {merge, o}) {  // merging, and resuming: never reused, never silently re-run
    const std::string e = error_of([&] { run_study(plan, run); });
    CHECK_THAT(e, Catch::Contains("cells/1.json") && Catch::Contains("SHA-256") && Catch::Contains("--overwrite"));
    CHECK(one_line(e));
  }
  CHECK(computed == std::vector<size_t>{0, 1, 2});
  // --overwrite recomputes it and says so
  StudyOptions over = o;
  over.overwrite = true;
  std::FILE* log = std::tmpfile();
  over.log = log;
  const StudyRun r = run_study(plan, over);
  std::rewind(log);
  std::string said(4096, '\0');
  said.resize(std::fread(said.data(), 1, said.size(), log));
  std::fclose(log);
  CHECK(computed == std::vector<size_t>{0, 1, 2, 1});
  CHECK_THAT(said, Catch::Contains("cells/1.json") && Catch::Contains("recomput"));
  REQUIRE(r.merge);
  CHECK(r.cells[1]->at("value") == 1.5);
  CHECK(read_file(cell1) == original);
  // a cell without its hash, a hash that is not one, a hash of another cell's name: refused alike
  fs::remove(cell_path(o.out, 2) + ".sha256");
  CHECK_THAT(error_of([&] { run_study(plan, merge); }), Catch::Contains("cells/2.json"));
  write_file_atomic(cell_path(o.out, 2) + ".sha256", "not a hash\n");
  CHECK_THAT(error_of([&] { run_study(plan, merge); }), Catch::Contains("cells/2.json.sha256"));
  write_file_atomic(cell_path(o.out, 2) + ".sha256", sha256_hex(read_file(cell_path(o.out, 2))) + "  1.json\n");
  CHECK_THAT(error_of([&] { run_study(plan, merge); }), Catch::Contains("cells/2.json.sha256"));
  // a hash without its cell (a run killed between the two writes): the cell is missing, and computed
  fs::remove(cell_path(o.out, 2));
  CHECK_THAT(error_of([&] { run_study(plan, merge); }), Catch::Contains("missing"));
  REQUIRE(run_study(plan, o).merge);
  CHECK(computed == std::vector<size_t>{0, 1, 2, 1, 2});
  fs::remove_all(d);
}

// JSON nested 300,000 levels deep overflowed the stack when it was copied or dumped: `mantis merge`
// and a merge of cells exited 139 (issue 32, an audit of item 6). The depth is refused while parsing.
TEST_CASE("a manifest or cell nested past 100 levels is refused while it is parsed, however deep") {
  const fs::path d = scratch("deep-json");
  std::vector<size_t> computed;
  const StudyPlan plan = counting_plan(2, computed, [](size_t i) { return double(i); });
  StudyOptions o;
  o.out = d.string(), o.progress = ProgressMode::quiet, o.log = nullptr;
  REQUIRE(run_study(plan, o).merge);
  auto deep = [](size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  for (size_t n : {size_t(100), size_t(300'000), size_t(3'000'000)}) {
    INFO(n);
    // a cell with a hash that matches: only the depth is wrong
    const std::string cell = cell_path(o.out, 1), content = R"({"key": {"cell": 1}, "x": )" + deep(n) + "}\n";
    write_file_atomic(cell, content);
    write_file_atomic(cell + ".sha256", sha256_hex(content) + "  1.json\n");
    StudyOptions merge = o;
    merge.merge_only = true;
    CHECK_THAT(error_of([&] { run_study(plan, merge); }), Catch::Contains("cells/1.json: malformed cell result (more "
                                                                         "than 100 levels of nesting)"));
    const std::string m = R"({"x": )" + deep(n) + R"(, "files": {"results.csv": "0"}})";
    write_file_atomic((d / "manifest.json").string(), m);
    CHECK_THAT(error_of([&] { verify_result_set(d.string()); }),
               Catch::Contains("malformed manifest (more than 100 levels of nesting)"));
  }
  fs::remove_all(d);
}

// A result-set writer removed whatever sat at manifest.json (a FIFO became a regular file, exit 0).
TEST_CASE("a result set is written only over regular files: a special file in its place is refused, untouched") {
  const fs::path d = scratch("set-special");
  write_result_set(d.string(), {{"results.csv", "a\n1\n"}}, ojson::object());
  for (const char* name : {"manifest.json", "results.csv"}) {
    INFO(name);
    const fs::path p = d / name;
    fs::remove(p);
    REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    CHECK_THAT(error_of([&] { write_result_set(d.string(), {{"results.csv", "a\n2\n"}}, ojson::object()); }),
               Catch::Contains(p.string() + "' is a FIFO (named pipe), not a regular file"));
    CHECK(fs::is_fifo(p));
    fs::remove(p);
    write_result_set(d.string(), {{"results.csv", "a\n1\n"}}, ojson::object());
  }
  fs::remove_all(d);
}

TEST_CASE("slurm: the study command without cell, thread or Slurm options; the script submits the array and the merge") {
  const std::vector<std::string> argv = {"mantis", "lamp", "sweep", "c.toml", "--cell", "3", "--shard=1/2", "-j", "4",
                                         "--threads=2", "-j8", "--merge", "--emit-slurm", "s.sh", "--slurm-shards", "5",
                                         "--slurm-time=10", "--out", "it's here"};
  const auto cmd = study_command(argv);
  CHECK(cmd == std::vector<std::string>{"mantis", "lamp", "sweep", "c.toml", "--out", "it's here"});
  CHECK(shell_quote("plain/path-1.toml") == "plain/path-1.toml");
  CHECK(shell_quote("it's here") == "'it'\\''s here'");
  CHECK(shell_quote("") == "''");
  SlurmOptions s;
  s.shards = 5, s.cpus = 2, s.partition = "short";
  const std::string script = slurm_script(s, cmd, "/work dir");
  CHECK_THAT(script, Catch::Contains("cd '/work dir'"));
  CHECK_THAT(script, Catch::Contains("--array=0-4"));
  CHECK_THAT(script, Catch::Contains("--cpus-per-task=2 --mem=4G --time=01:00:00 --partition=short"));
  CHECK_THAT(script, Catch::Contains("--dependency=afterok:\"$array\""));
  CHECK_THAT(script, Catch::Contains("--threads 2 --shard \"$SLURM_ARRAY_TASK_ID\"/5"));
  CHECK_THAT(script, Catch::Contains("--threads 2 --merge"));
  for (auto [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"time", "1 hour"}, {"mem", "lots"}, {"partition", "a b"}, {"account", "x;rm"}}) {
    INFO(field);
    SlurmOptions b = s;
    (field == "time" ? b.time : field == "mem" ? b.mem : field == "partition" ? b.partition : b.account) = value;
    CHECK_THAT(error_of([&] { validate(b); }), Catch::Contains("--slurm-" + field));
  }
  s.shards = 0;
  CHECK_THAT(error_of([&] { validate(s); }), Catch::Contains("--slurm-shards"));
}

TEST_CASE("merge: result sets into one long CSV with units and provenance; a changed set is refused") {
  const fs::path a = scratch("merge-a"), b = scratch("merge-b");
  write_result_set(a.string(), {{"results.csv", "cell,name,kind,mu,kl_nats,ppl,seconds\n"
                                                "0,\"fp32, ref\",fp32,,0.0,4.5,1.25\n"
                                                "1,uniform ps4,uniform,4,0.0155,5.03,1.5\n"}},
                   ojson{{"generator", "mantis lamp sweep"}, {"git_commit", "abc"}, {"model", "models/m"}});
  write_result_set(b.string(), {{"results.csv", "model,optimizer,seed,final_val_loss_nats,state_bytes,peak_rss_bytes\n"
                                                "m2,gefen,1,2.5,1024,4096\n"}},
                   ojson{{"generator", "mantis optim-study"}, {"git_commit", "def"}});
  const std::string csv = merge_result_sets({a.string(), b.string()});
  std::vector<std::string> lines;
  std::stringstream ss(csv);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  REQUIRE(lines.size() == 1 + 3 + 3 + 3);  // kl, ppl, seconds per LAMP row; three metrics of the optim row
  CHECK(lines[0] == "source,generator,git_commit,row,model,policy,mu,site,design,metric,value,unit");
  const std::string pa = a.string(), pb = b.string();
  CHECK(lines[1] == pa + ",mantis lamp sweep,abc,0,models/m,,,,\"cell=0;name=fp32, ref;kind=fp32\",kl_nats,0.0,nats");
  CHECK(lines[3] == pa + ",mantis lamp sweep,abc,0,models/m,,,,\"cell=0;name=fp32, ref;kind=fp32\",seconds,1.25,s");
  CHECK(lines[5] == pa + ",mantis lamp sweep,abc,1,models/m,,4,,cell=1;name=uniform ps4;kind=uniform,ppl,5.03,perplexity");
  CHECK(lines[7] == pb + ",mantis optim-study,def,0,m2,,,,optimizer=gefen;seed=1,final_val_loss_nats,2.5,nats");
  CHECK(lines[8] == pb + ",mantis optim-study,def,0,m2,,,,optimizer=gefen;seed=1,state_bytes,1024,bytes");
  CHECK(metric_unit("recompute_rate") == "1");
  CHECK(metric_unit("median_step_seconds") == "s");
  CHECK(metric_unit("loss_spikes") == "count");
  CHECK(metric_unit("flux") == "unknown");
  // the unit is the name's last suffix (study.h), a bracketed qualifier after it
  CHECK(metric_unit("kl_lo_nats") == "nats");
  CHECK(metric_unit("t_hi_nats") == "nats");
  CHECK(metric_unit("val_loss_nats[kjv/validation]") == "nats");
  CHECK(metric_unit("ctx_tokens") == "tokens");
  CHECK(metric_unit("period_elements") == "elements");
  CHECK(metric_unit("ref_seconds") == "s");
  CHECK(metric_unit("peak_rss_bytes") == "bytes");
  CHECK(metric_unit("bytes_per_param") == "bytes/param");
  CHECK(metric_unit("kl_ratio_lo") == "1");
  CHECK(metric_unit("max_abs_logit_error") == "logit");
  std::ofstream(b / "results.csv", std::ios::app) << "m3,adamw,2,2.6,1,1\n";
  CHECK_THAT(error_of([&] { merge_result_sets({a.string(), b.string()}); }), Catch::Contains("results.csv"));
  CHECK_THAT(error_of([&] { merge_result_sets({(a / "none").string()}); }), Catch::Contains("manifest"));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("policy sweep: cells from the axes; each cell is eval's numbers for its policy; shards merge to the same set") {
  const fs::path d = scratch("policy-sweep");
  const std::string model = std::string(MANTIS_SOURCE_DIR) + "/models/llama-bytes";
  const fs::path cfg = d / "sweep.toml";
  auto write = [&](const std::string& extra) {
    std::ofstream(cfg) << "model = \"" << model << "\"\ndata = \"test\"\nseqs = 2\nctx = 16\n" << extra;
  };
  write("sites = [\"mlp.fc\", \"silu\"]\nmu = [3]\nformats = [\"bf16\"]\naccumulations = [\"strict\", \"blocked\"]\n"
        "template = \"\"\"\n[site.\"attn.qk\"]\noutput = \"bf16\"\n\"\"\"\n");
  const PolicySweepConfig c = read_policy_sweep(cfg.string());
  CHECK(is_policy_sweep(cfg.string()));
  const auto names = policy_sweep_cells(c);
  CHECK(names == std::vector<std::string>{"template", "mlp.fc bf16 rne strict", "mlp.fc bf16 rne blocked",
                                          "mlp.fc ps3 rne strict", "mlp.fc ps3 rne blocked", "silu bf16 rne",
                                          "silu ps3 rne"});
  PolicySweepOptions o;
  o.config = cfg.string(), o.out = (d / "whole").string(), o.progress = ProgressMode::quiet, o.log = nullptr;
  const PolicySweepResult r = run_policy_sweep(o);
  REQUIRE(r.merged);
  const auto res = ojson::parse(read_file((d / "whole" / "results.json").string()))["cells"];
  REQUIRE(res.size() == names.size());
  // cell 3 (mlp.fc ps3 strict, on top of the template) is what eval gives for that policy
  const fs::path pol = d / "cell3.toml";
  std::ofstream(pol) << "[site.\"attn.qk\"]\noutput = \"bf16\"\n[site.\"mlp.fc\"]\naccumulation = \"strict\"\n"
                        "accumulator = \"ps3\"\noutput = \"ps3\"\nrounding = \"rne\"\n";
  EvalOptions e;
  e.model = model, e.policy = pol.string(), e.data = "test", e.seqs = 2, e.ctx = 16, e.progress = ProgressMode::quiet;
  const EvalResult er = run_eval(e);
  CHECK(res[3]["kl"] == er.results["summary"]["kl_mean"]);
  CHECK(res[3]["flip_rate"] == er.results["summary"]["flip_rate"]);
  CHECK(res[3]["ppl"] == er.results["summary"]["ppl_test"]);
  CHECK(res[3]["kl"].get<double>() > 0);
  // shards, then the merge: the same cells and results
  for (const char* k : {"1/2", "0/2"}) {
    PolicySweepOptions s = o;
    s.out = (d / "sharded").string();
    parse_shard(k, s);
    CHECK_FALSE(run_policy_sweep(s).merged);
  }
  PolicySweepOptions m = o;
  m.out = (d / "sharded").string(), m.merge_only = true;
  REQUIRE(run_policy_sweep(m).merged);
  auto sharded = ojson::parse(read_file((d / "sharded" / "results.json").string()))["cells"];
  REQUIRE(sharded.size() == res.size());
  for (size_t i = 0; i < res.size(); ++i) {
    ojson a = res[i], b = sharded[i];
    a.erase("seconds"), b.erase("seconds");
    CHECK(a == b);
  }
  // what cannot be swept is refused when the configuration is read
  for (auto [extra, msg] : std::vector<std::pair<std::string, std::string>>{
           {"sites = [\"attn.nope\"]\nmu = [3]\n", "unknown site"},
           {"sites = [\"mlp.fc\"]\n", "formats"},
           {"sites = [\"silu\"]\nmu = [3]\nset = [\"accumulator\"]\n", "nonlinearity"},
           {"sites = [\"mlp.fc\"]\nmu = [3]\nset = [\"input\"]\nschemes = [\"mxfp4\"]\n", "choose one"},
           {"sites = [\"mlp.fc\"]\nmu = [3, 3]\n", "twice"},
           {"sites = [\"mlp.fc\"]\nmu = [3]\nroundings = [\"nearest\"]\n", "roundings"}}) {
    INFO(extra);
    write(extra);
    CHECK_THAT(error_of([&] { read_policy_sweep(cfg.string()); }), Catch::Contains(msg));
  }
  fs::remove_all(d);
}

TEST_CASE("study axes list each value once, compared after names resolve (aliases, case, files, μ)") {
  const fs::path d = scratch("axes");
  const std::string root = MANTIS_SOURCE_DIR;
  auto refused = [&](const std::string& what, auto read, const std::string& text) {
    INFO(what << ": " << text);
    const fs::path cfg = d / "c.toml";
    std::ofstream(cfg) << text;
    CHECK_THAT(error_of([&] { read(cfg.string()); }), Catch::Contains("twice"));
  };
  auto mu = [](const std::string& p) { return read_mu_sweep(p); };
  refused("mu-sweep mu", mu, "mu = [3, 3]\nlengths = [16]\n");
  refused("mu-sweep lengths", mu, "mu = [3]\nlengths = [16, 64, 16]\n");
  refused("mu-sweep shapes", mu, "mu = [3]\ngemm_shapes = [[4, 4, 16], [4, 4, 16]]\n");
  // one format under an alias, in capitals, as a file of the same definition, as μ
  std::ofstream(d / "mybf16.toml") << "name = \"mybf16\"\nmantissa_bits = 7\nexponent_bits = 8\n";
  const std::string ps = "model = \"m\"\nsites = [\"mlp.fc\"]\n";
  auto policy = [](const std::string& p) { return read_policy_sweep(p); };
  refused("formats alias", policy, ps + "formats = [\"bf16\", \"bfloat16\"]\n");
  refused("formats case", policy, ps + "formats = [\"bf16\", \"BF16\"]\n");
  refused("formats file", policy, ps + "formats = [\"bf16\", \"" + (d / "mybf16.toml").string() + "\"]\n");
  refused("formats and mu", policy, ps + "formats = [\"PS4\"]\nmu = [4]\n");
  refused("bf16 is ps7", policy, ps + "formats = [\"bf16\"]\nmu = [7]\n");
  refused("roundings", policy, ps + "mu = [4]\nroundings = [\"rne\", \"RNE\"]\n");
  refused("schemes", policy, ps + "mu = [4]\nschemes = [\"mxfp4\", \"MXFP4\"]\n");
  refused("sites", policy, "model = \"m\"\nmu = [4]\nsites = [\"mlp.fc\", \"mlp.fc\"]\n");
  auto lamp = [](const std::string& p) { return read_lamp_sweep(p); };
  refused("lamp strict_tau", lamp, "model = \"m\"\nstrict_tau = [0.1, 1e-1]\n");
  refused("lamp relaxed_tau", lamp, "model = \"m\"\nrelaxed_tau = [0.0, -0.0]\n");
  // one model under two paths (its name in the results is the file's stem)
  const std::string om = root + "/tests/data/optim-small-model.toml";
  const std::string om2 = root + "/tests/data/../data/optim-small-model.toml";
  auto optim = [](const std::string& p) { return read_optim_study(p); };
  refused("optim models", optim, "models = [\"" + om + "\", \"" + om2 + "\"]\noptimizers = [\"adamw\"]\n");
  auto gnmr = [](const std::string& p) { return read_gnmr_study(p); };
  const std::string arm = "[[arm]]\nname = \"a\"\nconfig = \"\"\n";
  refused("gnmr models", gnmr, "models = [\"a/train-x.toml\", \"b/x.toml\"]\n" + arm);
  refused("gnmr also_validate", gnmr, "models = [\"x.toml\"]\nalso_validate = [\"validation\", \"validation\"]\n" + arm);
  // distinct values stay distinct
  const fs::path cfg = d / "c.toml";
  std::ofstream(cfg) << ps << "formats = [\"bf16\", \"fp16\", \"" << (d / "mybf16.toml").string() << "x\"]\n";
  CHECK_THAT(error_of([&] { read_policy_sweep(cfg.string()); }), Catch::Contains("mybf16.tomlx"));  // a missing file
  std::ofstream(cfg) << ps << "formats = [\"bf16\", \"fp16\", \"e5m2\"]\nmu = [4, 10]\nroundings = [\"rne\", \"sr\"]\n";
  CHECK(read_policy_sweep(cfg.string()).formats.size() == 5);
  fs::remove_all(d);
}

TEST_CASE("bootstrap: reproducible percentile intervals of window sums, equal to a direct resampling") {
  std::vector<double> num(37), den(37, 256.0);
  for (size_t w = 0; w < num.size(); ++w) num[w] = double(random_word(3, 0, w) % 1000) / 10.0;
  const Bootstrap b(num.size(), 500, 11);
  const Interval i = b.ratio(num, den);
  const Interval j = Bootstrap(num.size(), 500, 11).ratio(num, den);
  CHECK((i.lo == j.lo && i.hi == j.hi));
  double sn = 0, sd = 0;
  for (size_t w = 0; w < num.size(); ++w) sn += num[w], sd += den[w];
  CHECK(i.lo < sn / sd);
  CHECK(sn / sd < i.hi);
  // the same resamples, drawn here from the documented rule
  std::vector<double> stat;
  for (uint64_t r = 0; r < 500; ++r) {
    double a = 0, c = 0;
    for (uint64_t k = 0; k < num.size(); ++k) {
      const size_t w = size_t(random_word(11, r, k) % num.size());
      a += num[w], c += den[w];
    }
    stat.push_back(a / c);
  }
  std::sort(stat.begin(), stat.end());
  const double pos = 0.025 * 499;
  CHECK(i.lo == Approx(stat[size_t(pos)] + (pos - std::floor(pos)) * (stat[size_t(pos) + 1] - stat[size_t(pos)])));
  // constant windows: no spread
  std::vector<double> same(10, 2.0), one(10, 1.0);
  const Interval k = Bootstrap(10).ratio(same, one);
  CHECK((k.lo == 2.0 && k.hi == 2.0));
  // a window of infinite KL makes the upper end infinite
  same[3] = std::numeric_limits<double>::infinity();
  CHECK(std::isinf(Bootstrap(10).ratio(same, one).hi));
  CHECK_THROWS_AS(Bootstrap(0), InputError);
  CHECK_THROWS_AS(b.ratio(same, one), InputError);
}

namespace {
ModelConfig tiny(Arch a) {
  ModelConfig c;
  c.arch = a;
  c.vocab = 64, c.ctx = 32, c.layers = 2, c.heads = 2, c.kv_heads = a == Arch::llama ? 1 : 2, c.dim = 16,
  c.hidden = 32;
  return c;
}
}  // namespace

TEST_CASE("site health: overflows of a narrow site format are counted where they happen") {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    Model m = init_model(tiny(arch), 5);
    for (auto& [k, t] : m.params)
      if (t.shape.size() == 2)
        for (float& x : t.data) x *= 40.0f;  // scores far beyond e2m1's largest finite value
    std::vector<int32_t> tokens(20);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 64);
    ForwardStats clean;
    forward<float>(m, tokens, Policy{}, &clean);
    for (const SiteHealth& h : clean.health) CHECK(h.clean());
    Policy p;
    SitePolicy s;
    s.output = format_lookup("e2m1");  // IEEE-style: largest finite 3, overflow to inf
    p.all[int(Site::attn_qk)] = s;
    ForwardStats st;
    const auto logits = forward<float>(m, tokens, p, &st);
    // layer 0's scores do not depend on the site: the count is the number of causal scores
    // q_i·k_j/√HS beyond e2m1's largest finite (recomputed in binary64 from the FP32 run's q and k; no score of this
    // model lies within rounding of it, so the two evaluations agree on every comparison)
    detail::Tape<float> tape;
    detail::forward_tape<float>(m, tokens, Policy{}, tape);
    const auto& lt = tape.layers[0];
    const ModelConfig& c = m.cfg;
    const int HS = c.dim / c.heads, group = c.heads / c.kv_heads;
    const double mx = max_finite(*s.output);
    uint64_t beyond = 0, near = 0;
    for (int h = 0; h < c.heads; ++h)
      for (Eigen::Index i = 0; i < lt.q.rows(); ++i)
        for (Eigen::Index j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < HS; ++e) d += double(lt.q(i, h * HS + e)) * double(lt.k(j, (h / group) * HS + e));
          d = std::abs(d / std::sqrt(double(HS)));
          beyond += d > mx, near += std::abs(d - mx) < 1e-4;
        }
    REQUIRE(near == 0);
    CHECK(beyond > 0);
    CHECK(st.health_at(Site::attn_qk, 0).overflow == beyond);
    // the by-row path (stochastic rounding keys rows) counts the same overflows as the blocks
    Policy pr = p;
    pr.all[int(Site::attn_qk)].rounding = Rounding::sr;
    ForwardStats sr;
    forward<float>(m, tokens, pr, &sr);
    CHECK(sr.health_at(Site::attn_qk, 0).overflow == beyond);
    for (int s2 = 0; s2 < kSiteCount; ++s2)
      if (Site(s2) != Site::attn_qk) CHECK(st.health_at(Site(s2), 0).overflow == 0);
    CHECK(logits.allFinite() == (st.health_at(Site::lm_head, -1).nan + st.health_at(Site::lm_head, -1).inf == 0));
  }
}

TEST_CASE("an exception inside a parallel region is rethrown after it, never std::terminate") {
  ParallelErrors errors;
  int ran = 0;
#pragma omp parallel for reduction(+ : ran)
  for (int i = 0; i < 64; ++i) errors.run([&] {
    ++ran;
    if (i == 17) throw InputError("bad setting at 17");
  });
  CHECK(ran == 64);
  CHECK_THAT(error_of([&] { errors.rethrow(); }), Catch::Contains("bad setting at 17"));
  ParallelErrors none;
  CHECK_NOTHROW(none.rethrow());
}
