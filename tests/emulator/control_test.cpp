// The control socket and the host library against NICs made of real runtimes (no DPDK): a test
// nic_control whose sends are wire frames fed back into the destination runtime, so that a
// message a host sends really runs handlers, DMAs into shared memory and posts events.
#include <spin/emu/control.hpp>
#include <spin/host/host.hpp>
#include <spin/rt/runtime.hpp>
#include <spin/rt/stats.hpp>
#include <spin/rt/wire.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace spin;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string pkg(const std::string& name) { return std::string(SPIN_TEST_PKG_DIR) + "/" + name + ".spkg"; }

class test_nic;

/// Delivers frames to NICs by rank.
class fabric {
public:
  void attach(std::uint32_t rank, test_nic* n) {
    std::lock_guard lk(_mu);
    _nics[rank] = n;
  }
  void deliver(std::uint32_t rank, std::vector<std::byte> frame);

private:
  std::mutex _mu;
  std::map<std::uint32_t, test_nic*> _nics;
};

/// nic_control over an rt::runtime. One scheduler thread moves received frames into the
/// runtime and polls it; control calls take the same mutex, so runtime control calls never
/// overlap (the runtime's threading rule). Also the runtime's transmitter: handler sends are
/// encoded and delivered through the fabric. Counts the control calls that change state.
class test_nic final : public emu::nic_control, public rt::transmitter {
public:
  test_nic(fabric& f, std::uint32_t rank, std::string name) : _fabric(f), _rank(rank), _name(std::move(name)) {
    rt::runtime_config cfg;
    cfg.rank = rank;
    cfg.hpus = 2;
    cfg.nic_memory_bytes = 16 << 20;
    cfg.tx = this;
    cfg.release = &test_nic::release;
    cfg.release_user = this;
    auto r = rt::runtime::create(cfg);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
    _rt = std::move(r.value());
    _fabric.attach(rank, this);
    _thread = std::thread([this] { loop(); });
  }
  ~test_nic() override {
    _stop = true;
    _thread.join();
    _rt.reset();
    for (auto* f : _inbox) delete f;
  }

  // transmitter: called from HPU threads. (A test double: it allocates, which a real port must not.)
  errc send(std::uint32_t, std::uint32_t dest_rank, const rt::wire::header& h, std::span<const std::byte> payload) noexcept override {
    std::vector<std::byte> frame(rt::wire::encoded_len(h, payload.size()));
    frame.resize(rt::wire::encode(rt::wire::rank_endpoint(_rank), rt::wire::rank_endpoint(dest_rank), h, payload, frame));
    if (frame.empty()) return errc::invalid_argument;
    _fabric.deliver(dest_rank, std::move(frame));
    return errc::ok;
  }
  std::uint32_t max_payload_bytes() const noexcept override { return 1024; }

  void receive(std::vector<std::byte> frame) {
    std::lock_guard lk(_in_mu);
    _inbox.push_back(new std::vector<std::byte>(std::move(frame)));
  }

  // nic_control
  std::uint32_t rank() const noexcept override { return _rank; }
  const std::string& name() const noexcept override { return _name; }
  result<rt::region_id> register_host_memory(std::span<std::byte> mem) override {
    std::lock_guard lk(_rt_mu);
    auto id = _rt->register_host_memory(mem);
    if (id) {
      _regions[*id] = mem;
      ++mutations;
    }
    return id;
  }
  result<void> unregister_host_memory(rt::region_id region) override {
    std::lock_guard lk(_rt_mu);
    if (!_regions.contains(region)) return fail(errc::not_found, "no region " + std::to_string(region));
    for (const auto& [ec, win] : _ec_regions)
      if (win == region) return fail(errc::bad_state, "EC " + std::to_string(ec) + "'s window lies in region " + std::to_string(region));
    // The runtime keeps the id; this NIC refuses windows and sends on it from now on.
    _regions.erase(region);
    ++mutations;
    return {};
  }
  result<rt::ec_id> install(const rt::ec_config& cfg) override {
    std::lock_guard lk(_rt_mu);
    if (cfg.window && !_regions.contains(cfg.window->region))
      return fail(errc::not_found, "no region " + std::to_string(cfg.window->region));
    auto ec = _rt->install(cfg);
    if (ec) {
      ++mutations;
      if (cfg.window) _ec_regions[*ec] = cfg.window->region;
    }
    return ec;
  }
  result<void> uninstall(rt::ec_id ec) override {
    std::lock_guard lk(_rt_mu);
    auto r = _rt->uninstall(ec);
    if (r) {
      ++mutations;
      _ec_regions.erase(ec);
    }
    return r;
  }
  std::size_t poll_events(rt::ec_id ec, std::span<rt::host_event> out) noexcept override { return _rt->poll_events(ec, out); }
  std::size_t wait_events(rt::ec_id ec, std::span<rt::host_event> out, std::chrono::nanoseconds timeout) noexcept override {
    return _rt->wait_events(ec, out, timeout);
  }
  result<void> send(const host::message& m, std::chrono::milliseconds) override {
    std::lock_guard lk(_rt_mu);
    auto it = _regions.find(m.region);
    if (it == _regions.end()) return fail(errc::not_found, "no region " + std::to_string(m.region));
    if (m.offset_bytes > it->second.size() || m.len_bytes > it->second.size() - m.offset_bytes)
      return fail(errc::out_of_bounds, "message outside region " + std::to_string(m.region));
    const std::uint32_t pkt = max_payload_bytes();
    const std::uint64_t count = m.len_bytes == 0 ? 1 : (m.len_bytes + pkt - 1) / pkt;
    for (std::uint64_t k = 0; k < count; ++k) {
      rt::wire::header h;
      h.source_rank = _rank;
      h.match_bits = m.match_bits;
      h.message_id = m.message_id;
      h.seq = static_cast<std::uint32_t>(k);
      h.message_len = m.len_bytes;
      h.offset = k * pkt;
      h.flags = rt::wire::position_flags(k, count);
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(pkt, m.len_bytes - h.offset));
      (void)send(0, m.dest_rank, h, it->second.subspan(m.offset_bytes + h.offset, n));
    }
    ++mutations;
    return {};
  }
  rt::runtime_stats runtime_stats() const override { return _rt->stats(); }
  host::nic_stats stats() const override {
    host::nic_stats s;
    s.name = _name;
    s.rank = _rank;
    s.runtime = _rt->stats();
    return s;
  }
  emu::group_registry& groups() noexcept override { return _groups; }

  std::size_t ec_count() const { return _rt->stats().ecs.size(); }
  std::atomic<std::uint64_t> mutations{0};

