#include "io/checkpoint.h"

#include "core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <set>
#include <stdexcept>

#include "core/format.h"
#include "io/safetensors.h"

static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");
static_assert(sizeof(float) == 4);

namespace mantis {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int32_t kLlmcMagic = 20240326;
constexpr const char* kWeightsName = "model.safetensors";
constexpr const char* kConfigName = "config.json";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ",")); }
const char* arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

// Re-throws an InputError with "PREFIX: " in front of its message.
template <class F>
auto prefixed(const std::string& prefix, F&& f) {
  try {
    return f();
  } catch (const InputError& e) {
    throw InputError(prefix + ": " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Bytes: a read-only mapping of a whole file, little-endian reads, element conversion.

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    fd_ = open_input(path);  // a regular file (a FIFO would block, a device is no checkpoint)
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      ::close(fd_);
      throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd_);
        throw InputError(fmt::format("{}: cannot map {} bytes: {}", path, size_, std::strerror(err)));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

uint32_t rd_u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
int32_t rd_i32(const uint8_t* p) { return int32_t(rd_u32(p)); }
uint64_t rd_u64(const uint8_t* p) { return uint64_t(rd_u32(p)) | uint64_t(rd_u32(p + 4)) << 32; }

// binary16 → binary32, exact (every half value is a float; subnormal halves become normal floats).
float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(float(m), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = e == 31 ? sign | 0x7f800000u | m << 13 : sign | (e + 112) << 23 | m << 13;
  return std::bit_cast<float>(bits);
}
float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

enum class DType : uint8_t { f32, f16, bf16, other };

struct DTypeInfo {
  const char* name;
  DType kind;
};
// The dtypes the model readers convert (every other one the parser accepts is DType::other).
constexpr DTypeInfo kDTypes[] = {{"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}};

int dtype_size(DType d) { return d == DType::f32 ? 4 : 2; }

// Converts n elements at p (little-endian, any alignment) to floats.
void convert(const uint8_t* p, size_t n, DType d, float* out) {
  switch (d) {
    case DType::f32: std::memcpy(out, p, n * 4); break;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_float(uint16_t(p[2 * i] | p[2 * i + 1] << 8));
      break;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(uint16_t(p[2 * i] | p[2 * i + 1] << 8));
      break;
    case DType::other: break;
  }
}

// Product of dimensions, or -1 when it (or a byte count derived from it) would not fit in 2^62.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  __int128 n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    n *= d;
    if (n > (__int128(1) << 59)) return -1;
  }
  return int64_t(n);
}

// Sequential reader of a raw tensor stream (llm.c, llama2.c); the caller has checked the size.
struct Stream {
  const uint8_t* p;
  DType dtype;
  Tensor take(std::vector<int64_t> shape) {
    Tensor t;
    t.shape = std::move(shape);
    t.data.resize(size_t(t.numel()));
    convert(p, t.data.size(), dtype, t.data.data());
    p += t.data.size() * size_t(dtype_size(dtype));
    return t;
  }
  void skip(int64_t n) { p += size_t(n) * size_t(dtype_size(dtype)); }
};

// ---------------------------------------------------------------------------------------------
// safetensors (io/safetensors.h parses; here each entry's dtype becomes the kind the readers convert)

struct StEntry {
  std::string dtype_name;
  DType dtype = DType::other;
  std::vector<int64_t> shape;
  const uint8_t* ptr = nullptr;
  size_t nbytes = 0;
};

std::map<std::string, StEntry> parse_safetensors(const MappedFile& f) {
  std::map<std::string, StEntry> out;
  for (auto& [name, e] : mantis::parse_safetensors(f.data(), f.size(), f.path())) {
    DType kind = DType::other;
    for (auto& d : kDTypes)
      if (e.dtype == d.name) kind = d.kind;
    out.emplace(name, StEntry{e.dtype, kind, e.shape, e.ptr, e.nbytes});
  }
  return out;
}

Tensor to_tensor(const StEntry& e, const std::string& file, const std::string& name) {
  if (e.dtype == DType::other)
    throw InputError(fmt::format("{}: tensor {}: dtype {} not supported (F32, F16, BF16)", file, name, e.dtype_name));
  Tensor t;
  t.shape = e.shape;
  t.data.resize(size_t(t.numel()));
  convert(e.ptr, t.data.size(), e.dtype, t.data.data());
  return t;
}

// ---------------------------------------------------------------------------------------------
// JSON configs

json read_json(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) throw InputError(fmt::format("{}: no such file", p.string()));
  const std::string text = read_text_file(p.string(), "JSON file");  // a special file is named there
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number such as 1e999
    throw InputError(fmt::format("{}: not valid JSON: {}", p.string(), e.what()));
  }
  if (!j.is_object()) throw InputError(fmt::format("{}: not a JSON object", p.string()));
  return j;
}

