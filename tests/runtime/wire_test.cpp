#include "../common/wire_example.hpp"
#include "test_util.hpp"

#include <spin/rt/runtime.hpp>
#include <spin/rt/wire.hpp>
#include <spin/siphash.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace spin::rt;

namespace {

using bytes = std::vector<std::byte>;

// Byte offsets in a frame without IP options (docs/wire-format.md).
constexpr std::size_t ip_at = wire::eth_len;
constexpr std::size_t udp_at = ip_at + wire::ipv4_min_len;
constexpr std::size_t spin_at = udp_at + wire::udp_len;
constexpr std::size_t coll_at = spin_at + wire::spin_base_len;

// A spin header field: byte offset from the start of the spin header, and width in bytes.
struct field {
  std::size_t at, size;
};
constexpr field f_version{0, 1}, f_type{1, 1}, f_flags{2, 2}, f_source{4, 4}, f_match{8, 8}, f_msg_id{16, 8},
    f_seq{24, 4}, f_payload_len{28, 2}, f_message_len{30, 8}, f_offset{38, 8};
static_assert(f_offset.at + f_offset.size == wire::spin_base_len);

std::uint64_t get_be(const bytes& f, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v = v << 8 | std::to_integer<std::uint64_t>(f.at(at + i));
  return v;
}
void put_be(bytes& f, std::size_t at, std::size_t n, std::uint64_t v) {
  for (std::size_t i = 0; i < n; ++i) f.at(at + n - 1 - i) = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get(const bytes& f, field x) { return get_be(f, spin_at + x.at, x.size); }
void put(bytes& f, field x, std::uint64_t v) { put_be(f, spin_at + x.at, x.size, v); }

// Recomputes the IPv4 header checksum after a test changed header bytes.
void fix_ip_checksum(bytes& f) {
  const std::size_t ihl = (std::to_integer<std::size_t>(f.at(ip_at)) & 0x0f) * 4;
  put_be(f, ip_at + 10, 2, 0);
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < ihl; i += 2) sum += static_cast<std::uint32_t>(get_be(f, ip_at + i, 2));
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  put_be(f, ip_at + 10, 2, ~sum & 0xffff);
}

bytes make_payload(std::size_t n) {
  bytes p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(0xa0 + i);
  return p;
}

// A single-packet message whose every field has a distinct value.
wire::header sample_header(bool coll, std::size_t payload_bytes) {
  wire::header h;
  h.type = wire::packet_type::data;
  h.flags = static_cast<std::uint16_t>(wire::flag_start | wire::flag_end | (coll ? wire::flag_coll : 0));
  h.source_rank = 0x01020304;
  h.match_bits = 0x1112131415161718ull;
  h.message_id = 0x2122232425262728ull;
  h.message_len = payload_bytes;
  if (coll) h.coll = {0x31, 0x32, 0x8033, 0x34353637, 0x38393a3b, 0x3c3d3e3f};
  return h;
}

bytes encode(const wire::header& h, const bytes& payload, std::uint16_t port = wire::default_udp_port) {
  bytes f(wire::encoded_len(h, payload.size()));
  const std::size_t n = wire::encode(wire::rank_endpoint(h.source_rank & 0xffff, port), wire::rank_endpoint(9, port), h,
                                     payload, f);
  REQUIRE(n == f.size());
  return f;
}

bytes sample_frame(bool coll, std::size_t payload_bytes) {
  return encode(sample_header(coll, payload_bytes), make_payload(payload_bytes));
}

struct outcome {
  bool ok = false;
  wire::parsed p{};
  wire::reject why = wire::reject::count_;
};

bool same_outcome(const outcome& a, const outcome& b) {
  if (a.ok != b.ok) return false;
  if (!a.ok) return a.why == b.why;
  return a.p.hdr == b.p.hdr && a.p.payload_offset == b.p.payload_offset && a.p.frame_len == b.p.frame_len;
}

// Parses the first `n` bytes of `f` split at `cuts` (ascending, each <= n). Every segment lives
// in its own exactly-sized heap block, so ASan reports any read past a segment.
outcome parse_split(const bytes& f, std::size_t n, std::initializer_list<std::size_t> cuts = {},
                    std::uint16_t port = wire::default_udp_port) {
  std::vector<std::unique_ptr<std::byte[]>> blocks;
  std::vector<wire::segment> segs;
  std::size_t from = 0;
  auto add = [&](std::size_t to) {
    blocks.emplace_back(new std::byte[to - from]);
    if (to > from) std::memcpy(blocks.back().get(), f.data() + from, to - from);
    segs.push_back({blocks.back().get(), static_cast<std::uint32_t>(to - from)});
    from = to;
  };
  for (std::size_t c : cuts) add(c);
  add(n);
  outcome o;
  o.ok = wire::parse(std::span<const wire::segment>(segs), port, o.p, o.why);
  return o;
}

outcome parse_whole(const bytes& f, std::uint16_t port = wire::default_udp_port) {
  return parse_split(f, f.size(), {}, port);
}

// The reason a frame cut after `n` bytes gets when its IP and UDP lengths still describe the
// whole frame: once the IPv4 header is complete, its total length points past the end.
wire::reject cut_reason(std::size_t n) {
  if (n < wire::eth_len) return wire::reject::eth_truncated;
  if (n < udp_at) return wire::reject::ip_truncated;
  return wire::reject::ip_length;
}

// Cuts `f` after `n` bytes and rewrites the IP and UDP lengths (where present) to end there,
// so that the parser gets past the IP layer and meets the cut in a deeper layer.
bytes cut_consistently(const bytes& f, std::size_t n) {
  bytes c(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(n));
  if (n >= udp_at) {
    put_be(c, ip_at + 2, 2, n - ip_at);
    fix_ip_checksum(c);
  }
  if (n >= udp_at + 6) put_be(c, udp_at + 4, 2, n - udp_at);
  return c;
}

wire::reject consistent_cut_reason(std::size_t n, std::size_t header_end) {
  if (n < udp_at) return cut_reason(n);
  if (n < spin_at) return wire::reject::udp_truncated;
  if (n < header_end) return wire::reject::spin_truncated;
  return wire::reject::length_mismatch;
}

// One minimal corruption of the frame from `sample_frame(false, 8)` and the reason it must get.
struct corruption {
  const char* what;
  wire::reject why;
  void (*apply)(bytes& f);
};

const std::vector<corruption>& corruptions() {
  using r = wire::reject;
  static const std::vector<corruption> all = {
      {"frame shorter than an Ethernet header", r::eth_truncated, [](bytes& f) { f.resize(13); }},
      {"EtherType IPv6", r::not_ipv4, [](bytes& f) { put_be(f, 12, 2, 0x86dd); }},
      {"VLAN tag (not supported in v1)", r::not_ipv4, [](bytes& f) { put_be(f, 12, 2, 0x8100); }},
      {"frame ends inside the IPv4 header", r::ip_truncated, [](bytes& f) { f.resize(udp_at - 1); }},
      {"IP version 6", r::ip_version, [](bytes& f) { f[ip_at] = std::byte{0x65}; }},
      {"IHL 4", r::ip_truncated, [](bytes& f) { f[ip_at] = std::byte{0x44}; }},
      {"IHL 0", r::ip_truncated, [](bytes& f) { f[ip_at] = std::byte{0x40}; }},
      {"IHL 15 on a frame that ends inside the options", r::ip_truncated,
       [](bytes& f) {
         f.resize(ip_at + 59);
         f[ip_at] = std::byte{0x4f};
       }},
      {"IP total length one past the frame", r::ip_length,
       [](bytes& f) {
         put_be(f, ip_at + 2, 2, f.size() - ip_at + 1);
         fix_ip_checksum(f);
       }},
      {"IP total length smaller than the IP header", r::ip_length,
       [](bytes& f) {
         put_be(f, ip_at + 2, 2, 19);
         fix_ip_checksum(f);
       }},
      {"IP checksum off by one", r::ip_checksum,
       [](bytes& f) { put_be(f, ip_at + 10, 2, (get_be(f, ip_at + 10, 2) + 1) & 0xffff); }},
      {"IP source address changed without a new checksum", r::ip_checksum, [](bytes& f) { f[ip_at + 12] ^= std::byte{1}; }},
      {"more-fragments bit", r::ip_fragment,
       [](bytes& f) {
         put_be(f, ip_at + 6, 2, 0x2000);
         fix_ip_checksum(f);
       }},
      {"non-zero fragment offset", r::ip_fragment,
       [](bytes& f) {
         put_be(f, ip_at + 6, 2, 0x0001);
         fix_ip_checksum(f);
       }},
      {"IP protocol TCP", r::not_udp,
       [](bytes& f) {
         f[ip_at + 9] = std::byte{6};
         fix_ip_checksum(f);
       }},
      {"IP datagram too short for a UDP header", r::udp_truncated,
       [](bytes& f) {
         put_be(f, ip_at + 2, 2, wire::ipv4_min_len + wire::udp_len - 1);
         fix_ip_checksum(f);
       }},
      {"UDP length 7", r::udp_length, [](bytes& f) { put_be(f, udp_at + 4, 2, 7); }},
      {"UDP length one past the IP datagram", r::udp_length,
       [](bytes& f) { put_be(f, udp_at + 4, 2, f.size() - udp_at + 1); }},
      {"UDP destination port 17772", r::wrong_port, [](bytes& f) { put_be(f, udp_at + 2, 2, 17772); }},
      {"UDP payload one byte shorter than the spin header", r::spin_truncated,
       [](bytes& f) { put_be(f, udp_at + 4, 2, wire::udp_len + wire::spin_base_len - 1); }},
      {"collective flag on a frame too short for the extension", r::spin_truncated,
       [](bytes& f) { put(f, f_flags, get(f, f_flags) | wire::flag_coll); }},
      {"spin version 0", r::bad_version, [](bytes& f) { put(f, f_version, 0); }},
      {"spin version 2", r::bad_version, [](bytes& f) { put(f, f_version, 2); }},
      {"packet type 0", r::bad_type, [](bytes& f) { put(f, f_type, 0); }},
      {"packet type 6", r::bad_type, [](bytes& f) { put(f, f_type, 6); }},
      {"unknown flag bit 5", r::bad_flags,
       [](bytes& f) { put(f, f_flags, get(f, f_flags) | 0x20); }},
      {"unknown flag bit 15", r::bad_flags,
       [](bytes& f) { put(f, f_flags, get(f, f_flags) | 0x8000); }},
      {"start flag with seq 1", r::bad_flags, [](bytes& f) { put(f, f_seq, 1); }},
      {"payload_len one more than the UDP length says", r::length_mismatch,
       [](bytes& f) { put(f, f_payload_len, get(f, f_payload_len) + 1); }},
      {"payload_len one less than the UDP length says", r::length_mismatch,
       [](bytes& f) { put(f, f_payload_len, get(f, f_payload_len) - 1); }},
      {"message_len one less than offset + payload_len", r::bad_offset,
       [](bytes& f) { put(f, f_message_len, get(f, f_message_len) - 1); }},
      {"offset 2^64-1 (must not wrap)", r::bad_offset, [](bytes& f) { put(f, f_offset, ~0ull); }},
      {"end flag with offset + payload_len below message_len", r::bad_offset,
       [](bytes& f) { put(f, f_message_len, get(f, f_message_len) + 1); }},
  };
  return all;
}

} // namespace

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

