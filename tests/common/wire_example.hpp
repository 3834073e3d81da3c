// The worked example of docs/wire-format.md: wire_test checks its bytes, and
// `tests/fuzz/wire_samples --example` prints them for the doc.
#pragma once

#include <spin/rt/wire.hpp>

#include <cstddef>
#include <vector>

namespace spin::test {

/// One single-packet message (start|end) from rank 1 to rank 2: match bits 0x2a, message id 7,
/// the 4-byte payload de ad be ef. An empty vector if the encoder refuses it.
inline std::vector<std::byte> wire_example_frame() {
  rt::wire::header h;
  h.flags = rt::wire::flag_start | rt::wire::flag_end;
  h.source_rank = 1;
  h.match_bits = 0x2a;
  h.message_id = 7;
  h.message_len = 4;
  const std::vector<std::byte> payload{std::byte{0xde}, std::byte{0xad}, std::byte{0xbe}, std::byte{0xef}};
  std::vector<std::byte> out(rt::wire::encoded_len(h, payload.size()));
  out.resize(rt::wire::encode(rt::wire::rank_endpoint(1), rt::wire::rank_endpoint(2), h, payload, out));
  return out;
}

} // namespace spin::test
