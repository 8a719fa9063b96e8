// Files (core/file.h): atomic writes and their temporaries, SHA-256, bounded text reads, gzip,
// NumPy .npy — each failure an InputError naming the file; and the token files beside the corpora
// (io/dataset.h): .npy token arrays, llm.c token shards, UTF-8 text files.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <span>
#include <vector>

#include "core/file.h"
#include "exp/manifest.h"
#include "io/dataset.h"
#include "io/tokenizer.h"
#include "testutil.h"

using namespace mantis;
using mantis::test::error_of;
using mantis::test::scratch;
using mantis::test::slurp;
using mantis::test::spit;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {
// The entries of a directory, by name.
std::vector<std::string> entries(const fs::path& d) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace

TEST_CASE("io: an atomic write replaces the target whole and leaves no temporary") {
  const fs::path d = scratch("io-atomic");
  const std::string target = (d / "out.txt").string();
  write_file_atomic(target, "first");
  CHECK(slurp(target) == "first");
  const std::string_view pieces[] = {"sec", "ond ", "version"};
  write_file_atomic(target, std::span<const std::string_view>(pieces));
  CHECK(slurp(target) == "second version");
  CHECK(entries(d) == std::vector<std::string>{"out.txt"});
  // A target in a missing directory: an InputError naming the target, nothing written.
  const std::string bad = (d / "missing" / "x.txt").string();
  CHECK_THAT(error_of([&] { write_file_atomic(bad, "x"); }), Contains(bad) && Contains("cannot write"));
  CHECK(entries(d) == std::vector<std::string>{"out.txt"});
}

TEST_CASE("io: temporaries are named beside the target; only a dead writer's are removed") {
  const fs::path d = scratch("io-temporaries");
  const std::string t1 = temporary_path((d / "cell.json").string()), t2 = temporary_path((d / "cell.json").string());
  CHECK(fs::path(t1).parent_path() == d);
  CHECK(t1 != t2);
  CHECK_THAT(fs::path(t1).filename().string(), Catch::StartsWith(".cell.json.") && Catch::EndsWith(".tmp"));
  spit(t1, "live");                                    // this process: alive, kept
  spit(d / ".cell.json.2147483646.0.tmp", "dead");     // no such process: removed
  fs::create_directories(d / ".ckpt.2147483646.1.tmp");  // a directory built atomically, abandoned
  spit(d / "cell.json", "kept");                       // not a temporary name
  CHECK(remove_stale_temporaries(d.string()) == 2);
  CHECK(entries(d) == std::vector<std::string>{fs::path(t1).filename().string(), "cell.json"});
  CHECK(remove_stale_temporaries((d / "absent").string()) == 0);
}

TEST_CASE("io: SHA-256 of the standard test vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const fs::path d = scratch("io-sha");
  spit(d / "abc", "abc");
  CHECK(sha256_file((d / "abc").string()) == sha256_hex("abc"));
  CHECK_THAT(error_of([&] { sha256_file((d / "none").string()); }), Contains("none") && Contains("cannot open"));
}

TEST_CASE("io: text inputs are bounded and name what they are") {
  const fs::path d = scratch("io-text");
  spit(d / "policy.toml", "x = 1\n");
  CHECK(read_text_file((d / "policy.toml").string(), "policy") == "x = 1\n");
  CHECK_THAT(error_of([] { read_text_file("", "policy"); }), Contains("policy: the path is empty"));
  CHECK_THAT(error_of([&] { read_text_file(d.string(), "policy"); }), Contains("is a directory"));
  CHECK_THAT(error_of([&] { read_text_file((d / "none").string(), "config"); }), Contains("config") && Contains("cannot be read"));
  CHECK_THAT(error_of([&] { read_text_file((d / "policy.toml").string(), "policy", 5); }), Contains("larger than 5 bytes"));
  CHECK_THAT(error_of([] { read_text_file("/dev/zero", "format", 1 << 16); }),
             Contains("format '/dev/zero' is a character device, not a regular file"));
  CHECK_THAT(error_of([&] { read_file(d.string()); }), Contains("is a directory"));
}

// Special files as inputs (issue 32): /dev/zero grew without bound, a FIFO blocked forever; each is
// refused by name before a byte is read, by every reader (they all open through open_input).
TEST_CASE("io: a FIFO, a device or a directory is refused by name as an input, never read") {
  const fs::path d = scratch("io-special-in");
  const std::string fifo = (d / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: opening it for reading would block
  spit(d / "real.npy", "");
  ::symlink("/dev/zero", (d / "zero-link").c_str());
  struct Case {
    std::string path, kind;
  };
  const Case cases[] = {{fifo, "a FIFO (named pipe)"}, {"/dev/zero", "a character device"},
                        {"/dev/null", "a character device"}, {(d / "zero-link").string(), "a character device"},
                        {d.string(), "a directory"}};
  for (const auto& c : cases) {
    INFO(c.path);
    const std::string tail = " is " + c.kind + ", not a regular file";
    CHECK(error_of([&] { read_file(c.path); }) == c.path + tail);
    CHECK(error_of([&] { read_text_file(c.path, "policy file"); }) == "policy file '" + c.path + "'" + tail);
    CHECK(error_of([&] { read_gzip(c.path); }) == c.path + tail);
    CHECK(error_of([&] { read_npy_floats(c.path); }) == c.path + tail);
    CHECK(error_of([&] { read_npy_ints(c.path); }) == c.path + tail);
    CHECK(error_of([&] { (void)read_shard(c.path); }) == c.path + tail);
    CHECK(special_file_kind(c.path) == (fs::is_symlink(c.path) ? "a symbolic link" : c.kind));  // the path itself
  }
  CHECK(special_file_kind((d / "real.npy").string()).empty());
  CHECK(special_file_kind((d / "absent").string()).empty());
}

// Special files as outputs (issue 32): `--out /dev/full` replaced the device node with a regular file.
TEST_CASE("io: an atomic write never replaces anything but a regular file, nor writes through a link") {
  const fs::path d = scratch("io-special-out");
  const std::string fifo = (d / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directories(d / "sub");
  ::symlink((d / "absent").c_str(), (d / "dangling").c_str());
  struct Case {
    std::string path, kind;
  };
  // Only files this test made are written to: were the check broken, /dev/null would be replaced.
  for (const Case& c : {Case{fifo, "a FIFO (named pipe)"}, Case{(d / "sub").string(), "a directory"},
                        Case{(d / "dangling").string(), "a symbolic link"}}) {
    INFO(c.path);
    const std::string e = error_of([&] { write_file_atomic(c.path, "x"); });
    CHECK_THAT(e, Catch::StartsWith("output '" + c.path + "' is " + c.kind + ", not a regular file"));
    CHECK(e == error_of([&] { check_output_path(c.path); }));
    CHECK(special_file_kind(c.path) == c.kind);  // still what it was
  }
  for (const char* dev : {"/dev/null", "/dev/full"})
    CHECK_THAT(error_of([&] { check_output_path(dev); }),
               Catch::StartsWith(fmt::format("output '{}' is a character device, not a regular file", dev)));
  CHECK(fs::is_fifo(fifo));
  CHECK(fs::is_symlink(d / "dangling"));
  // a symbolic link to a regular file is refused too: following it would write wherever a link planted
  // in a shared directory points, replacing it would break the link
  spit(d / "real.txt", "old");
  fs::create_symlink(d / "real.txt", d / "link.txt");
  CHECK_THAT(error_of([&] { write_file_atomic((d / "link.txt").string(), "new"); }),
             Catch::StartsWith("output '" + (d / "link.txt").string() + "' is a symbolic link, not a regular file"));
  CHECK(fs::is_symlink(d / "link.txt"));
  CHECK(slurp(d / "real.txt") == "old");
  CHECK_NOTHROW(check_output_path((d / "real.txt").string()));
  CHECK_NOTHROW(check_output_path((d / "new-file").string()));
  CHECK(entries(d) == std::vector<std::string>{"dangling", "link.txt", "pipe", "real.txt", "sub"});
}

// A writer killed mid-write (SIGTERM during `quantize --out`) left its temporary for good (issue 32):
// the next write of the same target removes it; another target's, or a live writer's, stays.
TEST_CASE("io: an atomic write removes its target's temporaries left by dead writers") {
  const fs::path d = scratch("io-stale-target");
  spit(d / ".y.npy.2147483646.0.tmp", std::string(1000, 'x'));  // no such process
  spit(d / ".other.npy.2147483646.0.tmp", "x");                 // another target's
  const std::string live = temporary_path((d / "y.npy").string());
  spit(live, "live");                                             // this process: alive
  write_file_atomic((d / "y.npy").string(), "data");
  CHECK(entries(d) == std::vector<std::string>{".other.npy.2147483646.0.tmp", fs::path(live).filename().string(),
                                               "y.npy"});
}

TEST_CASE("io: gzip files are decompressed, plain files read as they are, corrupt ones named") {
  const fs::path d = scratch("io-gzip");
  const std::string text = "It is a truth universally acknowledged\n";
  {
    gzFile g = gzopen((d / "a.txt.gz").c_str(), "wb");
    REQUIRE(g != nullptr);
    REQUIRE(gzwrite(g, text.data(), unsigned(text.size())) == int(text.size()));
    REQUIRE(gzclose(g) == Z_OK);
  }
  CHECK(read_gzip((d / "a.txt.gz").string()) == text);
  spit(d / "plain.txt", text);
  CHECK(read_gzip((d / "plain.txt").string()) == text);
  std::string gz = slurp(d / "a.txt.gz");
  gz.resize(gz.size() / 2);  // truncated in the middle of the stream
  spit(d / "cut.gz", gz);
  CHECK_THAT(error_of([&] { read_gzip((d / "cut.gz").string()); }), Contains("cut.gz") && Contains("corrupt gzip data"));
  CHECK_THAT(error_of([&] { read_gzip((d / "none.gz").string()); }), Contains("no such file"));
  // decompression is bounded (a small file may decompress without end)
  CHECK(read_gzip((d / "a.txt.gz").string(), text.size()) == text);
  CHECK_THAT(error_of([&] { read_gzip((d / "a.txt.gz").string(), text.size() - 1); }),
             Contains("a.txt.gz: decompresses to more than 38 bytes"));
}

TEST_CASE("io: .npy round trip and every malformed file named") {
  const fs::path d = scratch("io-npy");
  const std::vector<float> v = {1.5f, -0.0f, 3e-45f, 65504.0f, -2.25f, 1e30f};
  const int64_t shape[] = {2, 3};
  const std::string p = (d / "a.npy").string();
  write_npy(p, v, shape);
  const NpyArray a = read_npy(p);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(mantis::test::same_bits(a.data, v));
  CHECK((slurp(p).size() - v.size() * sizeof(float)) % 64 == 0);  // the data starts at a multiple of 64
  const std::string bytes = slurp(p);
  auto broken = [&](const std::string& name, std::string b) {
    spit(d / name, b);
    return error_of([&] { read_npy((d / name).string()); });
  };
  CHECK_THAT(broken("magic.npy", "NUMPY" + bytes.substr(6)), Contains("not a .npy file"));
  std::string v3 = bytes;
  v3[6] = 3;
  CHECK_THAT(broken("v3.npy", v3), Contains("npy version 3.0"));
  std::string f8 = bytes;
  f8.replace(f8.find("<f4"), 3, "<f8");
  CHECK_THAT(broken("f8.npy", f8), Contains("not little-endian float32"));
  CHECK_THAT(broken("short.npy", bytes.substr(0, bytes.size() - 4)), Contains("data bytes for 6 values of <f4"));
  const int64_t negative[] = {-1};
  CHECK_THAT(error_of([&] { write_npy((d / "neg.npy").string(), v, negative); }), Contains("negative dimension"));
  // numpy reads at most 32 dimensions: more are refused both ways (issue 32: 101 were written)
  const std::vector<int64_t> ones33(33, 1), ones32(32, 1);
  const std::vector<float> one = {2.5f};
  CHECK_THAT(error_of([&] { write_npy((d / "d33.npy").string(), one, ones33); }),
             Contains("an array of 33 dimensions (a .npy holds at most 32"));
  CHECK(!fs::exists(d / "d33.npy"));
  write_npy((d / "d32.npy").string(), one, ones32);
  CHECK(read_npy_floats((d / "d32.npy").string()).shape == ones32);
  std::string h101 = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < 101; ++i) h101 += "1, ";
  h101 += "), }";
  h101.append((64 - (10 + h101.size() + 1) % 64) % 64, ' ');
  h101 += '\n';
  std::string f101 = std::string("\x93NUMPY") + char(1) + char(0) + char(h101.size() & 0xff) + char(h101.size() >> 8) +
                     h101 + std::string(4, '\0');
  CHECK_THAT(broken("d101.npy", f101), Contains("more than 32 dimensions"));
  // the data is read by the header's declared size: a file longer than it declares is refused
  CHECK_THAT(broken("long.npy", bytes + "xxxx"), Contains("28 data bytes for 6 values of <f4"));

  // float64 arrays, and the float32 / float64 reader's errors
  const std::vector<double> w = {1.5, -0.0, 5e-324, 1e300, -2.25, 0.1};
  const std::string p8 = (d / "b.npy").string();
  write_npy(p8, std::span<const double>(w), shape);
  const NpyFloats b = read_npy_floats(p8);
  CHECK(b.f8);
  CHECK(b.shape == std::vector<int64_t>{2, 3});
  CHECK(mantis::test::same_bits(b.f8_data, w));
  const NpyFloats a4 = read_npy_floats(p);
  CHECK_FALSE(a4.f8);
  CHECK(mantis::test::same_bits(a4.f4_data, v));
  auto broken_any = [&](const std::string& name, std::string bb) {
    spit(d / name, bb);
    return error_of([&] { read_npy_floats((d / name).string()); });
  };
  std::string fortran = bytes;
  fortran.replace(fortran.find("False"), 5, "True");
  fortran.insert(fortran.find('\n'), " ");  // the header keeps its length
  CHECK_THAT(broken_any("fortran.npy", fortran), Contains("Fortran order"));
  std::string i4 = bytes;
  i4.replace(i4.find("<f4"), 3, "<i4");
  CHECK_THAT(broken_any("i4.npy", i4), Contains("'<i4'") && Contains("float64"));
  std::string be = bytes;
  be.replace(be.find("<f4"), 3, ">f4");
  CHECK_THAT(broken_any("be.npy", be), Contains("'>f4'"));
  // a version 2.0 header (4-byte length) is read
  const std::string h = bytes.substr(10, bytes.size() - 10 - v.size() * 4);
  std::string two = std::string("\x93NUMPY") + char(2) + char(0);
  const uint32_t hl = uint32_t(h.size());
  two += std::string(reinterpret_cast<const char*>(&hl), 4) + h + bytes.substr(bytes.size() - v.size() * 4);
  spit(d / "two.npy", two);
  CHECK(mantis::test::same_bits(read_npy_floats((d / "two.npy").string()).f4_data, v));
}

// ---- token data beside the corpora (io/dataset.h): .npy arrays, llm.c shards, text files ----------

namespace {
// A .npy (version 1.0) of raw little-endian `data` under any descriptor and shape ("(3,)", "(2, 2)").
std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + char(h.size() & 0xff) + char(h.size() >> 8) + h + data;
}
// The little-endian bytes of each value, `width` bytes each.
template <class T>
std::string le(const std::vector<T>& v, size_t width) {
  std::string s;
  for (T x : v)
    for (size_t k = 0; k < width; ++k) s += char((uint64_t(int64_t(x)) >> (8 * k)) & 0xff);
  return s;
}
// An llm.c token shard: 256 int32 (magic, version, count, zeros), then the tokens.
std::string llmc_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens,
                       size_t width) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = count;
  return le(header, 4) + le(tokens, width);
}
}  // namespace

