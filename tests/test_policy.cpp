// The precision policy (nn/policy.h): the TOML form, defaults, layer entries, the resolver, errors.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "nn/policy.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::kLampToml;
using Catch::Contains;

// ------------------------------------------------------------------------------------------------
// the policy

TEST_CASE("policy: the TOML form, defaults, layer entries and the resolver") {
  const Policy empty = policy_from_toml("", "empty.toml");
  CHECK(empty.is_native());
  CHECK(Policy{}.is_native());
  CHECK(describe(empty) == "native\n");

  const Policy lamp = policy_from_toml(kLampToml, "lamp.toml");
  const SitePolicy& qk = lamp.at(Site::attn_qk, 3);
  REQUIRE(qk.accumulation);
  CHECK(*qk.accumulation == Accumulation::strict);
  CHECK(qk.accumulator->name == "ps4");
  CHECK(qk.accumulator->mu == 4);
  CHECK(qk.output->name == "ps4");
  CHECK_FALSE(qk.input);
  CHECK(qk.rounding == Rounding::rne);
  CHECK(lamp.at(Site::attn_pv, 3).is_native());
  CHECK_FALSE(lamp.is_native());
  CHECK(describe(lamp) == "attn.qk: strict acc ps4, output ps4, rne\n");
  CHECK(describe(lamp_policy(4)) == describe(lamp));

  const Policy p = policy_from_toml(R"(
[site."attn.qk"]
accumulation = "blocked"
accumulator = "fp16"
block = 16
input = "bf16"
rounding = "rz"

[site."layer.2.attn.qk"]
accumulation = "unfused"
accumulator = "ps7"

[site."layer.0.attn.qk"]
accumulation = "native"

[site.ln]
input = "bf16"
output = "e4m3"
rounding = "sr"
seed = 42
sr_bits = 12

[site.lm_head]
output = "bf16"
)", "p.toml");
  const SitePolicy& all = p.at(Site::attn_qk, 1);
  CHECK(*all.accumulation == Accumulation::blocked);
  CHECK(all.block == 16);
  CHECK(all.accumulator->name == "fp16");
  CHECK(all.input->name == "bf16");
  CHECK(all.rounding == Rounding::rz);
  CHECK(&p.at(Site::attn_qk, -1) == &all);      // outside the layers: the all-layers entry
  const SitePolicy& l2 = p.at(Site::attn_qk, 2);  // replaces the all-layers entry as a whole
  CHECK(*l2.accumulation == Accumulation::unfused);
  CHECK(l2.accumulator->name == "ps7");
  CHECK_FALSE(l2.input);
  CHECK(l2.rounding == Rounding::rne);
  CHECK(p.at(Site::attn_qk, 0).is_native());
  const SitePolicy& ln = p.at(Site::ln, 5);
  CHECK(ln.output->name == "e4m3");
  CHECK(ln.seed == 42);
  CHECK(ln.sr_bits == 12);
  CHECK(ln.rounding == Rounding::sr);
  CHECK(p.at(Site::lm_head).output->name == "bf16");
  CHECK_FALSE(p.at(Site::lm_head).accumulation);
  const GemmSpec s = all.gemm_spec(77);
  CHECK(s.stream == 77);
  CHECK(s.acc_mode == Rounding::rz);
  CHECK(s.input_mode == Rounding::rz);
  CHECK(s.block == 16);
  CHECK(describe(p).find("layer.0.attn.qk: native acc, binary32") != std::string::npos);

  CHECK(site_names() == "attn.qkv, attn.qk, attn.pv, attn.proj, mlp.fc, mlp.proj, lm_head, ln, softmax, gelu, silu");
  for (int i = 0; i < kSiteCount; ++i) CHECK(site_from_string(to_string(Site(i))) == Site(i));
  CHECK_FALSE(site_from_string("attn"));
}

