// Writes the fuzzers' seed corpora (valid frames made by the wire encoder) and prints the
// example frame of docs/wire-format.md, so neither is hand-computed.
//   wire_samples <dir>       writes <dir>/fuzz_wire/* and <dir>/fuzz_ingress/*
//   wire_samples --example   prints the example frame as a hex dump
#include <spin/rt/wire.hpp>

#include "../common/wire_example.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace spin::rt;
using bytes = std::vector<unsigned char>;

namespace {

bytes frame(const wire::header& h, std::size_t payload_len, std::uint32_t dest = 2) {
  std::vector<std::byte> payload(payload_len);
  for (std::size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<std::byte>(i * 7 + 1);
  std::vector<std::byte> out(wire::encoded_len(h, payload_len));
  if (wire::encode(wire::rank_endpoint(h.source_rank), wire::rank_endpoint(dest), h, payload, out) != out.size()) {
    std::fprintf(stderr, "wire_samples: encode failed\n");
    std::exit(1);
  }
  return bytes(reinterpret_cast<const unsigned char*>(out.data()),
               reinterpret_cast<const unsigned char*>(out.data()) + out.size());
}

// Packet `seq` of a message of `count` packets of `pkt` bytes; `match_bits` bit 0 clear matches
// the fuzz_ingress EC.
wire::header packet_of(std::uint32_t source, std::uint64_t msg, std::uint32_t seq, std::uint32_t count,
                       std::uint32_t pkt, std::uint64_t match_bits = 0x10) {
  wire::header h;
  h.source_rank = source;
  h.match_bits = match_bits;
  h.message_id = msg;
  h.seq = seq;
  h.message_len = std::uint64_t{count} * pkt;
  h.offset = std::uint64_t{seq} * pkt;
  h.flags = wire::position_flags(seq, count);
  return h;
}

void write(const std::filesystem::path& p, const bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) {
    std::fprintf(stderr, "wire_samples: cannot write %s\n", p.c_str());
    std::exit(1);
  }
}

// fuzz_wire input: one byte that chooses the segmentation, then the frame.
bytes wire_input(unsigned char how, const bytes& f) {
  bytes b{how};
  b.insert(b.end(), f.begin(), f.end());
  return b;
}

// fuzz_ingress input: one options byte, then frames each preceded by a 2-byte big-endian length.
bytes ingress_input(unsigned char options, const std::vector<bytes>& frames) {
  bytes b{options};
  for (const bytes& f : frames) {
    b.push_back(static_cast<unsigned char>(f.size() >> 8));
    b.push_back(static_cast<unsigned char>(f.size()));
    b.insert(b.end(), f.begin(), f.end());
  }
  return b;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_samples <corpus-dir> | --example\n");
    return 2;
  }
  if (std::strcmp(argv[1], "--example") == 0) {
    const std::vector<std::byte> out = spin::test::wire_example_frame();
    const std::size_t n = out.size();
    for (std::size_t i = 0; i < n; ++i)
      std::printf("%s%02x%s", i % 16 == 0 ? (i == 0 ? "" : "\n") : " ", std::to_integer<unsigned>(out[i]),
                  i + 1 == n ? "\n" : "");
    return 0;
  }

  const std::filesystem::path root = argv[1];
  std::filesystem::create_directories(root / "fuzz_wire");
  std::filesystem::create_directories(root / "fuzz_ingress");

  wire::header coll = packet_of(3, 11, 0, 1, 32);
  coll.flags |= wire::flag_coll;
  coll.coll = {1, 2, 0x8005, 8, 42, 0};
  wire::header ack = packet_of(4, 12, 0, 1, 0);
  ack.type = wire::packet_type::ack;

  write(root / "fuzz_wire" / "data_1seg", wire_input(0, frame(packet_of(1, 7, 0, 1, 4), 4)));
  write(root / "fuzz_wire" / "coll_3seg_step13", wire_input(2 | 12 << 2, frame(coll, 32)));
  write(root / "fuzz_wire" / "data_4seg_step40", wire_input(3 | 39 << 2, frame(packet_of(2, 9, 1, 3, 80), 80)));
  write(root / "fuzz_wire" / "ack_2seg_step50", wire_input(1 | 49 << 2, frame(ack, 0)));

  // One message in order; one out of order with a duplicate; two sources interleaved, a
  // collective packet and a frame no EC matches.
  write(root / "fuzz_ingress" / "in_order",
        ingress_input(0, {frame(packet_of(1, 1, 0, 3, 64), 64), frame(packet_of(1, 1, 1, 3, 64), 64),
                          frame(packet_of(1, 1, 2, 3, 64), 64)}));
  write(root / "fuzz_ingress" / "reordered_dup",
        ingress_input(1, {frame(packet_of(2, 5, 2, 3, 40), 40), frame(packet_of(2, 5, 1, 3, 40), 40),
                          frame(packet_of(2, 5, 1, 3, 40), 40), frame(packet_of(2, 5, 0, 3, 40), 40)}));
  write(root / "fuzz_ingress" / "mixed",
        ingress_input(3 << 1, {frame(packet_of(1, 2, 0, 2, 16), 16), frame(packet_of(3, 2, 0, 2, 16), 16),
                               frame(coll, 32), frame(packet_of(3, 2, 1, 2, 16), 16),
                               frame(packet_of(1, 2, 1, 2, 16), 16), frame(packet_of(5, 1, 0, 1, 8, 0x11), 8)}));
  return 0;
}
