// The NIC on DPDK's net_pcap driver: frames read from a capture file by the PMD reach handlers,
// and frames the NIC sends land in the PMD's output capture. The vdev is created at run time,
// after the input capture was written.
#include <doctest/doctest.h>

#include <spin/emu/nic.hpp>
#include <spin/emu/pcap.hpp>
#include <spin/emu/port.hpp>
#include <spin/rt/wire.hpp>

#include <rte_bus_vdev.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace spin;
using namespace std::chrono_literals;

TEST_SUITE("emulator") {

TEST_CASE("net_pcap: a capture file is received as a message into host memory, and sends are written to the output capture") {
  const std::string dir = "/tmp/spin-pcap-" + std::to_string(getpid());
  REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
  // Input: one 8-packet message from rank 3 to rank 1, 1000 bytes per packet.
  const std::uint32_t pkts = 8, per = 1000;
  std::vector<std::byte> data(pkts * per);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + 3);
  {
    auto w = emu::pcap_writer::open(dir + "/in.pcap");
    REQUIRE(w.ok());
    for (std::uint32_t s = 0; s < pkts; ++s) {
      rt::wire::header h;
      h.source_rank = 3;
      h.match_bits = 0xab;
      h.message_id = 77;
      h.seq = s;
      h.message_len = data.size();
      h.offset = std::uint64_t{s} * per;
      h.flags = rt::wire::position_flags(s, pkts);
      std::vector<std::byte> f(2048);
      const std::size_t n = rt::wire::encode(rt::wire::rank_endpoint(3), rt::wire::rank_endpoint(1), h,
                                             std::span<const std::byte>(data).subspan(s * per, per), f);
      REQUIRE(n > 0);
      f.resize(n);
      REQUIRE(w->write(f, 1000 + s) == errc::ok);
    }
    REQUIRE(w->close().ok());
  }
  const std::string args = "rx_pcap=" + dir + "/in.pcap,tx_pcap=" + dir + "/out.pcap";
  REQUIRE(rte_vdev_init("net_pcap0", args.c_str()) == 0);
  auto id = emu::find_port("net_pcap0");
  REQUIRE(id.ok());
  std::vector<std::byte> host(data.size()), out(3000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(i);
  {
    emu::nic_config c;
    c.name = "pcap";
    c.rank = 1;
    c.ports = {*id};
    c.port.max_frame_bytes = 2048;
    c.port.pool_mbufs = 1023;
    c.runtime.nic_memory_bytes = 8 << 20;
    auto n = emu::nic::create(c);
    REQUIRE_MESSAGE(n.ok(), (n.ok() ? std::string() : n.err().message));
    emu::nic& nic = **n;
    auto r = nic.register_host_memory(host);
    auto ro = nic.register_host_memory(out);
    REQUIRE(r.ok());
    REQUIRE(ro.ok());
    rt::ec_config ec{.name = "land", .match = {0xab, 0}, .window = rt::host_window{*r, 0, host.size()}};
    REQUIRE(nic.install(ec).ok());
    std::atomic<bool> stop{false};
    std::thread t([&] { nic.run(stop); });
    REQUIRE(nic.send(host::message{3, 0xcd, 5, *ro, 0, out.size()}, 2000ms).ok());
    std::this_thread::sleep_for(50ms);
    stop = true;
    t.join();
    REQUIRE(nic.quiesce(2000ms));
    const auto s = nic.stats();
    CHECK(s.ports[0].rx_packets == pkts);
    CHECK(s.runtime.ecs.at(0).deposit_bytes == data.size());
    CHECK(s.ports[0].tx_packets == 3);
    CHECK(s.mbufs_in_use == 0);
    nic.stop();
  }
  CHECK(host == data);
  REQUIRE(rte_vdev_uninit("net_pcap0") == 0);  // closes the output capture
  auto frames = emu::read_all_frames(dir + "/out.pcap");
  REQUIRE_MESSAGE(frames.ok(), (frames.ok() ? std::string() : frames.err().message));
  REQUIRE(frames->size() == 3);
  std::vector<std::byte> got;
  for (const auto& f : *frames) {
    rt::wire::parsed p;
    rt::wire::reject why;
    REQUIRE(rt::wire::parse(f, rt::wire::default_udp_port, p, why));
    CHECK(p.hdr.source_rank == 1);
    CHECK(p.hdr.match_bits == 0xcd);
    got.insert(got.end(), f.begin() + p.payload_offset, f.begin() + p.payload_offset + p.hdr.payload_len);
  }
  CHECK(got == out);
  CHECK(std::system(("rm -rf " + dir).c_str()) == 0);
}

}  // TEST_SUITE
