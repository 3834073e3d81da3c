// Handler packages and the loader: the package format rejects damaged files, the loader checks
// a package against the runtime, and native, eBPF-JIT and eBPF-interpreted builds of the same
// handlers give the same results. Packages are built by spinc at build time (tests/meson.build).
#include "test_util.hpp"

#include <spin/coll/mx.hpp>
#include <spin/rt/loader.hpp>
#include <spin/rt/package.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/tx.hpp>
#include <spin/std/isum.hpp>

#include "handlers/corner_layout.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

using namespace spin;
using namespace spin::test;

namespace {

std::string pkg_path(const std::string& name) { return std::string(SPIN_TEST_PKG_DIR) + "/" + name + ".spkg"; }

rt::package read_pkg(const std::string& name) {
  auto p = rt::read_package_file(pkg_path(name));
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? std::string() : p.err().message));
  return std::move(p.value());
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The three ways a package's handlers can run.
struct variant {
  const char* name;
  const char* package;
  rt::bpf_exec exec;
};
const variant variants[] = {
    {"native", "native", rt::bpf_exec::jit},
    {"ebpf-jit", "ebpf", rt::bpf_exec::jit},
    {"ebpf-interpreter", "ebpf", rt::bpf_exec::interpreter},
};

rt::loaded_package load(const std::string& name, rt::bpf_exec exec = rt::bpf_exec::jit) {
  rt::load_options o;
  o.bpf = exec;
  auto lp = rt::load_package_file(pkg_path(name), o);
  REQUIRE_MESSAGE(lp.ok(), (lp.ok() ? std::string() : lp.err().message));
  return std::move(lp.value());
}

// Assembles package bytes by the documented layout, with any manifest text (docs/handler-package.md).
std::vector<std::byte> assemble(const std::string& manifest, const std::vector<std::byte>& object) {
  const std::uint64_t m_off = 64, o_off = (m_off + manifest.size() + 15) / 16 * 16, total = o_off + object.size();
  std::vector<std::byte> b(total);
  auto put = [&](std::size_t off, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[off + i] = static_cast<std::byte>(v >> (8 * i));
  };
  std::memcpy(b.data(), "SPINPKG", 8);
  put(8, 1, 4);
  put(12, 64, 4);
  put(16, m_off, 8);
  put(24, manifest.size(), 8);
  put(32, o_off, 8);
  put(40, object.size(), 8);
  put(56, total, 8);
  std::memcpy(b.data() + m_off, manifest.data(), manifest.size());
  std::memcpy(b.data() + o_off, object.data(), object.size());
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(manifest.data()), static_cast<uInt>(manifest.size()));
  crc = crc32(crc, reinterpret_cast<const Bytef*>(object.data()), static_cast<uInt>(object.size()));
  put(48, crc, 4);
  return b;
}

std::string decode_error(std::span<const std::byte> b) {
  auto r = rt::decode_package(b);
  REQUIRE_FALSE(r.ok());
  return r.err().message;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("a package decodes to what was encoded, and encoding is deterministic") {
  rt::package p = read_pkg("isum.native");
  const auto bytes = rt::encode_package(p);
  auto back = rt::decode_package(bytes);
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? std::string() : back.err().message));
  CHECK(back->manifest == p.manifest);
  CHECK(back->object == p.object);
  CHECK(rt::encode_package(*back) == bytes);
  CHECK(p.manifest.abi_version == spin::abi_version);
  CHECK(p.manifest.handler_mem_bytes == sizeof(stdh::isum_state));
  REQUIRE(p.manifest.handlers.size() == 3);
  CHECK(p.manifest.handlers[0].name == "isum_header");
  CHECK(p.manifest.handlers[1].kind == handler_kind::payload);
}

TEST_CASE("a truncated package is rejected with a message that says so, at every length") {
  const auto bytes = rt::encode_package(read_pkg("isum.ebpf"));
  for (std::size_t len = 0; len < bytes.size(); len += (len < 80 ? 1 : 97)) {
    const std::string msg = decode_error(std::span(bytes).first(len));
    CHECK_MESSAGE(contains(msg, "truncated"), len, ": ", msg);
  }
}

