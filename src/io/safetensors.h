// safetensors — the one parser and the one writer of the safetensors container
// (https://github.com/huggingface/safetensors: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets [begin, end)}, "__metadata__": {…}}, the data bytes).
//
// parse_safetensors validates the whole header before anything is read: the length against the
// file and the 100 MB limit, the JSON, every entry's dtype (any the spec names), shape, offsets
// inside the data and spanning exactly numel × the dtype's size, and no two tensors overlapping.
// Each message names the file and, where there is one, the tensor.
//
// Named binary32 tensors (optimizer replay, exp/replay.h): read_f32_tensors refuses any dtype but
// F32 naming the tensor and returns the tensors in data-offset order (the order the file lays
// them out; the order write_f32_tensors writes them); write_f32_tensors writes F32 tensors in the
// given order, contiguous, the header padded with spaces to a multiple of 8 bytes, atomically
// (core/file.h write_file_atomic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mantis {

struct SafetensorsEntry {
  std::string dtype;            // as the header names it: "F32", "BF16", "U8", …
  int dtype_size = 0;           // bytes per element
  std::vector<int64_t> shape;
  const uint8_t* ptr = nullptr;  // into the caller's bytes
  size_t nbytes = 0;
  uint64_t offset = 0;           // data_offsets' begin
};

// DATA/SIZE: a whole safetensors file (FILE names it in messages). The entries point into DATA.
std::map<std::string, SafetensorsEntry> parse_safetensors(const uint8_t* data, size_t size, const std::string& file);

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
};

// Every tensor of PATH (F32 only), in data-offset order (ties: by name).
std::vector<NamedTensor> read_f32_tensors(const std::string& path);

// One tensor to write: a view of its values.
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;
};
// Writes PATH atomically: `metadata` (if any) as "__metadata__", then the tensors in order.
void write_f32_tensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace mantis
