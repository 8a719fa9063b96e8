#include "io/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace mantis {

namespace {

using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

uint64_t rd_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

struct DTypeInfo {
  const char* name;
  int size;
};
// Every dtype the safetensors spec names, so sizes can be checked even for tensors not read.
constexpr DTypeInfo kDTypes[] = {{"F32", 4},     {"F16", 2},     {"BF16", 2},    {"F64", 8},     {"I64", 8},
                                 {"U64", 8},     {"I32", 4},     {"U32", 4},     {"I16", 2},     {"U16", 2},
                                 {"I8", 1},      {"U8", 1},      {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1},
                                 {"C64", 8},     {"F8_E8M0", 1}};

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

}  // namespace

std::map<std::string, SafetensorsEntry> parse_safetensors(const uint8_t* data, size_t size, const std::string& file) {
  if (size < 8) throw InputError(fmt::format("{}: truncated: {} bytes, a safetensors file needs at least 8", file, size));
  const uint64_t n = rd_u64(data);
  if (n > size - 8)
    throw InputError(fmt::format("{}: safetensors header length {} exceeds the {} bytes after the 8-byte prefix "
                                 "(truncated or not a safetensors file)", file, n, size - 8));
  if (n > 100'000'000)  // the safetensors limit; keeps JSON parsing bounded
    throw InputError(fmt::format("{}: safetensors header length {} exceeds the 100 MB limit", file, n));
  const char* hb = reinterpret_cast<const char*>(data + 8);
  json h;
  try {
    h = json::parse(hb, hb + n);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number such as 1e999
    throw InputError(fmt::format("{}: safetensors header is not valid JSON: {}", file, e.what()));
  }
  if (!h.is_object()) throw InputError(fmt::format("{}: safetensors header is not a JSON object", file));
  const uint8_t* base = data + 8 + n;
  const uint64_t avail = size - 8 - n;

  std::map<std::string, SafetensorsEntry> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> range_names;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    const std::string where = fmt::format("{}: tensor {}", file, name);
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw InputError(where + ": header entry needs dtype, shape and data_offsets");
    const json &jd = v["dtype"], &js = v["shape"], &jo = v["data_offsets"];
    if (!jd.is_string()) throw InputError(where + ": dtype is not a string");
    SafetensorsEntry e;
    e.dtype = jd.get<std::string>();
    const DTypeInfo* info = nullptr;
    for (auto& d : kDTypes)
      if (e.dtype == d.name) info = &d;
    if (!info) throw InputError(fmt::format("{}: unknown dtype \"{}\" (supported: F32, F16, BF16)", where, e.dtype));
    e.dtype_size = info->size;
    if (!js.is_array()) throw InputError(where + ": shape is not an array");
    for (auto& d : js) {
      if (!d.is_number_unsigned()) throw InputError(fmt::format("{}: shape {} has a non-integer or negative entry", where, js.dump()));
      const uint64_t u = d.get<uint64_t>();
      if (u > (uint64_t(1) << 40)) throw InputError(fmt::format("{}: shape {} has an absurd dimension", where, js.dump()));
      e.shape.push_back(int64_t(u));
    }
    const int64_t numel = checked_numel(e.shape);
    if (numel < 0) throw InputError(fmt::format("{}: shape {} is too large", where, shape_str(e.shape)));
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      throw InputError(fmt::format("{}: data_offsets {} is not [begin, end]", where, jo.dump()));
    const uint64_t b = jo[0].get<uint64_t>(), en = jo[1].get<uint64_t>();
    if (b > en || en > avail)
      throw InputError(fmt::format("{}: data_offsets [{}, {}] outside the {} data bytes (truncated file?)", where, b,
                                   en, avail));
    const uint64_t want = uint64_t(numel) * uint64_t(info->size);
    if (en - b != want)
      throw InputError(fmt::format("{}: data_offsets [{}, {}] span {} bytes, but {} shape {} needs {}", where, b, en,
                                   en - b, e.dtype, shape_str(e.shape), want));
    e.ptr = base + b;
    e.nbytes = size_t(want);
    e.offset = b;
    if (en > b) {
      ranges.push_back({b, en});
      range_names.push_back(name);
    }
    out.emplace(name, std::move(e));
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second)
      throw InputError(fmt::format("{}: tensors {} and {} overlap (data_offsets [{}, {}] and [{}, {}])", file,
                                   range_names[order[i - 1]], range_names[order[i]], prev.first, prev.second,
                                   cur.first, cur.second));
  }
  return out;
}

std::vector<NamedTensor> read_f32_tensors(const std::string& path) {
  const std::string bytes = read_file(path);
  const auto entries = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  std::vector<std::pair<uint64_t, std::string>> order;
  for (auto& [name, e] : entries) {
    if (e.dtype != "F32")
      throw InputError(fmt::format("{}: tensor {}: dtype {}, expected F32 (binary32)", path, name, e.dtype));
    order.push_back({e.offset, name});
  }
  std::sort(order.begin(), order.end());
  std::vector<NamedTensor> out;
  out.reserve(order.size());
  for (auto& [off, name] : order) {
    const SafetensorsEntry& e = entries.at(name);
    NamedTensor t{name, e.shape, std::vector<float>(e.nbytes / 4)};
    if (e.nbytes) std::memcpy(t.data.data(), e.ptr, e.nbytes);
    out.push_back(std::move(t));
  }
  return out;
}

void write_f32_tensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    h["__metadata__"] = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) h["__metadata__"][k] = v;
  }
  uint64_t off = 0;
  for (auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (numel != int64_t(t.data.size()))
      throw InputError(fmt::format("{}: tensor {}: shape {} holds {} values, given {}", path, t.name,
                                   shape_str(t.shape), numel, t.data.size()));
    if (h.contains(t.name)) throw InputError(fmt::format("{}: tensor {} given twice", path, t.name));
    const uint64_t nb = uint64_t(t.data.size()) * 4;
    h[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
  std::vector<std::string_view> views = {{len, 8}, header};
  for (auto& t : tensors) views.emplace_back(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
  write_file_atomic(path, views);
}

}  // namespace mantis
