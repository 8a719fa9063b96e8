#include "core/file.h"

#include <fcntl.h>
#include <signal.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>

#include "core/format.h"

namespace mantis {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(fmt::format("{}: is a directory, not a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(fmt::format("{}: read error", path));
  return ss.str();
}

std::string read_gzip(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw InputError(fmt::format("{}: no such file", path));
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, gzclose);
  gzbuffer(f, 1 << 17);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      throw InputError(fmt::format("{}: corrupt gzip data: {}", path, msg ? msg : "unknown error"));
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  // A stream cut short ends the reads without a negative count: zlib records it as Z_BUF_ERROR
  // ("unexpected end of file"), which must not pass as a complete file.
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK) throw InputError(fmt::format("{}: corrupt gzip data: {}", path, msg ? msg : "unknown error"));
  return out;
}

namespace {
[[noreturn]] void write_failed(const std::string& path, int err) {
  throw InputError(fmt::format("{}: cannot write: {}", path, std::strerror(err ? err : EIO)));
}
}  // namespace

std::string temporary_path(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  return (dir / fmt::format(".{}.{}.{}.tmp", target.filename().string(), ::getpid(), counter.fetch_add(1))).string();
}

void sync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // make a rename durable; best effort
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const fs::path tmp = temporary_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) write_failed(path, errno);
  int err = 0;
  for (std::string_view p : pieces) {
    const char* d = p.data();
    size_t left = p.size();
    while (left > 0 && err == 0) {
      const ssize_t n = ::write(fd, d, std::min<size_t>(left, size_t(1) << 30));
      if (n < 0) {
        if (errno != EINTR) err = errno;
        continue;
      }
      d += n;
      left -= size_t(n);
    }
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), target.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    write_failed(path, err);
  }
  sync_directory(dir.string());
}

void write_file_atomic(const std::string& path, std::string_view content) {
  write_file_atomic(path, std::span<const std::string_view>(&content, 1));
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL EVP_Digest(sha256) failed");
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string sha256_file(const std::string& path) { return sha256_hex(read_file(path)); }

int remove_stale_temporaries(const std::string& dir) {
  // temporary_path's names: ".<name>.<pid>.<counter>.tmp"
  static const std::regex re(R"(^\..+\.([0-9]{1,10})\.[0-9]+\.tmp$)");
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, re)) continue;
    const long long pid = std::stoll(m[1].str());
    // Only a writer that no longer exists can have abandoned it; a live (or unknowable) PID keeps it.
    if (pid <= 0 || pid > std::numeric_limits<pid_t>::max() || ::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (fs::remove_all(e.path(), rm) > 0 && !rm) ++removed;
  }
  return removed;
}

// ---- .npy ------------------------------------------------------------------------------------
// Magic "\x93NUMPY", version 1 0, u16 header length, then an ASCII dict padded with spaces and
// ending in '\n' so that the data starts at a multiple of 64 bytes.

