#pragma once
/// A live line on a terminal while a long step runs:
///   "  stream T=8192: backward layer 3/8 chunk 5/16, 41 s"
/// Only when stderr is a terminal, at most twice a second; the line is cleared when the
/// object goes. Used by streambp-bench and the server's tools (verify, grad).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "streambp/engine.h"

namespace streambp {

class TerminalProgress {
 public:
  explicit TerminalProgress(std::string what) : what_(std::move(what)), on_(isatty(STDERR_FILENO) != 0) {}
  TerminalProgress(const TerminalProgress&) = delete;
  TerminalProgress& operator=(const TerminalProgress&) = delete;
  ~TerminalProgress() {
    if (on_ && shown_) std::fprintf(stderr, "\r\033[K");
  }
  /// `o` reporting to this line as well (use it while this object lives).
  EngineOptions wrap(EngineOptions o) {
    if (!on_) return o;
    auto previous = o.on_progress;
    o.on_progress = [this, previous](const EngineProgress& p) {
      if (previous) previous(p);
      show(p);
    };
    return o;
  }

 private:
  void show(const EngineProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (shown_ && now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    shown_ = true;
    const double secs = std::chrono::duration<double>(now - start_).count();
    if (p.phase == EngineProgress::Phase::kHead) {
      std::fprintf(stderr, "\r\033[K  %s: head chunk %lld/%lld, %.0f s", what_.c_str(), (long long)p.chunk + 1,
                   (long long)p.chunks, secs);
    } else {
      std::fprintf(stderr, "\r\033[K  %s: %s layer %lld/%lld chunk %lld/%lld, %.0f s", what_.c_str(),
                   PhaseName(p.phase), (long long)p.layer + 1, (long long)p.layers, (long long)p.chunk + 1,
                   (long long)p.chunks, secs);
    }
    std::fflush(stderr);
  }

  std::string what_;
  bool on_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace streambp
