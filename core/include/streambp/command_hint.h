#pragma once
/// A mistyped command word gets "unknown command 'sesion': did you mean 'session'?" instead of
/// CLI11's "A subcommand is required". Header-only, no LibTorch: both command-line programs
/// (streambp-server and the streambp client) use it.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace streambp {

namespace command_hint_detail {

inline size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace command_hint_detail

/// The message for the first word of argv that should name a subcommand (descending through
/// the ones it names) and names none; "" when every command word is known (then CLI11 parses
/// and reports as usual). `value_options`: options before the command that take a value.
inline std::string UnknownCommand(CLI::App& app, int argc, const char* const* argv,
                                  const std::set<std::string>& value_options = {}) {
  CLI::App* level = &app;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return "";
    if (!word.empty() && word[0] == '-') {
      if (level == &app && value_options.count(word) > 0) ++i;
      continue;
    }
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";  // a command of its own: positional arguments follow
    CLI::App* found = nullptr;
    for (auto* s : subs) {
      if (s->check_name(word)) found = s;
    }
    if (found == nullptr) {
      std::string names, best;
      size_t best_distance = 3;  // suggest only close names
      for (auto* s : subs) {
        names += (names.empty() ? "" : ", ") + s->get_name();
        const size_t d = command_hint_detail::EditDistance(word, s->get_name());
        const bool prefix = word.size() >= 2 && s->get_name().rfind(word, 0) == 0;
        if (d < best_distance || (prefix && best.empty())) {
          best = s->get_name();
          best_distance = std::min(d, best_distance);
        }
      }
      std::string message = "unknown command '" + path + word + "'";
      if (!best.empty()) message += ": did you mean '" + path + best + "'?";
      return message + " (" + (path.empty() ? std::string("commands") : path + "commands:") +
             (path.empty() ? ": " : " ") + names + "; --help says more)";
    }
    level = found;
    path += word + " ";
  }
  return "";
}

}  // namespace streambp