TEST_CASE("io: integer .npy arrays are read exactly in every accepted dtype; others are named") {
  const fs::path d = scratch("io-npy-ints");
  struct Case {
    const char* descr;
    size_t width;
    std::vector<int64_t> values;
  };
  const std::vector<Case> cases{{"<i4", 4, {0, -2147483648LL, 2147483647, 7}},
                                {"<i8", 8, {-5, int64_t(1) << 40, 0, 9223372036854775807LL}},
                                {"<u2", 2, {0, 1, 65535, 50256}},
                                {"<u4", 4, {0, 4000000000LL, 4294967295LL, 3}}};
  for (const Case& c : cases) {
    INFO(c.descr);
    const fs::path p = d / "a.npy";
    spit(p, npy_bytes(c.descr, "(4,)", le(c.values, c.width)));
    const NpyInts a = read_npy_ints(p.string());
    CHECK(a.descr == c.descr);
    CHECK(a.shape == std::vector<int64_t>{4});
    CHECK(a.data == c.values);
  }
  auto err = [&](const std::string& name, const std::string& bytes) {
    spit(d / name, bytes);
    return error_of([&] { read_npy_ints((d / name).string()); });
  };
  for (const char* bad : {"<f4", "<f8", ">i4", "|u1", "<i2", "<u8", "<f2"})
    CHECK_THAT(err("bad.npy", npy_bytes(bad, "(2,)", std::string(16, '\0'))),
               Contains("bad.npy") && Contains(std::string("npy dtype '") + bad + "'") && Contains("'<i4'"));
  CHECK_THAT(err("short.npy", npy_bytes("<i8", "(3,)", std::string(20, '\0'))), Contains("data bytes for 3 values of <i8"));
}