private:
  emu::group_registry _groups{"test"};
  static void release(void*, std::uint64_t cookie) noexcept { delete reinterpret_cast<std::vector<std::byte>*>(cookie); }

  void loop() {
    std::deque<std::vector<std::byte>*> pending;
    while (!_stop) {
      {
        std::lock_guard lk(_in_mu);
        for (auto* f : _inbox) pending.push_back(f);
        _inbox.clear();
      }
      {
        std::lock_guard lk(_rt_mu);
        std::vector<rt::packet> pkts;
        for (auto* f : pending)
          pkts.push_back(rt::packet{f->data(), static_cast<std::uint32_t>(f->size()), reinterpret_cast<std::uint64_t>(f)});
        const std::uint32_t n = pkts.empty() ? 0 : _rt->rx_burst(0, pkts.data(), static_cast<std::uint32_t>(pkts.size()));
        pending.erase(pending.begin(), pending.begin() + n);
        _rt->drain();  // this thread drives every HPU of the test NIC
      }
      std::this_thread::sleep_for(50us);
    }
    for (auto* f : pending) delete f;
  }

  fabric& _fabric;
  std::uint32_t _rank;
  std::string _name;
  std::unique_ptr<rt::runtime> _rt;
  std::mutex _rt_mu;
  std::map<rt::region_id, std::span<std::byte>> _regions;
  std::map<rt::ec_id, rt::region_id> _ec_regions;
  std::mutex _in_mu;
  std::vector<std::vector<std::byte>*> _inbox;
  std::atomic<bool> _stop{false};
  std::thread _thread;
};

void fabric::deliver(std::uint32_t rank, std::vector<std::byte> frame) {
  test_nic* n = nullptr;
  {
    std::lock_guard lk(_mu);
    if (auto it = _nics.find(rank); it != _nics.end()) n = it->second;
  }
  if (n != nullptr) n->receive(std::move(frame));
}

std::string temp_socket_path() {
  static std::atomic<int> seq{0};
  return "/tmp/spin-ctl-test-" + std::to_string(::getpid()) + "-" + std::to_string(seq++) + ".sock";
}

/// Two NICs (ranks 0 and 1) and a control server on a fresh socket path.
struct fixture {
  fabric net;
  test_nic nic0{net, 0, "host0"};
  test_nic nic1{net, 1, "host1"};
  std::atomic<int> stops{0};
  std::unique_ptr<emu::control_server> server;
  std::string path = temp_socket_path();