TEST_CASE("policy: every error names the file, the line and the valid choices") {
  auto parse = [](const std::string& text) { return error_of([&] { policy_from_toml(text, "pol.toml"); }); };
  std::string e = parse("[site.\"attn.qkk\"]\naccumulation = \"strict\"\n");
  CHECK_THAT(e, Contains("pol.toml:1") && Contains("unknown site 'attn.qkk'") &&
                    Contains("attn.qkv, attn.qk, attn.pv, attn.proj, mlp.fc, mlp.proj, lm_head, ln, softmax, gelu, silu") &&
                    Contains("layer.<n>.<site>"));
  CHECK_THAT(parse("[site.attn.qk]\naccumulation = \"strict\"\n"), Contains("unknown site 'attn'") && Contains("quote"));
  CHECK_THAT(parse("[site.\"layer.x.attn.qk\"]\n"), Contains("unknown site 'layer.x.attn.qk'"));
  CHECK_THAT(parse("[site.\"layer.-1.ln\"]\n"), Contains("unknown site"));
  // a layer a stream key can hold (nn/streams.h: 30 bits of layer + 1), no more
  CHECK_NOTHROW(policy_from_toml("[site.\"layer.1073741822.ln\"]\n", "pol.toml"));
  CHECK_THAT(parse("[site.\"layer.1073741823.ln\"]\n"), Contains("unknown site 'layer.1073741823.ln'"));
  CHECK_THAT(parse("[site.\"layer.2147483647.ln\"]\n"), Contains("unknown site"));
  CHECK_THAT(parse("\n\n[site.\"attn.qk\"]\naccumulation = \"strict\"\nacumulator = \"ps4\"\n"),
             Contains("pol.toml:5") && Contains("unknown key 'acumulator'") &&
                 Contains("accumulation, accumulator, align_bits, block, input, input_a, input_b, output, promote_every, "
                      "rounding, seed, split_k, sr_bits, sr_packed, tensor_core"));
  CHECK_THAT(parse("[site.softmax]\naccumulation = \"strict\"\n"),
             Contains("unknown key 'accumulation'") &&
                 Contains("nonlinearity sites: input, output, rounding, seed, sr_bits, sr_packed"));
  // packed random bits: a boolean, at most 16 bits, with sr / sre, not with scheme operands
  CHECK_THAT(parse("[site.gelu]\noutput = \"bf16\"\nrounding = \"sr\"\nsr_packed = 1\n"),
             Contains("pol.toml:4") && Contains("'sr_packed' in site gelu must be true or false"));
  CHECK_THAT(parse("[site.gelu]\noutput = \"bf16\"\nrounding = \"sr\"\nsr_packed = true\n"),
             Contains("pol.toml:4") && Contains("sr_bits = 32 does not fit"));
  CHECK_THAT(parse("[site.gelu]\noutput = \"bf16\"\nsr_bits = 8\nsr_packed = true\n"),
             Contains("pol.toml:4") && Contains("sr_packed is for stochastic rounding"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\ninput_a = \"mxfp4\"\nrounding = \"sr\"\nsr_bits = 8\nsr_packed = true\n"),
             Contains("sr_packed is not implemented for scaled operands"));
  {
    const Policy pk = policy_from_toml("[site.\"mlp.fc\"]\naccumulation = \"strict\"\naccumulator = \"bf16\"\n"
                                       "output = \"bf16\"\nrounding = \"sr\"\nsr_bits = 8\nsr_packed = true\n",
                                       "pol.toml");
    CHECK(pk.at(Site::mlp_fc).sr_packed);
    CHECK(pk.at(Site::mlp_fc).gemm_spec(0).sr_packed);
    const SitePlan sp = plan_site(pk.at(Site::mlp_fc));
    CHECK(sp.gemm->sr_pack == 2);
    CHECK(sp.output->plan.sr_pack == 2);
    CHECK_THAT(describe(pk), Contains("sr_bits 8, packed"));
  }
  CHECK_THAT(parse("[site.\"attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"ps99\"\n"),
             Contains("pol.toml:3") && Contains("ps99") && Contains("out of range 1..23"));
  CHECK_THAT(parse("[site.gelu]\noutput = \"posit8\"\n"), Contains("pol.toml:2") && Contains("unknown format 'posit8'"));
  CHECK_THAT(parse("[site.gelu]\noutput = \"fp64\"\n"), Contains("does not fit binary32"));
  CHECK_THAT(parse("[site.gelu]\nrounding = \"nearest\"\n"), Contains("pol.toml:2") && Contains("unknown rounding mode 'nearest'"));
  CHECK_THAT(parse("[site.gelu]\nseed = -1\n"), Contains("out of range"));
  CHECK_THAT(parse("[site.gelu]\nseed = \"x\"\n"), Contains("must be an integer"));
  CHECK_THAT(parse("[site.gelu]\noutput = 4\n"), Contains("must be a string"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulation = \"kahan\"\naccumulator = \"ps4\"\n"),
             Contains("unknown accumulation 'kahan'") && Contains("native, strict, unfused, blocked"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulation = \"strict\"\n"), Contains("needs an accumulator"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulator = \"ps4\"\n"), Contains("an accumulator needs accumulation"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulation = \"strict\"\naccumulator = \"ps4\"\nblock = 8\n"),
             Contains("pol.toml:4") && Contains("'block' needs accumulation = \"blocked\""));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulation = \"blocked\"\naccumulator = \"ps4\"\nblock = 0\n"),
             Contains("out of range"));
  // sr on a ps23 accumulator is exact only with sr_bits ≤ 52 − 24 = 28 (gemm.h)
  CHECK_THAT(parse("[site.\"mlp.fc\"]\naccumulation = \"strict\"\naccumulator = \"ps23\"\nrounding = \"sr\"\n"),
             Contains("pol.toml:") && Contains("sr_bits"));
  CHECK_THAT(parse("[site.\"layer.1.lm_head\"]\n"), Contains("lm_head is not inside a layer"));
  // per-operand inputs: a scheme or a format, not beside `input`, GEMM sites only
  CHECK_THAT(parse("[site.\"mlp.fc\"]\ninput = \"bf16\"\ninput_a = \"mxfp4\"\n"),
             Contains("pol.toml:3") && Contains("'input_a' and 'input'"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\ninput_b = \"mxfp5\"\n"), Contains("pol.toml:2") && Contains("unknown format 'mxfp5'"));
  CHECK_THAT(parse("[site.gelu]\ninput_a = \"mxfp4\"\n"), Contains("unknown key 'input_a'"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\ninput_a = \"fp64\"\n"), Contains("does not fit binary32"));
  CHECK_THAT(parse("[site]\n\"attn.qk\" = 3\n"), Contains("must be a table"));
  CHECK_THAT(parse("site = 3\n"), Contains("'site' must hold"));
  CHECK_THAT(parse("[sites.\"attn.qk\"]\n"), Contains("pol.toml:1") && Contains("unknown key 'sites'") && Contains("known: site"));
  CHECK_THAT(parse("[site.\"attn.qk\"\n"), Contains("pol.toml:1") && Contains("malformed TOML"));
  CHECK_THAT(error_of([] { load_policy("/nonexistent/policy.toml"); }), Contains("/nonexistent/policy.toml"));
  CHECK_THAT(error_of([] { lamp_policy(0); }), Contains("out of range 1..23"));
  CHECK_THAT(error_of([] { lamp_policy(24); }), Contains("out of range 1..23"));
}