TEST_CASE("io: --data reads .npy token arrays: 1-D, integer, every id in the vocabulary") {
  const fs::path d = scratch("io-npy-tokens");
  const auto bytes = make_tokenizer("bytes");
  const std::vector<uint32_t> ids = {72, 105, 0, 255, 10, 10, 33};
  for (auto [descr, width] : {std::pair{"<i4", 4}, {"<i8", 8}, {"<u2", 2}, {"<u4", 4}}) {
    INFO(descr);
    const fs::path p = d / (std::string("t") + descr[1] + descr[2] + ".npy");
    spit(p, npy_bytes(descr, "(7,)", le(ids, size_t(width))));
    const TokenData t = load_tokens(p.string(), *bytes, "/nonexistent-root");
    CHECK(t.tokens == ids);
    CHECK(t.tokenizer_id == "bytes");
    REQUIRE(t.sources.size() == 1);
    CHECK(t.sources[0].kind == SourceKind::npy);
    CHECK(t.sources[0].name == p.string());
    CHECK(t.sources[0].sha256 == sha256_file(p.string()));
    CHECK(t.sources[0].tokens == 7);
    const ojson j = data_sources_json(t);
    CHECK(j[0]["kind"] == "npy");
    CHECK(j[0]["sha256"] == sha256_file(p.string()));
  }
  auto err = [&](const std::string& name, const std::string& content) {
    spit(d / name, content);
    return error_of([&] { load_tokens((d / name).string(), *bytes, "/nonexistent-root"); });
  };
  CHECK_THAT(err("f4.npy", npy_bytes("<f4", "(2,)", le(std::vector<int32_t>{0, 0}, 4))),
             Contains("f4.npy") && Contains("npy dtype '<f4'"));
  CHECK_THAT(err("f8.npy", npy_bytes("<f8", "(1,)", std::string(8, '\0'))), Contains("f8.npy") && Contains("'<f8'"));
  CHECK_THAT(err("be.npy", npy_bytes(">i4", "(1,)", std::string(4, '\0'))), Contains("be.npy") && Contains("'>i4'"));
  CHECK_THAT(err("two.npy", npy_bytes("<i4", "(2, 2)", le(std::vector<int32_t>{1, 2, 3, 4}, 4))),
             Contains("two.npy") && Contains("must be 1-D") && Contains("2 dimensions"));
  CHECK_THAT(err("zero.npy", npy_bytes("<i4", "()", le(std::vector<int32_t>{1}, 4))),
             Contains("zero.npy") && Contains("must be 1-D") && Contains("0 dimensions"));
  CHECK_THAT(err("neg.npy", npy_bytes("<i8", "(3,)", le(std::vector<int64_t>{1, -1, 2}, 8))),
             Contains("neg.npy") && Contains("token 1 is -1, negative"));
  CHECK_THAT(err("big.npy", npy_bytes("<u2", "(3,)", le(std::vector<uint32_t>{1, 2, 256}, 2))),
             Contains("big.npy") && Contains("token 2 is 256") && Contains("tokenizer 'bytes' [0, 256)"));
  CHECK_THAT(err("huge.npy", npy_bytes("<i8", "(1,)", le(std::vector<int64_t>{int64_t(1) << 40}, 8))),
             Contains("token 0 is 1099511627776"));
  CHECK_THAT(err("fortran.npy", [] {
               std::string b = npy_bytes("<i4", "(1,)", std::string(4, '\0'));
               b.replace(b.find("False"), 5, "True");
               b.insert(b.find('\n'), " ");  // the header keeps its length
               return b;
             }()),
             Contains("Fortran order"));
  CHECK_THAT(error_of([&] { load_tokens((d / "none.npy").string(), *bytes, "/nonexistent-root"); }), Contains("none.npy"));
}

