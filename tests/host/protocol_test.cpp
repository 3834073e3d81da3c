// The control protocol's one encoding: every request and reply survives a round trip, the
// validation refuses what the reference (spin/emu/control.hpp) refuses, and replies to other
// requests are recognised.
#include <spin/host/protocol.hpp>

#include <doctest/doctest.h>

#include <array>

#include <string>

using namespace spin;
namespace proto = spin::host::protocol;

namespace {

proto::request round_trip(const proto::request& r, std::uint64_t id = 7) {
  std::optional<std::uint64_t> seen;
  auto d = proto::decode_request(proto::encode_request(id, r), seen);
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : (d.ok() ? std::string() : d.err().message)));
  CHECK(d->id == id);
  CHECK(seen == id);
  CHECK(std::string(proto::op_name(d->req)) == proto::op_name(r));
  return d->req;
}

error refused(const std::string& line) {
  std::optional<std::uint64_t> id;
  auto d = proto::decode_request(line, id);
  REQUIRE_FALSE(d.ok());
  return d.err();
}

} // namespace

TEST_SUITE("host") {

TEST_CASE("every request decodes to the value that was encoded") {
  proto::install in;
  in.node = 3;
  in.package = "/tmp/x.spkg";
  in.name = "ec one";
  in.match = {0xabcdef0123456789ull, 0xffull};
  in.handler_mem_bytes = 4096;
  in.window = rt::host_window{5, 64, 1 << 20};
  in.limits.max_messages = 9;
  in.limits.retired_history = 10;
  in.limits.window_packets = 11;
  in.limits.max_parked_packets = 12;
  in.limits.handler_budget = std::chrono::nanoseconds(13);
  in.limits.event_queue_depth = 14;
  in.limits.read_only_multicast = true;
  in.scratchpad = rt::scratchpad_init::undefined;
  in.bpf = rt::bpf_exec::interpreter;
  in.persist = true;
  for (std::size_t i = 0; i < 16; ++i) in.frame_key[i] = static_cast<std::uint8_t>(0xf0 - 7 * i);
  const auto out = std::get<proto::install>(round_trip(in));
  CHECK(out.frame_key == in.frame_key);
  CHECK(out.node == 3);
  CHECK(out.package == in.package);
  CHECK(out.name == in.name);
  CHECK(out.match.bits == in.match.bits);
  CHECK(out.match.ignore_mask == in.match.ignore_mask);
  CHECK(out.handler_mem_bytes == 4096);
  CHECK(out.scratchpad_bytes == 0);
  REQUIRE(out.window.has_value());
  CHECK(out.window->region == 5);
  CHECK(out.window->offset_bytes == 64);
  CHECK(out.window->len_bytes == (1u << 20));
  CHECK(out.limits.max_messages == 9);
  CHECK(out.limits.retired_history == 10);
  CHECK(out.limits.window_packets == 11);
  CHECK(out.limits.max_parked_packets == 12);
  CHECK(out.limits.handler_budget == std::chrono::nanoseconds(13));
  CHECK(out.limits.event_queue_depth == 14);
  CHECK(out.limits.read_only_multicast);
  CHECK(out.scratchpad == rt::scratchpad_init::undefined);
  CHECK(out.bpf == rt::bpf_exec::interpreter);
  CHECK(out.persist);

  const auto s = std::get<proto::send>(round_trip(proto::send{1, {2, ~0ull, 4, 5, 6, 7}, std::chrono::milliseconds(600000)}));
  CHECK(s.node == 1);
  CHECK(s.msg.dest_rank == 2);
  CHECK(s.msg.match_bits == ~0ull);
  CHECK(s.msg.message_id == 4);
  CHECK(s.msg.region == 5);
  CHECK(s.msg.offset_bytes == 6);
  CHECK(s.msg.len_bytes == 7);
  CHECK(s.timeout == std::chrono::milliseconds(600000));

  const auto reg = std::get<proto::register_memory>(round_trip(proto::register_memory{2, 1u << 30}));
  CHECK(reg.node == 2);
  CHECK(reg.bytes == (1u << 30));
  CHECK(proto::fds_of(reg) == 1);
  const auto unr = std::get<proto::unregister_memory>(round_trip(proto::unregister_memory{2, 9}));
  CHECK(unr.region == 9);
  const auto un = std::get<proto::uninstall>(round_trip(proto::uninstall{1, 8}));
  CHECK(un.ec == 8);
  const auto ev = std::get<proto::open_events>(round_trip(proto::open_events{1, 8, 4096}));
  CHECK(ev.capacity == 4096);
  CHECK(proto::fds_of(ev) == 0);
  CHECK(std::get<proto::close_events>(round_trip(proto::close_events{1, 8})).ec == 8);
  for (proto::request r : {proto::request(proto::hello{}), proto::request(proto::nodes{}), proto::request(proto::stats{}),
                           proto::request(proto::stop{})})
    CHECK(round_trip(r).index() == r.index());
}

TEST_CASE("the group registry's requests and replies survive a round trip") {
  const auto pool = std::get<proto::pool>(round_trip(proto::pool{2, host::slot_pool{32, 1024}}));
  CHECK(pool.node == 2);
  REQUIRE(pool.set.has_value());
  CHECK(*pool.set == host::slot_pool{32, 1024});
  CHECK_FALSE(std::get<proto::pool>(round_trip(proto::pool{2, std::nullopt})).set.has_value());
  const auto j = std::get<proto::join>(round_trip(proto::join{1, host::group_join{16, {4, 5, 4000000000u}, 64}, 2}));
  CHECK(j.node == 1);
  CHECK(j.group.group == 16);
  CHECK(j.group.members == std::vector<std::uint32_t>{4, 5, 4000000000u});
  CHECK(j.group.slots == 64);
  CHECK(j.me == 2);
  const auto d = std::get<proto::decide>(round_trip(proto::decide{1, host::group_decision{16, false, {9, 10}, "s0 is full\n"}}));
  CHECK(d.decision.group == 16);
  CHECK_FALSE(d.decision.granted);
  CHECK(d.decision.lease == std::vector<std::uint32_t>{9, 10});
  CHECK(d.decision.reason == "s0 is full\n");
  const auto l = std::get<proto::leave>(round_trip(proto::leave{3, 48, 1}));
  CHECK(l.node == 3);
  CHECK(l.group == 48);
  CHECK(l.me == 1);
  CHECK(l.via == host::group_join::own_registry);
  CHECK(j.group.via == host::group_join::own_registry);
  CHECK(j.group.packet_bytes == 0);
  CHECK(j.group.frame_key == std::array<std::uint8_t, 16>{});
  host::group_join kj{16, {4}, 64, 77};
  kj.frame_key = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
  CHECK(std::get<proto::join>(round_trip(proto::join{1, kj, 0})).group.frame_key == kj.frame_key);
  CHECK(d.decision.via == host::group_join::own_registry);
  // In-band (via a switch's rank), with the packets' size for the switch to check.
  host::group_join ij{16, {4, 5}, 64, 77};
  ij.packet_bytes = 1024;
  ij.via = 65535;
  const auto vj = std::get<proto::join>(round_trip(proto::join{1, ij, 0}));
  CHECK(vj.group.via == 65535);
  CHECK(vj.group.packet_bytes == 1024);
  CHECK(vj.group.proof == 77);
  host::group_decision id{16, false, {}, "gave up"};
  id.via = 0;
  CHECK(std::get<proto::decide>(round_trip(proto::decide{1, id})).decision.via == 0);
  CHECK(std::get<proto::leave>(round_trip(proto::leave{3, 48, 1, 65535})).via == 65535);

  bool other = true;
  host::pool_usage u{host::slot_pool{100, 2048}, 40, 2, 1};
  auto pr = proto::decode_reply<proto::pool_reply>(proto::encode_reply(4, proto::pool_reply{u}), 4, other);
  REQUIRE(pr.ok());
  CHECK(pr->usage.pool == host::slot_pool{100, 2048});
  CHECK(pr->usage.free == 40);
  CHECK(pr->usage.groups == 2);
  CHECK(pr->usage.waiting == 1);
  for (auto st : {host::join_state::install, host::join_state::wait, host::join_state::granted, host::join_state::refused}) {
    host::group_answer a{st, {65535, 3}, "why", st == host::join_state::install};
    auto jr = proto::decode_reply<proto::join_reply>(proto::encode_reply(5, proto::join_reply{a}), 5, other);
    REQUIRE(jr.ok());
    CHECK(jr->answer.state == st);
    CHECK(jr->answer.lease == a.lease);
    CHECK(jr->answer.reason == "why");
    CHECK(jr->answer.installer == a.installer);
  }
  auto bad = proto::decode_reply<proto::join_reply>(R"({"id":5,"ok":true,"state":"maybe","lease":[],"reason":"","installer":false})", 5, other);
  CHECK(bad.err().code == errc::bad_state);
}

TEST_CASE("the virtual-time requests and replies survive a round trip; hello says virtual_time only when it is") {
  CHECK(std::get<proto::attach>(round_trip(proto::attach{4})).node == 4);
  const auto w = std::get<proto::wait>(round_trip(proto::wait{2, 9, 256, std::chrono::nanoseconds(INT64_MAX)}));
  CHECK(w.node == 2);
  CHECK(w.ec == 9);
  CHECK(w.max_events == 256);
  CHECK(w.timeout == std::chrono::nanoseconds(INT64_MAX));
  CHECK(std::get<proto::sleep>(round_trip(proto::sleep{1, std::chrono::nanoseconds(1500)})).duration.count() == 1500);
  const auto c = std::get<proto::charge>(round_trip(proto::charge{3, host::work::reduce, 1u << 20}));
  CHECK(c.op == host::work::reduce);
  CHECK(c.bytes == 1u << 20);
  CHECK(std::get<proto::charge>(round_trip(proto::charge{3, host::work::copy, 0})).op == host::work::copy);
  const auto b = std::get<proto::barrier>(round_trip(proto::barrier{2, {0, 2, 5}, UINT64_MAX}));
  CHECK(b.node == 2);
  CHECK(b.members == std::vector<std::uint32_t>{0, 2, 5});
  CHECK(b.seq == UINT64_MAX);
  const auto ps = std::get<proto::p2p_send>(round_trip(proto::p2p_send{1, 3, UINT64_MAX, (1ull << 40) + 5, 77}));
  CHECK(ps.node == 1);
  CHECK(ps.dest == 3);
  CHECK(ps.match_bits == UINT64_MAX);
  CHECK(ps.bytes == (1ull << 40) + 5);
  CHECK(ps.id == 77);
  const auto pr = std::get<proto::p2p_recv>(round_trip(proto::p2p_recv{2, 9, proto::any_source, 0x1234ull << 32, 0xFFFFFFFFull}));
  CHECK(pr.id == 9);
  CHECK(pr.source == proto::any_source);
  CHECK(pr.match_bits == 0x1234ull << 32);
  CHECK(pr.ignore_bits == 0xFFFFFFFFull);
  const auto pw = std::get<proto::p2p_wait>(round_trip(proto::p2p_wait{2, {5, UINT64_MAX, 7}, 2, std::chrono::nanoseconds(0)}));
  CHECK(pw.ids == std::vector<std::uint64_t>{5, UINT64_MAX, 7});
  CHECK(pw.need == 2);
  CHECK(pw.timeout.count() == 0);
  const auto pp = std::get<proto::p2p_probe>(round_trip(proto::p2p_probe{0, 4, 6, 1, std::chrono::nanoseconds(INT64_MAX)}));
  CHECK(pp.source == 4);
  CHECK(pp.match_bits == 6);
  CHECK(pp.ignore_bits == 1);
  CHECK(pp.timeout == std::chrono::nanoseconds(INT64_MAX));

  bool other = true;
  auto p2 = proto::decode_reply<proto::p2p_reply>(
      proto::encode_reply(4, proto::p2p_reply{std::chrono::nanoseconds(42), {{9, 3, UINT64_MAX, 100, 6}, {10, 1, 0, 0, 0}}}), 4, other);
  REQUIRE(p2.ok());
  CHECK(p2->now.count() == 42);
  REQUIRE(p2->done.size() == 2);
  CHECK(p2->done[0].id == 9);
  CHECK(p2->done[0].source == 3);
  CHECK(p2->done[0].match_bits == UINT64_MAX);
  CHECK(p2->done[0].bytes == 100);
  CHECK(p2->done[0].order == 6);
  CHECK(p2->done[1].id == 10);

  auto cr = proto::decode_reply<proto::clock_reply>(proto::encode_reply(3, proto::clock_reply{std::chrono::nanoseconds(123456789), 17}), 3, other);
  REQUIRE(cr.ok());
  CHECK(cr->now.count() == 123456789);
  CHECK(cr->events == 17);
  for (bool vt : {false, true}) {
    const std::string line = proto::encode_reply(1, proto::hello_reply{proto::version, "spin-emu", 5, vt});
    CHECK((line.find("virtual_time") != std::string::npos) == vt);  // a wall-clock server's hello is unchanged
    auto h = proto::decode_reply<proto::hello_reply>(line, 1, other);
    REQUIRE(h.ok());
    CHECK(h->virtual_time == vt);
  }
}

TEST_CASE("an install without optional fields decodes to the defaults") {
  proto::install in;
  in.package = "/p";
  in.name = "n";
  const auto out = std::get<proto::install>(round_trip(in));
  CHECK(out.handler_mem_bytes == 0);
  CHECK(out.scratchpad_bytes == 0);
  CHECK(out.frame_key == std::array<std::uint8_t, 16>{});
  CHECK_FALSE(out.window.has_value());
  CHECK(out.scratchpad == rt::scratchpad_init::zeroed);
  CHECK(out.bpf == rt::bpf_exec::jit);
  CHECK(out.limits.max_messages == rt::ec_limits{}.max_messages);
}

TEST_CASE("malformed requests are refused with a message that names the problem") {
  struct bad {
    const char* line;
    const char* says;
  };
  for (const auto& b : {
           bad{"not json", "not valid JSON"},
           bad{"[1,2]", "must be a JSON object"},
           bad{R"({"id":1})", "missing field 'op'"},
           bad{R"({"op":"hello"})", "missing field 'id'"},
           bad{R"({"id":-1,"op":"hello"})", "field 'id' must be an integer in 0..9223372036854775807, not -1"},
           bad{R"({"id":1,"op":"fly"})", "unknown op 'fly'"},
           bad{R"({"id":1,"op":"hello","x":2})", "unknown field 'x'"},
           bad{R"({"id":1,"op":"uninstall","node":0})", "missing field 'ec'"},
           bad{R"({"id":1,"op":"uninstall","node":0,"ec":4294967296})", "field 'ec' must be an integer in 0..4294967295"},
           bad{R"({"id":1,"op":"uninstall","node":"0","ec":1})", "field 'node' must be an integer"},
           bad{R"({"id":1,"op":"register","node":0,"bytes":0})", "field 'bytes' must be an integer in 1.."},
           bad{R"({"id":1,"op":"send","node":0,"dest_rank":1,"match_bits":0,"message_id":0,"region":0,"offset_bytes":0,"len_bytes":1,"timeout_ms":600001})",
               "field 'timeout_ms' must be an integer in 0..600000"},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"n","match":{"bits":0}})", "missing field 'match.ignore_mask'"},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"n","match":{"bits":0,"ignore_mask":0},"limits":{"max_messages":0}})",
               "field 'limits.max_messages' must be an integer in 1.."},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"n","match":{"bits":0,"ignore_mask":0},"bpf":"fast"})",
               "field 'bpf' must be \"jit\" or \"interpreter\""},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"a\u0001b","match":{"bits":0,"ignore_mask":0}})",
               "field 'name' contains a control character"},
           bad{R"({"id":1,"op":"group_join","node":0,"group":16,"members":[1,-2],"slots":4,"me":0})",
               "field 'members' must be an integer in 0..4294967295, not -2"},
           bad{R"({"id":1,"op":"group_join","node":0,"group":16,"members":7,"slots":4,"me":0})",
               "field 'members' must be an array of at most 65535 integers"},
           bad{R"({"id":1,"op":"group_join","node":0,"group":16,"members":[1],"slots":0,"me":0})",
               "field 'slots' must be an integer in 1..32767, not 0"},
           bad{R"({"id":1,"op":"group_decide","node":0,"group":16,"granted":1,"lease":[],"reason":""})",
               "field 'granted' must be true or false"},
           bad{R"({"id":1,"op":"group_pool","node":0,"set":{"slots":4}})", "missing field 'set.slot_bytes'"},
           bad{R"({"id":1,"op":"group_join","node":0,"group":16,"members":[1],"slots":4,"proof":0,"me":0,"via":4294967295})",
               "field 'via' must be an integer in 0..4294967294"},
           bad{R"({"id":1,"op":"group_leave","node":0,"group":16,"me":0,"via":-1})", "field 'via' must be an integer"},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"n","match":{"bits":0,"ignore_mask":0},"frame_key":"00112233"})",
               "field 'frame_key' must be 32 hexadecimal digits (16 bytes)"},
           bad{R"({"id":1,"op":"install","node":0,"package":"/p","name":"n","match":{"bits":0,"ignore_mask":0},"frame_key":"0011223344556677889900aabbccddeg"})",
               "field 'frame_key' must be 32 hexadecimal digits (16 bytes)"},
           bad{R"({"id":1,"op":"group_join","node":0,"group":16,"members":[1],"slots":4,"proof":0,"me":0,"frame_key":7})",
               "field 'frame_key' must be 32 hexadecimal digits (16 bytes)"},
           bad{R"({"id":1,"op":"wait","node":0,"ec":1,"max_events":0,"timeout_ns":0})", "field 'max_events' must be an integer in 1..256, not 0"},
           bad{R"({"id":1,"op":"wait","node":0,"ec":1,"max_events":257,"timeout_ns":0})", "field 'max_events' must be an integer in 1..256"},
           bad{R"({"id":1,"op":"wait","node":0,"ec":1,"max_events":1,"timeout_ns":9223372036854775808})",
               "field 'timeout_ns' must be an integer in 0..9223372036854775807"},
           bad{R"({"id":1,"op":"sleep","node":0})", "missing field 'ns'"},
           bad{R"({"id":1,"op":"charge","node":0,"work":"fold","bytes":4})", "field 'work' must be \"copy\" or \"reduce\""},
           bad{R"({"id":1,"op":"attach"})", "missing field 'node'"},
           bad{R"({"id":1,"op":"barrier","node":0,"members":[],"seq":1})", "field 'members' must name at least one node"},
           bad{R"({"id":1,"op":"barrier","node":0,"members":[0,1]})", "missing field 'seq'"},
           bad{R"({"id":1,"op":"barrier","node":0,"members":[0,-1],"seq":1})", "members"},
           bad{R"({"id":1,"op":"p2p_recv","node":0,"recv":0,"source":1,"match_bits":0,"ignore_bits":0})",
               "field 'recv' must be an integer in 1..2^64-1"},
           bad{R"({"id":1,"op":"p2p_send","node":0,"dest":1,"match_bits":0,"bytes":9223372036854775808,"sync":0})", "field 'bytes'"},
           bad{R"({"id":1,"op":"p2p_send","node":0,"dest":1,"match_bits":0,"bytes":1})", "missing field 'sync'"},
           bad{R"({"id":1,"op":"p2p_wait","node":0,"ids":[],"need":1,"timeout_ns":0})", "field 'ids' must name at least one"},
           bad{R"({"id":1,"op":"p2p_wait","node":0,"ids":[3,0],"need":1,"timeout_ns":0})", "must not hold 0"},
           bad{R"({"id":1,"op":"p2p_wait","node":0,"ids":[3,4],"need":3,"timeout_ns":0})", "field 'need' must be an integer in 1..2"},
           bad{R"({"id":1,"op":"p2p_probe","node":0,"source":-1,"match_bits":0,"ignore_bits":0,"timeout_ns":0})", "source"},
       }) {
    CAPTURE(b.line);
    const error e = refused(b.line);
    CHECK(e.code == errc::invalid_argument);
    CHECK_MESSAGE(e.message.find(b.says) != std::string::npos, e.message);
  }
}

