// Uses the C allocator, declared by hand (handlers include no libc): the NIC has no heap.
#include <spin/handler.hpp>

using namespace spin;

using size_t = decltype(sizeof 0);
extern "C" {
void* malloc(size_t size);
void* calloc(size_t count, size_t size);
void* realloc(void* p, size_t size);
void* aligned_alloc(size_t alignment, size_t size);
int posix_memalign(void** p, size_t alignment, size_t size);
void free(void* p);
}

SPIN_PAYLOAD_HANDLER(malloc_payload) {
  const u64 n = ctx->packet.size();
  u8* copy = static_cast<u8*>(malloc(n)); // expected-error {{call to 'malloc' is not allowed in a handler: the NIC has no heap; keep state in handler memory (ctx->mem<T>(off)) or in the message scratchpad (ctx->scratchpad<T>(off))}}
  u32* counts = static_cast<u32*>(calloc(16, sizeof(u32))); // expected-error {{call to 'calloc' is not allowed in a handler}}
  copy = static_cast<u8*>(realloc(copy, 2 * n)); // expected-error {{call to 'realloc' is not allowed in a handler}}
  void* aligned = aligned_alloc(64, 64); // expected-error {{call to 'aligned_alloc' is not allowed in a handler}}
  void* page = nullptr;
  if (posix_memalign(&page, 4096, 4096) != 0) return ret::drop; // expected-error {{call to 'posix_memalign' is not allowed in a handler}}
  for (u64 i = 0; i < n; ++i) copy[i] = ctx->packet.data[i];
  counts[0] = static_cast<u32>(n);
  free(copy); // expected-error {{call to 'free' is not allowed in a handler}}
  free(counts); // expected-error {{call to 'free' is not allowed in a handler}}
  free(aligned); // expected-error {{call to 'free' is not allowed in a handler}}
  free(page); // expected-error {{call to 'free' is not allowed in a handler}}
  return ret::success;
}
