// Counted objects (spinc --count-instructions) and the runtime's invocation observer (virtual
// time): the counter is exact, per invocation and at each action, and the package format
// carries the counted object.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <spin/rt/loader.hpp>
#include <spin/rt/package.hpp>

#include <string>
#include <vector>

using namespace spin;

namespace {

const std::string pkg_dir = SPIN_TEST_PKG_DIR;

struct record {
  std::string what;  // "begin header", "action post_event", "end", ...
  std::uint64_t instructions = 0;
  std::uint64_t bytes = 0;
};

class recorder final : public rt::invocation_observer {
public:
  std::vector<record> log;
  void begin(std::uint32_t, rt::ec_id, handler_kind kind, std::uint32_t, std::uint64_t, std::uint32_t) noexcept override {
    log.push_back({std::string("begin ") + (kind == handler_kind::header ? "header" : kind == handler_kind::payload ? "payload" : "completion")});
  }
  void action(const rt::action_info& a) noexcept override {
    static const char* names[] = {"send", "multicast", "forward", "dma_to_host", "dma_from_host", "dma_wait", "post_event", "deposit"};
    log.push_back({std::string("action ") + names[static_cast<int>(a.kind)], a.instructions, a.bytes});
  }
  void end(std::uint64_t instructions, bool stopped) noexcept override { log.push_back({stopped ? "stopped" : "end", instructions}); }
};

// Runs one message of `len` bytes (one packet) through the counted handlers; returns the log.
std::vector<record> run_one(std::uint32_t len) {
  recorder rec;
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.observer = &rec;
  test::fixture f(cfg);
  auto lp = rt::load_package_file(pkg_dir + "/counted.native.spkg");
  REQUIRE_MESSAGE(lp.ok(), (lp.ok() ? std::string() : lp.err().message));
  std::vector<std::byte> host(64);
  auto region = f.rt->register_host_memory(host);
  REQUIRE(region.ok());
  rt::ec_config ec;
  ec.name = "counted";
  ec.match.bits = 3;
  ec.window = rt::host_window{region.value(), 0, 64};
  REQUIRE(lp.value().bind(ec).ok());
  auto id = f.rt->install(ec);
  REQUIRE_MESSAGE(id.ok(), (id.ok() ? std::string() : id.err().message));
  auto pkts = test::message_packets(f.pool, 3, 1, 1, len, len);
  REQUIRE(f.rt->rx_burst(0, pkts.data(), static_cast<std::uint32_t>(pkts.size())) == pkts.size());
  return rec.log;
}

} // namespace

TEST_SUITE("runtime") {

TEST_CASE("a counted object counts every executed instruction: a loop adds the same count per iteration") {
  const auto a = run_one(100), b = run_one(200), c = run_one(300);
  // header begin/end, payload begin, post_event, dma_to_host, end.
  REQUIRE(a.size() == 6);
  CHECK(a[0].what == "begin header");
  CHECK(a[1].what == "end");
  CHECK(a[2].what == "begin payload");
  CHECK(a[3].what == "action post_event");
  CHECK(a[4].what == "action dma_to_host");
  CHECK(a[4].bytes == 8);
  CHECK(a[5].what == "end");
  // The header handler does the same whatever the payload.
  CHECK(a[1].instructions > 0);
  CHECK(a[1].instructions == b[1].instructions);
  // The counter at each action, and the total, grow by the same amount per 100 bytes.
  const std::uint64_t per100 = b[5].instructions - a[5].instructions;
  CHECK(per100 >= 100);  // at least an instruction per byte (a load and a multiply-add, counted)
  CHECK(c[5].instructions - b[5].instructions == per100);
  CHECK(b[3].instructions - a[3].instructions == per100);
  // Counts only go up within an invocation: post_event before the DMA before the end.
  CHECK(a[3].instructions < a[4].instructions);
  CHECK(a[4].instructions <= a[5].instructions);
  // The same packet counts the same every time.
  CHECK(run_one(100)[5].instructions == a[5].instructions);
}

TEST_CASE("a runtime in virtual time refuses an EC whose handlers do not count, and takes one without handlers") {
  recorder rec;
  rt::runtime_config cfg;
  cfg.hpus = 1;
  cfg.observer = &rec;
  test::fixture f(cfg);
  auto pkg = rt::read_package_file(pkg_dir + "/counted.native.spkg");
  REQUIRE(pkg.ok());
  REQUIRE_FALSE(pkg.value().counted_object.empty());
  pkg.value().counted_object.clear();
  auto lp = rt::load_package(pkg.value());
  REQUIRE(lp.ok());
  CHECK(lp.value().handlers().counted.counter == nullptr);
  rt::ec_config ec;
  ec.name = "plain";
  REQUIRE(lp.value().bind(ec).ok());
  auto r = f.rt->install(ec);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::not_supported);
  CHECK(r.err().message.find("spinc --count-instructions") != std::string::npos);
  rt::ec_config none;
  none.name = "no handlers";
  CHECK(f.rt->install(none).ok());
}

TEST_CASE("a package's counted object survives encoding, and a damaged one is refused") {
  auto pkg = rt::read_package_file(pkg_dir + "/counted.native.spkg");
  REQUIRE(pkg.ok());
  const auto bytes = rt::encode_package(pkg.value());
  auto back = rt::decode_package(bytes);
  REQUIRE(back.ok());
  CHECK(back.value().object == pkg.value().object);
  CHECK(back.value().counted_object == pkg.value().counted_object);
  // Without a counted object the package is format 1, byte for byte as before.
  rt::package plain = pkg.value();
  plain.counted_object.clear();
  const auto pbytes = rt::encode_package(plain);
  CHECK(pbytes[8] == std::byte{1});
  CHECK(bytes[8] == std::byte{2});
  // A counted range past the end, and a flipped byte in the counted object.
  auto cut = bytes;
  cut.resize(cut.size() - 1);
  cut[56] = static_cast<std::byte>(static_cast<unsigned>(cut[56]) - 1);  // total bytes follow the cut
  CHECK_FALSE(rt::decode_package(cut).ok());
  auto flipped = bytes;
  flipped.back() ^= std::byte{1};
  auto f = rt::decode_package(flipped);
  REQUIRE_FALSE(f.ok());
  CHECK(f.err().message.find("CRC") != std::string::npos);
  // A counted object whose counter is not exported is refused by the loader.
  rt::package swapped = pkg.value();
  swapped.counted_object = swapped.object;  // the plain object: no counter
  auto lp = rt::load_package(swapped);
  REQUIRE_FALSE(lp.ok());
  CHECK(lp.err().message.find(rt::instruction_counter_symbol) != std::string::npos);
}

} // TEST_SUITE