int get_int(const json& j, const std::string& key) {
  if (!j.contains(key)) throw InputError(fmt::format("key \"{}\" missing", key));
  const json& v = j.at(key);
  if (!v.is_number_integer()) throw InputError(fmt::format("key \"{}\" must be an integer, got {}", key, v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x < INT32_MIN || x > INT32_MAX) throw InputError(fmt::format("key \"{}\" = {} out of range", key, x));
  return int(x);
}
double get_number(const json& j, const std::string& key) {
  if (!j.contains(key)) throw InputError(fmt::format("key \"{}\" missing", key));
  const json& v = j.at(key);
  if (!v.is_number()) throw InputError(fmt::format("key \"{}\" must be a number, got {}", key, v.dump()));
  return v.get<double>();
}
bool get_bool(const json& j, const std::string& key) {
  if (!j.contains(key)) throw InputError(fmt::format("key \"{}\" missing", key));
  const json& v = j.at(key);
  if (!v.is_boolean()) throw InputError(fmt::format("key \"{}\" must be true or false, got {}", key, v.dump()));
  return v.get<bool>();
}
std::string get_string(const json& j, const std::string& key) {
  if (!j.contains(key)) throw InputError(fmt::format("key \"{}\" missing", key));
  const json& v = j.at(key);
  if (!v.is_string()) throw InputError(fmt::format("key \"{}\" must be a string, got {}", key, v.dump()));
  return v.get<std::string>();
}

// GPT-2's default MLP width, saturated so that absurd headers reach validate() without overflow.
int four_times(int dim) { return int(std::clamp<int64_t>(4 * int64_t(dim), INT32_MIN, INT32_MAX)); }

// A float as the shortest decimal that reads back to the same float (else its exact double).
json float_json(float x) {
  const double d = std::stod(fmt::format("{}", x));
  return float(d) == x ? d : double(x);
}

const char* const kOwnKeys[] = {"mantis_format", "arch",      "vocab",     "ctx",  "layers",   "heads",     "kv_heads",
                                "dim",           "hidden",    "gelu_tanh", "tied", "norm_eps", "rope_theta"};

ModelConfig own_config(const json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (std::none_of(std::begin(kOwnKeys), std::end(kOwnKeys), [&](const char* s) { return k == s; }))
      throw InputError(fmt::format("unknown key \"{}\"", k));
  }
  const int version = get_int(j, "mantis_format");
  if (version != 1) throw InputError(fmt::format("mantis_format {} not supported (this build reads 1)", version));
  ModelConfig c;
  const std::string arch = get_string(j, "arch");
  if (arch == "gpt2") c.arch = Arch::gpt2;
  else if (arch == "llama") c.arch = Arch::llama;
  else throw InputError(fmt::format("arch \"{}\" unknown (gpt2, llama)", arch));
  c.vocab = get_int(j, "vocab");
  c.ctx = get_int(j, "ctx");
  c.layers = get_int(j, "layers");
  c.heads = get_int(j, "heads");
  c.kv_heads = get_int(j, "kv_heads");
  c.dim = get_int(j, "dim");
  c.hidden = get_int(j, "hidden");
  c.gelu_tanh = get_bool(j, "gelu_tanh");
  c.tied = get_bool(j, "tied");
  c.norm_eps = float(get_number(j, "norm_eps"));
  c.rope_theta = float(get_number(j, "rope_theta"));
  validate(c);
  return c;
}

// In the documented key order (kOwnKeys).
nlohmann::ordered_json own_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["mantis_format"] = 1;
  j["arch"] = arch_name(c.arch);
  j["vocab"] = c.vocab;
  j["ctx"] = c.ctx;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["kv_heads"] = c.kv_heads;
  j["dim"] = c.dim;
  j["hidden"] = c.hidden;
  j["gelu_tanh"] = c.gelu_tanh;
  j["tied"] = c.tied;
  j["norm_eps"] = float_json(c.norm_eps);
  j["rope_theta"] = float_json(c.rope_theta);
  return j;
}

ModelConfig hf_gpt2_config(const json& j) {
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw InputError(fmt::format("model_type {} not supported (Hugging Face: gpt2 only)", j["model_type"].dump()));
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.dim = get_int(j, "n_embd");
  c.layers = get_int(j, "n_layer");
  c.heads = c.kv_heads = get_int(j, "n_head");
  c.vocab = get_int(j, "vocab_size");
  c.ctx = j.contains("n_positions") ? get_int(j, "n_positions") : get_int(j, "n_ctx");
  c.hidden = (!j.contains("n_inner") || j["n_inner"].is_null()) ? four_times(c.dim) : get_int(j, "n_inner");
  const std::string act = j.contains("activation_function") ? get_string(j, "activation_function") : "gelu_new";
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.gelu_tanh = true;
  else if (act == "gelu") c.gelu_tanh = false;
  else throw InputError(fmt::format("activation_function \"{}\" not supported (gelu_new, gelu_pytorch_tanh, gelu)", act));
  c.norm_eps = j.contains("layer_norm_epsilon") ? float(get_number(j, "layer_norm_epsilon")) : 1e-5f;
  c.tied = true;
  if (j.contains("tie_word_embeddings")) get_bool(j, "tie_word_embeddings");  // type-checked here, used by the reader
  // Options that change the computation and that the simulator does not implement.
  // (a flag given as a string, "true", is an error, not silently the default)
  auto flag = [&](const char* k, bool dflt) { return j.contains(k) ? get_bool(j, k) : dflt; };
  if (flag("scale_attn_by_inverse_layer_idx", false))
    throw InputError("scale_attn_by_inverse_layer_idx = true not supported");
  if (!flag("scale_attn_weights", true)) throw InputError("scale_attn_weights = false not supported");
  if (flag("add_cross_attention", false)) throw InputError("add_cross_attention = true not supported");
  validate(c);
  return c;
}