TEST_CASE("every header field round-trips through encode and parse, with and without the collective extension and the tag") {
  for (bool coll : {false, true}) {
   for (bool auth : {false, true}) {
    for (int t = 1; t <= 5; ++t) {
      for (std::size_t len : {0u, 1u, 333u}) {
        CAPTURE(coll);
        CAPTURE(auth);
        CAPTURE(t);
        CAPTURE(len);
        wire::header h = sample_header(coll, len);
        h.type = static_cast<wire::packet_type>(t);
        h.flags = static_cast<std::uint16_t>(h.flags & ~wire::flag_start) | wire::flag_retransmit;
        h.seq = 0x41424344;
        h.offset = 0x0000000100000000ull;
        h.message_len = h.offset + len;
        if (auth) {
          h.flags |= wire::flag_auth;
          h.auth_tag = 0x5152535455565758ull;
        }
        const bytes payload = make_payload(len);
        const bytes f = encode(h, payload);
        CHECK(f.size() == wire::min_overhead + (coll ? wire::spin_coll_len : 0) + (auth ? wire::spin_auth_len : 0) + len);
        if (auth) CHECK(get_be(f, f.size() - len - 8, 8) == 0x5152535455565758ull);
        const outcome o = parse_whole(f);
        REQUIRE(o.ok);
        h.payload_len = static_cast<std::uint32_t>(len);
        CHECK((o.p.hdr == h));
        CHECK(o.p.frame_len == f.size());
        CHECK(o.p.payload_offset == f.size() - len);
        CHECK(std::equal(payload.begin(), payload.end(), f.begin() + o.p.payload_offset));
      }
    }
   }
  }
}

