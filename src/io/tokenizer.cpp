// tokenizer — GPT-2 byte-level BPE, the bytes tokenizer, token shards (see tokenizer.h).
#include "io/tokenizer.h"

#include "core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/format.h"   // InputError
#include "io/bpe.h"

namespace mantis {
namespace {

namespace fs = std::filesystem;

// ---- Unicode classes of the pre-tokenizer ------------------------------------------------

struct UnicodeClassRun {
  uint32_t first;
  uint8_t cls;
};
#include "io/unicode_tables.inc"

enum : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

constexpr std::array<uint8_t, 128> make_ascii_classes() {
  std::array<uint8_t, 128> a{};
  size_t r = 0;
  for (uint32_t c = 0; c < 128; ++c) {
    while (r + 1 < std::size(kUnicodeClassRuns) && kUnicodeClassRuns[r + 1].first <= c) ++r;
    a[c] = kUnicodeClassRuns[r].cls;
  }
  return a;
}
constexpr std::array<uint8_t, 128> kAsciiClass = make_ascii_classes();
static_assert(kAsciiClass[' '] == kSpace && kAsciiClass['\n'] == kSpace && kAsciiClass['a'] == kLetter &&
              kAsciiClass['7'] == kNumber && kAsciiClass['\''] == kOther);

uint8_t class_of(uint32_t cp) {
  if (cp < 128) return kAsciiClass[cp];
  const auto* it = std::upper_bound(std::begin(kUnicodeClassRuns), std::end(kUnicodeClassRuns), cp,
                                    [](uint32_t c, const UnicodeClassRun& r) { return c < r.first; });
  return std::prev(it)->cls;
}

struct CodePoint {
  uint32_t len;   // bytes
  uint8_t cls;
};

// The code point at p (n ≥ 1 bytes left). A byte that does not start a well-formed UTF-8
// sequence (RFC 3629) is a one-byte code point of class other.
inline CodePoint next_code_point(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return {1, kAsciiClass[c]};
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  uint32_t cp, len;
  if (c >= 0xC2 && c <= 0xDF) {
    if (!cont(1)) return {1, kOther};
    cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return {1, kOther};
    if (c == 0xE0 && p[1] < 0xA0) return {1, kOther};   // overlong
    if (c == 0xED && p[1] > 0x9F) return {1, kOther};   // surrogate
    cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    len = 3;
  } else if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return {1, kOther};
    if (c == 0xF0 && p[1] < 0x90) return {1, kOther};   // overlong
    if (c == 0xF4 && p[1] > 0x8F) return {1, kOther};   // > U+10FFFF
    cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    len = 4;
  } else {
    return {1, kOther};
  }
  return {len, class_of(cp)};
}

// Calls emit(offset, length) for each match of the GPT-2 regex, in order.
template <class Emit>
void pretokenize(std::string_view s, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    const unsigned char c = p[i];
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'' && i + 1 < n) {
      const unsigned char a = p[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(start, size_t{2});
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const unsigned char b = p[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(start, size_t{3});
          i += 3;
          continue;
        }
      }
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    CodePoint cur = next_code_point(p + i, n - i);
    size_t j = i;
    if (c == ' ' && i + 1 < n) {
      const CodePoint d = next_code_point(p + i + 1, n - i - 1);
      if (d.cls != kSpace) {
        j = i + 1;
        cur = d;
      }
    }
    if (cur.cls != kSpace) {
      const uint8_t k = cur.cls;
      j += cur.len;
      while (j < n) {
        if (p[j] < 0x80) {   // fast path
          if (kAsciiClass[p[j]] != k) break;
          ++j;
          continue;
        }
        const CodePoint d = next_code_point(p + j, n - j);
        if (d.cls != k) break;
        j += d.len;
      }
      emit(start, j - start);
      i = j;
      continue;
    }
    // `\s+(?!\S)|\s+`: a whitespace run; before a non-space, all but its last code point
    // (which then starts the next match), unless the run is a single code point.
    size_t end = i, last = i, count = 0;
    while (end < n) {
      const CodePoint d = next_code_point(p + end, n - end);
      if (d.cls != kSpace) break;
      last = end;
      end += d.len;
      ++count;
    }
    if (end == n || count == 1) {
      emit(start, end - start);
      i = end;
    } else {
      emit(start, last - start);
      i = last;
    }
  }
}