// A key present with a value other than null (Hugging Face writes unset options as null).
bool has_value(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// Hugging Face LlamaConfig / MistralConfig. Keys with a documented transformers default
// (num_key_value_heads = heads, rope_theta 10000, tie_word_embeddings false) take it when absent;
// every option that changes the computation and that the LLaMA graph does not implement is refused.
ModelConfig hf_llama_config(const json& j) {
  const std::string type = get_string(j, "model_type");
  if (type != "llama" && type != "mistral")
    throw InputError(fmt::format("model_type \"{}\" is not a LLaMA-family config (llama, mistral)", type));
  ModelConfig c;
  c.arch = Arch::llama;
  c.dim = get_int(j, "hidden_size");
  c.hidden = get_int(j, "intermediate_size");
  c.heads = get_int(j, "num_attention_heads");
  c.kv_heads = has_value(j, "num_key_value_heads") ? get_int(j, "num_key_value_heads") : c.heads;
  c.layers = get_int(j, "num_hidden_layers");
  c.vocab = get_int(j, "vocab_size");
  c.ctx = get_int(j, "max_position_embeddings");
  c.norm_eps = float(get_number(j, "rms_norm_eps"));
  c.rope_theta = has_value(j, "rope_theta") ? float(get_number(j, "rope_theta")) : 10000.0f;
  c.tied = has_value(j, "tie_word_embeddings") ? get_bool(j, "tie_word_embeddings") : false;
  c.gelu_tanh = false;
  const std::string act = get_string(j, "hidden_act");
  if (act != "silu") throw InputError(fmt::format("hidden_act \"{}\" not supported (silu: LLaMA's SwiGLU)", act));
  if (has_value(j, "rope_scaling"))
    throw InputError(fmt::format("rope_scaling {} not supported (mantis's RoPE is unscaled: null only)",
                                 j.at("rope_scaling").dump()));
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (has_value(j, k) && get_bool(j, k)) throw InputError(fmt::format("{} = true not supported (no biases)", k));
  if (has_value(j, "head_dim")) {
    const int hd = get_int(j, "head_dim");
    if (c.heads <= 0 || int64_t(hd) * c.heads != c.dim)
      throw InputError(fmt::format("head_dim {} not supported: mantis's head size is hidden_size / "
                                   "num_attention_heads = {} / {}", hd, c.dim, c.heads));
  }
  // Sliding-window attention over a window at least as long as the sequence is full causal
  // attention: the context is capped to the window, so every sequence mantis runs is exact.
  if (has_value(j, "sliding_window")) {
    const int w = get_int(j, "sliding_window");
    if (w <= 0) throw InputError(fmt::format("sliding_window {} must be positive (or null)", w));
    c.ctx = std::min(c.ctx, w);
  }
  validate(c);
  return c;
}

// Which config a config.json is: the project's own, Hugging Face GPT-2, or Hugging Face LLaMA.
enum class ConfigKind { own, hf_gpt2, hf_llama };
ConfigKind config_kind(const json& j, const std::string& file) {
  if (j.contains("mantis_format")) return ConfigKind::own;
  if (j.contains("model_type")) {
    const json& t = j["model_type"];
    if (t == "gpt2") return ConfigKind::hf_gpt2;
    if (t == "llama" || t == "mistral") return ConfigKind::hf_llama;
    throw InputError(fmt::format("{}: model_type {} not supported (Hugging Face: gpt2, llama, mistral)", file,
                                 t.dump()));
  }
  if (j.contains("n_embd")) return ConfigKind::hf_gpt2;
  throw InputError(fmt::format("{}: neither a mantis config (\"mantis_format\") nor a Hugging Face config "
                               "(\"model_type\": gpt2, llama or mistral)", file));
}

// Hugging Face LLaMA's tensor names for ours; `rope_heads` > 0: the rows are q or k of that many
// heads, stored in HF's rotate_half order (rope_rows).
struct HfName {
  std::string hf, ours;
  int rope_heads = 0;
};
std::vector<HfName> hf_llama_names(const ModelConfig& c) {
  std::vector<HfName> v = {{"model.embed_tokens.weight", "tok_embeddings"}};
  for (int l = 0; l < c.layers; ++l) {
    const std::string h = fmt::format("model.layers.{}.", l), o = fmt::format("layers.{}.", l);
    v.push_back({h + "input_layernorm.weight", o + "attention_norm"});
    v.push_back({h + "self_attn.q_proj.weight", o + "attention.wq", c.heads});
    v.push_back({h + "self_attn.k_proj.weight", o + "attention.wk", c.kv_heads});
    v.push_back({h + "self_attn.v_proj.weight", o + "attention.wv"});
    v.push_back({h + "self_attn.o_proj.weight", o + "attention.wo"});
    v.push_back({h + "post_attention_layernorm.weight", o + "ffn_norm"});
    v.push_back({h + "mlp.gate_proj.weight", o + "feed_forward.w1"});
    v.push_back({h + "mlp.up_proj.weight", o + "feed_forward.w3"});
    v.push_back({h + "mlp.down_proj.weight", o + "feed_forward.w2"});
  }
  v.push_back({"model.norm.weight", "norm"});
  if (!c.tied) v.push_back({"lm_head.weight", "output"});
  return v;
}

// RoPE's two conventions. mantis (Meta, llama2.c) rotates the consecutive pairs (x[2i], x[2i+1])
// of a head; Hugging Face's rotate_half pairs x[i] with x[i + HS/2], and its conversion script
// (convert_llama_weights_to_hf.py, permute) reorders the rows of q_proj and k_proj so that the
// same weights compute the same attention: HF row h·HS + p·HS/2 + i is Meta row h·HS + 2i + p
// (head h, pair i, member p). Scores q·k are sums over a head's rows, so they are unchanged.
Tensor rope_rows(const Tensor& t, int heads, bool to_hf) {
  const int64_t rows = t.shape[0], cols = t.shape[1], HS = rows / heads;
  Tensor u;
  u.shape = t.shape;
  u.data.resize(t.data.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < HS / 2; ++i)
      for (int64_t p = 0; p < 2; ++p) {
        const int64_t meta = h * HS + 2 * i + p, hf = h * HS + p * (HS / 2) + i;
        const int64_t from = to_hf ? meta : hf, to = to_hf ? hf : meta;
        std::copy_n(t.data.begin() + from * cols, cols, u.data.begin() + to * cols);
      }
  return u;
}

// ---------------------------------------------------------------------------------------------
// Weight files

// A tensor as floats, refusing NaN and infinity under the file's own name for it (the model's
// validate() would name the converted tensor, which a Hugging Face user does not know).
Tensor finite_tensor(const StEntry& e, const std::string& file, const std::string& name) {
  Tensor t = to_tensor(e, file, name);
  for (size_t i = 0; i < t.data.size(); ++i)
    if (!std::isfinite(t.data[i]))
      throw InputError(fmt::format("{}: tensor {}: non-finite value {} at flat index {}", file, name, t.data[i], i));
  return t;
}

// The safetensors files of a checkpoint: DIR/model.safetensors, or the shards that
// DIR/model.safetensors.index.json maps (Hugging Face's sharded layout); every tensor with the
// file that holds it.
struct WeightFiles {
  std::vector<std::unique_ptr<MappedFile>> files;
  std::map<std::string, StEntry> entries;
  std::map<std::string, std::string> file_of;  // tensor → the path of its file
  std::string where;                            // the single file, or the index: for messages
  const std::string& file(const std::string& tensor) const { return file_of.at(tensor); }
};

WeightFiles open_single(const fs::path& path) {
  WeightFiles w;
  w.where = path.string();
  w.files.push_back(std::make_unique<MappedFile>(w.where));
  w.entries = parse_safetensors(*w.files.back());
  for (auto& [name, e] : w.entries) w.file_of[name] = w.where;
  return w;
}

// Every mapped tensor must lie in its shard, and every tensor of a shard must be mapped there;
// shard names are file names inside DIR (no path: an index cannot point outside its checkpoint).
WeightFiles open_sharded(const fs::path& index) {
  const std::string ix = index.string();
  const json j = read_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(fmt::format("{}: key \"weight_map\" missing or not an object of tensor -> shard file", ix));
  WeightFiles w;
  w.where = ix;
  std::map<std::string, std::vector<std::string>> by_shard;  // shard → its tensors
  for (auto& [tensor, v] : j["weight_map"].items()) {
    if (!v.is_string())
      throw InputError(fmt::format("{}: weight_map: tensor {}: shard must be a file name, got {}", ix, tensor, v.dump()));
    const std::string shard = v.get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos)
      throw InputError(fmt::format("{}: weight_map: tensor {}: shard \"{}\" is not a file name in {}", ix, tensor,
                                   shard, index.parent_path().string()));
    by_shard[shard].push_back(tensor);
  }
  if (by_shard.empty()) throw InputError(fmt::format("{}: weight_map is empty", ix));
  for (auto& [shard, tensors] : by_shard) {
    const std::string path = (index.parent_path() / shard).string();
    w.files.push_back(std::make_unique<MappedFile>(path));
    auto entries = parse_safetensors(*w.files.back());
    const std::set<std::string> mapped(tensors.begin(), tensors.end());
    for (auto& [name, e] : entries) {
      if (!mapped.count(name)) {
        auto other = j["weight_map"].find(name);
        throw InputError(other == j["weight_map"].end()
                             ? fmt::format("{}: tensor {}: not in {}'s weight_map", path, name, ix)
                             : fmt::format("{}: tensor {}: {} maps it to {}", path, name, ix, other->dump()));
      }
      w.file_of[name] = path;
      w.entries.emplace(name, e);
    }
    for (auto& t : tensors)
      if (!entries.count(t))
        throw InputError(fmt::format("{}: tensor {}: mapped to {}, which does not hold it", ix, t, shard));
  }
  return w;
}

