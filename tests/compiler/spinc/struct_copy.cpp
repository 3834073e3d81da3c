// spinc test input: struct copies and clears that clang compiles into memcpy/memset calls on
// x86-64 (512-byte blocks), even freestanding. spinc links its own hidden copies.
#include <spin/handler.hpp>

using namespace spin;

struct block {
  u64 words[64];
};

SPIN_MEMORY(2 * sizeof(block), 0);

SPIN_PAYLOAD_HANDLER(copy_block) {
  block* from = ctx->mem<block>(0);
  block* to = ctx->mem<block>(sizeof(block));
  if (from == nullptr || to == nullptr) return ret::drop;
  *to = *from;
  return ret::success;
}

SPIN_COMPLETION_HANDLER(clear_block) {
  block* b = ctx->mem<block>(0);
  if (b == nullptr) return ret::drop;
  *b = block{};
  return ret::success;
}
