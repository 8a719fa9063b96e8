// ParamInfo: every parameter's role, layer and head row-blocks (gpt2's fused c_attn, llama's
// grouped-query wq / wk / wv), the one source of parameter_shapes; Unit ↔ Site.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <tuple>

#include "nn/backward.h"
#include "nn/model.h"

using namespace mantis;

namespace {

ModelConfig gpt2_config() {
  ModelConfig c;
  c.vocab = 50, c.ctx = 16, c.layers = 2, c.heads = 4, c.kv_heads = 4, c.dim = 32, c.hidden = 64;
  return c;
}

ModelConfig llama_config(bool tied) {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab = 50, c.ctx = 16, c.layers = 3, c.heads = 4, c.kv_heads = 2, c.dim = 32, c.hidden = 48, c.tied = tied;
  return c;
}

const ParamInfo& find(const std::vector<ParamInfo>& infos, const std::string& name) {
  for (const ParamInfo& p : infos)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  return infos.front();
}

// Names and shapes are parameter_shapes'; (role, layer, bias) names one parameter; head blocks
// tile the rows exactly.
void check_consistent(const ModelConfig& c) {
  const auto infos = parameter_infos(c);
  const auto shapes = parameter_shapes(c);
  REQUIRE(infos.size() == shapes.size());
  std::set<std::tuple<int, int, bool>> keys;
  for (size_t i = 0; i < infos.size(); ++i) {
    CHECK(infos[i].name == shapes[i].first);
    CHECK(infos[i].shape == shapes[i].second);
    CHECK(keys.insert({int(infos[i].role), infos[i].layer, infos[i].bias}).second);
    CHECK((infos[i].layer >= -1 && infos[i].layer < c.layers));
    if (infos[i].head_blocks > 0) CHECK(infos[i].head_blocks * infos[i].head_rows == infos[i].shape[0]);
    else CHECK(infos[i].head_rows == 0);
  }
  CHECK(int64_t(infos.size()) == parameter_count(c).tensors);
}

}  // namespace

TEST_CASE("ParamInfo, gpt2: roles, layers, biases; c_attn is 3·NH row blocks of HS (q heads, k heads, v heads)") {
  const ModelConfig c = gpt2_config();
  check_consistent(c);
  const auto infos = parameter_infos(c);
  const ParamInfo& wte = find(infos, "wte");
  CHECK((wte.role == Role::tok_emb && wte.layer == -1 && !wte.bias && wte.head_blocks == 0));
  CHECK(find(infos, "wpe").role == Role::pos_emb);
  const ParamInfo& lnf = find(infos, "ln_f.bias");
  CHECK((lnf.role == Role::norm_f && lnf.bias && lnf.layer == -1));
  const ParamInfo& attn = find(infos, "h.1.attn.c_attn.weight");
  CHECK((attn.role == Role::attn_qkv && attn.layer == 1 && !attn.bias));
  CHECK(attn.head_blocks == 3 * c.heads);
  CHECK(attn.head_rows == c.head_size());
  const ParamInfo& attn_b = find(infos, "h.0.attn.c_attn.bias");
  CHECK((attn_b.role == Role::attn_qkv && attn_b.bias && attn_b.head_blocks == 3 * c.heads && attn_b.head_rows == 8));
  const std::pair<const char*, Role> layer_roles[] = {
      {"h.0.ln_1.weight", Role::norm1},        {"h.0.attn.c_proj.weight", Role::attn_proj},
      {"h.0.ln_2.bias", Role::norm2},          {"h.1.mlp.c_fc.weight", Role::mlp_fc},
      {"h.1.mlp.c_proj.bias", Role::mlp_proj}};
  for (auto [name, role] : layer_roles) {
    const ParamInfo& p = find(infos, name);
    CHECK(p.role == role);
    CHECK(p.head_blocks == 0);
    CHECK(p.bias == std::string(name).ends_with(".bias"));
    CHECK(p.layer == (std::string(name).starts_with("h.0.") ? 0 : 1));
  }
  for (const ParamInfo& p : infos) CHECK(p.role != Role::lm_head);  // tied: the output is wte
}

TEST_CASE("ParamInfo, llama with grouped-query attention: wq NH blocks, wk and wv NKV blocks of HS") {
  const ModelConfig c = llama_config(false);
  check_consistent(c);
  check_consistent(llama_config(true));
  const auto infos = parameter_infos(c);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const ParamInfo& wq = find(infos, p + "attention.wq");
    CHECK((wq.role == Role::wq && wq.layer == l && wq.head_blocks == c.heads && wq.head_rows == c.head_size()));
    for (const char* kv : {"attention.wk", "attention.wv"}) {
      const ParamInfo& w = find(infos, p + kv);
      CHECK(w.layer == l);
      CHECK(w.head_blocks == c.kv_heads);
      CHECK(w.head_rows == c.head_size());
      CHECK(w.shape[0] == int64_t(c.kv_heads) * c.head_size());
    }
    CHECK(find(infos, p + "attention.wk").role == Role::wk);
    CHECK(find(infos, p + "attention.wv").role == Role::wv);
    CHECK(find(infos, p + "attention.wo").role == Role::attn_proj);
    CHECK(find(infos, p + "attention_norm").role == Role::norm1);
    CHECK(find(infos, p + "ffn_norm").role == Role::norm2);
    CHECK(find(infos, p + "feed_forward.w1").role == Role::mlp_gate);
    CHECK(find(infos, p + "feed_forward.w3").role == Role::mlp_up);
    CHECK(find(infos, p + "feed_forward.w2").role == Role::mlp_proj);
    CHECK(find(infos, p + "feed_forward.w2").head_blocks == 0);
  }
  CHECK(find(infos, "tok_embeddings").role == Role::tok_emb);
  CHECK(find(infos, "norm").role == Role::norm_f);
  const ParamInfo& out = find(infos, "output");
  CHECK((out.role == Role::lm_head && out.layer == -1));
  for (const ParamInfo& p : parameter_infos(llama_config(true))) CHECK(p.role != Role::lm_head);
  for (const ParamInfo& p : infos) CHECK(!p.bias);
}

TEST_CASE("Unit is its Site: names, and the unit's parameters are those of its roles") {
  for (Unit u : {Unit::qkv, Unit::proj, Unit::fc, Unit::down}) CHECK(std::string(to_string(u)) == to_string(site_of(u)));
  CHECK(site_of(Unit::down) == Site::mlp_proj);
  CHECK(unit_parameters(gpt2_config(), 1, Unit::qkv) ==
        std::vector<std::string>{"h.1.attn.c_attn.weight", "h.1.attn.c_attn.bias"});
  CHECK(unit_parameters(llama_config(false), 2, Unit::qkv) ==
        std::vector<std::string>{"layers.2.attention.wq", "layers.2.attention.wk", "layers.2.attention.wv"});
  CHECK(unit_parameters(llama_config(false), 0, Unit::fc) ==
        std::vector<std::string>{"layers.0.feed_forward.w1", "layers.0.feed_forward.w3"});
  CHECK(unit_parameters(llama_config(true), 0, Unit::down) == std::vector<std::string>{"layers.0.feed_forward.w2"});
}