// WEIGHTS: a safetensors file; when it is the default DIR/model.safetensors and absent, the
// sharded layout in DIR (as transformers: a single file first).
WeightFiles open_weights(const fs::path& weights) {
  std::error_code ec;
  if (fs::exists(weights, ec)) return open_single(weights);  // a special file is named by MappedFile
  const fs::path dir = weights.parent_path();
  if (weights.filename() == kWeightsName && fs::exists(dir / kIndexName, ec)) return open_sharded(dir / kIndexName);
  if (fs::exists(dir / "pytorch_model.bin", ec))
    throw InputError(fmt::format("{}: no {}; pytorch_model.bin (pickle) is not read, convert it to safetensors",
                                 dir.string(), kWeightsName));
  throw InputError(fmt::format("{}: no such file (nor {})", weights.string(), kIndexName));
}

// ---------------------------------------------------------------------------------------------
// Readers

Model finish(Model m, const std::string& where) {
  prefixed(where, [&] { validate(m); });
  return m;
}

// Refuses a configuration with far more tensors than the file holds before its tensor list
// (proportional to layers) is built: a 100 KB file whose config.json claims 16777216 layers. A
// near miss is left to the per-tensor checks, whose messages name the tensor.
void check_fits(const ModelConfig& c, const std::map<std::string, StEntry>& entries, const std::string& config_file,
                const std::string& weights_file) {
  const ParameterCount need = parameter_count(c);
  if (need.tensors > 2 * int64_t(entries.size()) + 16) {
    int64_t values = 0;  // no overflow: every tensor's values lie in its own bytes of the file
    for (auto& [name, e] : entries) values += checked_numel(e.shape);
    throw InputError(fmt::format("{}: the configuration (layers {}, dim {}, hidden {}, vocab {}, ctx {}) needs {} "
                                 "tensors of {} values, but {} holds {} tensors of {} values", config_file, c.layers,
                                 c.dim, c.hidden, c.vocab, c.ctx, need.tensors, need.values, weights_file,
                                 entries.size(), values));
  }
}

