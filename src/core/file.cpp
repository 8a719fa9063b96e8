#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
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
#include <utility>

#include "core/format.h"

namespace mantis {

namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t m) {
  if (S_ISREG(m)) return "";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

// How messages name a file: "WHAT 'PATH'", or the path alone.
std::string subject(const std::string& path, const std::string& what) {
  return what.empty() ? path : fmt::format("{} '{}'", what, path);
}

// Closes a descriptor on every path out of a reader.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Every byte of fd up to its end; more than max_bytes is an InputError naming `who`.
std::string read_fd(int fd, const std::string& who, size_t max_bytes) {
  std::string s;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0 && uint64_t(st.st_size) <= max_bytes) s.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError(fmt::format("{} cannot be read: {}", who, std::strerror(errno)));
    }
    if (n == 0) return s;
    if (s.size() + size_t(n) > max_bytes) throw InputError(fmt::format("{} is larger than {} bytes", who, max_bytes));
    s.append(buf, size_t(n));
  }
}

}  // namespace

std::string special_file_kind(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return "";
  return S_ISLNK(st.st_mode) ? "a symbolic link" : kind_of(st.st_mode);
}

int open_input(const std::string& path, const std::string& what) {
  if (path.empty()) throw InputError(fmt::format("{}: the path is empty", what.empty() ? "input" : what));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (what.empty()) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(err)));
    throw InputError(fmt::format("{} cannot be read: {}", subject(path, what), std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd, &st) == 0 ? kind_of(st.st_mode) : "unreadable";
    ::close(fd);
    throw InputError(fmt::format("{} is {}, not a regular file", subject(path, what), kind));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // ordinary reads from here on
  return fd;
}

std::string read_file(const std::string& path) {
  const Fd f{open_input(path)};
  return read_fd(f.fd, path, std::numeric_limits<size_t>::max());
}