TEST_CASE("a corrupted package is rejected naming the problem") {
  const auto good = rt::encode_package(read_pkg("isum.native"));
  SUBCASE("a flipped bit in the object or the manifest fails the CRC") {
    for (std::size_t at : {std::size_t{70}, good.size() / 2, good.size() - 1}) {
      auto bad = good;
      bad[at] ^= std::byte{0x10};
      CHECK(contains(decode_error(bad), "corrupted"));
    }
  }
  SUBCASE("bad magic") {
    auto bad = good;
    bad[0] = std::byte{'X'};
    CHECK(contains(decode_error(bad), "not a spinnic package"));
  }
  SUBCASE("unknown format version") {
    auto bad = good;
    bad[8] = std::byte{9};
    auto r = rt::decode_package(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_supported);
    CHECK(contains(r.err().message, "version 9"));
  }
  SUBCASE("trailing bytes") {
    auto bad = good;
    bad.push_back(std::byte{0});
    CHECK(contains(decode_error(bad), "trailing"));
  }
  SUBCASE("a manifest range outside the file") {
    auto bad = good;
    bad[24 + 6] = std::byte{1};  // manifest length += 2^48
    CHECK(contains(decode_error(bad), "outside"));
  }
}

TEST_CASE("a manifest with a missing or mistyped key is rejected naming the key") {
  const rt::package p = read_pkg("isum.native");
  const std::string good = rt::manifest_json(p.manifest);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string m = good;
    const auto at = m.find(from);
    REQUIRE(at != std::string::npos);
    m.replace(at, from.size(), to);
    return assemble(m, p.object);
  };
  CHECK(rt::decode_package(assemble(good, p.object)).ok());
  CHECK(contains(decode_error(with("\"abi_version\"", "\"abi_versio\"")), "missing key 'abi_version'"));
  CHECK(contains(decode_error(with("\"handler_mem_bytes\": " + std::to_string(p.manifest.handler_mem_bytes),
                                   "\"handler_mem_bytes\": -1")),
                 "'handler_mem_bytes' must be an integer"));
  CHECK(contains(decode_error(with("\"x86_64\"", "\"sparc\"")), "unknown target 'sparc'"));
  CHECK(contains(decode_error(with("\"kind\": \"payload\"", "\"kind\": \"header\"")), "two header handlers"));
  CHECK(contains(decode_error(with("\"sha256\"", "\"sha\"")), "missing key 'source.sha256'"));
  CHECK(contains(decode_error(assemble("{not json", p.object)), "not a JSON object"));
  // Names are identifiers, and messages never echo raw or huge names.
  CHECK(contains(decode_error(with("\"isum_payload\"", "\"isum\\u0000payload\"")), "not a C identifier"));
  const std::string huge = decode_error(with("\"isum_payload\"", "\"" + std::string(100000, 'x') + "\""));
  CHECK(contains(huge, "not a C identifier"));
  CHECK(huge.size() < 300);
  CHECK(contains(decode_error(with("\"sha256\": \"", "\"sha256\": \"zz")), "64 lowercase hex digits"));
}

TEST_CASE("the loader refuses packages this runtime cannot run, with a clear error") {
  SUBCASE("another handler ABI") {
    rt::package p = read_pkg("isum.native");
    p.manifest.abi_version = spin::abi_version + 1;
    auto r = rt::load_package(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_supported);
    CHECK(contains(r.err().message, "ABI"));
  }
  SUBCASE("a target that does not match the object") {
    rt::package p = read_pkg("isum.native");
    p.manifest.target = rt::package_target::ebpf;
    auto r = rt::load_package(p);
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.err().message, "x86-64"));
    rt::package q = read_pkg("isum.ebpf");
    q.manifest.target = rt::package_target::native_x86_64;
    auto s = rt::load_package(q);
    REQUIRE_FALSE(s.ok());
    CHECK(contains(s.err().message, "BPF"));
  }
  SUBCASE("a -march this runtime cannot check") {
    rt::package p = read_pkg("isum.native");
    p.manifest.march = "znver9";
    auto r = rt::load_package(p);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_supported);
    CHECK(contains(r.err().message, "znver9"));
  }
  for (const char* target : {"native", "ebpf"}) {
    CAPTURE(std::string(target));
    rt::package p = read_pkg(std::string("isum.") + target);
    SUBCASE("a handler the object lacks") {
      p.manifest.handlers[1].name = "isum_missing";
      auto r = rt::load_package(p);
      REQUIRE_FALSE(r.ok());
      CHECK(contains(r.err().message, "'isum_missing'"));
      CHECK(contains(r.err().message, "missing"));
    }
    SUBCASE("a handler the manifest does not list") {
      p.manifest.handlers.pop_back();
      auto r = rt::load_package(p);
      REQUIRE_FALSE(r.ok());
      CHECK_MESSAGE((contains(r.err().message, "not listed") || contains(r.err().message, "not a handler of the manifest")),
                    r.err().message);
    }
    SUBCASE("an object cut short") {
      p.object.resize(p.object.size() / 2);
      auto r = rt::load_package(p);
      REQUIRE_FALSE(r.ok());
      CHECK(!r.err().message.empty());
    }
  }
  SUBCASE("a missing file") {
    auto r = rt::load_package_file(pkg_path("does-not-exist"));
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::not_found);
  }
  SUBCASE("a path that is not a regular file is refused at once: a FIFO without writer, a device, a directory") {
    const std::string fifo = "/tmp/spin-loader-fifo-" + std::to_string(::getpid());
    ::unlink(fifo.c_str());
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/tmp")}) {
      auto r = rt::load_package_file(path);  // before the fix: blocked forever on the FIFO, or read /dev/zero without end
      REQUIRE_FALSE(r.ok());
      CHECK(r.err().code == errc::invalid_argument);
      CHECK(r.err().message.find("not a regular file") != std::string::npos);
    }
    ::unlink(fifo.c_str());
  }
}

