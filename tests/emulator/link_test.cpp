// The link model without DPDK: serialisation, latency, random effects, reproducibility, validation.
#include <doctest/doctest.h>

#include <spin/emu/link.hpp>

#include <cmath>
#include <limits>
#include <vector>

using namespace spin::emu;
using namespace std::chrono_literals;

namespace {

link_model model(double rate_gbps, std::chrono::nanoseconds latency) {
  link_model m;
  m.rate_gbps = rate_gbps;
  m.latency = latency;
  return m;
}

// |count - n p| <= 5 sigma of a binomial(n, p).
void check_fraction(std::uint64_t count, std::uint64_t n, double p) {
  const double mean = static_cast<double>(n) * p;
  const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
  INFO("count " << count << " of " << n << ", p = " << p);
  CHECK(std::fabs(static_cast<double>(count) - mean) <= 5 * sigma);
}

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("the random generator is xoshiro256** seeded by splitmix64, identical to the reference") {
  // Reference values computed with an independent implementation of both algorithms.
  prng r1(1);
  CHECK(r1.next() == 0xb3f2af6d0fc710c5ull);
  CHECK(r1.next() == 0x853b559647364ceaull);
  CHECK(r1.next() == 0x92f89756082a4514ull);
  prng r0(0);
  CHECK(r0.next() == 0x99ec5f36cb75f2b4ull);
  CHECK(r0.next() == 0xbf6e1f784956452aull);
  prng u(42);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.next_unit();
    CHECK(x >= 0.0);
    CHECK(x < 1.0);
  }
}

TEST_CASE("a 1500-byte frame at 10 Gbit/s takes 1200 ns and back-to-back frames queue behind it") {
  link_sim s(model(10, 0ns));
  CHECK(s.serialisation_ns(1500) == 1200);
  CHECK(s.on_packet(1500, 0).deliver_ns == 1200);
  CHECK(s.on_packet(1500, 0).deliver_ns == 2400);   // waits for the first
  CHECK(s.on_packet(1500, 1000).deliver_ns == 3600);  // still busy at 1000
  CHECK(s.busy_until_ns() == 3600);
  CHECK(s.on_packet(1500, 10000).deliver_ns == 11200);  // wire idle again
  CHECK(s.on_packet(64, 11200).deliver_ns == 11200 + 52);  // 512 bit / 10 = 51.2 -> 52
  CHECK(s.packets() == 5);
}

TEST_CASE("serialisation times are rounded up to whole nanoseconds") {
  link_sim s100(model(100, 0ns));
  CHECK(s100.serialisation_ns(64) == 6);  // 5.12 ns
  CHECK(s100.serialisation_ns(1500) == 120);
  link_sim s25(model(25, 0ns));
  CHECK(s25.serialisation_ns(9000) == 2880);
  link_sim s3(model(3, 0ns));
  CHECK(s3.serialisation_ns(1) == 3);  // 2.67 ns
  link_sim slow(model(1e-6, 0ns));  // 1 kbit/s
  CHECK(slow.serialisation_ns(1) == 8'000'000);
}

TEST_CASE("latency is added after serialisation") {
  link_sim s(model(10, 1000ns));
  CHECK(s.on_packet(1500, 500).deliver_ns == 500 + 1200 + 1000);
  CHECK(s.on_packet(1500, 500).deliver_ns == 500 + 2400 + 1000);
}

TEST_CASE("an unlimited link delivers every packet after the latency alone") {
  link_sim s(model(0, 700ns));
  for (int i = 0; i < 10; ++i) {
    const fate f = s.on_packet(9000, 100);
    CHECK(f.deliver_ns == 800);
    CHECK_FALSE(f.drop);
  }
  CHECK(s.serialisation_ns(9000) == 0);
  CHECK(s.busy_until_ns() == 100);
}

TEST_CASE("the default reorder delay is latency plus four 1500-byte serialisation times, at least 10 us") {
  CHECK(effective_reorder_delay(model(10, 1000ns)) == 10000ns);  // 1000 + 4 * 1200 < 10 us
  CHECK(effective_reorder_delay(model(1, 10000ns)) == 58000ns);  // 10000 + 4 * 12000
  CHECK(effective_reorder_delay(model(0, 0ns)) == 10000ns);
  link_model m = model(1, 10000ns);
  m.reorder_delay = 3us;
  CHECK(effective_reorder_delay(m) == 3000ns);
}

TEST_CASE("a reordered packet arrives reorder_delay later than it would have") {
  link_model m = model(0, 100ns);
  m.reorder = 0.5;
  m.reorder_delay = 7000ns;
  link_sim s(m);
  int reordered = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    const fate f = s.on_packet(100, i * 10);
    CHECK(f.deliver_ns == i * 10 + 100 + (f.reordered ? 7000 : 0));
    reordered += f.reordered;
  }
  CHECK(reordered > 0);
  CHECK(reordered < 1000);
}

TEST_CASE("a duplicate arrives one serialisation time after its original and occupies the wire") {
  link_model m = model(10, 1000ns);
  m.duplicate = 0.5;
  link_sim s(m);
  std::uint64_t busy = 0;
  int dups = 0;
  for (int i = 0; i < 200; ++i) {
    const fate f = s.on_packet(1500, 0);
    busy += 1200;
    CHECK(f.deliver_ns == busy + 1000);
    if (f.duplicate) {
      ++dups;
      CHECK(f.duplicate_deliver_ns == f.deliver_ns + 1200);
      busy += 1200;
    }
    CHECK(s.busy_until_ns() == busy);
  }
  CHECK(dups > 0);
  CHECK(dups < 200);
}

