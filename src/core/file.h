// io — files: whole-file and gzip reads, atomic writes, SHA-256, NumPy .npy arrays.
//
// Every failure is an InputError (format.h) naming the file and the problem.
// Inputs are regular files (or a symbolic link to one): a FIFO can block forever (opening it waits
// for a writer), a device can be endless (/dev/zero) or empty (/dev/null), so each such path is
// refused by name before a byte is read (open_input).
// Atomic write: the bytes go to a uniquely named temporary file in the target's directory, are
// fsync'ed, and the file is renamed over the target (atomic on POSIX), then the directory is
// fsync'ed (best effort). A reader sees the old file or the new one, never a mixture; on any
// failure the temporary file is removed and the target is untouched. Only a regular file or a
// missing path is ever replaced: a directory, FIFO, device, socket or symbolic link is refused
// (check_output_path) — a rename would destroy it, and following a link would write wherever it
// points (a link planted in a shared directory).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/paths.h"  // data_root(): where the readers' callers find data/

namespace mantis {

// What a path names when it is not a regular file ("a directory", "a FIFO (named pipe)", "a
// character device", "a symbolic link", …; the path itself, links not followed); empty for a
// regular file or a missing path.
std::string special_file_kind(const std::string& path);
// An open descriptor (O_RDONLY, O_CLOEXEC) of the regular file at `path`; InputError naming `what`
// (or the path alone when `what` is empty) for a missing, unreadable or special file. A FIFO is
// opened without blocking, so that it can be refused.
int open_input(const std::string& path, const std::string& what = "");

std::string read_file(const std::string& path);
// The decompressed bytes of a gzip file (zlib; a file that is not gzip is read as is); more than
// max_bytes is an InputError (a small file can decompress without bound).
inline constexpr size_t kGzipMaxBytes = size_t(1) << 30;
std::string read_gzip(const std::string& path, size_t max_bytes = kGzipMaxBytes);

// An output path write_file_atomic may replace: missing, or a regular file; anything else is an
// InputError naming `what` and the kind of file. Commands whose output is a file call it before
// they start work; write_file_atomic checks again before it renames.
void check_output_path(const std::string& path, const std::string& what = "output");

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces);
void write_file_atomic(const std::string& path, std::string_view content);

// A fresh temporary name beside PATH, DIR/.<name>.<pid>.<counter>.tmp (the name write_file_atomic
// writes to before its rename); callers that build a directory atomically use it too.
std::string temporary_path(const std::string& path);
// fsync of a directory, so that renames in it are durable; best effort.
void sync_directory(const std::string& dir);
// Removes the temporaries (files or directories named as temporary_path names them) in DIR whose
// writing process no longer exists — left by killed runs; returns how many were removed. With
// `name`, only the temporaries of DIR/name (write_file_atomic calls it so for its target).
int remove_stale_temporaries(const std::string& dir, const std::string& name = "");

// Lower-case hex SHA-256 (OpenSSL).
std::string sha256_hex(std::string_view bytes);
std::string sha256_file(const std::string& path);

// NumPy .npy, format version 1.0, little-endian float32 ('<f4') or float64 ('<f8'), C order.
// At most kNpyMaxDims dimensions, read or written: numpy before 2.0 (Debian 12's 1.24) reads no more
// (NPY_MAXDIMS), so a file mantis writes stays readable by every numpy.
inline constexpr size_t kNpyMaxDims = 32;
void write_npy(const std::string& path, std::span<const float> data, std::span<const int64_t> shape);
void write_npy(const std::string& path, std::span<const double> data, std::span<const int64_t> shape);
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a float32 array ('<f4', fortran_order False); anything else is an InputError.
NpyArray read_npy(const std::string& path);
// Reads a float32 or float64 array (C order, version 1.0 or 2.0 header): one of f4 / f8 is filled.
// Another dtype, Fortran order, a malformed header or a size mismatch is an InputError naming it.
struct NpyFloats {
  std::vector<int64_t> shape;
  bool f8 = false;
  std::vector<float> f4_data;
  std::vector<double> f8_data;
};
NpyFloats read_npy_floats(const std::string& path);
// Reads an integer array of one of the dtypes token arrays come in: '<i4', '<i8', '<u2', '<u4' (int32,
// int64, uint16, uint32, little-endian: what numpy writes for them), every value exactly. Another
// dtype (floats, big-endian, …), Fortran order or a size mismatch is an InputError naming it.
struct NpyInts {
  std::vector<int64_t> shape;
  std::string descr;          // as the header gives it
  std::vector<int64_t> data;  // every dtype above fits
};
NpyInts read_npy_ints(const std::string& path);

// The contents of a text input (a format, policy or configuration file, a list of token ids):
// InputError naming `what` and the path when the path is empty, a directory or unreadable, or when
// it holds more than max_bytes. Reads in chunks, so /dev/zero or an endless FIFO cannot exhaust
// memory.
inline constexpr size_t kTextInputMaxBytes = size_t(64) << 20;
std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes = kTextInputMaxBytes);

}  // namespace mantis
