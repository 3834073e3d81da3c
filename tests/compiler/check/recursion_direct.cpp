// Sums a tree of segments recursively: a handler runs on a small fixed stack.
#include <spin/handler.hpp>

using namespace spin;

struct segment {
  u32 len_bytes;
  u32 left;   // index of the left child in handler memory, 0 for none
  u32 right;  // index of the right child, 0 for none
};

u64 total_bytes(const ctx* c, u32 index) {
  const segment* s = c->mem<segment>(index * sizeof(segment));
  if (s == nullptr) return 0;
  u64 sum = s->len_bytes;
  if (s->left != 0) sum += total_bytes(c, s->left); // expected-error {{recursion is not allowed in a handler: this call to 'total_bytes' is part of a call cycle; a handler runs on a small fixed stack, so rewrite it as a loop (with an explicit, bounded stack in the scratchpad if needed)}} expected-note {{call cycle: total_bytes -> total_bytes}}
  if (s->right != 0) sum += total_bytes(c, s->right);
  return sum;
}

SPIN_COMPLETION_HANDLER(recursive_completion) {
  // A generic lambda that calls itself through its parameter recurses just the same.
  auto depth = [](auto self, const spin::ctx* c, u32 index) -> u32 {
    const segment* s = c->mem<segment>(index * sizeof(segment));
    return s == nullptr || s->left == 0 ? 1 : 1 + self(self, c, s->left); // expected-error {{recursion is not allowed in a handler: this call to 'operator()<(lambda at}} expected-note {{call cycle: operator()<(lambda at}}
  };
  ctx->post_event(total_bytes(ctx, 1) + depth(depth, ctx, 1));
  return ret::success;
}
