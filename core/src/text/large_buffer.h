#pragma once
/// An allocator for the buffers of one long word (internal): below 1 MiB it is operator new;
/// from 1 MiB on, a fresh anonymous mapping asked to be backed by huge pages where the kernel
/// offers them (Linux's transparent huge pages in "madvise" mode, the common default), so
/// that touching 100 MB of merge state costs ~50 page faults instead of ~25,000. Returned to
/// the system when freed.
#include <cstddef>
#include <cstdint>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace streambp::text {

template <class T>
struct LargeBufferAllocator {
  using value_type = T;
  static constexpr size_t kThreshold = size_t{1} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;

  LargeBufferAllocator() = default;
  template <class U>
  LargeBufferAllocator(const LargeBufferAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= kThreshold) {
      const size_t length = Rounded(bytes);
      // One huge page more than needed, then the unaligned ends given back: the buffer starts
      // on a huge-page boundary, so all of it can be backed by huge pages.
      void* raw = mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) throw std::bad_alloc();
      const auto start = reinterpret_cast<uintptr_t>(raw);
      const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
      if (aligned > start) munmap(raw, aligned - start);
      const uintptr_t end = start + length + kHugePage;
      if (end > aligned + length) munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
      madvise(reinterpret_cast<void*>(aligned), length, MADV_HUGEPAGE);
      return reinterpret_cast<T*>(aligned);
    }
#endif
    return static_cast<T*>(::operator new(bytes));
  }

  void deallocate(T* p, size_t n) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n * sizeof(T) >= kThreshold) {
      munmap(p, Rounded(n * sizeof(T)));
      return;
    }
#endif
    ::operator delete(p);
  }

  template <class U>
  bool operator==(const LargeBufferAllocator<U>&) const noexcept {
    return true;
  }

 private:
  static size_t Rounded(size_t bytes) { return (bytes + kHugePage - 1) & ~(kHugePage - 1); }
};

}  // namespace streambp::text