TEST_CASE("a lost packet occupies the wire and has no duplicate") {
  link_model m = model(10, 0ns);
  m.loss = 0.5;
  m.duplicate = 0.9;
  link_sim s(m);
  int lost = 0;
  for (int i = 0; i < 100; ++i) {
    const fate f = s.on_packet(1500, 0);
    if (f.drop) {
      ++lost;
      CHECK_FALSE(f.duplicate);
      CHECK_FALSE(f.reordered);
    }
  }
  CHECK(lost > 0);
  CHECK(s.busy_until_ns() >= 100u * 1200u);
}

TEST_CASE("the same seed gives the same fates over 100000 packets, another seed other fates") {
  link_model m = model(40, 2000ns);
  m.loss = 0.01;
  m.duplicate = 0.02;
  m.reorder = 0.03;
  m.seed = 12345;
  link_model other = m;
  other.seed = 12346;
  link_sim a(m), b(m), c(other);
  std::uint64_t differ = 0;
  for (std::uint32_t i = 0; i < 100000; ++i) {
    const std::uint32_t len = 64 + (i * 37) % 1437;
    const std::uint64_t now = std::uint64_t{i} * 150;
    const fate fa = a.on_packet(len, now);
    const fate fb = b.on_packet(len, now);
    const fate fc = c.on_packet(len, now);
    REQUIRE(fa == fb);
    differ += !(fa == fc);
  }
  CHECK(differ > 1000);
}

TEST_CASE("the fate of packet k does not depend on the random outcomes of earlier packets") {
  // Drawing a fixed count per packet: the loss decisions with loss 0.3 and with loss 0.3 plus
  // duplicates and reordering are the same packet by packet.
  link_model m = model(0, 0ns);
  m.loss = 0.3;
  link_model m2 = m;
  m2.duplicate = 0.4;
  m2.reorder = 0.2;
  link_sim a(m), b(m2);
  for (int i = 0; i < 10000; ++i) REQUIRE(a.on_packet(100, 0).drop == b.on_packet(100, 0).drop);
}

TEST_CASE("loss, duplicate and reorder fractions lie within 5 sigma of their probabilities") {
  link_model m = model(0, 1000ns);
  m.loss = 0.1;
  m.duplicate = 0.05;
  m.reorder = 0.2;
  m.seed = 99;
  link_sim s(m);
  constexpr std::uint64_t n = 100000;
  std::uint64_t lost = 0, dups = 0, reordered = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const fate f = s.on_packet(1000, i);
    lost += f.drop;
    dups += f.duplicate;
    reordered += f.reordered;
  }
  check_fraction(lost, n, 0.1);
  // Duplicates and reordering apply to packets that are not lost.
  check_fraction(dups, n - lost, 0.05);
  check_fraction(reordered, n - lost, 0.2);
}

TEST_CASE("zero probabilities give no random effects") {
  link_model m = model(10, 300ns);
  m.seed = 7;
  link_sim s(m);
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const fate f = s.on_packet(1500, i * 1200);
    REQUIRE_FALSE(f.drop);
    REQUIRE_FALSE(f.duplicate);
    REQUIRE_FALSE(f.reordered);
    REQUIRE(f.deliver_ns == i * 1200 + 1200 + 300);
  }
}

TEST_CASE("validate accepts the default model and names each bad field") {
  CHECK(validate(link_model{}).ok());
  link_model good;
  good.rate_gbps = 400;
  good.latency = 1s;
  good.reorder_delay = 1s;
  good.loss = 0.999;
  good.queue_packets = 1u << 20;
  CHECK(validate(good).ok());

  auto bad = [](auto change, const char* expected) {
    link_model m;
    change(m);
    const auto r = validate(m);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == spin::errc::invalid_argument);
    INFO(r.err().message);
    CHECK(r.err().message.find(expected) != std::string::npos);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  bad([&](link_model& m) { m.rate_gbps = nan; }, "rate_gbps must be 0 (unlimited) or positive, got nan");
  bad([](link_model& m) { m.rate_gbps = -1; }, "rate_gbps must be 0 (unlimited) or positive, got -1");
  bad([](link_model& m) { m.rate_gbps = 1e-7; }, "rate_gbps must be 0 (unlimited) or in [1e-6, 10000] Gbit/s, got 9.99");
  bad([](link_model& m) { m.rate_gbps = 20000; }, "rate_gbps must be 0 (unlimited) or in [1e-6, 10000] Gbit/s, got 20000");
  bad([&](link_model& m) { m.loss = nan; }, "loss is a probability and must be in [0, 1), got nan");
  bad([](link_model& m) { m.loss = 1; }, "loss is a probability and must be in [0, 1), got 1");
  bad([](link_model& m) { m.loss = -0.1; }, "loss is a probability and must be in [0, 1), got -0.1");
  bad([](link_model& m) { m.duplicate = 1.5; }, "duplicate is a probability and must be in [0, 1), got 1.5");
  bad([&](link_model& m) { m.reorder = nan; }, "reorder is a probability and must be in [0, 1), got nan");
  bad([](link_model& m) { m.latency = -1ns; }, "latency_ns must be in [0, 1000000000] ns, got -1");
  bad([](link_model& m) { m.latency = 1s + 1ns; }, "latency_ns must be in [0, 1000000000] ns, got 1000000001");
  bad([](link_model& m) { m.reorder_delay = 2s; }, "reorder_delay_ns must be in [0, 1000000000] ns, got 2000000000");
  bad([](link_model& m) { m.queue_packets = 0; }, "queue_packets must be in [1, 1048576], got 0");
  bad([](link_model& m) { m.queue_packets = (1u << 20) + 1; }, "queue_packets must be in [1, 1048576], got 1048577");
}

}  // TEST_SUITE