TEST_CASE("native packages loaded side by side each run their own code") {
  // Loaded one after the other, while the first stays loaded: same handler name, different code.
  rt::loaded_package v1 = load("version1.native");
  rt::loaded_package v2 = load("version2.native");
  rt::loaded_package other = load("pingpong.native");
  CHECK(other.handlers().payload != nullptr);
  for (auto [pkg, want] : {std::pair{&v1, 1u}, std::pair{&v2, 2u}}) {
    fixture f(1);
    rt::ec_config c;
    c.name = "version";
    REQUIRE(pkg->bind(c).ok());
    const rt::ec_id ec = f.install(c);
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 1, 8, 64)));
    rt::host_event ev[2];
    REQUIRE(f.rt->poll_events(ec, ev) == 1);
    CHECK(ev[0].value == want);
  }
}

TEST_CASE("the loader refuses native objects with load-time code, undefined symbols or extra exports") {
  // Objects spinc would not build, put into packages by hand (as a hostile or stale package
  // would be): each is refused before dlopen could run or bind anything.
  for (const char* name : {"ctor", "undef", "extra"}) {
    CAPTURE(std::string(name));
    rt::package p;
    {
      std::ifstream in(std::string(SPIN_TEST_PKG_DIR) + "/raw_" + name + ".so", std::ios::binary);
      REQUIRE(in);
      std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      p.object.resize(raw.size());
      std::memcpy(p.object.data(), raw.data(), raw.size());
    }
    p.manifest.source_name = std::string(name) + ".cpp";
    p.manifest.march = "x86-64";
    rt::package_handler h;
    h.name = "raw_payload";
    h.kind = handler_kind::payload;
    p.manifest.handlers.push_back(h);
    auto r = rt::load_package(p);
    REQUIRE_FALSE(r.ok());
    const std::string& m = r.err().message;
    if (std::string(name) == "ctor") CHECK(contains(m, "load-time code"));
    if (std::string(name) == "undef") CHECK(contains(m, "undefined symbol 'puts'"));
    if (std::string(name) == "extra") CHECK(contains(m, "exports 'extra_export'"));
  }
}

TEST_CASE("bind gives an EC at least the memory the package declares") {
  rt::loaded_package lp = load("isum.native");
  rt::ec_config c;
  c.name = "isum";
  REQUIRE(lp.bind(c).ok());
  CHECK(c.handler_mem_bytes == sizeof(stdh::isum_state));
  CHECK(c.handlers.payload != nullptr);
  rt::ec_config small;
  small.handler_mem_bytes = 64;
  auto r = lp.bind(small);
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.err().message, "handler memory of 64 bytes"));
}