// The tag as docs/wire-format.md defines it, from the frame's own bytes: the spin header with
// message_id zero, the extension (or 16 zero bytes), two zero bytes, the payload.
std::uint64_t documented_tag(const wire::auth_key& k, const bytes& f, bool coll, std::size_t len) {
  std::uint8_t pre[64] = {};
  for (std::size_t i = 0; i < wire::spin_base_len + (coll ? wire::spin_coll_len : 0); ++i)
    pre[i] = std::to_integer<std::uint8_t>(f.at(spin_at + i));
  std::memset(pre + f_msg_id.at, 0, 8);
  return spin::siphash24(k.k0, k.k1, pre, 64, reinterpret_cast<const std::uint8_t*>(f.data() + f.size() - len), len);
}

TEST_CASE("the authentication tag is SipHash-2-4 of the header as sent, message_id zero, and the payload") {
  std::array<std::uint8_t, 16> kb{};
  for (std::size_t i = 0; i < 16; ++i) kb[i] = static_cast<std::uint8_t>(i);
  const wire::auth_key k = wire::auth_key::from_bytes(kb);
  CHECK(k.k0 == 0x0706050403020100ull);
  CHECK(k.k1 == 0x0f0e0d0c0b0a0908ull);
  CHECK_FALSE(k.none());
  CHECK(wire::auth_key{}.none());
  for (bool coll : {false, true}) {
    for (std::size_t len : {0u, 7u, 8u, 333u}) {
      CAPTURE(coll);
      CAPTURE(len);
      wire::header h = sample_header(coll, len);
      h.flags |= wire::flag_auth;
      const bytes payload = make_payload(len);
      h.auth_tag = wire::auth_tag(k, h, payload);
      const bytes f = encode(h, payload);
      CHECK(h.auth_tag == documented_tag(k, f, coll, len));
      const outcome o = parse_whole(f);
      REQUIRE(o.ok);
      CHECK(o.p.hdr.auth_tag == h.auth_tag);
      CHECK(wire::auth_tag(k, o.p.hdr, std::span<const std::byte>(f.data() + o.p.payload_offset, len)) == h.auth_tag);
      // message_id is not covered: every copy of a multicast carries one tag.
      wire::header id = h;
      id.message_id ^= 0xff;
      CHECK(wire::auth_tag(k, id, payload) == h.auth_tag);
      // Every other field, each payload byte and the key are.
      std::vector<wire::header> other(9, h);
      other[0].source_rank ^= 1;
      other[1].match_bits ^= 1;
      other[2].seq ^= 1;
      other[3].message_len ^= 1;
      other[4].offset ^= 1;
      other[5].flags ^= wire::flag_retransmit;
      other[6].type = wire::packet_type::result;
      other[7].coll.aux ^= 1;
      other[8].flags ^= wire::flag_coll;
      for (std::size_t i = 0; i < other.size(); ++i) {
        CAPTURE(i);
        if (i == 7 && !coll) continue;  // without the extension its fields are not on the wire
        CHECK(wire::auth_tag(k, other[i], payload) != h.auth_tag);
      }
      for (std::size_t b = 0; b < len; b += 41) {
        bytes q = payload;
        q[b] ^= std::byte{1};
        CHECK(wire::auth_tag(k, h, q) != h.auth_tag);
      }
      wire::auth_key k2 = k;
      k2.k1 ^= 1;
      CHECK(wire::auth_tag(k2, h, payload) != h.auth_tag);
    }
  }
}