// Calls emit(offset, length) for each match of LLaMA-3's pre-tokenizer regex (tiktoken's
// cl100k pattern), in order:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// with the same classes as the GPT-2 one. Every position starts a match (the alternatives cover
// every code point), so the matches are the pieces; the alternatives are tried in order, as the
// regex engine does, with the backtracking each one needs worked out by hand below.
template <class Emit>
void pretokenize_llama3(std::string_view s, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto crlf = [&](size_t k) { return p[k] == '\r' || p[k] == '\n'; };
  // Bytes of a run of code points of class k from j (at most `limit` of them).
  auto run = [&](size_t j, uint8_t k, size_t limit = SIZE_MAX) {
    size_t count = 0;
    while (j < n && count < limit) {
      const CodePoint d = next_code_point(p + j, n - j);
      if (d.cls != k) break;
      j += d.len;
      ++count;
    }
    return j;
  };
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d); case folding also maps U+017F (ſ, C5 BF) to s
    if (p[i] == '\'' && i + 1 < n) {
      const unsigned char a = p[i + 1] | 0x20;   // ASCII letters to lower case
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if (p[i + 1] == 0xC5 && i + 2 < n && p[i + 2] == 0xBF) len = 3;
      else if (i + 2 < n) {
        const unsigned char b = p[i + 2] | 0x20;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      }
      if (len) {
        emit(start, len);
        i += len;
        continue;
      }
    }
    const CodePoint c0 = next_code_point(p + i, n - i);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    {
      size_t j = i;
      if (c0.cls != kLetter && c0.cls != kNumber && !crlf(i)) j += c0.len;
      if (j < n && next_code_point(p + j, n - j).cls == kLetter) {
        i = run(j, kLetter);
        emit(start, i - start);
        continue;
      }
    }
    // \p{N}{1,3}
    if (c0.cls == kNumber) {
      i = run(i, kNumber, 3);
      emit(start, i - start);
      continue;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    {
      size_t j = i;
      if (p[i] == ' ' && i + 1 < n && next_code_point(p + i + 1, n - i - 1).cls == kOther) j = i + 1;
      if (next_code_point(p + j, n - j).cls == kOther) {
        j = run(j, kOther);
        while (j < n && crlf(j)) ++j;
        emit(start, j - start);
        i = j;
        continue;
      }
    }
    // What is left starts with whitespace (a letter, number or other code point matched above).
    size_t end = i, last = i, count = 0, last_crlf = SIZE_MAX;
    while (end < n) {
      const CodePoint d = next_code_point(p + end, n - end);
      if (d.cls != kSpace) break;
      if (crlf(end)) last_crlf = end;
      last = end;
      end += d.len;
      ++count;
    }
    if (last_crlf != SIZE_MAX) {   // \s*[\r\n]+: up to the run's last line break
      i = last_crlf + 1;
    } else if (end == n || count == 1) {   // \s+(?!\S) reaching the end, or \s+
      i = end;
    } else {   // \s+(?!\S): all but the last code point, which then starts the next match
      i = last;
    }
    emit(start, i - start);
  }
}

// ---- GPT-2 byte <-> unicode table ---------------------------------------------------------

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> t{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = printable ? b : 256 + n++;
  }
  return t;
}

