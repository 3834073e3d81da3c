// pcap capture and replay (emulator/include/spin/emu/pcap.hpp): no DPDK, files in a temporary
// directory.
#include <spin/emu/pcap.hpp>

#include <doctest/doctest.h>
#include <pcap/pcap.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace wire = spin::rt::wire;
using spin::errc;
using spin::emu::frame_view;
using spin::emu::pcap_reader;
using spin::emu::pcap_writer;

namespace {

/// A fresh directory under the system's temporary directory, removed with its files at the end.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spin-pcap-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// A spin data frame from rank 1 to rank 2 (wire::encode) with `payload_len` payload bytes whose
/// values depend on `seq`, so frames differ from each other.
std::vector<std::byte> make_frame(std::uint32_t seq, std::size_t payload_len, std::uint16_t flags = 0) {
  wire::header h;
  h.type = wire::packet_type::data;
  h.flags = flags;
  h.source_rank = 1;
  h.match_bits = 0x2a;
  h.message_id = 7;
  h.seq = seq;
  h.offset = std::uint64_t{seq} * payload_len;
  h.message_len = h.offset + payload_len;
  std::vector<std::byte> payload(payload_len);
  for (std::size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<std::byte>((seq * 31 + i) & 0xff);
  std::vector<std::byte> out(wire::encoded_len(h, payload_len));
  REQUIRE(wire::encode(wire::rank_endpoint(1), wire::rank_endpoint(2), h, payload, out) == out.size());
  return out;
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// Reads every record of `path` with its metadata; fails the test when the reader reports an error.
std::vector<std::tuple<std::vector<std::byte>, std::uint32_t, std::uint64_t>> read_records(const std::string& path) {
  auto r = pcap_reader::open(path);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : (r.ok() ? std::string() : r.err().message)));
  std::vector<std::tuple<std::vector<std::byte>, std::uint32_t, std::uint64_t>> out;
  frame_view f;
  while (r->next(f)) out.emplace_back(std::vector<std::byte>(f.bytes.begin(), f.bytes.end()), f.orig_len, f.timestamp_ns);
  CHECK_FALSE(r->error().has_value());
  CHECK(r->frames() == out.size());
  return out;
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("contiguous frames are read back byte-identical with their nanosecond timestamps") {
  temp_dir dir;
  const std::string path = dir.file("contig.pcap");
  const std::vector<std::uint64_t> stamps = {0, 1, 999'999'999, 1'000'000'000, 1'700'000'000'123'456'789ull,
                                             4'294'967'295ull * 1'000'000'000ull + 999'999'999ull};
  std::vector<std::vector<std::byte>> frames;
  std::uint64_t total = 0;
  {
    auto w = pcap_writer::open(path);
    REQUIRE_MESSAGE(w.ok(), (w.ok() ? "" : (w.ok() ? std::string() : w.err().message)));
    for (std::size_t i = 0; i < stamps.size(); ++i) {
      frames.push_back(make_frame(static_cast<std::uint32_t>(i), 4 + 100 * i, i == 0 ? wire::flag_start : 0));
      total += frames.back().size();
      CHECK(w->write(std::span<const std::byte>(frames.back()), stamps[i]) == errc::ok);
    }
    CHECK(w->frames() == stamps.size());
    CHECK(w->bytes() == total);
    CHECK(w->truncated() == 0);
    CHECK(w->close().ok());
    CHECK_FALSE(w->is_open());
  }
  const auto recs = read_records(path);
  REQUIRE(recs.size() == frames.size());
  for (std::size_t i = 0; i < recs.size(); ++i) {
    CAPTURE(i);
    CHECK(std::get<0>(recs[i]) == frames[i]);
    CHECK(std::get<1>(recs[i]) == frames[i].size());
    CHECK(std::get<2>(recs[i]) == stamps[i]);
    // What comes back is still a valid spin frame with the header we encoded.
    wire::parsed p;
    wire::reject why{};
    REQUIRE(wire::parse(std::get<0>(recs[i]), wire::default_udp_port, p, why));
    CHECK(p.hdr.seq == i);
    CHECK(p.hdr.message_id == 7);
  }
}

TEST_CASE("a frame split over segments at any point is stored as the same bytes") {
  temp_dir dir;
  const std::string path = dir.file("segs.pcap");
  const auto frame = make_frame(0, 300, wire::flag_start | wire::flag_end);
  const std::uint32_t n = static_cast<std::uint32_t>(frame.size());
  // Split points: inside Ethernet, IPv4, UDP, the spin header, the payload; empty segments too.
  const std::vector<std::vector<std::uint32_t>> cuts = {
      {1}, {14}, {20}, {40}, {42}, {60}, {88}, {200}, {n - 1},                  // two segments
      {10, 50}, {34, 42}, {44, 87}, {88, 89}, {100, 300}, {0, 5}, {50, 50}, {n - 2, n - 1}, {0, n},  // three
  };
  std::uint64_t ts = 1'000;
  std::size_t written = 0;
  {
    auto w = pcap_writer::open(path);
    REQUIRE(w.ok());
    for (const auto& c : cuts) {
      std::vector<wire::segment> segs;
      std::uint32_t at = 0;
      for (std::uint32_t cut : c) {
        segs.push_back({frame.data() + at, cut - at});
        at = cut;
      }
      segs.push_back({frame.data() + at, n - at});
      CHECK(w->write(segs, ts++) == errc::ok);
      ++written;
    }
    REQUIRE(w->close().ok());
  }
  const auto recs = read_records(path);
  REQUIRE(recs.size() == written);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    CAPTURE(i);
    CHECK(std::get<0>(recs[i]) == frame);
    CHECK(std::get<1>(recs[i]) == n);
    CHECK(std::get<2>(recs[i]) == 1'000 + i);
  }
}

TEST_CASE("frames longer than the snapshot length are stored cut, counted, and keep their original length") {
  temp_dir dir;
  const std::string path = dir.file("snap.pcap");
  const std::uint32_t snap = 100;
  const auto small = make_frame(0, 12);   // 100 bytes: exactly the snapshot length, not cut
  const auto big = make_frame(1, 1000);   // 1088 bytes
  REQUIRE(small.size() == snap);
  {
    auto w = pcap_writer::open(path, snap);
    REQUIRE(w.ok());
    CHECK(w->snaplen_bytes() == snap);
    CHECK(w->write(std::span<const std::byte>(small), 1) == errc::ok);
    CHECK(w->write(std::span<const std::byte>(big), 2) == errc::ok);
    // Split so that the cut falls into the second of three segments.
    const wire::segment segs[] = {{big.data(), 60}, {big.data() + 60, 500}, {big.data() + 560, 528}};
    CHECK(w->write(segs, 3) == errc::ok);
    CHECK(w->frames() == 3);
    CHECK(w->truncated() == 2);
    CHECK(w->bytes() == small.size() + 2 * big.size());
    REQUIRE(w->close().ok());
  }
  auto r = pcap_reader::open(path);
  REQUIRE(r.ok());
  CHECK(r->snaplen_bytes() == snap);
  frame_view f;
  REQUIRE(r->next(f));
  CHECK_FALSE(f.truncated());
  CHECK(f.orig_len == 100);
  REQUIRE(r->next(f));
  CHECK(f.truncated());
  CHECK(f.orig_len == big.size());
  CHECK(std::vector<std::byte>(f.bytes.begin(), f.bytes.end()) == std::vector<std::byte>(big.begin(), big.begin() + snap));
  REQUIRE(r->next(f));
  CHECK(f.truncated());
  CHECK(f.orig_len == big.size());
  CHECK(std::vector<std::byte>(f.bytes.begin(), f.bytes.end()) == std::vector<std::byte>(big.begin(), big.begin() + snap));
  CHECK(f.timestamp_ns == 3);
  CHECK_FALSE(r->next(f));
  CHECK_FALSE(r->error().has_value());
  CHECK(r->frames() == 3);
  CHECK(r->truncated() == 2);
  CHECK(r->bytes() == 3 * snap);
}

TEST_CASE("the writer refuses bad arguments and reports files it cannot create") {
  temp_dir dir;
  SUBCASE("snapshot length 0 or above the libpcap maximum") {
    for (std::uint32_t snap : {0u, spin::emu::pcap_max_snaplen_bytes + 1}) {
      auto w = pcap_writer::open(dir.file("x.pcap"), snap);
      REQUIRE_FALSE(w.ok());
      CHECK(w.err().code == errc::invalid_argument);
      CHECK(w.err().message.find("snapshot length") != std::string::npos);
    }
  }
  SUBCASE("a directory that does not exist") {
    const std::string path = dir.file("missing/x.pcap");
    auto w = pcap_writer::open(path);
    REQUIRE_FALSE(w.ok());
    CHECK(w.err().code == errc::invalid_argument);
    CHECK(w.err().message == "cannot create capture file '" + path + "': No such file or directory");
  }
  SUBCASE("empty frames, null segments and a closed writer") {
    auto w = pcap_writer::open(dir.file("x.pcap"));
    REQUIRE(w.ok());
    CHECK(w->write(std::span<const std::byte>(), 1) == errc::invalid_argument);
    const wire::segment empties[] = {{nullptr, 0}, {nullptr, 0}};
    CHECK(w->write(empties, 1) == errc::invalid_argument);
    const wire::segment null_data[] = {{nullptr, 10}};
    CHECK(w->write(null_data, 1) == errc::invalid_argument);
    const auto frame = make_frame(0, 4);
    CHECK(w->write(std::span<const std::byte>(frame), 5'000'000'000ull * 1'000'000'000ull) == errc::invalid_argument);
    CHECK(w->frames() == 0);
    REQUIRE(w->close().ok());
    CHECK(w->close().ok());  // idempotent
    CHECK(w->write(std::span<const std::byte>(frame), 1) == errc::bad_state);
    CHECK(w->flush().err().code == errc::bad_state);
    CHECK(read_records(dir.file("x.pcap")).empty());
  }
}

TEST_CASE("write errors of the file system are reported by flush and close") {
  if (!std::filesystem::exists("/dev/full")) {
    MESSAGE("/dev/full is missing: write errors cannot be provoked here");
    return;
  }
  auto w = pcap_writer::open("/dev/full");
  REQUIRE(w.ok());
  const auto frame = make_frame(0, 64);
  CHECK(w->write(std::span<const std::byte>(frame), 1) == errc::ok);  // buffered by stdio
  auto f = w->flush();
  REQUIRE_FALSE(f.ok());
  CHECK(f.err().code == errc::bad_state);
  CHECK(f.err().message == "cannot write capture file '/dev/full': No space left on device");
  CHECK(w->write(std::span<const std::byte>(frame), 2) == errc::bad_state);
  auto c = w->close();
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().message.find("No space left on device") != std::string::npos);
  CHECK_FALSE(w->is_open());
  CHECK(w->close().ok());
}

TEST_CASE("a moved writer keeps writing to the same file and the moved-from one is closed") {
  temp_dir dir;
  const std::string path = dir.file("move.pcap");
  const auto a = make_frame(0, 8);
  const auto b = make_frame(1, 16);
  auto opened = pcap_writer::open(path);
  REQUIRE(opened.ok());
  pcap_writer w1 = std::move(opened.value());
  CHECK(w1.write(std::span<const std::byte>(a), 10) == errc::ok);
  pcap_writer w2 = std::move(w1);
  CHECK_FALSE(w1.is_open());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  CHECK(w1.write(std::span<const std::byte>(a), 11) == errc::bad_state);
  CHECK(w2.write(std::span<const std::byte>(b), 12) == errc::ok);
  CHECK(w2.frames() == 2);
  REQUIRE(w2.close().ok());
  const auto recs = read_records(path);
  REQUIRE(recs.size() == 2);
  CHECK(std::get<0>(recs[0]) == a);
  CHECK(std::get<0>(recs[1]) == b);
  CHECK(std::get<2>(recs[1]) == 12);
}

TEST_CASE("the reader names the file and the problem for each file it cannot read") {
  temp_dir dir;
  SUBCASE("missing file") {
    const std::string path = dir.file("nope.pcap");
    auto r = pcap_reader::open(path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_found);
    CHECK(r.err().message == "cannot open capture file '" + path + "': No such file or directory");
  }
  SUBCASE("a directory") {
    auto r = pcap_reader::open(dir.path.string());
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message == "cannot read capture file '" + dir.path.string() + "': it is a directory");
  }
  SUBCASE("not a capture file") {
    const std::string path = dir.file("text.pcap");
    write_text(path, "this is not a capture file, just some text that is long enough\n");
    auto r = pcap_reader::open(path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("'" + path + "' is not a pcap or pcapng file libpcap can read: ") == 0);
  }
  SUBCASE("a file header cut short") {
    const std::string path = dir.file("short.pcap");
    {
      auto w = pcap_writer::open(path);
      REQUIRE(w.ok());
      REQUIRE(w->close().ok());
    }
    std::filesystem::resize_file(path, 10);
    auto r = pcap_reader::open(path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("'" + path + "' is not a pcap or pcapng file libpcap can read: ") == 0);
    CHECK(r.err().message.find("truncated") != std::string::npos);
  }
  SUBCASE("an empty file") {
    const std::string path = dir.file("empty.pcap");
    write_text(path, "");
    auto r = pcap_reader::open(path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK(r.err().message.find("'" + path + "' is not a pcap or pcapng file") == 0);
  }
  SUBCASE("a link type other than Ethernet") {
    const std::string path = dir.file("raw.pcap");
    pcap_t* p = pcap_open_dead(DLT_RAW, 65535);
    REQUIRE(p != nullptr);
    pcap_dumper_t* d = pcap_dump_open(p, path.c_str());
    REQUIRE(d != nullptr);
    pcap_dump_close(d);
    pcap_close(p);
    auto r = pcap_reader::open(path);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_supported);
    CHECK(r.err().message.find("capture file '" + path + "' has link type ") == 0);
    CHECK(r.err().message.find("RAW") != std::string::npos);
    CHECK(r.err().message.find("only Ethernet") != std::string::npos);
  }
}