TEST_CASE("native, eBPF-JIT and eBPF-interpreter builds of isum give identical results") {
  constexpr std::uint32_t ranks = 3;
  // Not a multiple of the 16-element blocks nor of the packet: every tail path runs.
  constexpr std::uint64_t elements = 1000;
  constexpr std::uint32_t pkt_bytes = 1020;
  std::vector<std::vector<std::byte>> memories;
  std::vector<std::vector<std::int64_t>> results;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("isum.") + v.package, v.exec);
    fixture f(2);
    std::vector<std::byte> host(elements * sizeof(std::int64_t));
    auto region = f.rt->register_host_memory(host);
    REQUIRE(region.ok());
    const rt::ec_id ec = f.install(lp, {.name = "isum", .window = rt::host_window{*region, 0, host.size()}});
    auto mem = f.rt->handler_memory(ec);
    stdh::isum_state init{};
    init.elements = elements;
    init.expected_messages = ranks;
    std::memcpy(mem.data(), &init, offsetof(stdh::isum_state, messages));
    std::vector<rt::packet> pkts;
    for (std::uint32_t r = 0; r < ranks; ++r)
      for (auto& p : message_packets(f.pool, 0, r, 7, elements * 4, pkt_bytes)) pkts.push_back(p);
    // A contribution of the wrong length is refused by the header handler.
    for (auto& p : message_packets(f.pool, 0, 9, 8, 40, pkt_bytes)) pkts.push_back(p);
    REQUIRE(feed(*f.rt, pkts));
    const rt::ec_stats st = f.ec_stats(ec);
    CHECK(st.kinds[1].faults == 0);
    CHECK(st.kinds[1].over_budget == 0);
    rt::host_event ev[4];
    REQUIRE(f.rt->poll_events(ec, ev) == 1);
    CHECK(ev[0].value == ranks);
    stdh::isum_state out;
    std::memcpy(&out, mem.data(), sizeof out);
    CHECK(out.messages == ranks);
    CHECK(out.rejected == 1);
    CHECK(out.packets == ranks * ((elements * 4 + pkt_bytes - 1) / pkt_bytes));
    // The expected sum, from the payload pattern the test packets carry.
    std::vector<std::int64_t> want(elements, 0);
    for (std::uint32_t r = 0; r < ranks; ++r)
      for (std::uint64_t e = 0; e < elements; ++e) {
        std::byte b[4];
        for (int k = 0; k < 4; ++k) b[k] = pattern(r, 7, e * 4 + k);
        std::int32_t x;
        std::memcpy(&x, b, 4);
        want[e] += x;
      }
    std::vector<std::int64_t> got(elements);
    std::memcpy(got.data(), host.data(), host.size());
    CHECK(got == want);
    CHECK(std::memcmp(out.acc, want.data(), elements * 8) == 0);
    memories.emplace_back(mem.begin(), mem.end());
    results.push_back(got);
  }
  CHECK(memories[0] == memories[1]);
  CHECK(memories[0] == memories[2]);
}

TEST_CASE("native and eBPF builds of pingpong send back the same packets") {
  std::vector<std::vector<std::vector<std::byte>>> sent;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("pingpong.") + v.package, v.exec);
    rt::memory_transmitter tx(1, 1 << 20, 0);
    fixture f(1, &tx);
    const rt::ec_id ec = f.install(lp, {.name = "pingpong"});
    std::vector<rt::packet> pkts;
    for (std::uint32_t src = 1; src <= 3; ++src)
      for (auto& p : message_packets(f.pool, 0, src, 40 + src, 3000, 1024)) pkts.push_back(p);
    REQUIRE(feed(*f.rt, pkts));
    CHECK(f.word(ec, 0) == 9);  // echoed
    CHECK(f.word(ec, 8) == 0);  // refused
    std::vector<std::vector<std::byte>> frames;
    for (auto& fr : tx.take_frames()) {
      CHECK(fr.dest_rank >= 1);
      frames.push_back(std::move(fr.bytes));
    }
    std::sort(frames.begin(), frames.end());
    REQUIRE(frames.size() == 9);
    sent.push_back(std::move(frames));
  }
  CHECK(sent[0] == sent[1]);
  CHECK(sent[0] == sent[2]);
}

