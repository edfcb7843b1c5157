#pragma once
// The model folder of the text tests: the tiny preset around the real Qwen3 tokenizer of the
// npm reference packages (tests/text/reference/setup.sh).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

namespace streambp::testing {

std::string ReferenceModels();
/// The tiny preset with the Qwen3 tokenizer's vocabulary and end token, its tokenizer files
/// copied in (what `streambp-server init-model --tokenizer` writes). Made once per process.
const std::string& QwenModelDir();
/// The same for Gemma 3: the tiny preset as a gemma3 folder (tied head, pad and bos ids from
/// the tokenizer) around the real Gemma 3 tokenizer (262145 tokens).
const std::string& GemmaModelDir();

}  // namespace streambp::testing

// Skips the test when the npm reference could not be installed (outside CI), saying why.
#define REQUIRE_REFERENCE()                                                                         \
  do {                                                                                              \
    const std::filesystem::path ref(STREAMBP_TEXT_REFERENCE_DIR);                                   \
    if (!std::filesystem::exists(ref / "COMPLETE")) {                                               \
      std::ifstream why(ref / "UNAVAILABLE");                                                       \
      std::string reason((std::istreambuf_iterator<char>(why)), std::istreambuf_iterator<char>()); \
      GTEST_SKIP() << "text reference unavailable: " << reason;                                     \
    }                                                                                               \
  } while (0)