// (a, b) -> (rank, merged id), open addressing.
class MergeTable {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Hit {
    uint32_t rank = kNone, merged = 0;
  };

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  bool insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t merged) {
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, merged};
        return true;
      }
      if (slots_[i].key == key) return false;
    }
  }
  Hit find(uint32_t a, uint32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return {s.rank, s.merged};
      if (s.key == kEmpty) return {};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};   // ids are < 2^32 - 1, so never a real key
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0, merged = 0;
  };
  static uint64_t pack(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

using StringHash = detail::BpeStringHash;

// encoder.json is one flat object of string -> unsigned integer; read it with a SAX handler
// (no DOM: a quarter of the load time). `problem` says what else was found.
struct Gpt2EncoderSax {
  std::vector<std::pair<std::string, uint64_t>>& entries;
  std::string& problem;
  int depth = 0;
  std::string key_;

  bool fail(const std::string& what) {
    problem = "expected a flat JSON object of token -> id, found " + what;
    return false;
  }
  bool null() { return fail("null"); }
  bool boolean(bool) { return fail("a boolean"); }
  bool number_integer(int64_t v) { return v < 0 ? fail(fmt::format("the id {}", v)) : number_unsigned(uint64_t(v)); }
  bool number_unsigned(uint64_t v) {
    if (depth != 1) return fail("a bare number");
    entries.emplace_back(std::move(key_), v);
    return true;
  }
  bool number_float(double, const std::string& s) { return fail("the id " + s); }
  bool string(std::string&) { return fail("a string value"); }
  bool binary(nlohmann::json::binary_t&) { return fail("binary data"); }
  bool start_object(std::size_t) { return ++depth == 1 ? true : fail("a nested object"); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    --depth;
    return true;
  }
  bool start_array(std::size_t) { return fail("an array"); }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    problem = std::string("malformed JSON: ") + e.what();
    return false;
  }
};

