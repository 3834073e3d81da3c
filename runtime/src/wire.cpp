#include <spin/rt/wire.hpp>
#include <spin/siphash.hpp>

#include <bit>
#include <cstring>

namespace spin::rt::wire {

const char* reject_name(reject r) {
  switch (r) {
  case reject::eth_truncated: return "eth_truncated";
  case reject::not_ipv4: return "not_ipv4";
  case reject::ip_truncated: return "ip_truncated";
  case reject::ip_version: return "ip_version";
  case reject::ip_length: return "ip_length";
  case reject::ip_checksum: return "ip_checksum";
  case reject::ip_fragment: return "ip_fragment";
  case reject::not_udp: return "not_udp";
  case reject::udp_truncated: return "udp_truncated";
  case reject::udp_length: return "udp_length";
  case reject::wrong_port: return "wrong_port";
  case reject::spin_truncated: return "spin_truncated";
  case reject::bad_version: return "bad_version";
  case reject::bad_type: return "bad_type";
  case reject::bad_flags: return "bad_flags";
  case reject::length_mismatch: return "length_mismatch";
  case reject::bad_offset: return "bad_offset";
  case reject::count_: break;
  }
  return "unknown";
}

std::uint64_t parser_stats::total_rejected() const {
  std::uint64_t n = 0;
  for (const auto& r : rejected) n += r.load(std::memory_order_relaxed);
  return n;
}

namespace {

// Largest header prefix the parser ever needs: Ethernet + IPv4 with options + UDP + spin with
// extension.
constexpr std::size_t max_header_bytes = eth_len + 60 + udp_len + spin_base_len + spin_coll_len + spin_auth_len;

// Bytes of the spin header, its extension and its tag as `flags` say.
constexpr std::size_t spin_len(std::uint16_t flags) {
  return spin_base_len + ((flags & flag_coll) ? spin_coll_len : 0) + ((flags & flag_auth) ? spin_auth_len : 0);
}

// Big-endian loads as one load and a byte swap each (the parser's inner loop).
template <class T> T load_be(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::little) {
    if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
    if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
    if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
  }
  return v;
}
std::uint16_t be16(const std::uint8_t* p) { return load_be<std::uint16_t>(p); }
std::uint32_t be32(const std::uint8_t* p) { return load_be<std::uint32_t>(p); }
std::uint64_t be64(const std::uint8_t* p) { return load_be<std::uint64_t>(p); }
void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
void put32(std::uint8_t* p, std::uint32_t v) {
  put16(p, static_cast<std::uint16_t>(v >> 16));
  put16(p + 2, static_cast<std::uint16_t>(v));
}
void put64(std::uint8_t* p, std::uint64_t v) {
  put32(p, static_cast<std::uint32_t>(v >> 32));
  put32(p + 4, static_cast<std::uint32_t>(v));
}

// RFC 1071 ones' complement sum, 32 bits at a time in native byte order (the sum is byte-order
// independent up to a final swap). Returns the checksum in host order of the big-endian field.
std::uint16_t ipv4_checksum(const std::uint8_t* h, std::size_t len) {
  std::uint64_t sum = 0;
  std::size_t i = 0;
  if (len == ipv4_min_len) {  // no options (every frame spinnic sends): five words, unrolled
    std::uint32_t w[5];
    std::memcpy(w, h, sizeof w);
    sum = std::uint64_t{w[0]} + w[1] + w[2] + w[3] + w[4];
    i = len;
  }
  for (; i + 4 <= len; i += 4) {
    std::uint32_t w;
    std::memcpy(&w, h + i, 4);
    sum += w;
  }
  if (i + 2 <= len) {
    std::uint16_t w;
    std::memcpy(&w, h + i, 2);
    sum += w;
  }
  sum = (sum & 0xffffffffu) + (sum >> 32);  // fold 64 -> 33 -> 17 -> 16 bits
  sum = (sum & 0xffffffffu) + (sum >> 32);
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  auto r = static_cast<std::uint16_t>(~sum);
  if constexpr (std::endian::native == std::endian::little) r = static_cast<std::uint16_t>(r << 8 | r >> 8);
  return r;
}

// Copies up to `n` bytes of the frame's prefix into `dst`, walking the segments; returns the
// number of bytes copied (less than n when the frame is shorter).
std::size_t gather(std::span<const segment> segs, std::uint8_t* dst, std::size_t n) {
  std::size_t got = 0;
  for (const segment& s : segs) {
    if (got == n) break;
    if (s.data == nullptr) continue;
    const std::size_t take = std::min<std::size_t>(s.len, n - got);
    std::memcpy(dst + got, s.data, take);
    got += take;
  }
  return got;
}

// Writes the spin header, its extension and its tag as h.flags say; returns their bytes.
std::size_t put_spin(std::uint8_t* s, const header& h) {
  s[0] = h.version;
  s[1] = static_cast<std::uint8_t>(h.type);
  put16(s + 2, h.flags);
  put32(s + 4, h.source_rank);
  put64(s + 8, h.match_bits);
  put64(s + 16, h.message_id);
  put32(s + 24, h.seq);
  put16(s + 28, static_cast<std::uint16_t>(h.payload_len));
  put64(s + 30, h.message_len);
  put64(s + 38, h.offset);
  std::size_t hl = spin_base_len;
  if (h.flags & flag_coll) {
    std::uint8_t* c = s + spin_base_len;
    c[0] = h.coll.op;
    c[1] = h.coll.dtype;
    put16(c + 2, h.coll.slot);
    put32(c + 4, h.coll.elem_count);
    put32(c + 8, h.coll.epoch);
    put32(c + 12, h.coll.aux);
    hl += spin_coll_len;
  }
  if (h.flags & flag_auth) {
    put64(s + hl, h.auth_tag);
    hl += spin_auth_len;
  }
  return hl;
}

} // namespace

