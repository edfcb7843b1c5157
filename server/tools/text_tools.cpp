// Text tools: tokenize and render JSON lines with a model folder's tokenizer and chat format,
// from the shell, exactly as the server does (the same library).
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "streambp/chat.h"
#include "streambp/error.h"
#include "streambp/tokenizer.h"
#include "tools.h"

namespace streambp::tools {
namespace {

using nlohmann::json;

// Calls `line_fn(parsed, where)` for each non-blank line of stdin and prints its result.
int EachLine(const std::string& what, const std::function<json(const json&, const std::string&)>& line_fn) {
  std::string line;
  int64_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "stdin:" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw InvalidArgument(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw InvalidArgument(where + ": expected a JSON object with " + what);
    std::cout << line_fn(j, where).dump(-1, ' ', false, json::error_handler_t::strict) << "\n";
  }
  return 0;
}

std::vector<ChatMessage> ParseMessages(const json& j, const std::string& where) {
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array()) throw InvalidArgument(where + ": expected a field 'messages' (a list)");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    const std::string w = where + ": messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw InvalidArgument(w + ": needs a string 'role'");
    ChatMessage c;
    c.role = m["role"].get<std::string>();
    if (m.contains("content") && m["content"].is_string()) c.content = m["content"].get<std::string>();
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      c.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    if (m.contains("train") && m["train"].is_boolean()) c.train = m["train"].get<bool>();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

int Tokenize(const TokenizeArgs& args) {
  const auto tokenizer = Tokenizer::FromDir(args.model);
  return EachLine("a field 'text'", [&](const json& j, const std::string& where) {
    auto it = j.find("text");
    if (it == j.end() || !it->is_string()) throw InvalidArgument(where + ": expected a string field 'text'");
    try {
      return json{{"ids", tokenizer->encode(it->get<std::string>(), args.add_special_tokens)}};
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + ": " + e.what());
    }
  });
}

int Render(const RenderArgs& args) {
  const auto tokenizer = Tokenizer::FromDir(args.model);
  const auto format = ChatFormat::ForTokenizer(*tokenizer, args.format);
  ChatOptions options;
  options.add_generation_prompt = args.add_generation_prompt;
  options.enable_thinking = !args.disable_thinking;
  return EachLine("a field 'messages'", [&](const json& j, const std::string& where) {
    const auto messages = ParseMessages(j, where);
    RenderedChat r;
    try {
      r = format->render(*tokenizer, messages, options);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + ": " + e.what());
    }
    std::vector<int> mask(r.loss_mask.begin(), r.loss_mask.end());
    return json{{"text", r.text}, {"ids", r.ids}, {"loss_mask", mask}, {"format", std::string(format->name())}};
  });
}

}  // namespace streambp::tools
