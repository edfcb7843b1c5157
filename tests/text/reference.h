#pragma once
// Where tests/text find their references: the folder the ctest fixture `text.reference`
// fills (tests/text/reference/setup.sh): real tokenizer files from npm, the ids the Node
// reference gives for every corpus line, and the Jinja2 renderings of the chat cases.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace streambp::text_test {

inline std::string SourceDir() {
  const char* env = std::getenv("STREAMBP_TEXT_SOURCE_DIR");
  return env ? env : STREAMBP_TEXT_SOURCE_DIR;
}

inline std::string ReferenceDir() {
  const char* env = std::getenv("STREAMBP_TEXT_REFERENCE_DIR");
  return env ? env : STREAMBP_TEXT_REFERENCE_DIR;
}

inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

inline std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// Empty when the reference is there; otherwise why not (setup.sh writes UNAVAILABLE when npm
// could not reach the registry outside CI).
inline std::string ReferenceMissing() {
  namespace fs = std::filesystem;
  const fs::path dir(ReferenceDir());
  if (fs::exists(dir / "UNAVAILABLE"))
    return "reference unavailable: " + ReadText((dir / "UNAVAILABLE").string());
  if (!fs::exists(dir / "COMPLETE")) {
    return "no reference in " + dir.string() +
           " (run `ctest -R text`, whose fixture text.reference builds it)";
  }
  return "";
}

}  // namespace streambp::text_test

// Skips the test when the reference could not be built, except in CI (CI=true), where that fails.
#define STREAMBP_REQUIRE_REFERENCE()                                       \
  do {                                                                     \
    const std::string missing = ::streambp::text_test::ReferenceMissing(); \
    if (!missing.empty()) {                                                \
      if (::streambp::text_test::InCi()) FAIL() << missing;                \
      GTEST_SKIP() << missing;                                             \
    }                                                                      \
  } while (0)
