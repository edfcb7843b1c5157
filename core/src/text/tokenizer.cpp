#include "tokenizer_impl.h"

#include "byte_level.h"
#include "streambp/error.h"
#include "streambp/interrupt.h"

namespace streambp {

using text::AddedToken;
using text::AddedTokenMatcher;
using text::BpeModel;
using text::RegexSplitter;

template <class F>
void Tokenizer::Impl::split_pieces(std::string_view text, size_t level, size_t base, F&& piece) const {
  if (level == splitters.size()) {
    piece(base, base + text.size());
    return;
  }
  splitters[level]->split(text, [&](size_t begin, size_t end) {
    split_pieces(text.substr(begin, end - begin), level + 1, base + begin, piece);
  });
}

void Tokenizer::Impl::encode_normalized(std::string_view text, size_t text_offset, const text::OffsetMap& map,
                                        size_t segment_offset, std::vector<int64_t>& ids,
                                        std::vector<size_t>* offsets) const {
  split_pieces(text, 0, 0, [&](size_t begin, size_t end) {
    PollInterrupt(static_cast<int64_t>(end - begin) + 16);
    const size_t first = ids.size();
    model->encode_word(text.substr(begin, end - begin), ids);
    if (!offsets) return;
    size_t at = begin;
    for (size_t k = first; k < ids.size(); ++k) {
      offsets->push_back(segment_offset + map.to_input(text_offset + std::min(at, end)));
      at += bytes[ids[k]].size();
    }
  });
}

void Tokenizer::Impl::encode_segment(std::string_view segment, size_t segment_offset,
                                     std::vector<int64_t>& ids, std::vector<size_t>* offsets) const {
  if (segment.empty()) return;
  text::OffsetMap map;
  std::string normalized_storage;
  std::string_view normalized = segment;
  if (nfc) {
    normalized_storage.reserve(segment.size());
    if (text::AppendNfc(segment, normalized_storage, map)) normalized = normalized_storage;
  }
  if (normalized_matcher->empty()) {
    encode_normalized(normalized, 0, map, segment_offset, ids, offsets);
    return;
  }
  size_t done = 0;
  for (const auto& m : normalized_matcher->find_all(normalized)) {
    encode_normalized(normalized.substr(done, m.begin - done), done, map, segment_offset, ids, offsets);
    ids.push_back(m.token->id);
    if (offsets) offsets->push_back(segment_offset + map.to_input(m.begin));
    done = m.end;
  }
  encode_normalized(normalized.substr(done), done, map, segment_offset, ids, offsets);
}

void Tokenizer::Impl::encode(std::string_view text, bool add_special_tokens, std::vector<int64_t>& ids,
                             std::vector<size_t>* offsets) const {
  if (const size_t bad = text::FindInvalidUtf8(text); bad != std::string_view::npos) {
    throw InvalidArgument("text is not valid UTF-8 at byte " + std::to_string(bad));
  }
  ids.reserve(text.size() / 3 + 8);
  if (offsets) offsets->reserve(ids.capacity());
  if (add_special_tokens) {
    ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
    if (offsets) offsets->insert(offsets->end(), prefix_ids.size(), 0);
  }
  size_t done = 0;
  for (const auto& m : raw_matcher->find_all(text)) {
    encode_segment(text.substr(done, m.begin - done), done, ids, offsets);
    ids.push_back(m.token->id);
    if (offsets) offsets->push_back(m.begin);
    done = m.end;
  }
  encode_segment(text.substr(done), done, ids, offsets);
  if (add_special_tokens) {
    ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
    if (offsets) offsets->insert(offsets->end(), suffix_ids.size(), text.size());
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  impl_->encode(text, add_special_tokens, ids, nullptr);
  return ids;
}

Encoding Tokenizer::encode_with_offsets(std::string_view text, bool add_special_tokens) const {
  Encoding encoding;
  impl_->encode(text, add_special_tokens, encoding.ids, &encoding.offsets);
  return encoding;
}

std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string joined;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0)
      throw InvalidArgument("ids[" + std::to_string(i) + "] = " + std::to_string(id) + " is negative");
    if (id >= static_cast<int64_t>(m.exists.size()) || !m.exists[id]) continue;
    if (skip_special_tokens && m.special[id]) continue;
    PollInterrupt(static_cast<int64_t>(m.bytes[id].size()) + 16);
    if (m.byte_level_decoder) {
      joined += m.bytes[id];
    } else {
      // No decoder: HF joins the token spellings with spaces.
      if (!first) joined += ' ';
      joined += m.tokens[id];
    }
    first = false;
  }
  if (!m.byte_level_decoder) return joined;
  std::string text;
  text.reserve(joined.size());
  text::AppendUtf8Lossy(joined, text);
  return text;
}

const std::string& Tokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(impl_->exists.size()) || !impl_->exists[id]) {
    throw InvalidArgument("token id " + std::to_string(id) + " does not exist");
  }
  return impl_->bytes[id];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->exists.size()); }

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto id = impl_->model->token_to_id(token)) return *id;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(impl_->exists.size()) || !impl_->exists[id]) {
    throw InvalidArgument("token id " + std::to_string(id) + " does not exist");
  }
  return impl_->tokens[id];
}

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < static_cast<int64_t>(impl_->special.size()) && impl_->special[id];
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::pad_token() const { return impl_->pad_token; }

std::optional<int64_t> Tokenizer::bos_token_id() const {
  return impl_->bos_token.empty() ? std::nullopt : token_to_id(impl_->bos_token);
}

std::optional<int64_t> Tokenizer::pad_token_id() const {
  return impl_->pad_token.empty() ? std::nullopt : token_to_id(impl_->pad_token);
}

std::vector<int64_t> Tokenizer::eos_token_ids() const {
  if (impl_->eos_token.empty()) return {};
  if (auto id = token_to_id(impl_->eos_token)) return {*id};
  return {};
}

void Tokenizer::clear_cache() const { impl_->model->clear_cache(); }

EncodeThroughput MeasureEncodeThroughput(const Tokenizer& tokenizer, std::string_view text,
                                         double min_seconds) {
  using Clock = std::chrono::steady_clock;
  EncodeThroughput result;
  result.bytes = text.size();
  tokenizer.clear_cache();
  auto start = Clock::now();
  result.tokens = tokenizer.encode(text).size();
  double cold = std::chrono::duration<double>(Clock::now() - start).count();
  result.cold_mb_s = text.size() / 1e6 / std::max(cold, 1e-9);
  size_t passes = 0;
  start = Clock::now();
  double elapsed = 0;
  do {
    tokenizer.encode(text);
    ++passes;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  result.warm_mb_s = static_cast<double>(text.size()) * passes / 1e6 / std::max(elapsed, 1e-9);
  return result;
}

}  // namespace streambp