// A key with a line break made a two-line message (issue 32, through Python's mantis.Error): every
// InputError escapes its control bytes when it is made, so no message can span lines.
TEST_CASE("policy: a key with a line break or other control bytes stays one line in the message") {
  auto parse = [](const std::string& text) { return error_of([&] { policy_from_toml(text, "pol.toml"); }); };
  const std::string nl = parse("[site.\"attn\\nqk\"]\n");
  CHECK_THAT(nl, Contains("unknown site 'attn\\x0aqk'"));
  CHECK(nl.find('\n') == std::string::npos);
  CHECK_THAT(parse("\"we\\u001b[1mird\" = 1\n"), Contains("unknown key 'we\\x1b[1mird'"));
  CHECK(std::string(InputError("a\nb\r\tc\x7f").what()) == "a\\x0ab\\x0d\\x09c\\x7f");
}

// Two spellings of one site both loaded and one silently won (issue 32): layer numbers are read as
// numbers, so layer.00 is layer.0, and a site given twice is refused naming both spellings.
TEST_CASE("policy: a site spelled twice is refused; a layer's leading zeros name the same layer") {
  auto parse = [](const std::string& text) { return error_of([&] { policy_from_toml(text, "pol.toml"); }); };
  const std::string a = "[site.\"layer.0.attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"ps4\"\n";
  const std::string b = "[site.\"layer.00.attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"ps7\"\n";
  CHECK(parse(a + b) == "pol.toml:4: site 'layer.00.attn.qk' is site 'layer.0.attn.qk' again (layer 0): give each "
                        "site one table");
  // (toml++ hands the keys over in sorted order, so the message is the same whichever comes first)
  CHECK_THAT(parse(b + a), Contains("pol.toml:1: site 'layer.00.attn.qk' is site 'layer.0.attn.qk' again"));
  CHECK_THAT(parse(b + "[site.\"layer.000.attn.qk\"]\n"), Contains("is site 'layer.00.attn.qk' again"));
  // one spelling alone is the canonical site
  const Policy p = policy_from_toml(b, "pol.toml");
  CHECK(p.layer.count({0, Site::attn_qk}) == 1);
  CHECK(describe(p).find("layer.0.attn.qk: ") != std::string::npos);
  // the every-layer entry and one layer's are different sites, and so are two layers
  CHECK_NOTHROW(policy_from_toml("[site.\"attn.qk\"]\n" + a + "[site.\"layer.1.attn.qk\"]\n", "pol.toml"));
}

