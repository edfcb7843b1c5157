#pragma once
// A small tmpfs for disk-full tests (docs/architecture.md: Errors, admission and durability: disk full is an error that names it, never a
// lost or repeated record). Mounting needs root (CAP_SYS_ADMIN); tests run as root in CI
// and skip with the reason elsewhere.
#include <cstddef>
#include <memory>
#include <string>

namespace streambp::testing {

class SmallDisk {
 public:
  /// Mounts a tmpfs of `bytes` at a fresh folder; null (and `why_not`) when it cannot.
  static std::unique_ptr<SmallDisk> Create(size_t bytes, std::string* why_not);
  ~SmallDisk();  ///< unmounts and removes the folder
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;

  const std::string& path() const { return path_; }
  /// Fills the disk with a filler file until at most `leave` bytes are free.
  void fill(size_t leave);
  /// Removes the filler.
  void unfill();
  size_t free_bytes() const;

 private:
  explicit SmallDisk(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace streambp::testing