  explicit fixture(uid_t uid = ::geteuid()) {
    emu::server_options o;
    o.socket_path = path;
    o.nodes = {&nic0, &nic1};
    o.on_stop = [this] { ++stops; };
    o.allowed_uid = uid;
    auto s = emu::control_server::start(std::move(o));
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? std::string() : s.err().message));
    server = std::move(s.value());
  }
  ~fixture() { server.reset(); }

  host::client connect() {
    auto c = host::client::connect(path);
    REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.err().message));
    return std::move(c.value());
  }
  std::uint64_t mutations() const { return nic0.mutations + nic1.mutations; }
  // Waits until the server's tracked objects reach `want` (session release runs on a worker).
  bool wait_tracked(std::size_t regions, std::size_t ecs, std::size_t rings) {
    for (int i = 0; i < 400; ++i) {
      const auto t = server->tracked_objects();
      if (t.regions == regions && t.ecs == ecs && t.rings == rings) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

json parse_reply(const std::string& line) {
  json j = json::parse(line, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), line);
  return j;
}

std::string error_code(const json& reply) { return reply.at("error").at("code").get<std::string>(); }

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

host::install_options hostcopy_options(const host::memory& mem, std::uint64_t win_off, std::uint64_t win_len) {
  host::install_options o;
  o.package = pkg("hostcopy.native");
  o.name = "hostcopy";
  o.match.bits = 0x42;
  o.window = rt::host_window{mem.region(), win_off, win_len};
  return o;
}

std::byte pattern(std::size_t i) { return static_cast<std::byte>((i * 13 + (i >> 8)) & 0xff); }

// Every node's statistics as `spinctl stats --json` prints them.
json stats_of(host::client& c) {
  auto st = c.stats();
  REQUIRE_MESSAGE(st.ok(), (st.ok() ? std::string() : st.err().message));
  return json::parse(host::to_json(*st));
}

const json* find_ec(const json& stats, std::uint32_t node, const std::string& name) {
  for (const auto& n : stats)
    if (n.at("node") == node)
      for (const auto& e : n.at("stats").at("runtime").at("ecs"))
        if (e.at("name") == name) return &e;
  return nullptr;
}

// Runs spinctl with `args`; returns exit status and stdout+stderr.
std::pair<int, std::string> spinctl(const std::string& args) {
  const std::string cmd = std::string(SPIN_SPINCTL) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

} // namespace

TEST_SUITE("emulator") {

TEST_CASE("a host sends a message whose handler DMAs it into shared memory and posts an event") {
  fixture f;
  auto c = f.connect();
  auto nodes = c.nodes();
  REQUIRE(nodes.ok());
  REQUIRE(nodes->size() == 2);
  CHECK((*nodes)[1].name == "host1");
  CHECK((*nodes)[1].rank == 1);

  auto mem = c.alloc_memory(0, 64 * 1024);
  REQUIRE_MESSAGE(mem.ok(), (mem.ok() ? std::string() : mem.err().message));
  auto bytes = mem->bytes();
  REQUIRE(bytes.size() == 64 * 1024);
  for (std::size_t i = 0; i < 8192; ++i) bytes[i] = pattern(i);

  auto ec = c.install(0, hostcopy_options(*mem, 32 * 1024, 16 * 1024));
  REQUIRE_MESSAGE(ec.ok(), (ec.ok() ? std::string() : ec.err().message));
  auto q = c.open_events(*ec, 64);
  REQUIRE_MESSAGE(q.ok(), (q.ok() ? std::string() : q.err().message));
  CHECK(q->capacity() == 64);

  // 5000 bytes from offset 0 of the region, to rank 0 itself: five packets.
  host::message m;
  m.dest_rank = 0;
  m.match_bits = 0x42;
  m.message_id = 7;
  m.region = mem->region();
  m.len_bytes = 5000;
  REQUIRE(c.send(0, m).ok());
  auto e = q->wait(10s);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? std::string() : e.err().message));
  CHECK(e->type == rt::host_event::kind::handler);
  CHECK(e->message_id == 7);
  CHECK(e->source_rank == 0);
  CHECK(e->value == 5000);
  for (std::size_t i = 0; i < 5000; ++i) REQUIRE(bytes[32 * 1024 + i] == pattern(i));
  CHECK(bytes[32 * 1024 + 5000] == std::byte{0});
  CHECK(q->wait(50ms).err().code == errc::timeout);
  CHECK(q->dropped() == 0);

  // A message from the other NIC arrives too, with its source rank.
  auto mem1 = c.alloc_memory(1, 8192);
  REQUIRE(mem1.ok());
  std::memset(mem1->bytes().data(), 0x77, 100);
  host::message m1 = m;
  m1.region = mem1->region();
  m1.message_id = 8;
  m1.len_bytes = 100;
  REQUIRE(c.send(1, m1).ok());
  e = q->wait(10s);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? std::string() : e.err().message));
  CHECK(e->source_rank == 1);
  CHECK(e->message_id == 8);
  CHECK(bytes[32 * 1024 + 99] == std::byte{0x77});

  // The statistics say the same (the scheduler retires a message shortly after its event).
  json s;
  for (int i = 0; i < 400; ++i) {
    s = stats_of(c);
    const json* es = find_ec(s, 0, "hostcopy");
    if (es != nullptr && es->at("messages_completed") == 2) break;
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(s.is_array());
  REQUIRE(s.size() == 2);
  const json* es = find_ec(s, 0, "hostcopy");
  REQUIRE(es != nullptr);
  CHECK(es->at("packets_in") == 6);
  CHECK(es->at("messages_completed") == 2);
  CHECK(es->at("events_posted") == 2);
  CHECK(es->at("dma_to_host_bytes") == 5100);
}