TEST_CASE("policy: input_a / input_b take schemes (presets, case-insensitive) and formats; dx / dw too") {
  const Policy p = policy_from_toml(R"([site."mlp.fc"]
input_a = "MXFP8_E4M3"
input_b = "e4m3"
[site."mlp.fc".dw]
input_a = "nvfp4"
input_b = "deepseek_act"
rounding = "sr"
)", "t.toml");
  const SitePolicy& f = p.at(Site::mlp_fc);
  REQUIRE(f.input_a);
  REQUIRE(f.input_a->scheme);
  CHECK(f.input_a->scheme->name == "mxfp8_e4m3");
  REQUIRE(f.input_b->format);
  CHECK(f.input_b->format->name == "e4m3");
  CHECK_FALSE(f.is_native());
  const SitePolicy& dw = p.at(Site::mlp_fc, 0, Pass::dw);
  CHECK(dw.input_a->scheme->two_level);
  CHECK(dw.input_b->scheme->block_cols == 128);
  CHECK_THAT(describe(p), Contains("input_a mxfp8_e4m3") && Contains("input_b e4m3") && Contains("input_b deepseek_act"));
  // compiled: B's scheme block is transposed into its [K,N] orientation
  const SitePlan plan = plan_site(dw);
  CHECK(plan.input_b->scheme->block_rows == 128);
  CHECK(plan.input_b->scheme->block_cols == 1);
  CHECK(plan.input_a->scheme->block_cols == 16);
}