Model load_own(const json& j, const std::string& config_file, const fs::path& weights) {
  Model m;
  m.cfg = prefixed(config_file, [&] { return own_config(j); });
  const WeightFiles w = open_weights(weights);
  check_fits(m.cfg, w.entries, config_file, w.where);
  for (auto& [name, e] : w.entries) m.params[name] = to_tensor(e, w.file(name), name);
  return finish(std::move(m), w.where);
}

Model load_hf_gpt2(const json& j, const std::string& config_file, const fs::path& weights) {
  Model m;
  m.cfg = prefixed(config_file, [&] { return hf_gpt2_config(j); });
  const WeightFiles w = open_weights(weights);
  const auto& entries = w.entries;
  const std::string& weights_file = w.where;
  check_fits(m.cfg, entries, config_file, weights_file);
  std::map<std::string, std::vector<int64_t>> expected;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) expected[name] = shape;

  static const std::set<std::string> conv1d = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                               "mlp.c_proj.weight"};
  std::map<std::string, std::string> source;  // our name → the file's name
  const StEntry* lm_head = nullptr;
  std::string lm_head_name;
  for (auto& [file_name, e] : entries) {
    std::string n = file_name;
    if (n.starts_with("transformer.")) n = n.substr(12);
    if (n == "lm_head.weight") {
      lm_head = &e;
      lm_head_name = file_name;
      continue;
    }
    // "h.<layer>.<rest>"
    std::string rest;
    bool in_layer = false;
    if (n.starts_with("h.")) {
      size_t i = 2;
      while (i < n.size() && n[i] >= '0' && n[i] <= '9') ++i;
      in_layer = i > 2 && i + 1 < n.size() && n[i] == '.';
      if (in_layer) rest = n.substr(i + 1);
    }
    if (in_layer && (rest == "attn.bias" || rest == "attn.masked_bias")) continue;  // causal-mask buffers
    std::string ours = n;
    if (n == "wte.weight") ours = "wte";
    else if (n == "wpe.weight") ours = "wpe";
    auto it = expected.find(ours);
    if (it == expected.end())
      throw InputError(fmt::format("{}: tensor {}: unexpected in a GPT-2 checkpoint with n_layer {}",
                                   w.file(file_name), file_name, m.cfg.layers));
    if (source.count(ours))
      throw InputError(fmt::format("{}: tensors {} and {} both give {}", weights_file, source[ours], file_name, ours));
    source[ours] = file_name;
    const bool transpose = in_layer && conv1d.count(rest);
    std::vector<int64_t> want = it->second;
    if (transpose) std::reverse(want.begin(), want.end());
    if (e.shape != want)
      throw InputError(fmt::format("{}: tensor {}: shape {}, expected {}{}", w.file(file_name), file_name,
                                   shape_str(e.shape), shape_str(want), transpose ? " (Conv1D [in,out])" : ""));
    Tensor t = to_tensor(e, w.file(file_name), file_name);
    if (transpose) {
      const int64_t in = t.shape[0], out = t.shape[1];
      Tensor u;
      u.shape = {out, in};
      u.data.resize(t.data.size());
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < out; ++o) u.data[size_t(o * in + i)] = t.data[size_t(i * out + o)];
      t = std::move(u);
    }
    m.params[ours] = std::move(t);
  }
  if (lm_head) {
    auto wte = m.params.find("wte");
    const Tensor head = to_tensor(*lm_head, w.file(lm_head_name), lm_head_name);
    if (wte == m.params.end() || head.shape != wte->second.shape || head.data != wte->second.data)
      throw InputError(fmt::format("{}: tensor lm_head.weight differs from wte (gpt2 ties the output projection "
                                   "to the token embedding)", weights_file));
  } else if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].get<bool>()) {
    throw InputError(fmt::format("{}: tie_word_embeddings = false but no lm_head.weight", config_file));
  }
  for (auto& [name, shape] : expected)
    if (!m.params.count(name))
      throw InputError(fmt::format("{}: tensor {}: missing (looked for {}{} with or without the transformer. prefix)",
                                   weights_file, name, name, name == "wte" || name == "wpe" ? ".weight" : ""));
  return finish(std::move(m), weights_file);
}