// The byte-level BPE tokenizer both sources build (bpe.h).
class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(detail::BpeSpec spec)
      : id_(std::move(spec.id)), tokens_(std::move(spec.tokens)), index_(std::move(spec.index)), pre_(spec.pre),
        ignore_merges_(spec.ignore_merges) {
    for (int b = 0; b < 256; ++b) {
      auto it = index_.find(std::string(1, static_cast<char>(b)));
      if (it == index_.end())
        throw InputError(fmt::format("{}: the single byte 0x{:02X} has no token", spec.source, b));
      byte_id_[b] = it->second;
    }
    merges_.reserve(spec.merges.size());
    std::vector<uint32_t> made_by(tokens_.size(), MergeTable::kNone);   // rank of the merge making an id
    for (uint32_t r = 0; r < spec.merges.size(); ++r) {
      const auto& [l, rt, m] = spec.merges[r];
      if (!merges_.insert(l, rt, r, m))
        throw InputError(fmt::format("{}: merge {} ({:?} {:?}) is listed twice", spec.source, r, tokens_[l], tokens_[rt]));
      if (made_by[m] == MergeTable::kNone) made_by[m] = r;
      else heap_ok_ = false;   // a token made by two merges: keep the reference algorithm only
    }
    // The heap algorithm equals the reference one when every merge's parts are made by merges of
    // lower rank (true of GPT-2's files): then merges of equal rank never create one another.
    for (uint32_t r = 0; r < spec.merges.size() && heap_ok_; ++r)
      for (int k = 0; k < 2; ++k) {
        const uint32_t m = made_by[spec.merges[r][k]];
        if (m != MergeTable::kNone && m >= r) heap_ok_ = false;
      }
  }

  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> out;
    out.reserve(text.size() / 3 + 16);
    std::vector<uint32_t> scratch;
    WordCache fresh;   // this call's misses, merged into cache_ at the end
    {
      std::shared_lock lock(cache_mu_);
      auto word_ids = [&](size_t off, size_t len) {
        const std::string_view word = text.substr(off, len);
        if (len == 1) {
          out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
          return;
        }
        if (ignore_merges_)
          if (auto v = index_.find(word); v != index_.end()) {
            out.push_back(v->second);
            return;
          }
        if (len > kMaxCachedWordBytes) {
          bpe(word, scratch);
          out.insert(out.end(), scratch.begin(), scratch.end());
          return;
        }
        auto it = cache_.find(word);
        if (it == cache_.end()) {
          it = fresh.find(word);
          if (it == fresh.end()) {
            bpe(word, scratch);
            it = fresh.emplace(std::string(word), scratch).first;
          }
        }
        out.insert(out.end(), it->second.begin(), it->second.end());
      };
      if (pre_ == detail::PreTokenizer::gpt2) pretokenize(text, word_ids);
      else pretokenize_llama3(text, word_ids);
    }
    if (!fresh.empty() && fresh.size() <= kMaxCachedWords) {
      std::unique_lock lock(cache_mu_);
      if (cache_.size() + fresh.size() > kMaxCachedWords) cache_.clear();
      cache_.merge(fresh);
    }
    return out;
  }

  std::string decode(std::span<const uint32_t> ids) const override {
    size_t bytes = 0;
    for (uint32_t id : ids) {
      if (id >= tokens_.size())
        throw InputError(fmt::format("{} tokenizer: token id {} is out of vocabulary (ids are 0..{})", id_, id,
                                     tokens_.size() - 1));
      bytes += tokens_[id].size();
    }
    std::string s;
    s.reserve(bytes);
    for (uint32_t id : ids) s += tokens_[id];
    return s;
  }

  uint32_t vocab_size() const override { return static_cast<uint32_t>(tokens_.size()); }
  std::string id() const override { return id_; }

 private:
  using WordCache = std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>>;
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kMaxCachedWords = size_t{1} << 18;
  static constexpr size_t kNaiveMaxSymbols = 48;

  // BPE of one pre-token (≥ 1 byte) into ids.
  void bpe(std::string_view word, std::vector<uint32_t>& out) const {
    out.clear();
    for (unsigned char b : word) out.push_back(byte_id_[b]);
    if (out.size() > kNaiveMaxSymbols && heap_ok_) {
      bpe_heap(out);
      return;
    }
    // As the reference: find the adjacent pair of lowest rank, merge all its occurrences left to
    // right, repeat.
    while (out.size() > 1) {
      uint32_t best = MergeTable::kNone, left = 0, right = 0, merged = 0;
      for (size_t i = 0; i + 1 < out.size(); ++i) {
        const MergeTable::Hit h = merges_.find(out[i], out[i + 1]);
        if (h.rank < best) {
          best = h.rank;
          left = out[i];
          right = out[i + 1];
          merged = h.merged;
        }
      }
      if (best == MergeTable::kNone) break;
      size_t w = 0;
      for (size_t i = 0; i < out.size();) {
        if (i + 1 < out.size() && out[i] == left && out[i + 1] == right) {
          out[w++] = merged;
          i += 2;
        } else {
          out[w++] = out[i++];
        }
      }
      out.resize(w);
    }
  }

  // The same result in O(n log n) for long pre-tokens: merge the lowest-rank, leftmost pair one
  // at a time (a linked list of symbols and a heap of candidate pairs, stale ones skipped).
  void bpe_heap(std::vector<uint32_t>& sym) const {
    constexpr uint32_t kDead = UINT32_MAX;
    const auto n = static_cast<int32_t>(sym.size());
    std::vector<int32_t> next(n), prev(n);
    for (int32_t i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    struct Cand {
      uint32_t rank;
      int32_t pos;
      uint32_t left, right, merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      const MergeTable::Hit h = merges_.find(sym[pos], sym[next[pos]]);
      if (h.rank != MergeTable::kNone) heap.push({h.rank, pos, sym[pos], sym[next[pos]], h.merged});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const int32_t r = next[c.pos];
      if (sym[c.pos] != c.left || r < 0 || sym[r] != c.right) continue;   // stale
      sym[c.pos] = c.merged;
      sym[r] = kDead;
      next[c.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    size_t w = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[w++] = sym[i];
    sym.resize(w);
  }

  std::string id_;
  std::vector<std::string> tokens_;   // id -> bytes
  detail::BpeIndex index_;            // bytes -> id (ignore_merges)
  detail::PreTokenizer pre_;
  bool ignore_merges_;
  std::array<uint32_t, 256> byte_id_{};
  MergeTable merges_;
  bool heap_ok_ = true;
  mutable std::shared_mutex cache_mu_;
  mutable WordCache cache_;
};

}  // namespace

// OpenAI's GPT-2 files: encoder.json (token string -> id) and vocab.bpe (merges by rank).
detail::BpeSpec detail::read_gpt2_files(const std::string& dir_name) {
  const fs::path dir(dir_name);
  detail::BpeSpec spec;
  spec.id = "gpt2";
  spec.pre = detail::PreTokenizer::gpt2;

  // encoder.json
  const fs::path enc_path = dir / "encoder.json";
  spec.source = enc_path.string();
  const std::string enc_text = read_text_file(enc_path.string(), "GPT-2 vocabulary (set MANTIS_DATA_DIR?)");
  std::vector<std::pair<std::string, uint64_t>> entries;   // (key, id) in file order
  std::string problem;
  {
    Gpt2EncoderSax sax{entries, problem, 0, {}};
    const bool ok = nlohmann::json::sax_parse(enc_text, &sax);
    if (!ok || !problem.empty())
      throw InputError(fmt::format("{}: {}", enc_path.string(),
                                   problem.empty() ? std::string("malformed JSON") : problem));
  }
  if (entries.empty())
    throw InputError(fmt::format("{}: expected a non-empty JSON object of token -> id", enc_path.string()));
  auto& tokens = spec.tokens;
  auto& index = spec.index;
  tokens.assign(entries.size(), std::string());
  std::vector<bool> seen(entries.size(), false);
  index.reserve(entries.size());
  std::string bytes;
  for (const auto& [key, value] : entries) {
    if (value >= entries.size())
      throw InputError(fmt::format("{}: token {:?} has id {}, expected 0..{}", enc_path.string(), key, value,
                                   entries.size() - 1));
    const auto id = static_cast<uint32_t>(value);
    if (seen[id]) throw InputError(fmt::format("{}: id {} is used twice", enc_path.string(), id));
    if (!detail::byte_level_bytes(key, bytes))
      throw InputError(
          fmt::format("{}: token {:?} is not made of GPT-2 byte-alphabet characters", enc_path.string(), key));
    seen[id] = true;
    tokens[id] = bytes;
    if (!index.emplace(bytes, id).second)
      throw InputError(fmt::format("{}: token {:?} is listed twice", enc_path.string(), key));
  }

  // vocab.bpe
  const fs::path bpe_path = dir / "vocab.bpe";
  const std::string bpe_text = read_text_file(bpe_path.string(), "GPT-2 merges (set MANTIS_DATA_DIR?)");
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < bpe_text.size();) {
    size_t nl = bpe_text.find('\n', pos);
    if (nl == std::string::npos) nl = bpe_text.size();
    lines.push_back(std::string_view(bpe_text).substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (lines.empty() || !lines[0].starts_with("#version"))
    throw InputError(fmt::format("{}: expected a '#version' first line", bpe_path.string()));
  const size_t n_merges = lines.size() - 1;
  spec.merges.reserve(n_merges);
  std::unordered_set<uint64_t> listed;
  std::string a_bytes, b_bytes;
  for (size_t r = 0; r < n_merges; ++r) {
    const std::string_view line = lines[r + 1];
    const size_t sp = line.find(' ');
    auto bad = [&](const char* why) {
      return InputError(fmt::format("{}:{}: {}: {:?}", bpe_path.string(), r + 2, why, std::string(line)));
    };
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      throw bad("expected a merge 'a b'");
    if (!detail::byte_level_bytes(line.substr(0, sp), a_bytes) || !detail::byte_level_bytes(line.substr(sp + 1), b_bytes))
      throw bad("not GPT-2 byte-alphabet characters");
    const auto ia = index.find(a_bytes), ib = index.find(b_bytes), im = index.find(a_bytes + b_bytes);
    if (ia == index.end() || ib == index.end() || im == index.end())
      throw bad("a part or the result of this merge is not in encoder.json");
    if (!listed.insert(uint64_t{ia->second} << 32 | ib->second).second) throw bad("merge listed twice");
    spec.merges.push_back({ia->second, ib->second, im->second});
  }
  return spec;
}

namespace {

class BytesTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(std::span<const uint32_t> ids) const override {
    std::string s(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] > 255)
        throw InputError(fmt::format("bytes tokenizer: token id {} is out of vocabulary (ids are 0..255)", ids[i]));
      s[i] = static_cast<char>(ids[i]);
    }
    return s;
  }
  uint32_t vocab_size() const override { return 256; }
  std::string id() const override { return "bytes"; }
};

