// A NIC's statistics cross the control socket as typed values: every counter survives the JSON
// of the "stats" reply, a reply that lacks a counter is refused by name, and the text tables
// show what a user looks for.
#include <spin/host/protocol.hpp>
#include <spin/host/stats.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace spin;
namespace proto = spin::host::protocol;

namespace {

// Every counter a distinct value, so that a key read into the wrong field shows.
host::nic_stats sample() {
  host::nic_stats s;
  s.name = "sw";
  s.rank = 9;
  host::nic_port_stats p;
  p.name = "net_ring0";
  p.rx_packets = 11;
  p.rx_bytes = 12;
  p.tx_packets = 13;
  p.tx_bytes = 14;
  p.forwarded = 15;
  p.hw = {16, 17, 18, 19, 20, 21, 22, 23};
  s.ports.push_back(p);
  for (std::size_t i = 0; i < host::nic_drop_count; ++i) s.drops[i] = 100 + i;
  s.host_messages_sent = 31;
  s.host_packets_sent = 32;
  s.host_bytes_sent = 33;
  s.loopback_packets = 34;
  s.multicast_shared = 35;
  s.forward_in_place = 36;
  s.forward_chained = 37;
  s.unshared = 38;
  s.mbufs_in_use = 39;
  s.capture_frames = 40;
  s.capture_errors = 41;
  s.mgmt_received = 42;
  s.mgmt_sent = 43;
  auto& r = s.runtime;
  r.frames_accepted = 51;
  for (std::size_t i = 0; i < rt::wire::reject_count; ++i) r.frames_rejected[i] = 200 + i;
  r.unknown_ec = 52;
  r.nic_mem_capacity_bytes = 53;
  r.nic_mem_used_bytes = 54;
  r.nic_mem_peak_bytes = 55;
  r.watchdog_wakeups = 56;
  r.hpus.push_back({1, 61, 62, 63, 64, 65});
  rt::ec_stats e;
  e.ec_id = 7;
  e.name = "coll";
  e.packets_in = 71;
  e.bytes_in = 72;
  e.packets_skipped = 73;
  e.messages_started = 74;
  e.messages_completed = 75;
  e.messages_dropped = 76;
  e.messages_aborted = 77;
  for (std::size_t i = 0; i < rt::drop_reason_count; ++i) e.drops[i] = 300 + i;
  e.dma_to_host_bytes = 78;
  e.dma_from_host_bytes = 79;
  e.dma_ops = 80;
  e.deposit_bytes = 81;
  e.sends = 82;
  e.send_bytes = 83;
  e.send_failed = 84;
  e.events_posted = 85;
  e.events_lost = 86;
  e.api_errors = 87;
  e.handler_mem_bytes = 88;
  e.nic_mem_bytes = 89;
  for (std::uint64_t k = 0; k < 3; ++k) e.kinds[k] = {400 + k, 410 + k, 420 + k, 430 + k, {440 + k, 450.5 + k, 460 + k, 470 + k, 480 + k}};
  r.ecs.push_back(e);
  return s;
}

} // namespace

TEST_SUITE("host") {

TEST_CASE("every NIC counter survives the stats reply's JSON") {
  const host::nic_stats s = sample();
  bool other = true;
  auto d = proto::decode_reply<proto::stats_reply>(proto::encode_reply(8, proto::stats_reply{{{3, s}}}), 8, other);
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : (d.ok() ? std::string() : d.err().message)));
  CHECK_FALSE(other);
  REQUIRE(d->nodes.size() == 1);
  CHECK(d->nodes[0].node == 3);
  // The JSON of what came back equals the JSON of what went, key for key.
  CHECK(host::to_json(d->nodes[0].stats) == host::to_json(s));
  const auto& b = d->nodes[0].stats;
  CHECK(b.ports.at(0).hw.oerrors == 23);
  CHECK(b.drops[host::nic_drop_count - 1] == 100 + host::nic_drop_count - 1);
  CHECK(b.runtime.hpus.at(0).steered == 65);
  CHECK(b.runtime.ecs.at(0).kinds[2].time.mean_ns == 452.5);
  CHECK(b.runtime.ecs.at(0).drops[rt::drop_reason_count - 1] == 300 + rt::drop_reason_count - 1);
  CHECK(b.runtime.frames_rejected[rt::wire::reject_count - 1] == 200 + rt::wire::reject_count - 1);
  CHECK(b.total_drops() == s.total_drops());
}

TEST_CASE("statistics without a counter are refused, naming the missing key") {
  std::string json = host::to_json(sample());
  const std::string key = "\"forward_chained\":37,";
  REQUIRE(json.find(key) != std::string::npos);
  json.erase(json.find(key), key.size());
  auto r = host::nic_stats_from_json(json);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::invalid_argument);
  CHECK(r.err().message.find("forward_chained") != std::string::npos);
  CHECK(host::nic_stats_from_json("{not json").err().code == errc::invalid_argument);
  // The same inside a reply: the client gets an error, not zeros.
  bool other = false;
  const std::string line = R"({"id":8,"ok":true,"stats":[{"node":0,"name":"sw","rank":9,"stats":)" + json + "}]}";
  auto d = proto::decode_reply<proto::stats_reply>(line, 8, other);
  REQUIRE_FALSE(d.ok());
  CHECK(d.err().code == errc::bad_state);
  CHECK(d.err().message.find("forward_chained") != std::string::npos);
}

TEST_CASE("the text shows the ports as a table, drops by reason and a row per handler kind") {
  const std::string t = host::to_text(sample());
  INFO(t);
  CHECK(t.find("nic sw (rank 9)\n") == 0);
  CHECK(t.find("  port       rx packets  rx bytes  tx packets  tx bytes  forwarded  imissed  rx_nombuf  ierrors  oerrors\n") !=
        std::string::npos);
  CHECK(t.find("  net_ring0          11        12          13        14         15       20         21       22       23\n") !=
        std::string::npos);
  CHECK(t.find("  drops: no_mbuf 100, oversize 101,") != std::string::npos);
  CHECK(t.find("  EC  name  packets  bytes in  started  completed  dropped  aborted  drops\n") != std::string::npos);
  CHECK(t.find("   7  coll       71        72       74         75       76       77   4291\n") != std::string::npos);
  CHECK(t.find("   7  payload       401    411    451.5     461     471     481          421     431\n") != std::string::npos);
  CHECK(t.find("drop unauthenticated ") != std::string::npos);
}

} // TEST_SUITE