namespace {

void write_npy_bytes(const std::string& path, const char* descr, const void* data, size_t count, size_t elem,
                     std::span<const int64_t> shape) {
  static_assert(std::endian::native == std::endian::little, "npy writer assumes a little-endian host");
  int64_t n = 1;
  std::string dims;
  for (int64_t d : shape) {
    if (d < 0) throw InputError(fmt::format("{}: negative dimension {} in npy shape", path, d));
    n *= d;
    dims += fmt::format("{}, ", d);
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (a, b) ; a 1-D shape keeps "(a,)"
  else if (shape.size() == 1) dims.pop_back();
  if (size_t(n) != count)
    throw std::logic_error(fmt::format("write_npy: {} values for a shape of {} elements", count, n));
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string pre = "\x93NUMPY";
  pre += char(1);
  pre += char(0);
  pre += char(header.size() & 0xff);
  pre += char(header.size() >> 8);
  const std::string_view pieces[] = {pre, header, {static_cast<const char*>(data), count * elem}};
  write_file_atomic(path, pieces);
}

// The header of a .npy file: dtype descriptor, shape, data offset (a C-order float array).
struct NpyHeader {
  std::string descr;
  std::vector<int64_t> shape;
  int64_t count = 1;
  size_t offset = 0;
};

NpyHeader parse_npy(const std::string& path, const std::string& b) {
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) throw InputError(fmt::format("{}: not a .npy file", path));
  const int major = b[6];
  if (major != 1 && major != 2)
    throw InputError(fmt::format("{}: npy version {}.{} (1.0 and 2.0 are read)", path, int(b[6]), int(b[7])));
  const size_t lenbytes = major == 1 ? 2 : 4, start = 8 + lenbytes;
  if (b.size() < start) throw InputError(fmt::format("{}: truncated npy header", path));
  size_t hlen = 0;
  for (size_t i = 0; i < lenbytes; ++i) hlen |= size_t(uint8_t(b[8 + i])) << (8 * i);
  if (b.size() < start + hlen) throw InputError(fmt::format("{}: truncated npy header", path));
  const std::string h = b.substr(start, hlen);
  static const std::regex re(
      R"(^\{'descr': '([^']*)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \} *\n$)");
  std::smatch m;
  if (!std::regex_match(h, m, re))
    throw InputError(fmt::format("{}: malformed npy header: {}", path, h.substr(0, 80)));
  NpyHeader r;
  r.descr = m[1].str();
  if (m[2].str() == "True")
    throw InputError(fmt::format("{}: the array is in Fortran order (write it with numpy.ascontiguousarray)", path));
  std::stringstream dims(m[3].str());
  for (std::string d; std::getline(dims, d, ',');) {
    if (d.find_first_not_of(' ') == std::string::npos) continue;
    const size_t b0 = d.find_first_not_of(' '), b1 = d.find_last_not_of(' ') + 1;
    int64_t v = 0;
    const auto [end, err] = std::from_chars(d.data() + b0, d.data() + b1, v);
    // every dimension and the element count must fit the file that holds them
    if (err != std::errc() || end != d.data() + b1 || (v != 0 && r.count > int64_t(b.size()) / v))
      throw InputError(fmt::format("{}: npy shape ({}) does not fit a file of {} bytes", path, m[3].str(), b.size()));
    r.shape.push_back(v);
    r.count *= v;
  }
  r.offset = start + hlen;
  return r;
}

template <class T>
std::vector<T> npy_data(const std::string& path, const std::string& b, const NpyHeader& h) {
  if (b.size() != h.offset + size_t(h.count) * sizeof(T))
    throw InputError(fmt::format("{}: {} data bytes for {} values of {}", path, b.size() - h.offset, h.count, h.descr));
  std::vector<T> v(size_t(h.count));
  std::memcpy(v.data(), b.data() + h.offset, size_t(h.count) * sizeof(T));
  return v;
}

}  // namespace

void write_npy(const std::string& path, std::span<const float> data, std::span<const int64_t> shape) {
  write_npy_bytes(path, "<f4", data.data(), data.size(), sizeof(float), shape);
}
void write_npy(const std::string& path, std::span<const double> data, std::span<const int64_t> shape) {
  write_npy_bytes(path, "<f8", data.data(), data.size(), sizeof(double), shape);
}

NpyFloats read_npy_floats(const std::string& path) {
  const std::string b = read_file(path);
  const NpyHeader h = parse_npy(path, b);
  NpyFloats a;
  a.shape = h.shape;
  if (h.descr == "<f4") a.f4_data = npy_data<float>(path, b, h);
  else if (h.descr == "<f8") a.f8 = true, a.f8_data = npy_data<double>(path, b, h);
  else
    throw InputError(fmt::format("{}: npy dtype '{}' (float32 '<f4' or float64 '<f8' are read)", path, h.descr));
  return a;
}

NpyArray read_npy(const std::string& path) {
  const std::string b = read_file(path);
  const NpyHeader h = parse_npy(path, b);
  if (h.descr != "<f4")
    throw InputError(fmt::format("{}: npy dtype '{}', not little-endian float32 ('<f4')", path, h.descr));
  return NpyArray{h.shape, npy_data<float>(path, b, h)};
}

NpyInts read_npy_ints(const std::string& path) {
  const std::string b = read_file(path);
  const NpyHeader h = parse_npy(path, b);
  auto widen = [&](auto tag) {
    const auto v = npy_data<decltype(tag)>(path, b, h);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  NpyInts a{h.shape, h.descr, {}};
  if (h.descr == "<i4") a.data = widen(int32_t{});
  else if (h.descr == "<i8") a.data = widen(int64_t{});
  else if (h.descr == "<u2") a.data = widen(uint16_t{});
  else if (h.descr == "<u4") a.data = widen(uint32_t{});
  else
    throw InputError(fmt::format("{}: npy dtype '{}' (integer arrays are read as int32 '<i4', int64 '<i8', uint16 "
                                 "'<u2' or uint32 '<u4')", path, h.descr));
  return a;
}

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  if (path.empty()) throw InputError(fmt::format("{}: the path is empty", what));
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(fmt::format("{} '{}' is a directory, not a file", what, path));
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw InputError(fmt::format("{} '{}' cannot be read: {}", what, path, std::strerror(errno)));
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const size_t n = std::fread(buf, 1, sizeof buf, f.get());
    if (s.size() + n > max_bytes) throw InputError(fmt::format("{} '{}' is larger than {} bytes", what, path, max_bytes));
    s.append(buf, n);
    if (n < sizeof buf) break;
  }
  if (std::ferror(f.get())) throw InputError(fmt::format("{} '{}' cannot be read: {}", what, path, std::strerror(errno)));
  return s;
}

}  // namespace mantis