TEST_CASE("parse clears the collective extension of a frame without the collective flag") {
  const bytes f = sample_frame(false, 4);
  wire::parsed p;
  p.hdr.coll = {1, 2, 3, 4, 5, 6};
  wire::reject why;
  REQUIRE(wire::parse(std::span<const std::byte>(f), wire::default_udp_port, p, why));
  wire::header want = sample_header(false, 4);
  want.payload_len = 4;
  CHECK((p.hdr == want));
}

TEST_CASE("the encoder puts every field at its documented offset in network byte order") {
  const bytes f = sample_frame(true, 3);
  CHECK(get_be(f, 0, 6) == 0x025350000009ull);  // destination MAC of rank 9
  CHECK(get_be(f, 6, 6) == 0x025350000304ull);  // source MAC of rank 0x0304
  CHECK(get_be(f, 12, 2) == 0x0800);
  CHECK(get_be(f, ip_at, 1) == 0x45);
  CHECK(get_be(f, ip_at + 2, 2) == f.size() - ip_at);
  CHECK(get_be(f, ip_at + 6, 2) == 0x4000);  // don't fragment
  CHECK(get_be(f, ip_at + 8, 1) == 64);
  CHECK(get_be(f, ip_at + 9, 1) == 17);
  CHECK(get_be(f, ip_at + 12, 4) == 0x0a530304);
  CHECK(get_be(f, ip_at + 16, 4) == 0x0a530009);
  CHECK(get_be(f, udp_at, 2) == wire::default_udp_port);
  CHECK(get_be(f, udp_at + 2, 2) == wire::default_udp_port);
  CHECK(get_be(f, udp_at + 4, 2) == f.size() - udp_at);
  CHECK(get_be(f, udp_at + 6, 2) == 0);  // no UDP checksum
  CHECK(get(f, f_version) == 1);
  CHECK(get(f, f_type) == 1);
  CHECK(get(f, f_flags) == (wire::flag_start | wire::flag_end | wire::flag_coll));
  CHECK(get(f, f_source) == 0x01020304);
  CHECK(get(f, f_match) == 0x1112131415161718ull);
  CHECK(get(f, f_msg_id) == 0x2122232425262728ull);
  CHECK(get(f, f_seq) == 0);
  CHECK(get(f, f_payload_len) == 3);
  CHECK(get(f, f_message_len) == 3);
  CHECK(get(f, f_offset) == 0);
  CHECK(get_be(f, coll_at + 0, 1) == 0x31);
  CHECK(get_be(f, coll_at + 1, 1) == 0x32);
  CHECK(get_be(f, coll_at + 2, 2) == 0x8033);
  CHECK(get_be(f, coll_at + 4, 4) == 0x34353637);
  CHECK(get_be(f, coll_at + 8, 4) == 0x38393a3b);
  CHECK(get_be(f, coll_at + 12, 4) == 0x3c3d3e3f);
  CHECK(get_be(f, coll_at + 16, 3) == 0xa0a1a2);
}