TEST_CASE("an install whose options carry handlers is refused before it reaches spin-emu: the package gives them") {
  fixture f;
  auto c = f.connect();
  host::install_options o;
  o.package = pkg("pingpong.native");
  o.name = "pp";
  o.handlers.payload = +[](spin::ctx*) { return spin::ret::success; };
  auto ec = c.install(0, o);
  REQUIRE_FALSE(ec.ok());
  CHECK(ec.err().code == errc::invalid_argument);
  CHECK(ec.err().message.find("handlers") != std::string::npos);
  CHECK(f.nic0.ec_count() == 0);
  o.handlers = {};
  CHECK(c.install(0, o).ok());
}

TEST_CASE("a standard package (pingpong) installs through the socket and echoes what the host sends") {
  fixture f;
  auto c = f.connect();
  auto mem = c.alloc_memory(1, 4096);
  REQUIRE(mem.ok());
  host::install_options o;
  o.package = pkg("pingpong.native");
  o.name = "pingpong";
  o.match.bits = 0x10;
  auto ec = c.install(0, o);
  REQUIRE_MESSAGE(ec.ok(), (ec.ok() ? std::string() : ec.err().message));
  host::message m;
  m.dest_rank = 0;
  m.match_bits = 0x10;
  m.message_id = 1;
  m.region = mem->region();
  m.len_bytes = 3000;  // three packets, each echoed back to rank 1
  REQUIRE(c.send(1, m).ok());
  std::uint64_t sends = 0;
  for (int i = 0; i < 400 && sends < 3; ++i) {
    std::this_thread::sleep_for(5ms);
    const json s = stats_of(c);
    const json* e = find_ec(s, 0, "pingpong");
    REQUIRE(e != nullptr);
    sends = e->at("sends").get<std::uint64_t>();
  }
  CHECK(sends == 3);
  // Rank 1 has no EC: the echoes count as unknown_ec there.
  CHECK(stats_of(c)[1]["stats"]["runtime"]["unknown_ec"] == 3);
}

