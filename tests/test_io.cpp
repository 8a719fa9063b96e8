// Files (core/file.h): atomic writes and their temporaries, SHA-256, bounded text reads, gzip,
// NumPy .npy — each failure an InputError naming the file.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <filesystem>
#include <string>
#include <span>
#include <vector>

#include "core/file.h"
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
  CHECK_THAT(error_of([] { read_text_file("/dev/zero", "format", 1 << 16); }), Contains("larger than 65536 bytes"));
  CHECK_THAT(error_of([&] { read_file(d.string()); }), Contains("is a directory"));
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