Model load_hf_llama(const json& j, const std::string& config_file, const fs::path& weights) {
  Model m;
  m.cfg = prefixed(config_file, [&] { return hf_llama_config(j); });
  const WeightFiles w = open_weights(weights);
  check_fits(m.cfg, w.entries, config_file, w.where);
  std::map<std::string, std::vector<int64_t>> shape;
  for (auto& [name, s] : parameter_shapes(m.cfg)) shape[name] = s;
  std::map<std::string, HfName> by_hf;
  for (auto& n : hf_llama_names(m.cfg)) by_hf[n.hf] = n;
  for (auto& [name, e] : w.entries) {
    const std::string& file = w.file(name);
    // RoPE's inverse frequencies, a buffer older transformers saved: recomputed from rope_theta.
    if (name.starts_with("model.layers.") && name.ends_with(".self_attn.rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && m.cfg.tied) {  // tied: must be the embedding itself
      const auto emb = w.entries.find("model.embed_tokens.weight");
      const Tensor head = finite_tensor(e, file, name);
      if (emb == w.entries.end() || head.shape != emb->second.shape ||
          head.data != to_tensor(emb->second, w.file(emb->first), emb->first).data)
        throw InputError(fmt::format("{}: tensor lm_head.weight differs from model.embed_tokens.weight, but {} says "
                                     "tie_word_embeddings = true", file, config_file));
      continue;
    }
    const auto it = by_hf.find(name);
    if (it == by_hf.end())
      throw InputError(fmt::format("{}: tensor {}: unexpected in a LLaMA checkpoint with num_hidden_layers {}{}", file,
                                   name, m.cfg.layers, m.cfg.tied ? ", tie_word_embeddings true" : ""));
    const HfName& n = it->second;
    if (e.shape != shape.at(n.ours))
      throw InputError(fmt::format("{}: tensor {}: shape {}, expected {}", file, name, shape_str(e.shape),
                                   shape_str(shape.at(n.ours))));
    Tensor t = finite_tensor(e, file, name);
    m.params[n.ours] = n.rope_heads ? rope_rows(t, n.rope_heads, false) : std::move(t);
  }
  for (auto& n : hf_llama_names(m.cfg))
    if (!m.params.count(n.ours))
      throw InputError(fmt::format("{}: tensor {}: missing{}", w.where, n.hf,
                                   n.hf == "lm_head.weight" ? " (tie_word_embeddings is false)" : ""));
  return finish(std::move(m), w.where);
}

// config.json decides: the project's own format ("mantis_format"), Hugging Face GPT-2 or LLaMA.
Model load_with_config(const fs::path& config, const fs::path& weights) {
  const json j = read_json(config);
  const std::string cf = config.string();
  switch (config_kind(j, cf)) {
    case ConfigKind::own: return load_own(j, cf, weights);
    case ConfigKind::hf_gpt2: return load_hf_gpt2(j, cf, weights);
    case ConfigKind::hf_llama: return load_hf_llama(j, cf, weights);
  }
  throw std::logic_error("config_kind");
}

Model load_llmc(const MappedFile& f) {
  const std::string& file = f.path();
  if (f.size() < 1024)
    throw InputError(fmt::format("{}: truncated llm.c checkpoint: {} bytes, the header alone is 1024", file, f.size()));
  const uint8_t* p = f.data();
  auto h = [&](int i) { return rd_i32(p + 4 * i); };
  const int version = h(1);
  if (version != 3 && version != 5)
    throw InputError(fmt::format("{}: llm.c checkpoint version {} not supported (3 = fp32, 5 = bf16)", file, version));
  const DType dt = version == 3 ? DType::f32 : DType::bf16;
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.ctx = h(2);
  c.vocab = h(3);
  c.layers = h(4);
  c.heads = c.kv_heads = h(5);
  c.dim = h(6);
  c.hidden = four_times(c.dim);
  c.gelu_tanh = true;
  c.tied = true;
  const int Vp = h(7);
  prefixed(fmt::format("{}: llm.c header", file), [&] { validate(c); });
  if (Vp < c.vocab || Vp > (1 << 24))
    throw InputError(fmt::format("{}: llm.c header: padded vocab {} is below vocab {} or absurd", file, Vp, c.vocab));
  const int64_t V = c.vocab, T = c.ctx, L = c.layers, C = c.dim, H = c.hidden;
  const __int128 Vp_ = Vp, T_ = T, L_ = L, C_ = C, H_ = H;  // no overflow for any header values
  const __int128 count = Vp_ * C_ + T_ * C_ + L_ * (9 * C_ + 4 * C_ * C_ + H_ * C_ + H_ + C_ * H_) + 2 * C_;
  const __int128 want = 1024 + count * dtype_size(dt);
  if (__int128(f.size()) != want)
    throw InputError(fmt::format("{}: {}: {} bytes, expected {} for an llm.c {} checkpoint (vocab {} padded {}, ctx {}, "
                                 "layers {}, heads {}, dim {})", file,
                                 __int128(f.size()) < want ? "truncated" : "wrong size", f.size(), int64_t(want),
                                 version == 3 ? "fp32" : "bf16", V, Vp, T, L, c.heads, C));
  Model m;
  m.cfg = c;
  Stream s{p + 1024, dt};
  m.params["wte"] = s.take({V, C});
  s.skip((Vp - V) * C);  // padding rows
  m.params["wpe"] = s.take({T, C});
  auto per_layer = [&](const char* name, std::vector<int64_t> shape) {
    for (int l = 0; l < c.layers; ++l) m.params[fmt::format("h.{}.{}", l, name)] = s.take(shape);
  };
  per_layer("ln_1.weight", {C});
  per_layer("ln_1.bias", {C});
  per_layer("attn.c_attn.weight", {3 * C, C});
  per_layer("attn.c_attn.bias", {3 * C});
  per_layer("attn.c_proj.weight", {C, C});
  per_layer("attn.c_proj.bias", {C});
  per_layer("ln_2.weight", {C});
  per_layer("ln_2.bias", {C});
  per_layer("mlp.c_fc.weight", {H, C});
  per_layer("mlp.c_fc.bias", {H});
  per_layer("mlp.c_proj.weight", {C, H});
  per_layer("mlp.c_proj.bias", {C});
  m.params["ln_f.weight"] = s.take({C});
  m.params["ln_f.bias"] = s.take({C});
  return finish(std::move(m), file);
}

Model load_llama2c(const MappedFile& f, int32_t first_word) {
  const std::string& file = f.path();
  const std::string not_llmc = fmt::format("no llm.c magic {} (first int32 is {})", kLlmcMagic, first_word);
  if (f.size() < 28)
    throw InputError(fmt::format("{}: not a checkpoint: {} bytes, too short for a llama2.c header (28); {}", file,
                                 f.size(), not_llmc));
  const uint8_t* p = f.data();
  const int32_t dim = rd_i32(p), hidden = rd_i32(p + 4), layers = rd_i32(p + 8), heads = rd_i32(p + 12),
                kv = rd_i32(p + 16), vocab = rd_i32(p + 20), seq = rd_i32(p + 24);
  const std::string header = fmt::format("dim {}, hidden {}, layers {}, heads {}, kv_heads {}, vocab {}, seq_len {}",
                                         dim, hidden, layers, heads, kv, vocab, seq);
  ModelConfig c;
  c.arch = Arch::llama;
  c.dim = dim;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv;
  c.vocab = vocab == INT32_MIN ? 0 : std::abs(vocab);
  c.ctx = seq;
  c.tied = vocab > 0;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  try {
    validate(c);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: not a llama2.c checkpoint: header ({}) is invalid: {}; {}", file, header,
                                 e.what(), not_llmc));
  }
  const int64_t V = c.vocab, T = c.ctx, L = c.layers, C = c.dim, H = c.hidden, HS = c.head_size(),
                KV = int64_t(c.kv_heads) * HS;
  const __int128 V_ = V, T_ = T, L_ = L, C_ = C, H_ = H, KV_ = KV;  // no overflow for any header values
  const __int128 count = V_ * C_ + L_ * (2 * C_ + 2 * C_ * C_ + 2 * KV_ * C_ + 3 * H_ * C_) + C_ + 2 * T_ * (HS / 2) +
                         (c.tied ? 0 : V_ * C_);
  const __int128 want = 28 + 4 * count;
  if (__int128(f.size()) != want)
    throw InputError(fmt::format("{}: not a llama2.c checkpoint: size {} bytes, expected {} for header ({}); {}", file,
                                 f.size(), int64_t(std::min<__int128>(want, INT64_MAX)), header, not_llmc));
  Model m;
  m.cfg = c;
  Stream s{p + 28, DType::f32};
  m.params["tok_embeddings"] = s.take({V, C});
  auto per_layer = [&](const char* name, std::vector<int64_t> shape) {
    for (int l = 0; l < c.layers; ++l) m.params[fmt::format("layers.{}.{}", l, name)] = s.take(shape);
  };
  per_layer("attention_norm", {C});
  per_layer("attention.wq", {C, C});
  per_layer("attention.wk", {KV, C});
  per_layer("attention.wv", {KV, C});
  per_layer("attention.wo", {C, C});
  per_layer("ffn_norm", {C});
  per_layer("feed_forward.w1", {H, C});
  per_layer("feed_forward.w2", {C, H});
  per_layer("feed_forward.w3", {H, C});
  m.params["norm"] = s.take({C});
  s.skip(2 * T * (HS / 2));  // freq_cis_real, freq_cis_imag: recomputed from rope_theta
  if (!c.tied) m.params["output"] = s.take({V, C});
  return finish(std::move(m), file);
}