TEST_CASE("every malformed request gets an error reply, changes nothing, and the connection stays usable") {
  fixture f;
  auto c = f.connect();
  auto mem = c.alloc_memory(0, 4096);
  REQUIRE(mem.ok());
  auto ec = c.install(0, hostcopy_options(*mem, 0, 4096));
  REQUIRE(ec.ok());
  const auto before = f.server->tracked_objects();
  const std::uint64_t mutations = f.mutations();
  const std::size_t ecs0 = f.nic0.ec_count();
  const std::string r = std::to_string(mem->region());
  const std::string good_install =
      R"("op":"install","node":0,"package":")" + pkg("hostcopy.native") + R"(","name":"x","match":{"bits":1,"ignore_mask":0})";

  struct bad {
    std::string line;
    std::string code;
    std::string says;  // part of the message
  };
  const std::vector<bad> cases = {
      {"not json", "invalid_argument", "JSON"},
      {"{\"id\":1,\"op\":\"hello\"", "invalid_argument", "JSON"},
      {"{\"id\":1,\"op\":\"hel\xff\xfelo\"}", "invalid_argument", "UTF-8"},
      {"{\"id\":1,\"op\":\"nodes\",\"x\":\"\xc3\x28\"}", "invalid_argument", "JSON"},
      {"[1,2,3]", "invalid_argument", "object"},
      {"{\"op\":\"hello\"}", "invalid_argument", "'id'"},
      {"{\"id\":\"1\",\"op\":\"hello\"}", "invalid_argument", "'id'"},
      {"{\"id\":-1,\"op\":\"hello\"}", "invalid_argument", "'id'"},
      {"{\"id\":1}", "invalid_argument", "'op'"},
      {"{\"id\":1,\"op\":7}", "invalid_argument", "'op'"},
      {"{\"id\":1,\"op\":\"format_disk\"}", "invalid_argument", "unknown op"},
      {"{\"id\":1,\"op\":\"hello\",\"extra\":1}", "invalid_argument", "unknown field 'extra'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":0}", "invalid_argument", "missing field 'region'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":0,\"region\":\"" + r + "\"}", "invalid_argument", "'region'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":0,\"region\":1.5}", "invalid_argument", "'region'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":0,\"region\":4294967296}", "invalid_argument", "'region'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":0,\"region\":99999999999999999999999}", "invalid_argument", "'region'"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":2,\"region\":" + r + "}", "not_found", "node 2"},
      {"{\"id\":1,\"op\":\"unregister\",\"node\":-1,\"region\":" + r + "}", "invalid_argument", "'node'"},
      {"{\"id\":1,\"op\":\"uninstall\",\"node\":0,\"ec\":" + std::to_string(ec->id) + ",\"ec2\":1}", "invalid_argument",
       "unknown field"},
      {"{\"id\":1,\"op\":\"register\",\"node\":0,\"bytes\":4096}", "invalid_argument", "file descriptor"},
      {"{\"id\":1,\"op\":\"register\",\"node\":0,\"bytes\":0}", "invalid_argument", "'bytes'"},
      {"{\"id\":1,\"op\":\"events\",\"node\":0,\"ec\":" + std::to_string(ec->id) + ",\"capacity\":0}", "invalid_argument", "'capacity'"},
      {"{\"id\":1,\"op\":\"events\",\"node\":0,\"ec\":" + std::to_string(ec->id) + ",\"capacity\":16777217}", "invalid_argument",
       "'capacity'"},
      {"{\"id\":1,\"op\":\"events\",\"node\":0,\"ec\":999,\"capacity\":8}", "not_found", "999"},
      {"{\"id\":1,\"op\":\"close_events\",\"node\":0,\"ec\":" + std::to_string(ec->id) + "}", "not_found", "no event ring"},
      {"{\"id\":1,\"op\":\"send\",\"node\":0,\"dest_rank\":4294967296,\"match_bits\":1,\"message_id\":1,\"region\":" + r +
           ",\"offset_bytes\":0,\"len_bytes\":1,\"timeout_ms\":10}",
       "invalid_argument", "'dest_rank'"},
      {"{\"id\":1,\"op\":\"send\",\"node\":0,\"dest_rank\":0,\"match_bits\":1,\"message_id\":1,\"region\":" + r +
           ",\"offset_bytes\":0,\"len_bytes\":1,\"timeout_ms\":600001}",
       "invalid_argument", "'timeout_ms'"},
      {"{\"id\":1,\"op\":\"send\",\"node\":0,\"dest_rank\":0,\"match_bits\":1,\"message_id\":1,\"region\":" + r +
           ",\"offset_bytes\":0,\"timeout_ms\":10}",
       "invalid_argument", "'len_bytes'"},
      {"{\"id\":1," + good_install.substr(0, good_install.find(",\"match\"")) + "}", "invalid_argument", "missing field 'match'"},
      {"{\"id\":1," + good_install + ",\"window\":{\"region\":" + r + ",\"offset_bytes\":0}}", "invalid_argument",
       "'window.len_bytes'"},
      {"{\"id\":1," + good_install + ",\"limits\":{\"max_messages\":0}}", "invalid_argument", "'limits.max_messages'"},
      {"{\"id\":1," + good_install + ",\"limits\":{\"handler_budget_ns\":3600000000001}}", "invalid_argument",
       "'limits.handler_budget_ns'"},
      {"{\"id\":1," + good_install + ",\"limits\":{\"colour\":1}}", "invalid_argument", "'limits.colour'"},
      {"{\"id\":1," + good_install + ",\"persist\":1}", "invalid_argument", "'persist'"},
      {"{\"id\":1," + good_install + ",\"bpf\":\"fast\"}", "invalid_argument", "'bpf'"},
      {"{\"id\":1," + good_install + ",\"name\":\"\"}", "invalid_argument", "'name'"},
      {"{\"id\":1," + good_install + ",\"name\":\"a\\u0000b\"}", "invalid_argument", "'name'"},
      {"{\"id\":1," + good_install + ",\"name\":\"" + std::string(65, 'n') + "\"}", "invalid_argument", "'name'"},
      {"{\"id\":1,\"op\":\"install\",\"node\":0,\"package\":\"relative.spkg\",\"name\":\"x\",\"match\":{\"bits\":1,"
       "\"ignore_mask\":0}}",
       "invalid_argument", "absolute"},
      {"{\"id\":1," + good_install + ",\"match\":{\"bits\":1}}", "invalid_argument", "'match.ignore_mask'"},  // duplicate key: the last counts
      {std::string(20000, '[') + std::string(20000, ']'), "invalid_argument", "object"},
      {"{\"id\":1,\"op\":\"stats\",\"pretty\":true}", "invalid_argument", "unknown field 'pretty'"},
      {"{\"id\":1,\"op\":\"stop\",\"now\":true}", "invalid_argument", "unknown field 'now'"},
  };
  int n = 0;
  for (const auto& b : cases) {
    CAPTURE(b.line.substr(0, 200));
    auto line = c.raw_request(b.line);
    REQUIRE_MESSAGE(line.ok(), (line.ok() ? std::string() : line.err().message));
    const json rep = parse_reply(*line);
    CHECK(rep["ok"] == false);
    CHECK(error_code(rep) == b.code);
    const std::string msg = rep["error"]["message"].get<std::string>();
    CHECK_MESSAGE(msg.find(b.says) != std::string::npos, msg);
    ++n;
  }
  CHECK(n == static_cast<int>(cases.size()));
  // The id of a request is echoed even when the request is refused.
  auto line = c.raw_request(R"({"id":77,"op":"nope"})");
  REQUIRE(line.ok());
  CHECK(parse_reply(*line)["id"] == 77);
  // A wall-clock server says nothing of virtual time and refuses its requests.
  CHECK_FALSE(c.virtual_time());
  for (const char* vt : {R"({"id":78,"op":"attach","node":0})", R"({"id":79,"op":"sleep","node":0,"ns":5})",
                         R"({"id":80,"op":"charge","node":0,"work":"copy","bytes":5})",
                         R"({"id":81,"op":"wait","node":0,"ec":1,"max_events":1,"timeout_ns":5})",
                         R"({"id":82,"op":"barrier","node":0,"members":[0],"seq":1})",
                         R"({"id":83,"op":"p2p_send","node":0,"dest":1,"match_bits":0,"bytes":4,"sync":0})",
                         R"({"id":84,"op":"p2p_recv","node":0,"recv":1,"source":1,"match_bits":0,"ignore_bits":0})",
                         R"({"id":85,"op":"p2p_wait","node":0,"ids":[1],"need":1,"timeout_ns":0})",
                         R"({"id":86,"op":"p2p_probe","node":0,"source":1,"match_bits":0,"ignore_bits":0,"timeout_ns":0})"}) {
    auto l = c.raw_request(vt);
    REQUIRE(l.ok());
    CHECK(parse_reply(*l)["error"]["code"] == "not_supported");
    CHECK(parse_reply(*l)["error"]["message"].get<std::string>().find("wall-clock") != std::string::npos);
  }
  CHECK(c.attach(0).err().code == errc::not_supported);
  CHECK(c.barrier(0, {0}, 1).err().code == errc::not_supported);
  CHECK(c.p2p_send(0, 1, 0, 4).err().code == errc::not_supported);
  CHECK(c.p2p_wait(0, {1}, 1, std::chrono::nanoseconds(0)).err().code == errc::not_supported);

  SUBCASE("a package that does not load is refused with the loader's error") {
    host::install_options o = hostcopy_options(*mem, 0, 4096);
    o.package = "/nonexistent/x.spkg";
    auto r2 = c.install(0, o);
    REQUIRE_FALSE(r2.ok());
    CHECK(r2.err().message.find("/nonexistent/x.spkg") != std::string::npos);
  }
  SUBCASE("file descriptors a request does not expect are refused and closed") {
    const int fd = ::memfd_create("unexpected", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    const std::size_t fds_before = open_fds();
    const int two[2] = {fd, fd};
    auto l1 = c.raw_request(R"({"id":1,"op":"hello"})", std::span(&fd, 1));
    REQUIRE(l1.ok());
    CHECK(parse_reply(*l1)["ok"] == false);
    auto l2 = c.raw_request(R"({"id":2,"op":"register","node":0,"bytes":4096})", std::span(two, 2));
    REQUIRE(l2.ok());
    CHECK(parse_reply(*l2)["error"]["message"].get<std::string>().find("carried 2") != std::string::npos);
    CHECK(open_fds() == fds_before);  // the server closed its copies
    ::close(fd);
  }
  SUBCASE("a descriptor that is not shared memory is refused") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    auto l = c.raw_request(R"({"id":1,"op":"register","node":0,"bytes":4096})", std::span(p, 1));
    REQUIRE(l.ok());
    CHECK(parse_reply(*l)["error"]["message"].get<std::string>().find("regular file") != std::string::npos);
    ::close(p[0]);
    ::close(p[1]);
  }
  SUBCASE("NIC errors pass through with their code and message") {
    host::install_options o = hostcopy_options(*mem, 0, 8192);  // window larger than the region
    auto r2 = c.install(0, o);
    REQUIRE_FALSE(r2.ok());
    CHECK(r2.err().code == errc::invalid_argument);
    host::message m;
    m.region = mem->region();
    m.offset_bytes = 4000;
    m.len_bytes = 100;
    auto r3 = c.send(0, m);
    CHECK(r3.err().code == errc::out_of_bounds);
    CHECK(c.uninstall(host::ec{0, 999}).err().code == errc::not_found);
  }
  CHECK(f.mutations() == mutations);
  CHECK(f.nic0.ec_count() == ecs0);
  const auto after = f.server->tracked_objects();
  CHECK(after.regions == before.regions);
  CHECK(after.ecs == before.ecs);
  CHECK(after.rings == before.rings);
  auto h = c.raw_request(R"({"id":5,"op":"hello"})");
  REQUIRE(h.ok());
  CHECK(parse_reply(*h)["ok"] == true);
  CHECK(parse_reply(*h)["protocol"] == 1);
}