TEST_CASE("the example frame of docs/wire-format.md is what the encoder produces") {
  // Keep in sync with the "Worked example" section (printed by tests/fuzz/wire_samples --example).
  const bytes f = spin::test::wire_example_frame();
  const std::array<std::uint8_t, 92> expected = {
      0x02, 0x53, 0x50, 0x00, 0x00, 0x02, 0x02, 0x53, 0x50, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45, 0x00,
      0x00, 0x4e, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x25, 0xf7, 0x0a, 0x53, 0x00, 0x01, 0x0a, 0x53,
      0x00, 0x02, 0x45, 0x6b, 0x45, 0x6b, 0x00, 0x3a, 0x00, 0x00, 0x01, 0x01, 0x00, 0x03, 0x00, 0x00,
      0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef};
  REQUIRE(f.size() == expected.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    CAPTURE(i);
    CHECK(std::to_integer<std::uint8_t>(f[i]) == expected[i]);
  }
}

TEST_CASE("rank_endpoint derives MAC 02:53:50:00:hi:lo and IPv4 10.83.hi.lo from the rank") {
  const wire::endpoint e = wire::rank_endpoint(0x00051234, 4000);
  CHECK(e.mac == std::array<std::uint8_t, 6>{0x02, 0x53, 0x50, 0x00, 0x12, 0x34});
  CHECK(e.ipv4 == 0x0a531234u);
  CHECK(e.udp_port == 4000);
  CHECK(wire::rank_endpoint(7).udp_port == wire::default_udp_port);
}

