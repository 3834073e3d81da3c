#include <spin/rt/wire.hpp>

#include <doctest/doctest.h>

#include <vector>

using namespace spin::rt;

TEST_SUITE("runtime") {

TEST_CASE("an encoded frame parses back to the same header and payload") {
  wire::header h;
  h.flags = wire::flag_start | wire::flag_end;
  h.source_rank = 3;
  h.match_bits = 0x1122334455667788ull;
  h.message_id = 99;
  h.message_len = 5;
  std::vector<std::byte> payload{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}, std::byte{5}};
  std::vector<std::byte> f(wire::encoded_len(h, payload.size()));
  REQUIRE(wire::encode(wire::rank_endpoint(3), wire::rank_endpoint(4), h, payload, f) == f.size());
  wire::parsed p;
  wire::reject why;
  REQUIRE(wire::parse(std::span<const std::byte>(f), wire::default_udp_port, p, why));
  CHECK(p.hdr.match_bits == h.match_bits);
  CHECK(p.hdr.message_id == 99);
  CHECK(p.hdr.payload_len == 5);
  CHECK(p.payload_offset == wire::min_overhead);
}

} // TEST_SUITE
