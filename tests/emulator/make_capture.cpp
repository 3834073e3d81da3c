// Writes a capture with known spin frames for the tshark dissector test (tshark_test.py):
//   make_capture <out.pcap>
// Prints one line per frame: "<frame number> <wire::parse verdict>" ("ok" or the reject reason),
// so the test can check that the dissector flags exactly the frames the runtime rejects.
#include <spin/emu/pcap.hpp>
#include <spin/rt/wire.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

namespace wire = spin::rt::wire;

namespace {

constexpr std::uint64_t base_ns = 1'700'000'000'000'000'000ull;  // 2023-11-14T22:13:20Z

// Encodes `h` with `payload_len` payload bytes from rank h.source_rank to rank `dst_rank`.
std::vector<std::byte> encode(const wire::header& h, std::size_t payload_len, std::uint32_t dst_rank = 2,
                              std::uint16_t dst_port = wire::default_udp_port) {
  std::vector<std::byte> payload(payload_len);
  for (std::size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<std::byte>(i & 0xff);
  auto dst = wire::rank_endpoint(dst_rank);
  dst.udp_port = dst_port;
  std::vector<std::byte> out(wire::encoded_len(h, payload_len));
  if (wire::encode(wire::rank_endpoint(h.source_rank), dst, h, payload, out) != out.size()) {
    std::fprintf(stderr, "make_capture: wire::encode failed\n");
    std::exit(1);
  }
  return out;
}

void put16(std::vector<std::byte>& f, std::size_t at, std::uint16_t v) {
  f[at] = static_cast<std::byte>(v >> 8);
  f[at + 1] = static_cast<std::byte>(v & 0xff);
}

// Recomputes the IPv4 header checksum (IHL 5) after a length change.
void fix_ip_checksum(std::vector<std::byte>& f) {
  put16(f, 24, 0);
  std::uint32_t sum = 0;
  for (std::size_t i = 14; i < 34; i += 2) sum += (std::to_integer<std::uint32_t>(f[i]) << 8) | std::to_integer<std::uint32_t>(f[i + 1]);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >> 16);
  put16(f, 24, static_cast<std::uint16_t>(~sum & 0xffff));
}

wire::header data(std::uint32_t seq, std::uint16_t flags, std::uint64_t offset, std::uint64_t message_len) {
  wire::header h;
  h.type = wire::packet_type::data;
  h.flags = flags;
  h.source_rank = 1;
  h.match_bits = 0x1234;
  h.message_id = 0x2a;
  h.seq = seq;
  h.offset = offset;
  h.message_len = message_len;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_capture <out.pcap>\n");
    return 2;
  }
  std::vector<std::vector<std::byte>> frames;

  // 1, 2: a two-packet data message (start, then end).
  frames.push_back(encode(data(0, wire::flag_start, 0, 2048), 1024));
  frames.push_back(encode(data(1, wire::flag_end, 1024, 2048), 1024));
  // 3: a collective packet with the extension, shadow copy of slot 5, and an authentication tag.
  {
    wire::header h = data(0, wire::flag_start | wire::flag_end | wire::flag_coll | wire::flag_auth, 0, 64);
    h.auth_tag = 0x0123456789abcdefull;
    h.source_rank = 3;
    h.message_id = 0x100;
    h.match_bits = 0xfeedface00000001ull;
    h.coll = wire::coll_ext{.op = 1, .dtype = 3, .slot = 0x8005, .elem_count = 16, .epoch = 9, .aux = 0};
    frames.push_back(encode(h, 64));
  }
  // 4: retransmission of frame 2.
  frames.push_back(encode(data(1, wire::flag_end | wire::flag_retransmit, 1024, 2048), 1024));
  // 5, 6: ack and nack from rank 2 for message 0x2a.
  for (auto t : {wire::packet_type::ack, wire::packet_type::nack}) {
    wire::header h;
    h.type = t;
    h.source_rank = 2;
    h.message_id = 0x2a;
    h.seq = 1;
    frames.push_back(encode(h, 0, 1));
  }
  // 7: a one-packet result; 8: control.
  {
    wire::header h = data(0, wire::flag_start | wire::flag_end, 0, 8);
    h.type = wire::packet_type::result;
    frames.push_back(encode(h, 8));
    h.type = wire::packet_type::control;
    h.flags = 0;
    h.message_len = 0;
    frames.push_back(encode(h, 0));
  }
  // 9: malformed: the UDP datagram holds only 20 bytes of spin header (lengths and IP checksum
  // consistent, so only the spin layer is wrong).
  {
    auto f = encode(data(0, wire::flag_start, 0, 0), 0);
    f.resize(wire::eth_len + wire::ipv4_min_len + wire::udp_len + 20);
    put16(f, 16, static_cast<std::uint16_t>(f.size() - wire::eth_len));
    put16(f, 38, static_cast<std::uint16_t>(wire::udp_len + 20));
    fix_ip_checksum(f);
    frames.push_back(f);
  }
  // 10: malformed: version 2.
  {
    wire::header h = data(0, wire::flag_start | wire::flag_end, 0, 8);
    h.version = 2;
    frames.push_back(encode(h, 8));
  }
  // 11: malformed: payload_len says 100, the datagram carries 8.
  {
    auto f = encode(data(0, wire::flag_start | wire::flag_end, 0, 100), 8);
    put16(f, 42 + 28, 100);
    frames.push_back(f);
  }
  // 12: malformed: unknown type 9 and unknown flag bits 0x0060.
  {
    wire::header h = data(0, 0x0060 | wire::flag_start, 0, 0);
    h.type = static_cast<wire::packet_type>(9);
    frames.push_back(encode(h, 0));
  }
  // 13: a valid spin frame to UDP port 9999 (not the spin port).
  frames.push_back(encode(data(0, wire::flag_start | wire::flag_end, 0, 4), 4, 2, 9999));

  auto w = spin::emu::pcap_writer::open(argv[1]);
  if (!w) {
    std::fprintf(stderr, "make_capture: %s\n", w.err().message.c_str());
    return 1;
  }
  for (std::size_t i = 0; i < frames.size(); ++i) {
    // Frame 3 goes through the segment path, split inside the collective extension.
    spin::errc rc;
    if (i == 2) {
      const wire::segment segs[] = {{frames[i].data(), 95}, {frames[i].data() + 95, static_cast<std::uint32_t>(frames[i].size() - 95)}};
      rc = w->write(segs, base_ns + i * 1'000'001);
    } else {
      rc = w->write(std::span<const std::byte>(frames[i]), base_ns + i * 1'000'001);
    }
    if (rc != spin::errc::ok) {
      std::fprintf(stderr, "make_capture: cannot write frame %zu: %s\n", i + 1, spin::errc_name(rc));
      return 1;
    }
    wire::parsed p;
    wire::reject why{};
    const bool ok = wire::parse(frames[i], wire::default_udp_port, p, why);
    std::printf("%zu %s\n", i + 1, ok ? "ok" : wire::reject_name(why));
  }
  if (auto c = w->close(); !c) {
    std::fprintf(stderr, "make_capture: %s\n", c.err().message.c_str());
    return 1;
  }
  return 0;
}
