// streambp-bench --tokenizer DIR: what text costs next to ids. The tokenizer's encode speed
// (cold: empty word cache; warm) on an English text, adversarial inputs of the same size next
// to it (one letter, combining marks, CJK, emoji, punctuation, digits, spaces, newlines), the
// chat format's rendering speed, and
// a text request's tokenization time next to the forward-backward of the same tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "bench.h"
#include "streambp/chat.h"
#include "streambp/engine.h"
#include "streambp/error.h"
#include "streambp/objective.h"
#include "streambp/tokenizer.h"

namespace streambp::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound("cannot read the text file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// text[begin, begin + length) with both ends moved back to the start of a UTF-8 character,
// so a piece of a text with non-ASCII characters is still valid UTF-8.
std::string Utf8Piece(const std::string& text, size_t begin, size_t length) {
  auto boundary = [&](size_t i) {
    i = std::min(i, text.size());
    while (i > 0 && i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  const size_t b = boundary(begin);
  const size_t e = boundary(begin + length);
  return text.substr(b, e > b ? e - b : 0);
}

}  // namespace

nlohmann::json RunTextBench(const TextBenchPlan& plan) {
  const auto tokenizer = Tokenizer::FromDir(plan.tokenizer_dir);
  std::string text = ReadText(plan.text_file);
  while (text.size() < plan.min_bytes) text += "\n" + text;  // long enough to time
  const auto enc = MeasureEncodeThroughput(*tokenizer, text, plan.min_seconds);
  std::printf("tokenizer %s: %.2f MB of text, %zu tokens (%.2f bytes/token)\n", plan.tokenizer_dir.c_str(),
              enc.bytes / 1e6, enc.tokens, static_cast<double>(enc.bytes) / static_cast<double>(enc.tokens));
  std::printf("  encode, one core: %.1f MB/s cold (empty word cache), %.1f MB/s warm\n", enc.cold_mb_s, enc.warm_mb_s);
  nlohmann::json out{{"tokenizer", plan.tokenizer_dir},
                     {"text_file", plan.text_file},
                     {"bytes", enc.bytes},
                     {"tokens", enc.tokens},
                     {"encode_cold_mb_s", enc.cold_mb_s},
                     {"encode_warm_mb_s", enc.warm_mb_s}};

  // Adversarial text next to it: each kind repeated to the English text's size and encoded once
  // from an empty word cache, as the English was for its cold figure. The ratio to that figure
  // is what a client choosing its worst input gains over plain text (1 = the same cost per MB).
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"one letter", "a"},         {"combining marks", "\u0301\u0316"}, {"cjk", "\u4e00\u4e8c\u4e09\u56db"},
      {"emoji", "\U0001F600\U0001F389"}, {"punctuation", "!?"},                {"digits", "1234567890"},
      {"spaces", " "},             {"newlines", "\n"},                   {"repeated sentence", "The quick brown fox. "}};
  nlohmann::json adversarial = nlohmann::json::object();
  double slowest = 1e30;
  for (const auto& [name, unit] : kinds) {
    std::string input;
    input.reserve(text.size() + unit.size());
    while (input.size() < text.size()) input += unit;
    tokenizer->clear_cache();
    const auto start = Clock::now();
    const size_t tokens = tokenizer->encode(input).size();
    const double mb_s = static_cast<double>(input.size()) / 1e6 / std::max(Since(start), 1e-9);
    if (name != "repeated sentence") slowest = std::min(slowest, mb_s / enc.cold_mb_s);
    std::printf("  %-18s %7.1f MB/s  %5.2fx the English text's (%zu tokens)\n", name.c_str(), mb_s,
                mb_s / enc.cold_mb_s, tokens);
    adversarial[name] = {{"mb_s", mb_s}, {"ratio_to_english", mb_s / enc.cold_mb_s}, {"tokens", tokens}};
  }
  std::printf("  slowest adversarial input: %.2fx the English text's speed\n", slowest);
  out["adversarial"] = adversarial;
  out["adversarial_slowest_ratio"] = slowest;

  // Chat rendering: conversations of paragraphs of the text, ids and loss mask.
  std::unique_ptr<ChatFormat> format;
  try {
    format = ChatFormat::ForTokenizer(*tokenizer);
  } catch (const Error& e) {
    std::printf("  chat: %s\n", e.what());
  }
  if (format) {
    std::vector<std::vector<ChatMessage>> conversations;
    size_t bytes = 0;
    for (size_t at = 0; at + 2000 < text.size() && conversations.size() < 200; at += 2000) {
      std::vector<ChatMessage> m = {{"system", "You are a helpful assistant."},
                                    {"user", Utf8Piece(text, at, 400)},
                                    {"assistant", Utf8Piece(text, at + 400, 1600)}};
      for (const auto& x : m) bytes += x.content.size();
      conversations.push_back(std::move(m));
    }
    const auto start = Clock::now();
    size_t ids = 0;
    int passes = 0;
    do {
      for (const auto& c : conversations) ids += format->render(*tokenizer, c).ids.size();
      ++passes;
    } while (Since(start) < plan.min_seconds);
    const double secs = Since(start);
    const double mb_s = static_cast<double>(bytes) * passes / 1e6 / secs;
    const double per_s = static_cast<double>(conversations.size()) * passes / secs;
    std::printf("  chat (%s): %.1f MB/s, %.0f conversations/s of ~%zu tokens\n", std::string(format->name()).c_str(),
                mb_s, per_s, ids / (conversations.size() * passes));
    out["chat"] = {{"format", std::string(format->name())}, {"mb_s", mb_s}, {"conversations_per_s", per_s}};
  }

  // A text request next to the step it feeds: tokenizing T tokens' worth of text vs one
  // forward-backward of T tokens (stream engine, this model).
  if (plan.model) {
    const int64_t T = plan.step_tokens;
    const size_t span = static_cast<size_t>(static_cast<double>(T) * enc.bytes / enc.tokens);
    const std::string piece = Utf8Piece(text, 0, span);
    tokenizer->clear_cache();
    auto start = Clock::now();
    auto ids = tokenizer->encode(piece);
    const double tokenize = Since(start);
    ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(T)));
    const auto vocab = (*plan.model)->config().vocab_size;
    Sequence s;
    for (auto id : ids) s.tokens.push_back(id % vocab);
    auto batch = MakeBatch({s}, Layout::kRightPad);
    auto objective = CreateObjective("sft", nlohmann::json::object());
    EngineOptions engine;
    engine.kind = EngineKind::kStream;
    ForwardBackward(*plan.model, batch, *objective, engine);  // warm up
    objective->finish();
    start = Clock::now();
    ForwardBackward(*plan.model, batch, *objective, engine);
    const double step = Since(start);
    objective->finish();
    for (auto& p : (*plan.model)->parameters()) p.mutable_grad() = torch::Tensor();
    std::printf("  a request of %zu tokens of text: tokenize %.2f ms (cold cache) vs forward-backward %.1f ms "
                "(%.3f%% of the step)\n",
                ids.size(), tokenize * 1e3, step * 1e3, 100.0 * tokenize / step);
    out["request"] = {{"tokens", ids.size()}, {"tokenize_seconds", tokenize}, {"step_seconds", step},
                      {"fraction", tokenize / step}};
  }
  return out;
}

}  // namespace streambp::bench
