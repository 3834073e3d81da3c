// The NIC on net_null ports (EAL vdevs net_null0 and net_null1, built into this binary): set-up
// checks, a port that generates frames without pause, and transmit to a sink.
#include <doctest/doctest.h>

#include <spin/emu/nic.hpp>
#include <spin/emu/port.hpp>

#include <rte_mbuf.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using namespace spin;
using namespace std::chrono_literals;

TEST_SUITE("emulator") {

TEST_CASE("a port that cannot scatter refuses frames larger than its mbufs with a clear message instead of truncating") {
  auto id = emu::find_port("net_null0");
  REQUIRE(id.ok());
  emu::port_options o;
  o.max_frame_bytes = 9216;
  o.mbuf_data_bytes = 2048;
  o.pool_mbufs = 255;
  auto p = emu::port::open(*id, o, "null0");
  REQUIRE_FALSE(p.ok());
  CHECK(p.err().code == errc::invalid_argument);
  CHECK(p.err().message.find("cannot scatter") != std::string::npos);
  CHECK(p.err().message.find("9216") != std::string::npos);
  CHECK(p.err().message.find("2048") != std::string::npos);
  // The NIC passes the error on.
  emu::nic_config c;
  c.ports = {*id};
  c.port = o;
  auto n = emu::nic::create(c);
  REQUIRE_FALSE(n.ok());
  CHECK(n.err().message.find("cannot scatter") != std::string::npos);
}

TEST_CASE("unknown port names and bad NIC settings are refused with messages") {
  CHECK(emu::find_port("net_nothing9").err().code == errc::not_found);
  auto id = emu::find_port("net_null0");
  REQUIRE(id.ok());
  emu::nic_config c;
  c.port.max_frame_bytes = 2048;
  c.port.pool_mbufs = 255;
  auto none = emu::nic::create(c);
  CHECK(none.err().message.find("no port") != std::string::npos);
  c.ports = {*id};
  c.payload_bytes = 4000;
  auto big = emu::nic::create(c);
  CHECK(big.err().message.find("does not fit") != std::string::npos);
  c.payload_bytes = 1024;
  c.tx_ring_packets = 1000;
  CHECK(emu::nic::create(c).err().message.find("power of two") != std::string::npos);
}

TEST_CASE("frames from a port that never pauses are all counted, and every mbuf returns when the NIC is quiet") {
  auto id0 = emu::find_port("net_null0");
  auto id1 = emu::find_port("net_null1");
  REQUIRE(id0.ok());
  REQUIRE(id1.ok());
  emu::nic_config c;
  c.name = "null";
  c.rank = 1;
  c.ports = {*id0, *id1};
  c.routes = {1};  // rank 0's messages go out of port 1
  c.port.max_frame_bytes = 2048;
  c.port.pool_mbufs = 1023;
  c.runtime.nic_memory_bytes = 8 << 20;
  auto n = emu::nic::create(c);
  REQUIRE_MESSAGE(n.ok(), (n.ok() ? std::string() : n.err().message));
  emu::nic& nic = **n;
  // net_null hands out 64-byte frames without writing them: their bytes are whatever the mbuf
  // held before (zeros, or the start of a frame this NIC sent). 64 bytes never hold a spin
  // packet (88 at least), so the parser rejects each one, for one reason or another.
  for (int i = 0; i < 200; ++i) nic.poll();
  std::vector<std::byte> msg(10 * 1024);
  auto r = nic.register_host_memory(msg);
  REQUIRE(r.ok());
  std::atomic<bool> stop{false};
  std::thread t([&] { nic.run(stop); });
  REQUIRE(nic.send(host::message{0, 1, 1, *r, 0, msg.size()}, 2000ms).ok());
  stop = true;
  t.join();
  REQUIRE(nic.quiesce(2000ms));
  const auto s = nic.stats();
  std::uint64_t rx = 0;
  for (const auto& p : s.ports) rx += p.rx_packets;
  CHECK(rx > 0);
  // A stale frame that still starts with the Ethernet header of a frame this NIC sent to rank 0
  // is transit traffic for rank 0: on port 0 it goes out of port 1 again; on port 1, the port
  // towards rank 0 it came in on, it is unroutable (frames to rank 0 are built in port 1's pool,
  // so net_null port 1 hands out such stale frames). Every other frame is rejected.
  std::uint64_t forwarded = 0;
  for (const auto& p : s.ports) forwarded += p.forwarded;
  std::uint64_t rejected = 0;
  for (auto v : s.runtime.frames_rejected) rejected += v;
  const std::uint64_t unroutable = s.drops[static_cast<std::size_t>(emu::nic_drop::unroutable)];
  CHECK(s.drops[static_cast<std::size_t>(emu::nic_drop::malformed)] == rejected);
  CHECK(rejected + forwarded + unroutable == rx);
  CHECK(s.runtime.frames_accepted == 0);
  CHECK(s.ports[1].tx_packets == 10 + forwarded);
  CHECK(s.ports[0].tx_packets == 0);
  CHECK(s.host_packets_sent == 10);
  CHECK(s.mbufs_in_use == 0);
}

}  // TEST_SUITE