TEST_CASE("a request line longer than the limit gets an error reply and the connection is closed") {
  fixture f;
  auto c = f.connect();
  const std::string huge = "{\"id\":1,\"op\":\"hello\",\"pad\":\"" + std::string(70000, 'a') + "\"}";
  auto line = c.raw_request(huge);
  REQUIRE_MESSAGE(line.ok(), (line.ok() ? std::string() : line.err().message));
  const json rep = parse_reply(*line);
  CHECK(rep["ok"] == false);
  CHECK(rep["error"]["message"].get<std::string>().find("longer than 65536") != std::string::npos);
  CHECK(c.raw_request(R"({"id":2,"op":"hello"})").err().code == errc::bad_state);
  // Other connections are unaffected.
  auto c2 = f.connect();
  CHECK(c2.nodes().ok());
}

TEST_CASE("a user other than the allowed one is refused with a permission error") {
  fixture f(::geteuid() + 1);
  auto c = host::client::connect(f.path);
  REQUIRE_FALSE(c.ok());
  CHECK(c.err().code == errc::not_supported);
  CHECK(c.err().message.find("may not use") != std::string::npos);
  // On the wire: one reply with code "permission", then the server closes.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, f.path.c_str());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  std::string got;
  char buf[1024];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const json rep = parse_reply(got.substr(0, got.find('\n')));
  CHECK(rep["ok"] == false);
  CHECK(error_code(rep) == "permission");
}