TEST_CASE("an eBPF handler's changes to a packet it has forwarded stay in its own copy, and the packet cannot go again") {
  // Mode 0: forward, change, forward in the payload handler. Mode 1: the header handler
  // forwards; the payload handler changes the packet and forwards it.
  for (const std::uint64_t mode : {0u, 1u})
    for (const variant& v : variants) {
      CAPTURE(std::string(v.name));
      CAPTURE(mode);
      rt::loaded_package lp = load(std::string("reforward.") + v.package, v.exec);
      rt::memory_transmitter tx(1, 1 << 20, 0);
      rt::runtime_config cfg;
      cfg.hpus = 1;
      cfg.tx = &tx;
      fixture f(cfg);
      const rt::ec_id ec = f.install(lp, {.name = "reforward"});
      std::memcpy(f.rt->handler_memory(ec).data(), &mode, sizeof mode);
      auto pkts = message_packets(f.pool, 0, 2, 5, 300, 1024);
      REQUIRE(pkts.size() == 1);
      const std::byte* frame = pkts[0].frame;
      const std::uint32_t frame_len = pkts[0].frame_len;
      const std::vector<std::byte> before(frame, frame + frame_len);
      REQUIRE(feed(*f.rt, pkts));
      const std::vector<std::byte> after(frame, frame + frame_len);
      rt::host_event ev[4];
      const std::size_t n = f.rt->poll_events(ec, ev);
      REQUIRE(n == (mode == 1 ? 2u : 1u));
      if (mode == 1) CHECK(ev[0].value == 8u);  // the header handler's forward went
      const std::uint64_t first = mode == 0 ? 1u : 0u;
      const auto out = tx.take_frames();
      if (std::string(v.package) == "ebpf") {
        CHECK(ev[n - 1].value == (first | 4u));  // the forward after the change failed with bad_state
        CHECK(after == before);                  // the shared frame was not written
        REQUIRE(out.size() == 1);
      } else {
        CHECK(ev[n - 1].value == (first | 2u));  // native code writes the frame itself: the rule is its own to keep
        REQUIRE(out.size() == 2);
      }
      // The first forward carried the packet as received.
      CHECK(std::equal(before.end() - 300, before.end(), out[0].bytes.end() - 300));
    }
}

TEST_CASE("packet changes an eBPF handler makes in place are sent and reach the frame, as natively") {
  std::vector<std::vector<std::vector<std::byte>>> sent;
  std::vector<std::vector<std::byte>> frames_after;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("rewrite.") + v.package, v.exec);
    rt::memory_transmitter tx(1, 1 << 20, 0);
    rt::runtime_config cfg;
    cfg.hpus = 1;
    cfg.tx = &tx;
    fixture f(cfg);
    std::vector<std::byte> host(64);
    auto region = f.rt->register_host_memory(host);
    REQUIRE(region.ok());
    f.install(lp, {.name = "rewrite", .window = rt::host_window{*region, 0, host.size()}});
    // 1000 bytes: 15 whole 64-byte blocks inside the payload, and a 4 KiB window past its end.
    auto pkts = message_packets(f.pool, 0, 2, 5, 1000, 1024);
    REQUIRE(pkts.size() == 1);
    const std::byte* frame = pkts[0].frame;
    const std::uint32_t frame_len = pkts[0].frame_len;
    std::vector<std::byte> before(frame, frame + frame_len);
    REQUIRE(feed(*f.rt, pkts));
    std::vector<std::byte> after(frame, frame + frame_len);  // the pool keeps frames alive
    CHECK(after != before);
    // The DMA saw the inverted words but not the later change of the first byte.
    const std::size_t payload_at = frame_len - 1000;
    std::vector<std::byte> want_host(after.begin() + static_cast<std::ptrdiff_t>(payload_at),
                                     after.begin() + static_cast<std::ptrdiff_t>(payload_at + 64));
    want_host[0] ^= std::byte{0x5a};
    want_host[9] ^= std::byte{0x33};
    CHECK(host == want_host);
    frames_after.push_back(after);
    std::vector<std::vector<std::byte>> out;
    for (auto& fr : tx.take_frames()) out.push_back(std::move(fr.bytes));
    REQUIRE(out.size() == 1);
    // The echo carries the payload as the frame now holds it.
    const std::size_t payload_off = frame_len - 1000;
    CHECK(std::equal(after.begin() + static_cast<std::ptrdiff_t>(payload_off), after.end(),
                     out[0].end() - 1000));
    sent.push_back(std::move(out));
  }
  CHECK(sent[0] == sent[1]);
  CHECK(sent[0] == sent[2]);
  CHECK(frames_after[0] == frames_after[1]);
  CHECK(frames_after[0] == frames_after[2]);
}