TEST_CASE("a refused request still gives its id to the error reply when it had a usable one") {
  std::optional<std::uint64_t> id;
  CHECK_FALSE(proto::decode_request(R"({"id":42,"op":"fly"})", id).ok());
  CHECK(id == 42u);
  CHECK_FALSE(proto::decode_request(R"({"id":"x","op":"hello"})", id).ok());
  CHECK_FALSE(id.has_value());
}

TEST_CASE("replies decode to what the server encoded, and errors carry the server's errc") {
  bool other = true;
  auto line = proto::encode_reply(5, proto::nodes_reply{{{0, "host0", 1, 4096}, {1, "sw", 9, 1024}}});
  auto n = proto::decode_reply<proto::nodes_reply>(line, 5, other);
  REQUIRE(n.ok());
  CHECK_FALSE(other);
  REQUIRE(n->nodes.size() == 2);
  CHECK(n->nodes[1].name == "sw");
  CHECK(n->nodes[1].rank == 9);
  CHECK(n->nodes[1].max_payload_bytes == 1024);

  auto ev = proto::decode_reply<proto::events_reply>(proto::encode_reply(6, proto::events_reply{64, 8192}), 6, other);
  REQUIRE(ev.ok());
  CHECK(ev->capacity == 64);
  CHECK(ev->bytes == 8192);

  auto e = proto::decode_reply<proto::done>(proto::encode_error(9, "exists", "EC 3 is there"), 9, other);
  CHECK(e.err().code == errc::exists);
  CHECK(e.err().message == "EC 3 is there");
  CHECK(proto::decode_reply<proto::done>(proto::encode_error(std::nullopt, "permission", "no"), 9, other).err().code ==
        errc::not_supported);
  CHECK(proto::decode_reply<proto::done>(proto::encode_error(9, "martian", "?"), 9, other).err().code == errc::bad_state);
}

TEST_CASE("a reply to another request, or one without its result, is not taken for the answer") {
  bool other = false;
  auto r = proto::decode_reply<proto::install_reply>(proto::encode_reply(3, proto::install_reply{4}), 4, other);
  CHECK(other);
  CHECK(r.err().code == errc::bad_state);
  auto m = proto::decode_reply<proto::install_reply>(R"({"id":4,"ok":true})", 4, other);
  CHECK_FALSE(other);
  CHECK(m.err().code == errc::bad_state);
  CHECK(proto::decode_reply<proto::done>("garbage", 4, other).err().code == errc::bad_state);
}

} // TEST_SUITE
