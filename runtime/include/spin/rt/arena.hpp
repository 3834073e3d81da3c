// NIC memory: one fixed arena from which handler memory and scratchpads are carved, with
// accounting. Control path only (install/uninstall); the data path never allocates.
#pragma once

#include <spin/result.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

namespace spin::rt {

/// A block of NIC memory: `offset` into the arena, `len_bytes` long.
struct arena_block {
  std::uint64_t offset = 0;
  std::uint64_t len_bytes = 0;
};

/// Fixed-size NIC memory with first-fit allocation and coalescing on free. Blocks are 64-byte
/// aligned (one cache line, so ECs never share a line). Not thread-safe: the runtime calls it
/// from its control thread only.
class nic_arena {
public:
  /// Reserves `capacity_bytes` (rounded up to 64) of zeroed memory: an anonymous mapping, so
  /// that pages cost nothing until a block uses them (a switch's 1 GiB of NIC memory in virtual
  /// time, most of it never allocated). When the mapping fails the capacity is 0 and every
  /// allocation fails with no_memory.
  explicit nic_arena(std::uint64_t capacity_bytes);

  /// Allocates `len_bytes` (rounded up to 64; 0 gives an empty block). The block is zeroed.
  /// Errors: no_memory when no free range is large enough (the message says how much is free
  /// and the largest free range).
  result<arena_block> allocate(std::uint64_t len_bytes);
  /// Returns `b` to the arena. Freeing a block twice or a block it never gave out is ignored.
  void free(arena_block b);

  std::byte* data(const arena_block& b) const { return _mem.get() + b.offset; }
  std::uint64_t capacity_bytes() const { return _capacity; }
  std::uint64_t used_bytes() const { return _used; }
  std::uint64_t peak_bytes() const { return _peak; }
  std::uint64_t largest_free_bytes() const;

private:
  std::uint64_t _capacity;
  struct unmap {
    std::uint64_t bytes = 0;
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, unmap> _mem;
  std::map<std::uint64_t, std::uint64_t> _free;  // offset -> length
  std::map<std::uint64_t, std::uint64_t> _taken; // offset -> length
  std::uint64_t _used = 0;
  std::uint64_t _peak = 0;
};

} // namespace spin::rt