TEST_CASE("a handler's multicast sends the same frames natively, JIT-compiled and interpreted") {
  std::vector<std::vector<rt::memory_transmitter::frame>> sent;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("mcast.") + v.package, v.exec);
    rt::memory_transmitter tx(1, 1 << 20, 0);
    rt::runtime_config cfg;
    cfg.hpus = 1;
    cfg.tx = &tx;
    fixture f(cfg);
    const rt::ec_id ec = f.install(lp, {.name = "mcast"});
    const std::uint32_t dests[3] = {4, 5, 6};
    std::memcpy(f.rt->handler_memory(ec).data(), dests, sizeof dests);
    auto pkts = message_packets(f.pool, 0, 2, 5, 1000, 1024);
    REQUIRE(feed(*f.rt, pkts));
    CHECK(f.word(ec, 16) == 3);
    auto out = tx.take_frames();
    REQUIRE(out.size() == 3);
    for (std::uint32_t i = 0; i < 3; ++i) {
      rt::wire::parsed p;
      rt::wire::reject why;
      REQUIRE(rt::wire::parse(std::span<const std::byte>(out[i].bytes), rt::wire::default_udp_port, p, why));
      CHECK(out[i].dest_rank == dests[i]);
      CHECK(p.hdr.message_id == 1000 + 16 * 5 + i);
      REQUIRE(p.hdr.payload_len == 1000);
      for (std::uint32_t k = 0; k < 1000; ++k) REQUIRE(out[i].bytes[p.payload_offset + k] == pattern(2, 5, k));
    }
    sent.push_back(std::move(out));
  }
  for (std::size_t v = 1; v < sent.size(); ++v)
    for (std::size_t i = 0; i < 3; ++i) CHECK(sent[v][i].bytes == sent[0][i].bytes);
}

TEST_CASE("runtime calls from JIT-compiled handlers do not fault, whatever the handler's stack frame") {
  for (const variant& v : variants) {
    if (std::string(v.package) != "ebpf") continue;
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load("sendalign.ebpf", v.exec);
    rt::memory_transmitter tx(1, 1 << 20, 0);
    fixture f(1, &tx);
    const rt::ec_id ec = f.install(lp, {.name = "sendalign"});
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 1, 32, 64)));
    CHECK(f.ec_stats(ec).kinds[1].faults == 0);
    CHECK(f.word(ec, 56) == 0x600d);
    rt::host_event ev[8];
    REQUIRE(f.rt->poll_events(ec, ev) == 5);
    CHECK(static_cast<errc>(static_cast<std::int64_t>(ev[0].value)) == errc::invalid_argument);  // op code 0
    CHECK(static_cast<errc>(static_cast<std::int64_t>(ev[1].value)) == errc::out_of_bounds);  // data in runtime memory
    CHECK(static_cast<errc>(static_cast<std::int64_t>(ev[2].value)) == errc::out_of_bounds);  // data past handler memory
  }
}