TEST_CASE("encode refuses a buffer one byte too small and a datagram over 65535 bytes") {
  wire::header h = sample_header(false, 10);
  const bytes payload = make_payload(10);
  bytes f(wire::encoded_len(h, payload.size()) - 1);
  CHECK(wire::encode(wire::rank_endpoint(1), wire::rank_endpoint(2), h, payload, f) == 0);

  // The largest datagram: 65535 bytes of IP = IPv4 + UDP + spin header + payload.
  const std::size_t max_payload = 65535 - wire::ipv4_min_len - wire::udp_len - wire::spin_base_len;
  for (std::size_t len : {max_payload, max_payload + 1}) {
    h = sample_header(false, len);
    const bytes big = make_payload(len);
    bytes out(wire::encoded_len(h, len));
    const std::size_t n = wire::encode(wire::rank_endpoint(1), wire::rank_endpoint(2), h, big, out);
    if (len == max_payload) {
      REQUIRE(n == out.size());
      CHECK(parse_whole(out).ok);
    } else {
      CHECK(n == 0);
    }
  }
}

TEST_CASE("a frame cut at every byte is rejected for the layer it ends in and never read past") {
  for (bool coll : {false, true}) {
    const bytes f = sample_frame(coll, 20);
    for (std::size_t n = 0; n < f.size(); ++n) {
      CAPTURE(coll);
      CAPTURE(n);
      const outcome o = parse_split(f, n);
      REQUIRE_FALSE(o.ok);
      CHECK(wire::reject_name(o.why) == std::string(wire::reject_name(cut_reason(n))));
    }
  }
}

TEST_CASE("a frame cut at every byte with its IP and UDP lengths rewritten is rejected in the layer it ends in") {
  for (bool coll : {false, true}) {
    const bytes f = sample_frame(coll, 20);
    const std::size_t header_end = coll_at + (coll ? wire::spin_coll_len : 0);
    for (std::size_t n = 0; n < f.size(); ++n) {
      CAPTURE(coll);
      CAPTURE(n);
      const bytes c = cut_consistently(f, n);
      const outcome o = parse_split(c, c.size());
      REQUIRE_FALSE(o.ok);
      CHECK(wire::reject_name(o.why) == std::string(wire::reject_name(consistent_cut_reason(n, header_end))));
    }
  }
}

TEST_CASE("a frame split into two segments at every point parses exactly as the contiguous frame") {
  for (bool coll : {false, true}) {
    // 80 payload bytes make the frame longer than the parser's header prefix (at most 144 bytes), so
    // both the in-place and the gathering path run.
    const bytes f = sample_frame(coll, 80);
    const outcome whole = parse_whole(f);
    REQUIRE(whole.ok);
    for (std::size_t i = 0; i <= f.size(); ++i) {
      CAPTURE(coll);
      CAPTURE(i);
      CHECK(same_outcome(parse_split(f, f.size(), {i}), whole));
    }
  }
}