TEST_CASE("policy: promoted and tensor-core accumulation, tensor-core presets") {
  const Policy p = policy_from_toml(R"([site."attn.qk"]
tensor_core = "hopper_fp8"
[site."mlp.fc"]
accumulation = "promoted"
accumulator = "ps13"
block = 128
[site."mlp.proj"]
tensor_core = "v100_fp16"
align_bits = 26
rounding = "rne"
)", "t.toml");
  const SitePolicy& qk = p.at(Site::attn_qk);
  CHECK(qk.accumulation == Accumulation::tensor_core);
  CHECK(qk.block == 32);
  CHECK(qk.align_bits == 13);
  CHECK(qk.accumulator->name == "fp32");
  CHECK(qk.rounding == Rounding::rz);
  const SitePolicy& fc = p.at(Site::mlp_fc);
  CHECK(fc.accumulation == Accumulation::promoted);
  CHECK(fc.block == 128);
  const SitePolicy& pr = p.at(Site::mlp_proj);
  CHECK(pr.align_bits == 26);  // given beside the preset: kept
  CHECK(pr.block == 4);
  CHECK(pr.rounding == Rounding::rne);
  CHECK_THAT(describe(p), Contains("tensor_core acc fp32 (k_b = 32, F = 13)") && Contains("promoted acc ps13 (k_b = 128)"));
  auto parse = [](const std::string& text) { return error_of([&] { policy_from_toml(text, "pol.toml"); }); };
  CHECK_THAT(parse("[site.\"attn.qk\"]\ntensor_core = \"b300\"\n"), Contains("unknown tensor-core preset 'b300'") &&
                                                                     Contains("hopper_fp8") && Contains("GPUs: v100"));
  // A GPU's matrix unit: the input format is required; the accumulator is the unit's output.
  CHECK_THAT(parse("[site.\"attn.qk\"]\ntensor_core = \"b200\"\n"), Contains("pol.toml:1: site attn.qk: tensor core b200: "
                                                                     "give the input format"));
  CHECK_THAT(parse("[site.\"mlp.fc\"]\ntensor_core = \"v100\"\ninput = \"bf16\"\n"), Contains("the v100 has no bf16 → fp32"));
  const Policy u = policy_from_toml("[site.\"mlp.fc\"]\ntensor_core = \"H100\"\ninput = \"e4m3\"\n"
                                    "[site.\"mlp.proj\"]\ntensor_core = \"h100:mma\"\ninput = \"e4m3\"\naccumulator = \"fp16\"\n"
                                    "rounding = \"sr\"\n", "u.toml");
  CHECK(u.at(Site::mlp_fc).tensor_core == "H100");
  CHECK(u.at(Site::mlp_fc).accumulator->name == "fp32");
  CHECK(u.at(Site::mlp_proj).accumulator->name == "fp16");
  CHECK(u.at(Site::mlp_proj).gemm_spec(0).acc_mode == Rounding::rne);    // the unit rounds its own way ..
  CHECK(u.at(Site::mlp_proj).gemm_spec(0).input_mode == Rounding::sr);   // .. `rounding` is the operands'
  CHECK(plan_gemm(u.at(Site::mlp_proj).gemm_spec(0)).unit->interleaved == 1);
  CHECK_THAT(describe(u), Contains("tensor_core acc fp32 (H100)") && Contains("tensor_core acc fp16 (h100:mma)"));
  CHECK_THAT(parse("[site.\"attn.qk\"]\ntensor_core = \"v100_fp16\"\naccumulation = \"strict\"\n"),
             Contains("tensor_core = \"v100_fp16\" with accumulation = \"strict\""));
  CHECK_THAT(parse("[site.\"attn.qk\"]\naccumulation = \"strict\"\naccumulator = \"fp32\"\nalign_bits = 10\n"),
             Contains("'align_bits' needs accumulation = \"tensor_core\""));
  CHECK_THAT(parse("[site.\"attn.qk\"]\naccumulation = \"tensor_core\"\naccumulator = \"fp32\"\nalign_bits = 52\n"),
             Contains("align_bits = 52"));
}

TEST_CASE("policy: load_policy reads a file and reports its path") {
  const std::string path = "test_forward_policy.tmp";
  {
    std::ofstream out(path);
    out << kLampToml << "[site.\"layer.9.mlp.fcc\"]\n";
  }
  CHECK_THAT(error_of([&] { load_policy(path); }), Contains(path + ":6") && Contains("unknown site 'layer.9.mlp.fcc'"));
  {
    std::ofstream out(path);
    out << kLampToml;
  }
  CHECK(describe(load_policy(path)) == describe(lamp_policy(4)));
  std::remove(path.c_str());
}