TEST_CASE("integer corner cases agree on native, eBPF-JIT and eBPF-interpreter, and follow the API's rule") {
  // Operand pairs: zero divisors, -1 with the minimum, shifts by the width and more, values
  // with upper halves set.
  const std::uint64_t specials[] = {0, 1, 2, 31, 32, 33, 63, 64, 65, 127, 0x7fffffff, 0x80000000, 0xffffffff,
                                    0x100000000ull, 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull,
                                    ~0ull - 1, 0xdeadbeefcafef00dull, 0x00000001ffffffffull};
  std::vector<std::uint64_t> pairs;
  for (std::uint64_t a : specials)
    for (std::uint64_t b : specials) pairs.insert(pairs.end(), {a, b});
  const std::size_t n_pairs = pairs.size() / 2;
  REQUIRE(n_pairs <= corner_rows);
  std::vector<std::byte> payload(pairs.size() * 8);
  std::memcpy(payload.data(), pairs.data(), payload.size());

  std::vector<std::vector<std::uint64_t>> rows;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("corner.") + v.package, v.exec);
    fixture f(1);
    const rt::ec_id ec = f.install(lp, {.name = "corner"});
    std::vector<rt::packet> pkts;
    const std::uint32_t pkt_bytes = corner_pairs_per_packet * 16;
    const std::uint32_t count = static_cast<std::uint32_t>((payload.size() + pkt_bytes - 1) / pkt_bytes);
    for (std::uint32_t s = 0; s < count; ++s) {
      const std::size_t off = std::size_t{s} * pkt_bytes, len = std::min<std::size_t>(pkt_bytes, payload.size() - off);
      pkts.push_back(f.pool.add(data_header(0, 0, 1, s, count, payload.size(), pkt_bytes), std::span(payload).subspan(off, len)));
    }
    REQUIRE(feed(*f.rt, pkts));
    CHECK(f.ec_stats(ec).kinds[1].faults == 0);
    auto mem = f.rt->handler_memory(ec);
    std::vector<std::uint64_t> r(n_pairs * corner_results);
    std::memcpy(r.data(), mem.data(), r.size() * 8);
    rows.push_back(r);
  }
  CHECK(rows[0] == rows[1]);
  CHECK(rows[0] == rows[2]);
  // The rule, evaluated by the host compiler from the same header.
  for (std::size_t p = 0; p < n_pairs; ++p) {
    const std::uint64_t a = pairs[2 * p], b = pairs[2 * p + 1];
    const std::uint64_t* row = rows[1].data() + p * corner_results;
    CAPTURE(a);
    CAPTURE(b);
    CHECK(row[0] == (b == 0 ? 0 : a / b));
    CHECK(row[1] == (b == 0 ? a : a % b));
    CHECK(row[2] == (static_cast<std::uint32_t>(b) == 0 ? 0 : static_cast<std::uint32_t>(a) / static_cast<std::uint32_t>(b)));
    CHECK(row[8] == a << (b & 63));
    CHECK(row[9] == a >> (b & 63));
    CHECK(row[11] == static_cast<std::uint32_t>(static_cast<std::uint32_t>(a) << (b & 31)));
    CHECK(row[14] == static_cast<std::uint32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b)));
    CHECK(row[15] == static_cast<std::uint32_t>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b)));
    CHECK(row[17] == static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(a))));
    const auto sa = static_cast<std::int64_t>(a), sb = static_cast<std::int64_t>(b);
    const std::int64_t q = b == 0 ? 0 : (sa == INT64_MIN && sb == -1) ? INT64_MIN : sa / sb;
    const std::int64_t m = b == 0 ? sa : (sa == INT64_MIN && sb == -1) ? 0 : sa % sb;
    CHECK(row[4] == static_cast<std::uint64_t>(q));
    CHECK(row[5] == static_cast<std::uint64_t>(m));
    CHECK(row[20] == (a < b ? 1u : 0u));
    CHECK(row[21] == (sa < sb ? 1u : 0u));
  }
}

TEST_CASE("MX blocks decode to the same float32 bits natively, JIT-compiled and interpreted") {
  // One block per element type: random codes under a scale that is not NaN (both ends of the
  // range too), in the wire layout behind the element type's byte; the host's decode of the
  // same codes is the expectation. The eBPF build loads only because decode_of has no branch.
  std::mt19937 rng(11);
  std::vector<std::vector<std::byte>> payloads;
  std::vector<std::uint32_t> want;
  for (std::uint32_t t = 0; t < coll::mx::element_count; ++t) {
    const auto e = static_cast<coll::mx::element>(t);
    const std::uint32_t mask = (1u << coll::mx::spec_of(e).bits) - 1;
    std::uint8_t codes[coll::mx::block_elements], packed[coll::mx::block_elements] = {};
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng() & mask);
    const auto scale = static_cast<std::uint8_t>(t == 0 ? 254 : t == 1 ? 0 : 100 + rng() % 60);
    coll::mx::pack(e, codes, packed);
    std::vector<std::byte> p(34);
    p[0] = std::byte(t);
    p[1] = std::byte(scale);
    std::memcpy(p.data() + 2, packed, coll::mx::block_bytes(e) - 1);
    payloads.push_back(p);
    for (std::uint8_t c : codes) want.push_back(coll::mx::decode(e, scale, c));
  }
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("mx_decode.") + v.package, v.exec);
    fixture f(1);
    const rt::ec_id ec = f.install(lp, {.name = "mx"});
    std::vector<rt::packet> pkts;
    for (std::uint32_t t = 0; t < payloads.size(); ++t) pkts.push_back(f.pool.add(data_header(0, 0, t + 1, 0, 1, 34, 34), payloads[t]));
    REQUIRE(feed(*f.rt, pkts));
    CHECK(f.ec_stats(ec).kinds[1].faults == 0);
    std::vector<std::uint32_t> got(want.size());
    std::memcpy(got.data(), f.rt->handler_memory(ec).data(), got.size() * 4);
    CHECK(got == want);
  }
}

