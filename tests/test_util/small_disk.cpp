#include "test_util/small_disk.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "test_util/fixtures.h"

namespace streambp::testing {

std::unique_ptr<SmallDisk> SmallDisk::Create(size_t bytes, std::string* why_not) {
  static int counter = 0;
  const std::string dir = TempDir("disk-" + std::to_string(counter++));
  const std::string options = "size=" + std::to_string(bytes) + ",mode=0777";
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    if (why_not) *why_not = "cannot mount a tmpfs (needs root): " + std::string(std::strerror(errno));
    std::filesystem::remove_all(dir);
    return nullptr;
  }
  return std::unique_ptr<SmallDisk>(new SmallDisk(dir));
}

SmallDisk::~SmallDisk() {
  ::umount2(path_.c_str(), MNT_DETACH);
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

size_t SmallDisk::free_bytes() const {
  struct statvfs s {};
  if (::statvfs(path_.c_str(), &s) != 0) return 0;
  return static_cast<size_t>(s.f_bavail) * s.f_frsize;
}

void SmallDisk::fill(size_t leave) {
  const std::string filler = path_ + "/.filler";
  const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  std::vector<char> page(4096, 'x');
  while (free_bytes() > leave) {
    const size_t n = std::min(page.size(), free_bytes() - leave);
    if (::write(fd, page.data(), n) <= 0) break;
  }
  ::fsync(fd);
  ::close(fd);
}

void SmallDisk::unfill() { ::unlink((path_ + "/.filler").c_str()); }

}  // namespace streambp::testing