TEST_CASE("a segment without data is skipped wherever it stands, whatever length it claims") {
  const bytes f = sample_frame(false, 80);
  const outcome whole = parse_whole(f);
  REQUIRE(whole.ok);
  for (std::uint32_t claimed : {0u, 10u, 500u}) {
    CAPTURE(claimed);
    const wire::segment before[] = {{nullptr, claimed}, {f.data(), static_cast<std::uint32_t>(f.size())}};
    const wire::segment after[] = {{f.data(), static_cast<std::uint32_t>(f.size())}, {nullptr, claimed}};
    for (const auto* segs : {before, after}) {
      outcome o;
      o.ok = wire::parse(std::span<const wire::segment>(segs, 2), wire::default_udp_port, o.p, o.why);
      CHECK(same_outcome(o, whole));
    }
  }
}

TEST_CASE("a frame split into three segments at every pair of points parses exactly as the contiguous frame") {
  for (bool coll : {false, true}) {
    const bytes f = sample_frame(coll, 80);
    const outcome whole = parse_whole(f);
    REQUIRE(whole.ok);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i <= f.size(); ++i)
      for (std::size_t j = i; j <= f.size(); ++j)
        if (!same_outcome(parse_split(f, f.size(), {i, j}), whole)) {
          if (mismatches++ == 0) FAIL_CHECK("split at " << i << " and " << j << " differs");
        }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("a cut frame split into two segments is rejected for the same reason as the contiguous cut frame") {
  for (bool coll : {false, true}) {
    const bytes f = sample_frame(coll, 20);
    const std::size_t header_end = coll_at + (coll ? wire::spin_coll_len : 0);
    std::size_t mismatches = 0;
    for (std::size_t n = 0; n < f.size(); ++n) {
      const bytes c = cut_consistently(f, n);
      for (std::size_t i = 0; i <= n; ++i) {
        const outcome raw = parse_split(f, n, {i});
        const outcome fixed = parse_split(c, n, {i});
        if (raw.ok || raw.why != cut_reason(n) || fixed.ok || fixed.why != consistent_cut_reason(n, header_end)) {
          if (mismatches++ == 0) FAIL_CHECK("cut at " << n << ", split at " << i << " differs");
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("each minimal corruption of a valid frame is rejected for its own reason") {
  const bytes base = sample_frame(false, 8);
  REQUIRE(parse_whole(base).ok);
  std::array<bool, wire::reject_count> seen{};
  for (const corruption& c : corruptions()) {
    CAPTURE(c.what);
    bytes f = base;
    c.apply(f);
    const outcome o = parse_whole(f);
    REQUIRE_FALSE(o.ok);
    CHECK(wire::reject_name(o.why) == std::string(wire::reject_name(c.why)));
    // Splitting the corrupted frame does not change the verdict.
    CHECK(same_outcome(parse_split(f, f.size(), {std::min<std::size_t>(f.size(), 41)}), o));
    seen[static_cast<std::size_t>(c.why)] = true;
  }
  for (std::size_t r = 0; r < wire::reject_count; ++r) {
    CAPTURE(wire::reject_name(static_cast<wire::reject>(r)));
    CHECK(seen[r]);
  }
}

TEST_CASE("every reject reason has its own name") {
  for (std::size_t r = 0; r < wire::reject_count; ++r)
    for (std::size_t s = 0; s < r; ++s)
      CHECK(std::string(wire::reject_name(static_cast<wire::reject>(r))) !=
            wire::reject_name(static_cast<wire::reject>(s)));
  CHECK(std::string(wire::reject_name(wire::reject::count_)) == "unknown");
}

TEST_CASE("frames the parser accepts although they differ from what the encoder writes") {
  const bytes base = sample_frame(false, 8);
  const outcome want = parse_whole(base);
  REQUIRE(want.ok);

  SUBCASE("Ethernet padding after the IP datagram") {
    for (std::size_t pad : {1u, 6u, 200u}) {
      bytes f = base;
      f.resize(f.size() + pad, std::byte{0x55});
      const outcome o = parse_whole(f);
      REQUIRE(o.ok);
      CHECK((o.p.hdr == want.p.hdr));
      CHECK(o.p.payload_offset == want.p.payload_offset);
      CHECK(o.p.frame_len == f.size());
    }
  }
  SUBCASE("IPv4 options (IHL 6 to 15) move the payload") {
    for (std::size_t words = 1; words <= 10; ++words) {
      bytes f = base;
      f.insert(f.begin() + udp_at, words * 4, std::byte{0x01});  // NOP options
      f[ip_at] = static_cast<std::byte>(0x45 + words);
      put_be(f, ip_at + 2, 2, f.size() - ip_at);
      fix_ip_checksum(f);
      const outcome o = parse_split(f, f.size(), {f.size() / 2});
      REQUIRE(o.ok);
      CHECK((o.p.hdr == want.p.hdr));
      CHECK(o.p.payload_offset == want.p.payload_offset + words * 4);
    }
  }
  SUBCASE("IP datagram longer than the UDP datagram") {
    bytes f = base;
    f.resize(f.size() + 4);
    put_be(f, ip_at + 2, 2, f.size() - ip_at);
    fix_ip_checksum(f);
    const outcome o = parse_whole(f);
    REQUIRE(o.ok);
    CHECK((o.p.hdr == want.p.hdr));
  }
  SUBCASE("a UDP checksum is not verified") {
    bytes f = base;
    put_be(f, udp_at + 6, 2, 0xbeef);
    CHECK(parse_whole(f).ok);
  }
  SUBCASE("the don't-fragment bit may be clear") {
    bytes f = base;
    put_be(f, ip_at + 6, 2, 0);
    fix_ip_checksum(f);
    CHECK(parse_whole(f).ok);
  }
  SUBCASE("a message that is not complete in this packet needs no end flag") {
    bytes f = base;
    put(f, f_flags, wire::flag_start);
    put(f, f_message_len, 1000);
    CHECK(parse_whole(f).ok);
  }
  SUBCASE("a non-default spin port when the parser is configured with it") {
    const wire::header h = sample_header(false, 8);
    const bytes f = encode(h, make_payload(8), 4000);
    CHECK(parse_whole(f, 4000).ok);
    const outcome o = parse_whole(f);
    REQUIRE_FALSE(o.ok);
    CHECK(o.why == wire::reject::wrong_port);
  }
}

TEST_CASE("the runtime counts every malformed frame under its reason and releases each exactly once") {
  spin::test::packet_pool pool;
  runtime_config cfg;
  cfg.hpus = 2;
  pool.attach(cfg);
  auto created = runtime::create(cfg);
  REQUIRE_MESSAGE(created.ok(), (created.ok() ? std::string() : created.err().message));
  std::unique_ptr<runtime> rt = std::move(created.value());

  std::array<std::uint64_t, wire::reject_count> want{};
  std::vector<packet> pkts;
  for (bool coll : {false, true}) {
    const bytes f = sample_frame(coll, 20);
    for (std::size_t n = 0; n < f.size(); ++n) {
      pkts.push_back(pool.add_raw(bytes(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(n))));
      ++want[static_cast<std::size_t>(cut_reason(n))];
    }
  }
  const bytes base = sample_frame(false, 8);
  for (const corruption& c : corruptions()) {
    bytes f = base;
    c.apply(f);
    pkts.push_back(pool.add_raw(std::move(f)));
    ++want[static_cast<std::size_t>(c.why)];
  }
  REQUIRE(spin::test::feed(*rt, pkts, 7));

  const runtime_stats s = rt->stats();
  CHECK(s.frames_accepted == 0);
  for (std::size_t r = 0; r < wire::reject_count; ++r) {
    CAPTURE(wire::reject_name(static_cast<wire::reject>(r)));
    CHECK(s.frames_rejected[r] == want[r]);
  }
  // Rejected frames are released at once, not only when the runtime is destroyed.
  CHECK(pool.unreleased() == 0);
  CHECK(pool.released_twice() == 0);
  rt.reset();
  CHECK(pool.released_once() == pkts.size());
  CHECK(pool.released_twice() == 0);
}

} // TEST_SUITE