// ---- shards -------------------------------------------------------------------------------

constexpr char kShardMagic[8] = {'M', 'N', 'T', 'S', 'T', 'O', 'K', '\0'};
constexpr size_t kIdField = 16;

void put_le(std::string& buf, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) buf.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t token_width(uint32_t vocab) { return vocab <= 65536 ? 2 : 4; }

bool valid_id(std::string_view id) {
  return !id.empty() && id.size() <= kIdField &&
         std::all_of(id.begin(), id.end(), [](char c) { return c >= 0x21 && c <= 0x7E; });
}


}  // namespace

// ---- bpe.h ------------------------------------------------------------------------------------

namespace detail {

bool byte_level_bytes(std::string_view token, std::string& out) {
  static const std::array<int, 512> u2b = [] {
    std::array<int, 512> t;
    t.fill(-1);
    const std::array<uint32_t, 256> b2u = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) t[b2u[b]] = b;
    return t;
  }();
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    if (p[i] < 0x80) {
      cp = p[i];
      i += 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < token.size() && (p[i + 1] & 0xC0) == 0x80) {
      cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;
    }
    if (cp >= u2b.size() || u2b[cp] < 0) return false;
    out.push_back(static_cast<char>(u2b[cp]));
  }
  return !out.empty();
}

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

}  // namespace detail