auth_key auth_key::from_bytes(const std::array<std::uint8_t, 16>& b) {
  return auth_key{siphash_detail::le64(b.data()), siphash_detail::le64(b.data() + 8)};
}

std::uint64_t auth_tag(const auth_key& k, const header& h, std::span<const std::byte> payload) noexcept {
  // 46 header bytes, 16 extension bytes, 2 zero bytes: eight words ahead of the payload.
  std::uint8_t pre[spin_base_len + spin_coll_len + 2 + spin_auth_len] = {};
  header c = h;
  c.flags = static_cast<std::uint16_t>(c.flags | flag_auth | flag_coll);
  c.message_id = 0;
  c.payload_len = static_cast<std::uint32_t>(payload.size());
  c.auth_tag = 0;
  if ((h.flags & flag_coll) == 0) c.coll = coll_ext{};
  put_spin(pre, c);  // writes 70 bytes: the tag's 8 zero bytes land in the spare words
  put16(pre + 2, static_cast<std::uint16_t>(h.flags | flag_auth));  // the flags as sent
  constexpr std::size_t covered = spin_base_len + spin_coll_len + 2;
  static_assert(covered % 8 == 0);
  return siphash24(k.k0, k.k1, pre, covered, reinterpret_cast<const u8*>(payload.data()), payload.size());
}

bool parse(std::span<const segment> segs, std::uint16_t udp_port, parsed& out, reject& why) noexcept {
  std::uint64_t frame_len = 0;
  for (const segment& s : segs) frame_len += s.data != nullptr ? s.len : 0;
  if (frame_len > UINT32_MAX) frame_len = UINT32_MAX;

  // Contiguous fast path reads in place; otherwise the header prefix is gathered once.
  std::uint8_t buf[max_header_bytes];
  const std::uint8_t* f;
  std::size_t have;
  if (!segs.empty() && segs[0].data != nullptr && (segs.size() == 1 || segs[0].len >= max_header_bytes)) {
    f = reinterpret_cast<const std::uint8_t*>(segs[0].data);
    have = segs[0].data != nullptr ? segs[0].len : 0;
  } else {
    have = gather(segs, buf, max_header_bytes);
    f = buf;
  }

  auto fail = [&](reject r) {
    why = r;
    return false;
  };
  if (have < eth_len) return fail(reject::eth_truncated);
  if (be16(f + 12) != 0x0800) return fail(reject::not_ipv4);
  const std::uint8_t* ip = f + eth_len;
  if (have < eth_len + ipv4_min_len) return fail(reject::ip_truncated);
  if ((ip[0] >> 4) != 4) return fail(reject::ip_version);
  const std::size_t ihl = std::size_t{ip[0] & 0x0fu} * 4;
  if (ihl < ipv4_min_len || have < eth_len + ihl) return fail(reject::ip_truncated);
  const std::size_t ip_total = be16(ip + 2);
  if (ip_total < ihl || ip_total > frame_len - eth_len) return fail(reject::ip_length);
  if (ipv4_checksum(ip, ihl) != 0) return fail(reject::ip_checksum);
  if ((be16(ip + 6) & 0x3fff) != 0) return fail(reject::ip_fragment);
  if (ip[9] != 17) return fail(reject::not_udp);
  if (ip_total < ihl + udp_len || have < eth_len + ihl + udp_len) return fail(reject::udp_truncated);
  const std::uint8_t* udp = ip + ihl;
  const std::size_t ulen = be16(udp + 4);
  if (ulen < udp_len || ulen > ip_total - ihl) return fail(reject::udp_length);
  if (be16(udp + 2) != udp_port) return fail(reject::wrong_port);

  const std::size_t spin_off = eth_len + ihl + udp_len;
  if (ulen < udp_len + spin_base_len || have < spin_off + spin_base_len) return fail(reject::spin_truncated);
  const std::uint8_t* s = f + spin_off;
  header& h = out.hdr;
  if (s[0] != version) return fail(reject::bad_version);
  if (s[1] < static_cast<std::uint8_t>(packet_type::data) || s[1] > static_cast<std::uint8_t>(packet_type::control))
    return fail(reject::bad_type);
  const std::uint16_t flags = be16(s + 2);
  if ((flags & ~known_flags) != 0) return fail(reject::bad_flags);
  const std::size_t hdr_len = spin_len(flags);
  if (ulen < udp_len + hdr_len || have < spin_off + hdr_len) return fail(reject::spin_truncated);
  decode_spin(reinterpret_cast<const std::byte*>(s), h);
  if ((h.flags & flag_start) != 0 && h.seq != 0) return fail(reject::bad_flags);
  if (h.payload_len != ulen - udp_len - hdr_len) return fail(reject::length_mismatch);
  if (h.offset > h.message_len || h.payload_len > h.message_len - h.offset) return fail(reject::bad_offset);
  if ((h.flags & flag_end) != 0 && h.offset + h.payload_len != h.message_len) return fail(reject::bad_offset);

  out.spin_offset = static_cast<std::uint32_t>(spin_off);
  out.payload_offset = static_cast<std::uint32_t>(spin_off + hdr_len);
  out.frame_len = static_cast<std::uint32_t>(frame_len);
  return true;
}