TEST_CASE("io: --data reads llm.c token shards of both formats; every malformed header is named") {
  const fs::path d = scratch("io-llmc");
  const auto bytes = make_tokenizer("bytes");
  const std::vector<uint32_t> ids = {0, 1, 200, 255, 65, 65};
  // GPT-2's format (magic 20240520, version 1, uint16) and LLaMA-3's (20240801, 7, uint32)
  for (auto [magic, version, width] : {std::tuple{20240520, 1, 2}, {20240801, 7, 4}}) {
    INFO(magic);
    const fs::path p = d / ("s" + std::to_string(magic) + ".bin");
    spit(p, llmc_bytes(magic, version, 6, ids, size_t(width)));
    CHECK(fs::file_size(p) == 1024 + 6 * size_t(width));
    const TokenData t = load_tokens(p.string(), *bytes, "/nonexistent-root");
    CHECK(t.tokens == ids);
    REQUIRE(t.sources.size() == 1);
    CHECK(t.sources[0].kind == SourceKind::llmc);
    CHECK(t.sources[0].sha256 == sha256_file(p.string()));
    CHECK(data_sources_json(t)[0]["kind"] == "llmc");
  }
  // an empty shard is read (0 tokens); a window of it is refused later (window_starts)
  spit(d / "empty.bin", llmc_bytes(20240520, 1, 0, {}, 2));
  CHECK(load_tokens((d / "empty.bin").string(), *bytes, "/nonexistent-root").tokens.empty());
  // ids above 255 are GPT-2's: read with gpt2's vocabulary they would be fine, with bytes they are refused
  const std::vector<uint32_t> wide = {50256, 3};
  auto err = [&](const std::string& name, const std::string& content) {
    spit(d / name, content);
    return error_of([&] { load_tokens((d / name).string(), *bytes, "/nonexistent-root"); });
  };
  CHECK_THAT(err("vocab.bin", llmc_bytes(20240520, 1, 2, wide, 2)),
             Contains("vocab.bin") && Contains("token 0 is 50256") && Contains("[0, 256)"));
  CHECK_THAT(err("vocab7.bin", llmc_bytes(20240801, 7, 2, {3, 128000}, 4)), Contains("token 1 is 128000"));
  CHECK_THAT(err("magic.bin", llmc_bytes(20240522, 1, 2, {1, 2}, 2)),
             Contains("magic.bin") && Contains("not an llm.c token shard (magic 20240522"));
  CHECK_THAT(err("v2.bin", llmc_bytes(20240520, 2, 2, {1, 2}, 4)),
             Contains("v2.bin") && Contains("magic 20240520 has version 2 (expected 1)"));
  CHECK_THAT(err("v1.bin", llmc_bytes(20240801, 1, 2, {1, 2}, 2)), Contains("magic 20240801 has version 1 (expected 7)"));
  CHECK_THAT(err("negcount.bin", llmc_bytes(20240520, 1, -3, {1, 2}, 2)),
             Contains("negcount.bin") && Contains("negative token count -3"));
  CHECK_THAT(err("short.bin", llmc_bytes(20240520, 1, 3, {1, 2}, 2)),
             Contains("short.bin") && Contains("3 tokens of 2 bytes should be 1030 bytes; the file has 1028"));
  CHECK_THAT(err("long.bin", llmc_bytes(20240520, 1, 1, {1, 2}, 2)),
             Contains("should be 1026 bytes; the file has 1028"));
  CHECK_THAT(err("width.bin", llmc_bytes(20240520, 1, 2, {1, 2}, 4)),  // uint32 tokens under the uint16 magic
             Contains("should be 1028 bytes; the file has 1032"));
  CHECK_THAT(err("header.bin", llmc_bytes(20240520, 1, 0, {}, 2).substr(0, 1000)),
             Contains("header.bin") && Contains("truncated llm.c token shard: 1000 bytes, shorter than the 1024-byte header"));
  CHECK_THAT(err("nothing.bin", ""), Contains("nothing.bin") && Contains("0 bytes"));
  fs::create_directories(d / "dir.bin");
  CHECK_THAT(error_of([&] { load_tokens((d / "dir.bin").string(), *bytes, "/nonexistent-root"); }),
             Contains("dir.bin") && Contains("is a directory"));
  CHECK_THAT(error_of([&] { load_tokens((d / "none.bin").string(), *bytes, "/nonexistent-root"); }),
             Contains("none.bin"));
}