TEST_CASE("an eBPF handler that reads past its window is rejected at load, quoting the validator") {
  auto r = rt::load_package_file(pkg_path("bpf_window.ebpf"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::invalid_argument);
  CHECK(contains(r.err().message, "past_window"));
  CHECK(contains(r.err().message, "memory boundary violation"));
}

namespace {
// bpf_misuse's three handlers each test one thing: installs its package without the others.
rt::ec_id install_without(fixture& f, const rt::loaded_package& lp, const std::string& name,
                          std::initializer_list<handler_kind> without) {
  rt::ec_config c{.name = name};
  auto b = lp.bind(c);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? std::string() : b.err().message));
  for (handler_kind k : without) {
    rt::handler_ref& h = k == handler_kind::header    ? c.handlers.header
                         : k == handler_kind::payload ? c.handlers.payload
                                                      : c.handlers.completion;
    h = nullptr;
  }
  return f.install(c);
}
} // namespace

TEST_CASE("a handler that uses a null pointer faults, is stopped, and the runtime goes on") {
#if defined(SPIN_TSAN)
  MESSAGE("fault catching is off under ThreadSanitizer (runtime_config::catch_faults)");
#else
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("bpf_misuse.") + v.package, v.exec);
    fixture f(2);
    const rt::ec_id ec = install_without(f, lp, "misuse", {handler_kind::header, handler_kind::completion});
    std::vector<rt::packet> pkts;
    for (std::uint64_t m = 0; m < 4; ++m)
      for (auto& p : message_packets(f.pool, 0, 1, m, 64, 64)) pkts.push_back(p);
    REQUIRE(feed(*f.rt, pkts));
    const rt::ec_stats st = f.ec_stats(ec);
    CHECK(st.kinds[1].faults == 4);
    CHECK(st.messages_aborted == 4);
    rt::host_event ev[8];
    const std::size_t n = f.rt->poll_events(ec, ev);
    REQUIRE(n == 4);
    CHECK(ev[0].code == errc::fault);
  }
#endif
}

TEST_CASE("an eBPF handler cannot widen its reach by writing to its context") {
  for (const variant& v : variants) {
    if (std::string(v.package) != "ebpf") continue;
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load("bpf_misuse.ebpf", v.exec);
    fixture f(1);
    const rt::ec_id ec = install_without(f, lp, "scribble", {handler_kind::payload});
    REQUIRE(feed(*f.rt, message_packets(f.pool, 0, 1, 1, 32, 64)));
    // The handler got null for the out-of-range request and wrote 42 through a valid pointer.
    CHECK(f.word(ec, 0) == 42);
    CHECK(f.ec_stats(ec).kinds[0].faults == 0);
  }
}

TEST_CASE("atomics through the eBPF bridge match native atomics, signed values included") {
  std::vector<std::vector<std::byte>> memories;
  std::vector<std::vector<std::int64_t>> events;
  for (const variant& v : variants) {
    CAPTURE(std::string(v.name));
    rt::loaded_package lp = load(std::string("bpf_misuse.") + v.package, v.exec);
    fixture f(1);
    const rt::ec_id ec = install_without(f, lp, "atomics", {handler_kind::header, handler_kind::payload});
    std::vector<rt::packet> pkts;
    for (std::uint64_t m = 0; m < 3; ++m)
      for (auto& p : message_packets(f.pool, 0, 1, m, 16, 64)) pkts.push_back(p);
    REQUIRE(feed(*f.rt, pkts));
    CHECK(f.word(ec, 8) == 3);
    auto mem = f.rt->handler_memory(ec);
    std::int32_t low;
    std::memcpy(&low, mem.data() + 16, 4);
    CHECK(low == -3);
    rt::host_event ev[8];
    const std::size_t n = f.rt->poll_events(ec, ev);
    REQUIRE(n == 3);
    std::vector<std::int64_t> vals;
    for (std::size_t i = 0; i < n; ++i) vals.push_back(static_cast<std::int64_t>(ev[i].value));
    std::sort(vals.begin(), vals.end());
    CHECK(vals == std::vector<std::int64_t>{-3, -2, -1});
    memories.emplace_back(mem.begin(), mem.begin() + 64);
    events.push_back(vals);
  }
  CHECK(memories[0] == memories[1]);
  CHECK(memories[0] == memories[2]);
}

} // TEST_SUITE
