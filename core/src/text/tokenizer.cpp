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

namespace {

// The input offset of an offset in the text the normalizer steps (their maps, in order) made.
size_t ToInput(std::span<const text::OffsetMap> maps, size_t offset) {
  for (size_t k = maps.size(); k-- > 0;) offset = maps[k].to_input(offset);
  return offset;
}

}  // namespace

void Tokenizer::Impl::encode_normalized(std::string_view text, size_t text_offset,
                                        std::span<const text::OffsetMap> maps, size_t segment_offset,
                                        std::vector<int64_t>& ids, std::vector<size_t>* offsets) const {
  thread_local std::vector<uint32_t> starts;
  split_pieces(text, 0, 0, [&](size_t begin, size_t end) {
    PollInterrupt(static_cast<int64_t>(end - begin) + 16);
    if (!offsets) {
      model->encode_word(text.substr(begin, end - begin), ids);
      return;
    }
    starts.clear();
    model->encode_word(text.substr(begin, end - begin), ids, &starts);
    for (uint32_t start : starts) offsets->push_back(segment_offset + ToInput(maps, text_offset + begin + start));
  });
  if (starts.capacity() > (size_t{1} << 16)) starts = {};
}

void Tokenizer::Impl::encode_segment(std::string_view segment, size_t segment_offset,
                                     std::vector<int64_t>& ids, std::vector<size_t>* offsets) const {
  if (segment.empty()) return;
  // Each normalizer step writes into the buffer the previous one did not.
  std::vector<text::OffsetMap> maps;
  std::string buffers[2];
  std::string_view normalized = segment;
  for (const NormalizerStep& step : normalizers) {
    std::string& next = buffers[maps.size() % 2];
    next.clear();
    next.reserve(normalized.size() + normalized.size() / 4);
    text::OffsetMap map;
    const bool changed = step.nfc ? text::AppendNfc(normalized, next, map)
                                  : text::AppendReplaced(normalized, step.from, step.to, next, map);
    if (changed) {
      maps.push_back(std::move(map));
      normalized = next;
    }
  }
  if (normalized_matcher->empty()) {
    encode_normalized(normalized, 0, maps, segment_offset, ids, offsets);
    return;
  }
  size_t done = 0;
  for (const auto& m : normalized_matcher->find_all(normalized)) {
    encode_normalized(normalized.substr(done, m.begin - done), done, maps, segment_offset, ids, offsets);
    ids.push_back(m.token->id);
    if (offsets) offsets->push_back(segment_offset + ToInput(maps, m.begin));
    done = m.end;
  }
  encode_normalized(normalized.substr(done), done, maps, segment_offset, ids, offsets);
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

void Tokenizer::Impl::decode_pieces(std::span<const int64_t> ids, bool skip_special_tokens,
                                    std::string& out) const {
  // As HF's ByteFallback: a run of `<0xNN>` tokens is its bytes when they are valid UTF-8,
  // otherwise one U+FFFD per byte.
  std::string run;
  auto flush = [&] {
    if (run.empty()) return;
    if (text::FindInvalidUtf8(run) == std::string::npos) {
      out += run;
    } else {
      for (size_t k = 0; k < run.size(); ++k) out += "\xEF\xBF\xBD";
    }
    run.clear();
  };
  for (const int64_t id : ids) {
    if (id >= static_cast<int64_t>(exists.size()) || !exists[id]) continue;
    if (skip_special_tokens && special[id]) continue;
    PollInterrupt(static_cast<int64_t>(bytes[id].size()) + 16);
    if (fallback_byte[id] >= 0) {
      run += static_cast<char>(fallback_byte[id]);
    } else {
      flush();
      out += bytes[id];
    }
  }
  flush();
}

std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0)
      throw InvalidArgument("ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is negative");
  }
  if (m.decoder == Impl::Decoder::kPieces) {
    std::string text;
    m.decode_pieces(ids, skip_special_tokens, text);
    return text;
  }
  std::string joined;
  bool first = true;
  for (const int64_t id : ids) {
    if (id >= static_cast<int64_t>(m.exists.size()) || !m.exists[id]) continue;
    if (skip_special_tokens && m.special[id]) continue;
    PollInterrupt(static_cast<int64_t>(m.bytes[id].size()) + 16);
    if (m.decoder == Impl::Decoder::kByteLevel) {
      joined += m.bytes[id];
    } else {
      // No decoder: HF joins the token spellings with spaces.
      if (!first) joined += ' ';
      joined += m.tokens[id];
    }
    first = false;
  }
  if (m.decoder != Impl::Decoder::kByteLevel) return joined;
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

std::string Tokenizer::kind() const {
  const text::BpeOptions& o = impl_->model->options();
  if (o.byte_level) return "BPE (byte-level)";
  return o.byte_fallback ? "BPE (characters, byte fallback)" : "BPE (characters)";
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
