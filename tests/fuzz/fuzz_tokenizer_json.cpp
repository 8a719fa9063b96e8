// fuzz_tokenizer_json — a Hugging Face tokenizer.json (io/tokenizer.h make_tokenizer: model.vocab,
// merges, added_tokens, the pre-tokenizers, normalizer and decoder). A tokenizer that loads encodes
// a fixed multilingual text and the input's own bytes, and decodes them back: byte-level BPE
// encodes any bytes, so decode(encode(s)) == s (tokenizer.h) is checked.
#include <string_view>

#include "io/tokenizer.h"
#include "fuzz.h"

using namespace mantis;

MANTIS_FUZZ_TARGET(tokenizer_json) {
  const std::string path = fuzz::put("tokenizer.json", data, size);
  fuzz::refused([&] {
    const auto t = make_tokenizer(path);
    const std::string_view input(reinterpret_cast<const char*>(data), std::min<size_t>(size, 512));
    for (std::string_view s :
         {std::string_view("Hello world's  THE 1234 tokens,\r\n\tÜber 東京 \xF0\x9F\x98\x80 \xFF\xC0!"), input}) {
      const std::vector<uint32_t> ids = t->encode(s);
      for (uint32_t id : ids) fuzz::check(id < t->vocab_size(), "tokenizer_json: encode gave an id ≥ vocab_size()");
      fuzz::check(t->decode(ids) == s, "tokenizer_json: decode(encode(s)) != s");
    }
  });
  return 0;
}
