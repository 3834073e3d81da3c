// Parses nested type-length-value records with two mutually recursive functions: a handler
// runs on a small fixed stack. The cycle is reported once, with its path.
#include <spin/handler.hpp>

using namespace spin;

struct tlv {
  u16 type;
  u16 len_bytes;
};

constexpr u16 tlv_list = 1;

u64 parse_item(const ctx* c, u64 off, u64 end);

u64 parse_list(const ctx* c, u64 off, u64 end) {
  u64 items = 0;
  while (off < end) {
    const tlv* t = c->payload<tlv>(off);
    if (t == nullptr || t->len_bytes == 0) break;
    items += parse_item(c, off, end); // expected-error {{recursion is not allowed in a handler: this call to 'parse_item' is part of a call cycle}} expected-note {{call cycle: parse_list -> parse_item -> parse_list}}
    off += t->len_bytes;
  }
  return items;
}

u64 parse_item(const ctx* c, u64 off, u64 end) {
  const tlv* t = c->payload<tlv>(off);
  if (t == nullptr) return 0;
  if (t->type == tlv_list) return parse_list(c, off + sizeof(tlv), end); // expected-note {{'parse_item' calls 'parse_list' here}}
  return 1;
}

SPIN_PAYLOAD_HANDLER(tlv_payload) {
  ctx->fetch_add<u64>(0, parse_list(ctx, 0, ctx->packet.size()));
  return ret::success;
}