TEST_CASE("the socket is created with mode 0600 and removed at stop; stale sockets are replaced, other files kept") {
  std::string path;
  {
    fixture f;
    path = f.path;
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
    // A second server on the same path is refused while the first listens.
    emu::server_options o;
    o.socket_path = path;
    o.nodes = {&f.nic0};
    auto second = emu::control_server::start(std::move(o));
    REQUIRE_FALSE(second.ok());
    CHECK(second.err().code == errc::exists);
  }
  CHECK(::access(path.c_str(), F_OK) != 0);

  fabric net;
  test_nic nic{net, 0, "n"};
  // A stale socket (bound, nobody listening) is replaced.
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    ::close(fd);
    emu::server_options o;
    o.socket_path = path;
    o.nodes = {&nic};
    auto s = emu::control_server::start(std::move(o));
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? std::string() : s.err().message));
    CHECK(host::client::connect(path).ok());
  }
  // A regular file is never replaced.
  {
    std::ofstream(path) << "precious";
    emu::server_options o;
    o.socket_path = path;
    o.nodes = {&nic};
    auto s = emu::control_server::start(std::move(o));
    REQUIRE_FALSE(s.ok());
    CHECK(s.err().code == errc::exists);
    std::ifstream in(path);
    std::string text;
    in >> text;
    CHECK(text == "precious");
    ::unlink(path.c_str());
  }
  // Options the server cannot work with.
  emu::server_options o;
  o.socket_path = "/tmp/" + std::string(200, 's');
  o.nodes = {&nic};
  CHECK(emu::control_server::start(o).err().code == errc::invalid_argument);
  o.socket_path = path;
  o.nodes = {};
  CHECK(emu::control_server::start(o).err().code == errc::invalid_argument);
}

TEST_CASE("closing a connection releases its event rings, ECs and regions; persistent ECs and their regions stay") {
  fixture f;
  auto keeper = f.connect();
  rt::ec_id persistent = 0;
  {
    auto c = f.connect();
    auto mem = c.alloc_memory(0, 8192);
    REQUIRE(mem.ok());
    auto mem2 = c.alloc_memory(1, 8192);
    REQUIRE(mem2.ok());
    auto session_ec = c.install(0, hostcopy_options(*mem, 0, 4096));
    REQUIRE(session_ec.ok());
    auto o = hostcopy_options(*mem, 4096, 4096);
    o.name = "persistent";
    o.match.bits = 0x43;
    o.life = host::lifetime::persist;
    auto pers = c.install(0, o);
    REQUIRE_MESSAGE(pers.ok(), (pers.ok() ? std::string() : pers.err().message));
    persistent = pers->id;
    auto q = c.open_events(*session_ec, 16);
    REQUIRE(q.ok());
    // One ring per EC.
    CHECK(c.open_events(*session_ec, 16).err().code == errc::exists);
    CHECK(f.server->tracked_objects().rings == 1);
    CHECK(f.nic0.ec_count() == 2);
    CHECK(f.server->connections() == 2);
  }
  // The session EC, the ring and mem2 go; the persistent EC stays and keeps mem (its window).
  REQUIRE(f.wait_tracked(1, 1, 0));
  CHECK(f.nic0.ec_count() == 1);
  CHECK(f.server->connections() == 1);
  // Another connection uninstalls the persistent EC; its region follows.
  REQUIRE(keeper.uninstall(host::ec{0, persistent}).ok());
  REQUIRE(f.wait_tracked(0, 0, 0));
  CHECK(f.nic0.ec_count() == 0);
}

TEST_CASE("memory can be freed once no EC uses it, and event rings can be closed and reopened") {
  fixture f;
  auto c = f.connect();
  auto mem = c.alloc_memory(0, 8192);
  REQUIRE(mem.ok());
  auto ec = c.install(0, hostcopy_options(*mem, 0, 4096));
  REQUIRE(ec.ok());
  CHECK(c.free_memory(*mem).err().code == errc::bad_state);
  CHECK(mem->bytes().size() == 8192);
  auto q = c.open_events(*ec, 8);
  REQUIRE(q.ok());
  REQUIRE(c.close_events(*ec).ok());
  auto q2 = c.open_events(*ec, 8);
  REQUIRE(q2.ok());
  REQUIRE(c.uninstall(*ec).ok());
  CHECK(f.server->tracked_objects().rings == 0);  // an uninstalled EC's ring goes with it
  REQUIRE(c.free_memory(*mem).ok());
  CHECK(mem->bytes().empty());
  CHECK(f.server->tracked_objects().regions == 0);
}