// ---- public -------------------------------------------------------------------------------

std::vector<std::string> tokenizer_names() { return {"gpt2", "bytes"}; }

std::string gpt2_data_dir() {
  const fs::path root(data_root());
  std::error_code ec;
  if (!fs::exists(root / "gpt2" / "encoder.json", ec) && fs::exists(root / "encoder.json", ec)) return root.string();
  return (root / "gpt2").string();
}

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& dir) {
  return detail::make_bpe_tokenizer(detail::read_gpt2_files(dir));
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  if (name == "gpt2") return make_gpt2_tokenizer(gpt2_data_dir());
  if (name == "bytes") return std::make_unique<BytesTokenizer>();
  std::error_code ec;
  const fs::path p(name);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json", ec)) return detail::make_tokenizer_json((p / "tokenizer.json").string());
    if (fs::exists(p / "encoder.json", ec)) return make_gpt2_tokenizer(name);
    throw InputError(fmt::format("{}: no tokenizer.json (nor encoder.json + vocab.bpe) in this directory", name));
  }
  if (fs::exists(p, ec)) {
    if (p.extension() == ".json") return detail::make_tokenizer_json(name);
    throw InputError(fmt::format("{}: not a tokenizer (a tokenizer.json, or a directory holding one or encoder.json "
                                 "+ vocab.bpe)", name));
  }
  throw InputError(fmt::format("unknown tokenizer '{}' (known: gpt2, bytes, a tokenizer.json, or a directory holding "
                               "tokenizer.json or encoder.json + vocab.bpe)", name));
}

std::string model_tokenizer_json(const std::string& model_path) {
  if (model_path.empty()) return {};
  std::error_code ec;
  const fs::path p(model_path);
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
  const fs::path t = dir / "tokenizer.json";
  return fs::is_regular_file(t, ec) ? t.string() : std::string();
}

size_t utf8_invalid_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const CodePoint cp = next_code_point(p + i, s.size() - i);
    if (p[i] >= 0x80 && cp.len == 1) return i;  // a non-ASCII byte read alone: no well-formed sequence starts here
    i += cp.len;
  }
  return std::string_view::npos;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view utf8) {
  std::vector<std::string_view> words;
  pretokenize(utf8, [&](size_t off, size_t len) { words.push_back(utf8.substr(off, len)); });
  return words;
}

std::vector<std::string_view> llama3_pretokenize(std::string_view utf8) {
  std::vector<std::string_view> words;
  pretokenize_llama3(utf8, [&](size_t off, size_t len) { words.push_back(utf8.substr(off, len)); });
  return words;
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens, const Tokenizer& tokenizer) {
  write_shard(path, tokens, tokenizer.id(), tokenizer.vocab_size());
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens, const std::string& tokenizer_id,
                 uint32_t vocab_size) {
  if (!valid_id(tokenizer_id))
    throw InputError(fmt::format("{}: tokenizer id {:?} must be 1..16 printable ASCII characters", path,
                                 tokenizer_id));
  if (vocab_size == 0) throw InputError(fmt::format("{}: vocab size 0", path));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab_size)
      throw InputError(fmt::format("{}: token {} is {}, out of vocabulary (size {})", path, i, tokens[i],
                                   vocab_size));
  const uint32_t width = token_width(vocab_size);
  std::string buf;
  buf.reserve(kShardHeaderBytes + tokens.size() * width);
  buf.append(kShardMagic, sizeof kShardMagic);
  put_le(buf, kShardVersion, 4);
  put_le(buf, width, 4);
  put_le(buf, tokens.size(), 8);
  buf.append(tokenizer_id);
  buf.append(kIdField - tokenizer_id.size(), '\0');
  put_le(buf, vocab_size, 4);
  put_le(buf, 0, 4);
  for (uint32_t t : tokens) put_le(buf, t, static_cast<int>(width));

  write_file_atomic(path, buf);
}

