#include <spin/rt/arena.hpp>

#include <cstdlib>

#include <sys/mman.h>
#include <cstring>
#include <string>

namespace spin::rt {

void nic_arena::unmap::operator()(std::byte* p) const { ::munmap(p, bytes); }

namespace {
constexpr std::uint64_t align_up(std::uint64_t v) { return (v + 63) & ~std::uint64_t{63}; }

// Zeroed pages, touched only when used (and never by malloc's debugging fill, MALLOC_PERTURB_).
std::byte* map_zeroed(std::uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}
} // namespace

nic_arena::nic_arena(std::uint64_t capacity_bytes)
    : _capacity(align_up(capacity_bytes)),
      _mem(map_zeroed(_capacity == 0 ? 64 : _capacity), unmap{_capacity == 0 ? 64 : _capacity}) {
  if (!_mem) _capacity = 0;
  if (_capacity > 0) _free.emplace(0, _capacity);
}

result<arena_block> nic_arena::allocate(std::uint64_t len_bytes) {
  if (len_bytes == 0) return arena_block{0, 0};
  if (len_bytes > _capacity) {
    return fail(errc::no_memory, "NIC memory: request of " + std::to_string(len_bytes) + " bytes exceeds the arena of " +
                                     std::to_string(_capacity) + " bytes");
  }
  const std::uint64_t len = align_up(len_bytes);
  for (auto it = _free.begin(); it != _free.end(); ++it) {
    if (it->second < len) continue;
    const std::uint64_t off = it->first;
    const std::uint64_t rest = it->second - len;
    _free.erase(it);
    if (rest > 0) _free.emplace(off + len, rest);
    _taken.emplace(off, len);
    _used += len;
    if (_used > _peak) _peak = _used;
    std::memset(_mem.get() + off, 0, len);
    return arena_block{off, len};
  }
  return fail(errc::no_memory, "NIC memory: no free range of " + std::to_string(len) + " bytes (" +
                                   std::to_string(_capacity - _used) + " bytes free, largest range " +
                                   std::to_string(largest_free_bytes()) + ")");
}

void nic_arena::free(arena_block b) {
  if (b.len_bytes == 0) return;
  auto t = _taken.find(b.offset);
  if (t == _taken.end() || t->second != b.len_bytes) return;
  _taken.erase(t);
  _used -= b.len_bytes;
  auto it = _free.emplace(b.offset, b.len_bytes).first;
  auto next = std::next(it);
  if (next != _free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    _free.erase(next);
  }
  if (it != _free.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      _free.erase(it);
    }
  }
}

std::uint64_t nic_arena::largest_free_bytes() const {
  std::uint64_t m = 0;
  for (const auto& [off, len] : _free) m = len > m ? len : m;
  return m;
}

} // namespace spin::rt