// What a file with an llm.c-family magic holds when it is not a model.
const char* llmc_other(int32_t magic) {
  switch (magic) {
    case 20240327: return "an llm.c debug state";
    case 20240328: return "an llm.c tokenizer";
    case 20240520: return "an llm.c token shard";
    case 20240522: return "an llm.c eval file";
    case 20240527: return "an llm.c training state";
    case 20240801: return "an llm.c LLaMA-3 token shard";
    default: return nullptr;
  }
}

Model load_file(const fs::path& path) {
  const std::string file = path.string();
  if (path.extension() == ".safetensors") return load_with_config(path.parent_path() / kConfigName, path);
  if (path.filename() == kConfigName || path.filename() == kIndexName)
    return load_with_config(path.parent_path() / kConfigName, path.parent_path() / kWeightsName);
  MappedFile f(file);
  if (f.size() == 0) throw InputError(fmt::format("{}: empty file, not a checkpoint", file));
  const int32_t magic = f.size() >= 4 ? rd_i32(f.data()) : 0;
  if (magic == kLlmcMagic) return load_llmc(f);
  if (const char* what = llmc_other(magic))
    throw InputError(fmt::format("{}: {} (magic {}), not a model checkpoint (magic {})", file, what, magic, kLlmcMagic));
  if (f.size() >= 4 && std::memcmp(f.data(), "ak42", 4) == 0)
    throw InputError(fmt::format("{}: llama2.c export version 1/2 (magic \"ak42\") not supported; export with "
                                 "--version 0 (legacy)", file));
  // safetensors without the extension: a plausible header length followed by '{'.
  if (f.size() >= 10 && rd_u64(f.data()) <= f.size() - 8 && f.data()[8] == '{')
    return load_with_config(path.parent_path() / kConfigName, path);
  return load_llama2c(f, magic);
}

}  // namespace

Model load_model(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  const auto st = fs::status(p, ec);
  if (!fs::exists(st)) throw InputError(fmt::format("{}: no such file or directory", path));
  if (fs::is_directory(st)) {
    if (!fs::exists(p / kConfigName, ec))
      throw InputError(fmt::format("{}: no {} (a checkpoint directory holds {} + {})", path, kConfigName, kConfigName,
                                   kWeightsName));
    return load_with_config(p / kConfigName, p / kWeightsName);
  }
  return load_file(p);
}