TokenShard read_shard(const std::string& path) {
  auto fail = [&](const std::string& why) { return InputError(fmt::format("{}: {}", path, why)); };
  const int fd = open_input(path);  // a regular file: a FIFO or a device is refused by name
  std::unique_ptr<FILE, int (*)(FILE*)> f(::fdopen(fd, "rb"), std::fclose);
  if (!f) {
    ::close(fd);
    throw InputError(fmt::format("{}: cannot open token shard: {}", path, std::strerror(errno)));
  }
  std::string data;
  auto read_up_to = [&](size_t n) {
    char buf[1 << 16];
    while (n > 0) {
      const size_t k = std::fread(buf, 1, std::min(n, sizeof buf), f.get());
      if (k == 0) break;
      data.append(buf, k);
      n -= k;
    }
    if (std::ferror(f.get())) throw fail("cannot read token shard");
  };
  // The header first: a special file that is no shard (/dev/zero, a terminal) fails its checks
  // before the body is read, so it cannot make this read without bound.
  read_up_to(kShardHeaderBytes);
  if (data.empty())
    throw fail(fmt::format("empty file, not a token shard (truncated: 0 bytes, no {}-byte header)", kShardHeaderBytes));
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < kShardHeaderBytes)
    throw fail(fmt::format("truncated token shard: {} bytes, shorter than the {}-byte header", data.size(),
                           kShardHeaderBytes));
  if (std::memcmp(p, kShardMagic, sizeof kShardMagic) != 0)
    throw fail("not a token shard (bad magic, expected \"MNTSTOK\\0\")");
  const auto version = static_cast<uint32_t>(get_le(p + 8, 4));
  if (version != kShardVersion)
    throw fail(fmt::format("unsupported token shard version {} (this build reads version {})", version,
                           kShardVersion));
  const auto width = static_cast<uint32_t>(get_le(p + 12, 4));
  const uint64_t count = get_le(p + 16, 8);
  const std::string id_field(data.data() + 24, kIdField);  // a copy: `data` grows (reallocates) below
  const std::string_view id = std::string_view(id_field).substr(0, std::min(id_field.find('\0'), kIdField));
  const auto vocab = static_cast<uint32_t>(get_le(p + 40, 4));
  const auto reserved = static_cast<uint32_t>(get_le(p + 44, 4));
  if (!valid_id(id) || id_field.find_first_not_of('\0', id.size()) != std::string_view::npos)
    throw fail("malformed tokenizer id field (expected 1..16 printable ASCII characters, NUL-padded)");
  if (vocab == 0) throw fail("vocab size 0 in the header");
  if (width != token_width(vocab))
    throw fail(fmt::format("token width {} does not match vocab size {} (expected {})", width, vocab,
                           token_width(vocab)));
  if (reserved != 0) throw fail(fmt::format("reserved header field is {}, expected 0", reserved));
  read_up_to(SIZE_MAX);
  const uint64_t body = data.size() - kShardHeaderBytes;
  if (count > body / width)
    throw fail(fmt::format("truncated token shard: the header says {} tokens of {} bytes, the file has {} bytes "
                           "after the header",
                           count, width, body));
  if (body != count * width)
    throw fail(fmt::format("token shard has {} trailing bytes after its {} tokens", body - count * width, count));

  TokenShard shard;
  shard.tokenizer_id = std::string(id);
  shard.vocab_size = vocab;
  shard.tokens.resize(count);
  const unsigned char* t = reinterpret_cast<const unsigned char*>(data.data()) + kShardHeaderBytes;
  for (uint64_t i = 0; i < count; ++i) {
    const auto v = static_cast<uint32_t>(get_le(t + i * width, static_cast<int>(width)));
    if (v >= vocab)
      throw fail(fmt::format("token {} is {}, out of vocabulary (size {})", i, v, vocab));
    shard.tokens[i] = v;
  }
  return shard;
}

}  // namespace mantis