TEST_CASE("a full event ring counts the events it lost, and the host sees the count") {
  fixture f;
  auto c = f.connect();
  auto mem = c.alloc_memory(0, 8192);
  REQUIRE(mem.ok());
  auto ec = c.install(0, hostcopy_options(*mem, 0, 4096));
  REQUIRE(ec.ok());
  auto q = c.open_events(*ec, 2);
  REQUIRE(q.ok());
  host::message m;
  m.match_bits = 0x42;
  m.region = mem->region();
  m.offset_bytes = 4096;  // outside the window, so no handler DMA writes what a later send reads
  m.len_bytes = 16;
  for (std::uint64_t id = 1; id <= 5; ++id) {
    m.message_id = id;
    REQUIRE(c.send(0, m).ok());
    // Every message deposits at window offset 0: wait until this one completed, so that two
    // handlers never write the same host bytes at once.
    for (int i = 0; i < 400; ++i) {
      const json s = stats_of(c);
      const json* es = find_ec(s, 0, "hostcopy");
      if (es != nullptr && es->at("messages_completed") == id) break;
      std::this_thread::sleep_for(2ms);
    }
  }
  for (int i = 0; i < 400 && q->dropped() < 3; ++i) std::this_thread::sleep_for(5ms);
  CHECK(q->dropped() == 3);
  std::vector<rt::host_event> out(8);
  CHECK(q->wait_burst(out, 1s) == 2);
}

TEST_CASE("stop runs on_stop after its reply") {
  fixture f;
  auto c = f.connect();
  REQUIRE(c.stop_emulator().ok());
  for (int i = 0; i < 200 && f.stops == 0; ++i) std::this_thread::sleep_for(5ms);
  CHECK(f.stops == 1);
}

TEST_CASE("spinctl lists nodes, installs, uninstalls, prints statistics and errors, and stops") {
  fixture f;
  const std::string sock = "--socket " + f.path + " ";
  auto [rc, out] = spinctl(sock + "nodes");
  CHECK(rc == 0);
  CHECK(out == "0 host0 rank 0\n1 host1 rank 1\n");

  std::tie(rc, out) = spinctl(sock + "install host1 " + pkg("pingpong.native") + " --name pp --match-bits 0x10 --budget-ns 5000000");
  REQUIRE_MESSAGE(rc == 0, out);
  const std::string ec = out.substr(0, out.find('\n'));
  CHECK(f.nic1.ec_count() == 1);  // persists after spinctl exited
  REQUIRE(f.wait_tracked(0, 1, 0));

  std::tie(rc, out) = spinctl(sock + "stats --json --pretty");
  CHECK(rc == 0);
  json s = json::parse(out);
  CHECK(find_ec(s, 1, "pp") != nullptr);
  // By default the same counters as the tables spin-emu prints at exit: one block per node, the
  // EC a row of its table.
  std::tie(rc, out) = spinctl(sock + "stats");
  CHECK(rc == 0);
  INFO(out);
  CHECK(out.find("nic host0 (rank 0)\n") == 0);
  const auto host1 = out.find("nic host1 (rank 1)\n");
  REQUIRE(host1 != std::string::npos);
  CHECK(out.find("  EC  name", host1) != std::string::npos);
  CHECK(out.find("\n   " + ec + "  pp ", host1) != std::string::npos);
  std::tie(rc, out) = spinctl(sock + "stats --pretty");  // --pretty indents JSON only
  CHECK(rc == 2);

  std::tie(rc, out) = spinctl(sock + "uninstall 1 " + ec);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(f.nic1.ec_count() == 0);

  std::tie(rc, out) = spinctl(sock + "uninstall host1 " + ec);
  CHECK(rc == 1);
  CHECK(out.find("not_found") != std::string::npos);
  std::tie(rc, out) = spinctl(sock + "uninstall host7 1");
  CHECK(rc == 1);
  CHECK(out.find("no node 'host7'") != std::string::npos);
  std::tie(rc, out) = spinctl("--socket /nonexistent/sock nodes");
  CHECK(rc == 1);

  std::tie(rc, out) = spinctl(sock + "stop");
  CHECK(rc == 0);
  for (int i = 0; i < 200 && f.stops == 0; ++i) std::this_thread::sleep_for(5ms);
  CHECK(f.stops == 1);
}

TEST_CASE("requests of different connections run in parallel and each gets its own replies") {
  fixture f;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      auto c = host::client::connect(f.path);
      if (!c) return;
      auto mem = c->alloc_memory(static_cast<std::uint32_t>(t % 2), 4096);
      if (!mem) return;
      for (int i = 0; i < 20; ++i)
        if (!c->nodes().ok()) return;
      if (c->free_memory(*mem).ok()) ++ok;
    });
  for (auto& t : threads) t.join();
  CHECK(ok == 4);
  CHECK(f.wait_tracked(0, 0, 0));
}

} // TEST_SUITE