void decode_spin(const std::byte* spin, header& h) noexcept {
  const auto* s = reinterpret_cast<const std::uint8_t*>(spin);
  h.version = s[0];
  h.type = static_cast<packet_type>(s[1]);
  h.flags = be16(s + 2);
  h.source_rank = be32(s + 4);
  h.match_bits = be64(s + 8);
  h.message_id = be64(s + 16);
  h.seq = be32(s + 24);
  h.payload_len = be16(s + 28);
  h.message_len = be64(s + 30);
  h.offset = be64(s + 38);
  if (h.flags & flag_coll) {
    const std::uint8_t* c = s + spin_base_len;
    h.coll.op = c[0];
    h.coll.dtype = c[1];
    h.coll.slot = be16(c + 2);
    h.coll.elem_count = be32(c + 4);
    h.coll.epoch = be32(c + 8);
    h.coll.aux = be32(c + 12);
  } else {
    h.coll = coll_ext{};
  }
  h.auth_tag = (h.flags & flag_auth) ? be64(s + spin_base_len + ((h.flags & flag_coll) ? spin_coll_len : 0)) : 0;
}

endpoint rank_endpoint(std::uint32_t rank, std::uint16_t udp_port) {
  endpoint e;
  e.mac = {0x02, 0x53, 0x50, 0x00, static_cast<std::uint8_t>(rank >> 8), static_cast<std::uint8_t>(rank)};
  e.ipv4 = (10u << 24) | (83u << 16) | (rank & 0xffffu);
  e.udp_port = udp_port;
  return e;
}

std::size_t encoded_len(const header& h, std::size_t payload_len) {
  return eth_len + ipv4_min_len + udp_len + spin_len(h.flags) + payload_len;
}

std::size_t encode(const endpoint& src, const endpoint& dst, header h, std::span<const std::byte> payload,
                   std::span<std::byte> out) noexcept {
  const std::size_t hl = encode_headers(src, dst, h, payload.size(), out);
  if (hl == 0 || out.size() - hl < payload.size()) return 0;
  if (!payload.empty()) std::memcpy(out.data() + hl, payload.data(), payload.size());
  return hl + payload.size();
}

std::size_t encode_headers(const endpoint& src, const endpoint& dst, header h, std::size_t payload_len,
                           std::span<std::byte> out) noexcept {
  const std::size_t len = encoded_len(h, payload_len);
  if (len - payload_len > out.size() || len - eth_len > 65535) return 0;
  auto* f = reinterpret_cast<std::uint8_t*>(out.data());
  std::memcpy(f, dst.mac.data(), 6);
  std::memcpy(f + 6, src.mac.data(), 6);
  put16(f + 12, 0x0800);
  std::uint8_t* ip = f + eth_len;
  std::memset(ip, 0, ipv4_min_len);
  ip[0] = 0x45;
  put16(ip + 2, static_cast<std::uint16_t>(len - eth_len));
  put16(ip + 6, 0x4000);  // don't fragment
  ip[8] = 64;
  ip[9] = 17;
  put32(ip + 12, src.ipv4);
  put32(ip + 16, dst.ipv4);
  put16(ip + 10, ipv4_checksum(ip, ipv4_min_len));
  std::uint8_t* udp = ip + ipv4_min_len;
  put16(udp, src.udp_port);
  put16(udp + 2, dst.udp_port);
  put16(udp + 4, static_cast<std::uint16_t>(len - eth_len - ipv4_min_len));
  put16(udp + 6, 0);
  std::uint8_t* s = udp + udp_len;
  h.payload_len = static_cast<std::uint32_t>(payload_len);
  const std::size_t hl = put_spin(s, h);
  return static_cast<std::size_t>(s + hl - f);
}

} // namespace spin::rt::wire