TEST_CASE("a file cut in the middle of a record gives the frames before it and then an error") {
  temp_dir dir;
  const std::string path = dir.file("cut.pcap");
  std::vector<std::vector<std::byte>> frames;
  {
    auto w = pcap_writer::open(path);
    REQUIRE(w.ok());
    for (std::uint32_t i = 0; i < 3; ++i) {
      frames.push_back(make_frame(i, 40));
      REQUIRE(w->write(std::span<const std::byte>(frames.back()), 100 + i) == errc::ok);
    }
    REQUIRE(w->close().ok());
  }
  const auto full = file_bytes(path);
  constexpr std::size_t file_header = 24;
  constexpr std::size_t record_header = 16;
  const std::size_t rec = record_header + frames[0].size();
  REQUIRE(full.size() == file_header + 3 * rec);

  // Cut inside the third record's data, inside its header, and right after the second record.
  struct cut_case {
    std::size_t size;
    bool error;
  };
  for (const cut_case c : {cut_case{full.size() - 10, true}, cut_case{file_header + 2 * rec + 5, true},
                           cut_case{file_header + 2 * rec, false}}) {
    CAPTURE(c.size);
    std::filesystem::copy_file(path, dir.file("c.pcap"), std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(dir.file("c.pcap"), c.size);
    auto r = pcap_reader::open(dir.file("c.pcap"));
    REQUIRE(r.ok());
    frame_view f;
    for (std::size_t i = 0; i < 2; ++i) {
      REQUIRE(r->next(f));
      CHECK(std::vector<std::byte>(f.bytes.begin(), f.bytes.end()) == frames[i]);
      CHECK(f.timestamp_ns == 100 + i);
    }
    CHECK_FALSE(r->next(f));
    CHECK_FALSE(r->next(f));  // stays at the end
    CHECK(r->frames() == 2);
    CHECK(r->error().has_value() == c.error);
    auto all = spin::emu::read_all_frames(dir.file("c.pcap"));
    CHECK(all.ok() == !c.error);
    if (c.error) {
      CHECK(r->error()->code == errc::invalid_argument);
      CHECK(r->error()->message.find("cannot read capture file '" + dir.file("c.pcap") + "' after frame 2: ") == 0);
      CHECK(r->error()->message.find("truncated") != std::string::npos);
      CHECK(all.err().message == r->error()->message);
    } else {
      REQUIRE(all->size() == 2);
      CHECK((*all)[1] == frames[1]);
    }
  }
}

TEST_CASE("microsecond captures written by other tools are read with nanosecond timestamps") {
  temp_dir dir;
  const std::string path = dir.file("usec.pcap");
  const auto frame = make_frame(0, 20);
  pcap_t* p = pcap_open_dead(DLT_EN10MB, 65535);  // microsecond precision, as tcpdump writes
  REQUIRE(p != nullptr);
  pcap_dumper_t* d = pcap_dump_open(p, path.c_str());
  REQUIRE(d != nullptr);
  pcap_pkthdr rec{};
  rec.ts.tv_sec = 1'700'000'000;
  rec.ts.tv_usec = 123'456;
  rec.caplen = rec.len = static_cast<bpf_u_int32>(frame.size());
  pcap_dump(reinterpret_cast<u_char*>(d), &rec, reinterpret_cast<const u_char*>(frame.data()));
  pcap_dump_close(d);
  pcap_close(p);
  const auto recs = read_records(path);
  REQUIRE(recs.size() == 1);
  CHECK(std::get<0>(recs[0]) == frame);
  CHECK(std::get<2>(recs[0]) == 1'700'000'000'123'456'000ull);
}

TEST_CASE("read_all_frames returns every frame of a capture in order") {
  temp_dir dir;
  const std::string path = dir.file("all.pcap");
  std::vector<std::vector<std::byte>> frames;
  {
    auto w = pcap_writer::open(path);
    REQUIRE(w.ok());
    for (std::uint32_t i = 0; i < 5; ++i) {
      frames.push_back(make_frame(i, 10 * i));
      REQUIRE(w->write(std::span<const std::byte>(frames.back()), i) == errc::ok);
    }
  }  // the destructor closes and flushes
  auto all = spin::emu::read_all_frames(path);
  REQUIRE_MESSAGE(all.ok(), (all.ok() ? "" : (all.ok() ? std::string() : all.err().message)));
  CHECK(*all == frames);
  auto missing = spin::emu::read_all_frames(dir.file("nope.pcap"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.err().code == errc::not_found);
}

}  // TEST_SUITE
