// Text processing is linear in its input (issue 30): for adversarial inputs (one word of a
// single letter, runs of combining marks NFC must reorder, CJK, emoji, punctuation, digits,
// spaces, newlines) tokenizing 8 MiB takes about 4 times what 2 MiB takes, not 16 (a run
// of marks took 6.8 s for 128 KiB, and one word of 16 MiB took 4 s and 530 MB, before).
// Ratios within one run; the absolute MB/s are printed, next to plain prose's.
// (Below 4 MiB a long word's merge state still fits the caches: 1 -> 4 MiB crosses that cliff.)
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "reference.h"
#include "streambp/tokenizer.h"

namespace streambp {
namespace {

std::string Repeat(const std::string& unit, size_t bytes) {
  std::string out;
  out.reserve(bytes + unit.size());
  while (out.size() < bytes) out += unit;
  return out;
}

// CPU time of this thread (not wall time: other processes on a busy machine do not count),
// the least of two runs.
double Seconds(const std::function<void()>& f) {
  auto now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  double best = 1e30;
  for (int run = 0; run < 2; ++run) {
    const double start = now();
    f();
    best = std::min(best, now() - start);
  }
  return best;
}

void ExpectLinear(const std::string& model) {
  auto tokenizer = Tokenizer::FromDir(text_test::ReferenceDir() + "/models/" + model);
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"prose", "The quick brown fox jumps over the lazy dog. "},
      {"one letter", "a"},
      {"combining marks", "\u0301\u0316"},
      {"cjk", "\u4e00\u4e8c\u4e09\u56db"},
      {"emoji", "\U0001F600\U0001F389"},
      {"punctuation", "!?"},
      {"digits", "1234567890"},
      {"spaces", " "},
      {"newlines", "\n"},
  };
  // Real English (this README and two licenses) with an empty word cache: what a server
  // meets on the first pass of new text. The repeated sentence below is all cache hits.
  std::string english = text_test::ReadText(text_test::SourceDir() + "/../../README.md");
  for (const char* license : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"}) {
    english += text_test::ReadText(license);
  }
  const double english_cold = MeasureEncodeThroughput(*tokenizer, english, 0.5).cold_mb_s;
  std::printf("[ %s ] English (cold word cache) %.1f MB/s\n", model.c_str(), english_cold);
  double prose_rate = 0;
  for (const auto& [name, unit] : kinds) {
    const std::string small = Repeat(unit, 2 << 20), large = Repeat(unit, 8 << 20);
    size_t n_small = 0, n_large = 0;
    const double t_small = Seconds([&] { n_small = tokenizer->encode(small, false).size(); });
    const double t_large = Seconds([&] { n_large = tokenizer->encode(large, false).size(); });
    EXPECT_GT(n_small, 0u);
    EXPECT_GT(n_large, n_small);
    const double rate = 8.0 * 1.048576 / t_large;  // MB/s (1e6 bytes, as for English) at 8 MiB
    if (name == "prose") prose_rate = rate;
    std::printf("%-16s 2 MiB %7.3f s  8 MiB %7.3f s  ratio %5.2f  %6.1f MB/s (prose %6.1f, English cold %.1f)\n",
                name.c_str(), t_small, t_large, t_large / t_small, rate, prose_rate, english_cold);
    // Linear: 4x the input, about 4x the time (16x if quadratic); slack for caches and noise.
    EXPECT_LT(t_large, 10.0 * t_small + 0.05)
        << model << ", " << name << ": 8 MiB took " << t_large << " s, 2 MiB " << t_small << " s";
  }
}

TEST(TokenizerLinearTime, AdversarialInputsTokenizeInLinearTime) {
  STREAMBP_REQUIRE_REFERENCE();
  ExpectLinear("qwen3");  // NFC, byte-level BPE, a split regex
}

// Gemma's tokenizer has no pre-tokenizer split: the text between two added tokens (newlines,
// runs of tabs) is one word however long, spaces included.
TEST(TokenizerLinearTime, CharacterLevelBpeIsLinearToo) {
  STREAMBP_REQUIRE_REFERENCE();
  ExpectLinear("gemma3");
}

}  // namespace
}  // namespace streambp