TEST_CASE("io: text files are tokenized by the corpora's rule; invalid UTF-8 names its byte offset") {
  const fs::path d = scratch("io-text");
  const std::string text = "Caf\xc3\xa9 au lait.\nSecond line.\n\nA new document \xe2\x80\x94 with a dash.\n";
  spit(d / "a.txt", text);
  const auto bytes = make_tokenizer("bytes");
  const TokenData b = load_text_tokens((d / "a.txt").string(), *bytes);
  std::vector<uint32_t> want_bytes;  // each byte's value (char may be signed)
  for (unsigned char c : text) want_bytes.push_back(c);
  CHECK(b.tokens == want_bytes);
  REQUIRE(b.sources.size() == 1);
  CHECK(b.sources[0].kind == SourceKind::text);
  CHECK(b.sources[0].sha256 == sha256_hex(text));
  CHECK(b.sources[0].name == (d / "a.txt").string());
  CHECK(data_sources_json(b)[0]["kind"] == "text");
  // gpt2: <|endoftext|> before each blank-line-separated document, as the corpora
  const auto gpt2 = make_tokenizer("gpt2");
  std::vector<uint32_t> want = {kGpt2EndOfText};
  for (uint32_t t : gpt2->encode("Caf\xc3\xa9 au lait.\nSecond line.")) want.push_back(t);
  want.push_back(kGpt2EndOfText);
  for (uint32_t t : gpt2->encode("A new document \xe2\x80\x94 with a dash.")) want.push_back(t);
  CHECK(load_text_tokens((d / "a.txt").string(), *gpt2).tokens == want);
  // a corpus split, decompressed, gives that split's tokens
  const std::string root = std::string(MANTIS_SOURCE_DIR) + "/data";
  spit(d / "kjv-test.txt", read_gzip(root + "/corpora/kjv/test.txt.gz"));
  CHECK(load_text_tokens((d / "kjv-test.txt").string(), *gpt2).tokens == load_tokens("kjv/test", *gpt2, root).tokens);

  // invalid UTF-8: the offset of the first byte that starts no well-formed sequence
  struct Bad {
    std::string bytes;
    size_t offset;
  };
  const std::vector<Bad> bad{{"ok\xff", 2},             {"caf\xc3\xa9\xc3", 5},      // lone byte; cut sequence
                             {"ab\xc0\xaf", 2},         {"\xe0\x80\xaf", 0},         // overlong
                             {"xx\xed\xa0\x80", 2},     {"\xf4\x90\x80\x80 z", 0},   // surrogate; > U+10FFFF
                             {"\xe2\x80\x94\x80", 3}};                               // a stray continuation byte
  for (const Bad& x : bad) {
    INFO(x.offset);
    CHECK(utf8_invalid_offset(x.bytes) == x.offset);
    spit(d / "bad.txt", x.bytes);
    CHECK_THAT(error_of([&] { load_text_tokens((d / "bad.txt").string(), *bytes); }),
               Contains("bad.txt") && Contains("not UTF-8: byte offset " + std::to_string(x.offset) + " "));
  }
  CHECK(utf8_invalid_offset(text) == std::string_view::npos);
  CHECK(utf8_invalid_offset("\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf") == std::string_view::npos);  // U+1F600, U+10FFFF
  CHECK_THAT(error_of([&] { load_text_tokens((d / "none.txt").string(), *bytes); }),
             Contains("text file") && Contains("none.txt"));
  CHECK_THAT(error_of([&] { load_text_tokens(d.string(), *bytes); }), Contains("is a directory"));
}

TEST_CASE("io: the sources of the committed forms keep their fields (study keys written before 'kind')") {
  const auto gpt2 = make_tokenizer("gpt2");
  const std::string root = std::string(MANTIS_SOURCE_DIR) + "/data";
  const TokenData shard = load_tokens("kjv/test", *gpt2, root), text = load_tokens("jargon/test", *gpt2, root);
  CHECK(shard.sources[0].kind == SourceKind::shard);
  CHECK(text.sources[0].kind == SourceKind::corpus);
  for (const TokenData* t : {&shard, &text}) {
    const ojson j = data_sources_json(*t);
    std::vector<std::string> keys;
    for (auto& [k, v] : j[0].items()) keys.push_back(k);
    CHECK(keys == std::vector<std::string>{"name", "file", "sha256", "tokens"});
  }
}