std::string model_sha256(const Model& m) {
  const ModelConfig& c = m.cfg;
  std::string text = fmt::format("mantis model v1\n{} {} {} {} {} {} {} {} {} {} {:08x} {:08x}\n", arch_name(c.arch),
                                 c.vocab, c.ctx, c.layers, c.heads, c.kv_heads, c.dim, c.hidden, int(c.gelu_tanh),
                                 int(c.tied), std::bit_cast<uint32_t>(c.norm_eps), std::bit_cast<uint32_t>(c.rope_theta));
  for (auto& [name, shape] : parameter_shapes(c)) {
    const auto& d = m.params.at(name).data;
    text += fmt::format("{} {} {}\n", name, shape_str(shape),
                        sha256_hex(std::string_view(reinterpret_cast<const char*>(d.data()), d.size() * 4)));
  }
  return sha256_hex(text);
}

std::string model_config_json(const ModelConfig& c) { return own_config_json(c).dump(2) + "\n"; }

ModelConfig load_model_config(const std::string& path) {
  const json j = read_json(path);
  switch (config_kind(j, path)) {
    case ConfigKind::own: return prefixed(path, [&] { return own_config(j); });
    case ConfigKind::hf_gpt2: return prefixed(path, [&] { return hf_gpt2_config(j); });
    case ConfigKind::hf_llama: return prefixed(path, [&] { return hf_llama_config(j); });
  }
  throw std::logic_error("config_kind");
}

namespace {
// DIR, created if needed, for a checkpoint's files.
fs::path output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) throw InputError(fmt::format("cannot create directory {}: {}", dir, ec.message()));
  return fs::path(dir);
}
}  // namespace

void save_model(const Model& m, const std::string& dir) {
  validate(m);
  const fs::path d = output_dir(dir);

  // tensors in parameter_shapes order, contiguous F32 data (io/safetensors.h)
  std::vector<TensorView> views;
  for (auto& [name, shape] : parameter_shapes(m.cfg)) views.push_back({name, shape, m.params.at(name).data});
  const std::string config = model_config_json(m.cfg);
  write_f32_tensors((d / kWeightsName).string(), views, {{"format", "mantis"}, {"mantis_format", "1"}});
  // weights first: config.json marks a complete pair
  write_file_atomic((d / kConfigName).string(), config);
}

namespace {

// The config.json transformers reads for this model (GPT2LMHeadModel / LlamaForCausalLM).
nlohmann::ordered_json hf_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  if (c.arch == Arch::gpt2) {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab;
    j["n_positions"] = c.ctx;
    j["n_ctx"] = c.ctx;
    j["n_embd"] = c.dim;
    j["n_layer"] = c.layers;
    j["n_head"] = c.heads;
    j["n_inner"] = c.hidden == four_times(c.dim) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.hidden);
    j["activation_function"] = c.gelu_tanh ? "gelu_new" : "gelu";
    j["layer_norm_epsilon"] = float_json(c.norm_eps);
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = c.vocab;
    j["max_position_embeddings"] = c.ctx;
    j["hidden_size"] = c.dim;
    j["intermediate_size"] = c.hidden;
    j["num_hidden_layers"] = c.layers;
    j["num_attention_heads"] = c.heads;
    j["num_key_value_heads"] = c.kv_heads;
    j["head_dim"] = c.head_size();
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = float_json(c.norm_eps);
    j["rope_theta"] = float_json(c.rope_theta);
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["tie_word_embeddings"] = c.tied;
  }
  j["torch_dtype"] = "float32";
  return j;
}

}  // namespace

std::string hf_config_json_text(const ModelConfig& c) { return hf_config_json(c).dump(2) + "\n"; }

void save_model_hf(const Model& m, const std::string& dir) {
  validate(m);
  const fs::path d = output_dir(dir);

  std::vector<TensorView> views;
  std::vector<Tensor> converted;  // the tensors whose layout differs from ours (kept alive for views)
  converted.reserve(m.params.size());
  if (m.cfg.arch == Arch::gpt2) {
    // GPT2LMHeadModel's state dict: the transformer. prefix, Conv1D weights [in, out], the tied
    // lm_head left out (as save_pretrained does).
    for (auto& [name, shape] : parameter_shapes(m.cfg)) {
      const Tensor& t = m.params.at(name);
      const bool conv1d = shape.size() == 2 && name.starts_with("h.");
      const std::string hf = "transformer." + (name == "wte" || name == "wpe" ? name + ".weight" : name);
      if (!conv1d) {
        views.push_back({hf, shape, t.data});
        continue;
      }
      const int64_t out = shape[0], in = shape[1];
      Tensor u;
      u.shape = {in, out};
      u.data.resize(t.data.size());
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) u.data[size_t(i * out + o)] = t.data[size_t(o * in + i)];
      converted.push_back(std::move(u));
      views.push_back({hf, converted.back().shape, converted.back().data});
    }
  } else {
    for (const HfName& n : hf_llama_names(m.cfg)) {
      const Tensor& t = m.params.at(n.ours);
      if (!n.rope_heads) {
        views.push_back({n.hf, t.shape, t.data});
        continue;
      }
      converted.push_back(rope_rows(t, n.rope_heads, true));
      views.push_back({n.hf, converted.back().shape, converted.back().data});
    }
  }
  const std::string config = hf_config_json_text(m.cfg);
  // transformers reads safetensors only with __metadata__ format "pt"
  write_f32_tensors((d / kWeightsName).string(), views, {{"format", "pt"}});
  write_file_atomic((d / kConfigName).string(), config);  // weights first: config.json marks a complete pair
}

}  // namespace mantis
