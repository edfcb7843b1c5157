#include "added_tokens.h"

#include <algorithm>

#include "unicode.h"

namespace streambp::text {

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens) : first_byte_(256, false) {
  nodes_.emplace_back();
  for (const AddedToken* token : tokens) {
    if (token->content.empty()) continue;
    int32_t node = 0;
    for (char c : token->content) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(std::upper_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                        {byte, next});
      }
      node = next;
    }
    if (!nodes_[node].token) nodes_[node].token = token;  // the first of equal contents wins
    first_byte_[static_cast<unsigned char>(token->content[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& end) const {
  const AddedToken* found = nullptr;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token) {
      found = nodes_[node].token;
      end = i + 1;
    }
  }
  return found;
}

namespace {

bool EndsWithWordChar(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t begin;
  return IsAlphanumeric(PrevCodePoint(text, end, begin));
}

bool StartsWithWordChar(std::string_view text, size_t begin) {
  if (begin >= text.size()) return false;
  return IsAlphanumeric(NextCodePoint(text, begin));
}

}  // namespace

std::vector<AddedTokenMatcher::Match> AddedTokenMatcher::find_all(std::string_view text) const {
  std::vector<Match> matches;
  if (empty()) return matches;
  size_t previous_end = 0;  // end of the previous match, stripped whitespace included
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t end = 0;
    const AddedToken* token = longest_at(text, pos, end);
    if (!token) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    pos = end;
    if (token->single_word && (EndsWithWordChar(text, begin) || StartsWithWordChar(text, end))) continue;
    if (token->lstrip) {
      while (begin > previous_end) {
        size_t prev;
        if (!IsWhiteSpace(PrevCodePoint(text, begin, prev))) break;
        begin = prev;
      }
    }
    if (token->rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!IsWhiteSpace(NextCodePoint(text, next))) break;
        end = next;
      }
      pos = end;
    }
    matches.push_back({begin, end, token});
    previous_end = end;
  }
  return matches;
}

}  // namespace streambp::text