std::string read_gzip(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(fmt::format("{}: no such file", path));
  const int fd = open_input(path);
  gzFile f = gzdopen(fd, "rb");  // owns fd from here (gzclose closes it)
  if (!f) {
    ::close(fd);
    throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
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
    if (out.size() + size_t(n) > max_bytes)
      throw InputError(fmt::format("{}: decompresses to more than {} bytes", path, max_bytes));
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

void check_output_path(const std::string& path, const std::string& what) {
  if (path.empty()) throw InputError(fmt::format("{}: the path is empty", what));
  const std::string kind = special_file_kind(path);
  if (!kind.empty())
    throw InputError(fmt::format("{} '{}' is {}, not a regular file: mantis writes a new file and renames it over "
                                 "the old one, which would replace it (give a file path)", what, path, kind));
}

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  check_output_path(path, "output");
  const fs::path target(path);
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  remove_stale_temporaries(dir.string(), target.filename().string());  // a killed writer's leftovers
  const fs::path tmp = temporary_path(target.string());
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
  // Checked again just before the rename: the path may have become a special file meanwhile.
  if (err == 0 && !special_file_kind(path).empty()) {
    ::unlink(tmp.c_str());
    check_output_path(path, "output");  // throws, naming it
  }
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

int remove_stale_temporaries(const std::string& dir, const std::string& only) {
  // temporary_path's names: ".<name>.<pid>.<counter>.tmp"
  static const std::regex re(R"(^\.(.+)\.([0-9]{1,10})\.[0-9]+\.tmp$)");
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    // (a plain prefix test first: a cells directory holds thousands of names, and this runs per write)
    if (!only.empty() && (name.size() < only.size() + 2 || name[0] != '.' || name.compare(1, only.size(), only) != 0))
      continue;
    if (!std::regex_match(name, m, re) || (!only.empty() && m[1].str() != only)) continue;
    const long long pid = std::stoll(m[2].str());
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
  if (shape.size() > kNpyMaxDims)
    throw InputError(fmt::format("{}: an array of {} dimensions (a .npy holds at most {}: numpy reads no more)", path,
                                 shape.size(), kNpyMaxDims));
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

// The header of a .npy file: dtype descriptor, shape, element count, data offset (C order).
struct NpyHeader {
  std::string descr;
  std::vector<int64_t> shape;
  int64_t count = 1;
  size_t offset = 0;
};

// Reads exactly n bytes at the descriptor's position; false at an early end of file.
bool read_exact(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

// The header of the .npy file open on fd (at its start), of file_size bytes; the descriptor is
// left at the data. Every bound is checked against the file's size before anything is allocated.
NpyHeader read_npy_header(const std::string& path, int fd, uint64_t file_size) {
  char pre[12];
  if (file_size < 10 || !read_exact(fd, pre, 10) || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw InputError(fmt::format("{}: not a .npy file", path));
  const int major = pre[6];
  if (major != 1 && major != 2)
    throw InputError(fmt::format("{}: npy version {}.{} (1.0 and 2.0 are read)", path, int(pre[6]), int(pre[7])));
  const size_t lenbytes = major == 1 ? 2 : 4, start = 8 + lenbytes;
  if (file_size < start || (major == 2 && !read_exact(fd, pre + 10, 2)))
    throw InputError(fmt::format("{}: truncated npy header", path));
  uint64_t hlen = 0;
  for (size_t i = 0; i < lenbytes; ++i) hlen |= uint64_t(uint8_t(pre[8 + i])) << (8 * i);
  if (file_size - start < hlen) throw InputError(fmt::format("{}: truncated npy header", path));
  constexpr uint64_t kMaxHeader = 1 << 16;  // numpy writes ~128 bytes; its readers stop at 10,000
  if (hlen > kMaxHeader)
    throw InputError(fmt::format("{}: npy header of {} bytes (at most {} are read)", path, hlen, kMaxHeader));
  std::string h(size_t(hlen), '\0');
  if (!read_exact(fd, h.data(), h.size())) throw InputError(fmt::format("{}: truncated npy header", path));
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
    if (err != std::errc() || end != d.data() + b1 || (v != 0 && uint64_t(r.count) > file_size / uint64_t(v)))
      throw InputError(fmt::format("{}: npy shape ({}) does not fit a file of {} bytes", path, m[3].str(), file_size));
    if (r.shape.size() == kNpyMaxDims)
      throw InputError(fmt::format("{}: npy shape with more than {} dimensions (numpy reads at most {})", path,
                                   kNpyMaxDims, kNpyMaxDims));
    r.shape.push_back(v);
    r.count *= v;
  }
  r.offset = start + size_t(hlen);
  return r;
}

// The data of a .npy file whose header is h (the descriptor at the data): exactly h.count values,
// the file's size checked against the header's declared size before they are read.
template <class T>
std::vector<T> npy_data(const std::string& path, int fd, uint64_t file_size, const NpyHeader& h) {
  const uint64_t avail = file_size - h.offset;  // compared by division first: count · sizeof(T) may not fit
  if (uint64_t(h.count) > avail / sizeof(T) || avail != uint64_t(h.count) * sizeof(T))
    throw InputError(fmt::format("{}: {} data bytes for {} values of {}", path, file_size - h.offset, h.count, h.descr));
  std::vector<T> v(size_t(h.count));
  if (!read_exact(fd, reinterpret_cast<char*>(v.data()), size_t(avail)))
    throw InputError(fmt::format("{}: the file ended before its {} values (changed while read?)", path, h.count));
  return v;
}

// An opened .npy: the descriptor, the file's size and its header.
struct NpyFile {
  Fd f;
  uint64_t size;
  NpyHeader h;
};
NpyFile open_npy(const std::string& path) {
  const int fd = open_input(path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  }
  NpyFile n{Fd{fd}, uint64_t(st.st_size), {}};
  n.h = read_npy_header(path, fd, n.size);
  return n;
}

}  // namespace

void write_npy(const std::string& path, std::span<const float> data, std::span<const int64_t> shape) {
  write_npy_bytes(path, "<f4", data.data(), data.size(), sizeof(float), shape);
}
void write_npy(const std::string& path, std::span<const double> data, std::span<const int64_t> shape) {
  write_npy_bytes(path, "<f8", data.data(), data.size(), sizeof(double), shape);
}

NpyFloats read_npy_floats(const std::string& path) {
  const NpyFile n = open_npy(path);
  NpyFloats a;
  a.shape = n.h.shape;
  if (n.h.descr == "<f4") a.f4_data = npy_data<float>(path, n.f.fd, n.size, n.h);
  else if (n.h.descr == "<f8") a.f8 = true, a.f8_data = npy_data<double>(path, n.f.fd, n.size, n.h);
  else
    throw InputError(fmt::format("{}: npy dtype '{}' (float32 '<f4' or float64 '<f8' are read)", path, n.h.descr));
  return a;
}

NpyArray read_npy(const std::string& path) {
  const NpyFile n = open_npy(path);
  if (n.h.descr != "<f4")
    throw InputError(fmt::format("{}: npy dtype '{}', not little-endian float32 ('<f4')", path, n.h.descr));
  return NpyArray{n.h.shape, npy_data<float>(path, n.f.fd, n.size, n.h)};
}

NpyInts read_npy_ints(const std::string& path) {
  const NpyFile n = open_npy(path);
  auto widen = [&](auto tag) {
    const auto v = npy_data<decltype(tag)>(path, n.f.fd, n.size, n.h);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  NpyInts a{n.h.shape, n.h.descr, {}};
  if (n.h.descr == "<i4") a.data = widen(int32_t{});
  else if (n.h.descr == "<i8") a.data = widen(int64_t{});
  else if (n.h.descr == "<u2") a.data = widen(uint16_t{});
  else if (n.h.descr == "<u4") a.data = widen(uint32_t{});
  else
    throw InputError(fmt::format("{}: npy dtype '{}' (integer arrays are read as int32 '<i4', int64 '<i8', uint16 "
                                 "'<u2' or uint32 '<u4')", path, n.h.descr));
  return a;
}

std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes) {
  const Fd f{open_input(path, what)};
  return read_fd(f.fd, subject(path, what), max_bytes);
}

}  // namespace mantis
