// spin-emu --virtual-time with host programs in other processes (docs/virtual-time.md, "Host
// programs in other processes"): four rank processes allreduce through the virtual-time
// cluster's NICs and switch with every algorithm; results are exact, and a second run, with
// both cores loaded by other processes, prints the same virtual times and the same statistics
// byte for byte. Also the protocol's refusals.
#include "../emulator/emu_process.hpp"
#include "rank_body.hpp"

#include <spin/coll/coll.hpp>
#include <spin/emu/topology.hpp>
#include <spin/sim/cluster.hpp>

#include <spin/host/host.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace spin;
using namespace spin::test;
using namespace std::chrono_literals;

namespace {

/// A child process running `args`, its stdout and stderr in `out`. Killed when it outlives the
/// object, and with the test (PR_SET_PDEATHSIG).
struct child {
  pid_t pid = -1;
  std::string out;
  int status = -1;
  child(std::vector<std::string> args, std::string out_file) : out(std::move(out_file)) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    const pid_t parent = ::getpid();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fd);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  /// Waits up to `limit` for the exit; true when it exited.
  bool wait(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (pid > 0) {
      int st = 0;
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        status = st;
        pid = -1;
        return true;
      }
      if (std::chrono::steady_clock::now() >= end) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }
  bool exited_ok() const { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  ~child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

/// A process that keeps one core busy: forked from this one, it stops by itself after 60 s and
/// dies with the test (PR_SET_PDEATHSIG); the destructor kills it. (Not a `timeout` wrapper
/// around a shell loop: killing the wrapper leaves the loop running.)
struct burner {
  pid_t pid = -1;
  burner() {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const auto end = std::chrono::steady_clock::now() + 60s;
      volatile std::uint64_t spins = 0;
      while (std::chrono::steady_clock::now() < end) spins = spins + 1;
      ::_exit(0);
    }
  }
  burner(const burner&) = delete;
  burner& operator=(const burner&) = delete;
  ~burner() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

const std::string topology = std::string(SPIN_SIM_TEST_DIR) + "/topologies/star4.toml";

/// spin-emu --virtual-time on the four-host star, its socket and statistics in `dir`.
std::unique_ptr<child> start_emu(const temp_dir& dir, const std::string& tag, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {SPIN_EMU_BIN, "--topology", topology, "--virtual-time", "--socket", dir.path + "/" + tag + ".sock",
                                   "--stats-json", dir.path + "/" + tag + ".json", "--duration", "600"};
  args.insert(args.end(), more.begin(), more.end());
  return std::make_unique<child>(args, dir.path + "/" + tag + ".log");
}

host::client connect_to(const std::string& socket, child& emu) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  std::string last;
  while (std::chrono::steady_clock::now() < end) {
    if (std::filesystem::exists(socket)) {
      auto c = host::client::connect(socket);
      if (c) return std::move(c.value());
      last = c.err().message;
    }
    if (emu.wait(0ms)) FAIL("spin-emu exited before its socket answered:\n" << read_file(emu.out));
    std::this_thread::sleep_for(50ms);
  }
  FAIL("spin-emu's socket " << socket << " did not answer: " << last << "\n" << read_file(emu.out));
  std::abort();
}

struct run_result {
  std::vector<std::string> lines;  // each rank's line
  std::string stats_json;
};

/// One run: spin-emu and four rank processes; `load` other processes keep both cores busy.
run_result run_job(const temp_dir& dir, const std::string& tag, bool load) {
  auto emu = start_emu(dir, tag);
  const std::string sock = dir.path + "/" + tag + ".sock";
  auto probe = connect_to(sock, *emu);
  CHECK(probe.virtual_time());
  std::vector<std::unique_ptr<burner>> burners;
  if (load)
    for (int i = 0; i < 2; ++i) burners.push_back(std::make_unique<burner>());
  std::vector<std::unique_ptr<child>> ranks;
  for (std::uint32_t r = 0; r < 4; ++r)
    ranks.push_back(std::make_unique<child>(
        std::vector<std::string>{SPIN_REMOTE_RANK_BIN, sock, std::to_string(r), "4", "4", "3000", "2"},
        dir.path + "/" + tag + "-rank" + std::to_string(r) + ".log"));
  run_result out;
  for (auto& r : ranks) {
    REQUIRE_MESSAGE(r->wait(300s), "a rank did not finish:\n" << read_file(r->out) << read_file(emu->out));
    CHECK_MESSAGE(r->exited_ok(), read_file(r->out));
    out.lines.push_back(read_file(r->out));
  }
  burners.clear();
  REQUIRE(probe.stop_emulator().ok());
  REQUIRE_MESSAGE(emu->wait(60s), read_file(emu->out));
  CHECK_MESSAGE(emu->exited_ok(), read_file(emu->out));
  out.stats_json = read_file(dir.path + "/" + tag + ".json");
  return out;
}

} // namespace

TEST_CASE("host programs of other processes drive spin-emu --virtual-time: exact results, the same timings under load") {
  temp_dir dir;
  const run_result a = run_job(dir, "quiet", false);
  for (std::uint32_t r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << a.lines[r]);
    CHECK(a.lines[r].rfind("rank " + std::to_string(r) + " ok switch ", 0) == 0);
    CHECK(a.lines[r].find(" edge_ring ") != std::string::npos);
    CHECK(a.lines[r].find(" host_ring ") != std::string::npos);
  }
  REQUIRE_FALSE(a.stats_json.empty());
  const run_result b = run_job(dir, "loaded", true);
  for (std::uint32_t r = 0; r < 4; ++r) CHECK(a.lines[r] == b.lines[r]);
  CHECK(a.stats_json == b.stats_json);
}

TEST_CASE("the same ranks as in-process actors of spin::sim take the same virtual time per call as over spin-emu --virtual-time") {
  temp_dir dir;
  const run_result remote = run_job(dir, "remote", false);
  auto t = emu::load_topology_file(topology);
  REQUIRE(t.ok());
  auto c = sim::cluster::create(*t);
  REQUIRE(c.ok());
  auto fab = coll::fabric::create(*t, (*c)->controls());
  REQUIRE(fab.ok());
  std::vector<std::uint32_t> ranks;
  for (std::uint32_t r = 0; r < 4; ++r) ranks.push_back((*c)->node(r).rank());
  std::vector<std::string> lines(4);
  for (std::uint32_t r = 0; r < 4; ++r)
    (*c)->spawn("rank" + std::to_string(r), [&, r] {
      const auto [g, o] = rank_group(ranks, r, fab->get());
      auto comm = coll::communicator::create((*c)->node(r), g, o);
      if (!comm) {
        lines[r] = "rank " + std::to_string(r) + ": " + comm.err().message;
        return;
      }
      bool ok = false;
      lines[r] = run_rank(**comm, r, 4, 3000, 2, ok) + "\n";
    });
  REQUIRE((*c)->run().ok());
  for (std::uint32_t r = 0; r < 4; ++r) {
    INFO("in-process: " << lines[r] << "over spin-emu: " << remote.lines[r]);
    CHECK(lines[r].find(" ok ") != std::string::npos);
    // Every call but the first switch call: it waits for every member's switch group set-up,
    // which a fabric over a connection (fabric::connect) does in other steps than an
    // in-process one (rank 0 measured 230453 ns there against 80453 ns here).
    auto calls = [](const std::string& l) {
      std::vector<std::string> out;
      std::istringstream in(l);
      std::string w;
      while (in >> w) out.push_back(w);
      return out;
    };
    const auto a = calls(lines[r]), b = calls(remote.lines[r]);
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() == 3 + 3 * 3);  // rank, its number, ok, and per algorithm its name and two calls
    for (std::size_t i = 0; i < a.size(); ++i)
      if (i != 4) CHECK(a[i] == b[i]);
  }
}

TEST_CASE("spin-emu --virtual-time refuses waits of connections that are not bound to a host node, and bad attaches") {
  temp_dir dir;
  auto emu = start_emu(dir, "refuse", {"--actors", "1", "--progress", "1"});
  const std::string sock = dir.path + "/refuse.sock";
  auto c = connect_to(sock, *emu);
  REQUIRE(c.virtual_time());
  // --progress names the host nodes whose programs have not come yet (time stands still).
  for (int i = 0; i < 500 && read_file(emu->out).find("waiting for the host programs of") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  CHECK_MESSAGE(read_file(emu->out).find("round 1, 0 host programs so far, waiting for the host programs of h0") != std::string::npos,
                read_file(emu->out));
  // A wait before attach: the simulation would not know this process waits.
  auto m = c.alloc_memory(0, 4096);
  REQUIRE(m.ok());
  auto s = c.sleep_for(0, 1us);
  REQUIRE_FALSE(s.ok());
  CHECK(s.err().code == errc::bad_state);
  auto raw = c.raw_request(R"({"id": 7, "op": "sleep", "node": 0, "ns": 1000})");
  REQUIRE(raw.ok());
  CHECK(raw.value().find("bad_state") != std::string::npos);
  CHECK(raw.value().find("attach") != std::string::npos);
  // Attach errors: no such node; twice on one connection.
  auto bad = c.attach(99);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.err().code == errc::not_found);
  auto sw = c.attach(4);  // the switch: attached, not bound (its process has no host node yet)
  REQUIRE(sw.ok());
  auto again = c.attach(0);
  REQUIRE_FALSE(again.ok());
  CHECK(again.err().code == errc::exists);
  // A second connection of this process binds it to host 0; then it may wait, and time moves.
  auto d = connect_to(sock, *emu);
  REQUIRE(d.attach(0).ok());
  const auto t0 = d.virtual_now();
  REQUIRE(d.sleep_for(0, 5us).ok());
  CHECK(d.virtual_now() - t0 == 5us);
  CHECK(c.virtual_now() == d.virtual_now());  // one clock per process and server
  REQUIRE(c.sleep_for(4, 1us).ok());          // the switch's connection joined the actor
  CHECK(d.virtual_now() - t0 == 6us);
  // A wait without end on an idle cluster: cut to request_scheduler::max_wait, not a stop.
  REQUIRE(d.sleep_for(0, std::chrono::nanoseconds::max()).ok());
  CHECK(d.virtual_now() - t0 == 6us + std::chrono::hours(24 * 100));
  REQUIRE(d.stop_emulator().ok());
  REQUIRE_MESSAGE(emu->wait(60s), read_file(emu->out));
}

TEST_CASE("a barrier of host programs in other processes: all go on at the virtual time the last came; a member that "
          "leaves ends it; bad member lists are refused") {
  temp_dir dir;
  auto emu = start_emu(dir, "barrier", {"--actors", "2"});
  const std::string sock = dir.path + "/barrier.sock";
  auto c = connect_to(sock, *emu);  // the socket answers before the child connects
  // Node 1's program, in a child process: it comes 30 us late to barrier 1, then leaves
  // without coming to barrier 2. It reports its virtual time after barrier 1 through a pipe.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t kid = ::fork();
  REQUIRE(kid >= 0);
  if (kid == 0) {
    ::close(p[0]);
    auto k = host::client::connect(sock);
    if (!k.ok() || !k.value().attach(1).ok() || !k.value().sleep_for(1, 30us).ok()) ::_exit(2);
    if (!k.value().barrier(1, {0, 1}, 1).ok()) ::_exit(3);
    const std::int64_t t = k.value().virtual_now().count();
    if (::write(p[1], &t, sizeof t) != static_cast<ssize_t>(sizeof t)) ::_exit(4);
    ::_exit(0);  // closes its connection: it leaves the round
  }
  ::close(p[1]);
  REQUIRE(c.attach(0).ok());
  // Refused member lists, checked before anything waits.
  for (const auto& [members, what] : std::vector<std::pair<std::vector<std::uint32_t>, std::string>>{
           {{1}, "own node"}, {{0, 0, 1}, "twice"}, {{0, 4}, "no host program"}, {{0, 2}, "no host program"}}) {
    auto r = c.barrier(0, members, 9);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().code == errc::invalid_argument);
    CHECK_MESSAGE(r.err().message.find(what) != std::string::npos, r.err().message);
  }
  REQUIRE(c.sleep_for(0, 10us).ok());
  REQUIRE(c.barrier(0, {1, 0}, 1).ok());  // any order of the members
  CHECK(c.virtual_now() == 30us);          // the time the last one came
  std::int64_t theirs = -1;
  REQUIRE(::read(p[0], &theirs, sizeof theirs) == static_cast<ssize_t>(sizeof theirs));
  ::close(p[0]);
  CHECK(theirs == c.virtual_now().count());
  // Barrier 2: its other member leaves instead (before or while this one waits).
  auto gone = c.barrier(0, {0, 1}, 2);
  REQUIRE_FALSE(gone.ok());
  CHECK(gone.err().code == errc::bad_state);
  CHECK_MESSAGE(gone.err().message.find("left") != std::string::npos, gone.err().message);
  int st = 0;
  REQUIRE(::waitpid(kid, &st, 0) == kid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  REQUIRE(c.stop_emulator().ok());
  REQUIRE_MESSAGE(emu->wait(60s), read_file(emu->out));
}

TEST_CASE("point-to-point envelopes of host programs in other processes: matched in MPI's order, received when their "
          "bytes have crossed the network; synchronous sends, probes, bad ids and lost peers") {
  // The model's times, from a cluster of the same topology and options.
  auto topo = emu::load_topology_file(topology);
  REQUIRE(topo.ok());
  auto model = sim::cluster::create(topo.value());
  REQUIRE(model.ok());
  auto way = [&](std::uint32_t from, std::uint32_t to, std::uint64_t bytes) {
    auto t = model.value()->transfer_time(from, to, bytes);
    REQUIRE(t.ok());
    return t.value();
  };
  auto ns = [](sim::picoseconds p) { return std::chrono::duration_cast<std::chrono::nanoseconds>(p); };

  temp_dir dir;
  auto emu = start_emu(dir, "p2p", {"--actors", "2"});
  const std::string sock = dir.path + "/p2p.sock";
  auto c = connect_to(sock, *emu);
  namespace proto = host::protocol;
  // Node 1's program, in a child: at 5 us it sends 100 bytes (bits 7), then 100000 bytes
  // (bits 8), then 10 bytes synchronously (bits 9, id 77) and waits for that; it reports its
  // virtual time after the wait through a pipe.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t kid = ::fork();
  REQUIRE(kid >= 0);
  if (kid == 0) {
    ::close(p[0]);
    auto k = host::client::connect(sock);
    if (!k.ok() || !k.value().attach(1).ok() || !k.value().sleep_for(1, 5us).ok()) ::_exit(2);
    auto& kc = k.value();
    if (!kc.p2p_send(1, 0, 7, 100).ok() || !kc.p2p_send(1, 0, 8, 100000).ok() || !kc.p2p_send(1, 0, 9, 10, 77).ok()) ::_exit(3);
    auto w = kc.p2p_wait(1, {77}, 1, 1s);
    if (!w.ok() || w.value().size() != 1 || w.value()[0].id != 77) ::_exit(4);
    const std::int64_t t = kc.virtual_now().count();
    if (::write(p[1], &t, sizeof t) != static_cast<ssize_t>(sizeof t)) ::_exit(5);
    ::_exit(0);
  }
  ::close(p[1]);
  REQUIRE(c.attach(0).ok());
  // Refusals before anything waits.
  auto bad_src = c.p2p_recv(0, 5, 2, 0, 0);
  REQUIRE_FALSE(bad_src.ok());
  CHECK(bad_src.err().code == errc::invalid_argument);
  auto bad_dest = c.p2p_send(0, 4, 0, 8);
  REQUIRE_FALSE(bad_dest.ok());
  CHECK(bad_dest.err().code == errc::invalid_argument);
  auto unknown = c.p2p_wait(0, {12345}, 1, 1s);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.err().code == errc::not_found);

  // Receive 1 takes bits 7 only (posted first); receive 2 takes anything from node 1.
  REQUIRE(c.p2p_recv(0, 1, 1, 7, 0).ok());
  REQUIRE(c.p2p_recv(0, 2, proto::any_source, 0, ~0ull).ok());
  auto dup = c.p2p_recv(0, 2, 1, 0, 0);
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.err().code == errc::exists);
  // A test finds nothing yet and takes no time.
  auto none = c.p2p_wait(0, {1, 2}, 1, 0ns);
  REQUIRE(none.ok());
  CHECK(none.value().empty());
  CHECK(c.virtual_now() == 0ns);

  // The bytes cross the network as packets (sim::cluster::send_host_traffic): no sooner than
  // the route alone takes (transfer_time; the NICs' PCIe and transmit costs come on top).
  const sim::picoseconds start = 5us;
  const auto lower = [&](std::uint64_t bytes) { return ns(start + way(1, 0, bytes).total()); };

  // Bits 7 arrives first and goes to receive 1.
  auto w1 = c.p2p_wait(0, {1, 2}, 1, 1s);
  REQUIRE(w1.ok());
  REQUIRE(w1.value().size() == 1);
  CHECK(w1.value()[0].id == 1);
  CHECK(w1.value()[0].source == 1);
  CHECK(w1.value()[0].match_bits == 7);
  CHECK(w1.value()[0].bytes == 100);
  CHECK(w1.value()[0].order == 0);
  const auto a1 = c.virtual_now();
  CHECK(a1 > lower(100));
  // Receive 2 gets bits 8, sent before bits 9: the 10-byte message's packet passes the
  // 100000-byte message's on the way, but its envelope does not (MPI's non-overtaking).
  auto w2 = c.p2p_wait(0, {2}, 1, 1s);
  REQUIRE(w2.ok());
  REQUIRE(w2.value().size() == 1);
  CHECK(w2.value()[0].match_bits == 8);
  CHECK(w2.value()[0].bytes == 100000);
  CHECK(w2.value()[0].order == 1);
  const auto a2 = c.virtual_now();
  CHECK(a2 > std::max(a1, lower(100000)));
  // A probe finds the synchronous message, which came with it, and leaves it for a receive.
  auto pr = c.p2p_probe(0, 1, 0, ~0ull, 1s);
  REQUIRE(pr.ok());
  REQUIRE(pr.value().has_value());
  CHECK(pr.value()->match_bits == 9);
  const auto a3 = c.virtual_now();
  CHECK(a3 == a2);
  REQUIRE(c.sleep_for(0, 2us).ok());  // the match comes later than the arrival
  REQUIRE(c.p2p_recv(0, 3, 1, 9, 0).ok());
  auto w3 = c.p2p_wait(0, {3}, 1, 0ns);
  REQUIRE(w3.ok());
  REQUIRE(w3.value().size() == 1);
  CHECK(w3.value()[0].bytes == 10);
  // The sender's synchronous send completes when word of the match came back. This program
  // waits in virtual time past that before it blocks on the pipe: blocked outside spin, it
  // would hold the simulation.
  REQUIRE(c.sleep_for(0, 10us).ok());
  std::int64_t theirs = -1;
  REQUIRE(::read(p[0], &theirs, sizeof theirs) == static_cast<ssize_t>(sizeof theirs));
  ::close(p[0]);
  CHECK(std::chrono::nanoseconds(theirs) > a3 + 2us + ns(way(0, 1, 0).total()));
  CHECK(std::chrono::nanoseconds(theirs) < a3 + 10us);
  // Nothing more comes from a program that left: the wait ends at its deadline.
  auto r4 = c.p2p_recv(0, 4, 1, 0, ~0ull);
  REQUIRE_MESSAGE(r4.ok(), (r4.ok() ? std::string() : r4.err().message));
  const auto before = c.virtual_now();
  auto never = c.p2p_wait(0, {4}, 1, 50us);
  REQUIRE_FALSE(never.ok());
  CHECK(never.err().code == errc::timeout);
  REQUIRE(c.sleep_for(0, 0ns).ok());  // an error reply carries no time
  CHECK(c.virtual_now() == before + 50us);
  int st = 0;
  REQUIRE(::waitpid(kid, &st, 0) == kid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  REQUIRE(c.stop_emulator().ok());
  REQUIRE_MESSAGE(emu->wait(60s), read_file(emu->out));
}

TEST_CASE("point-to-point envelopes keep the order of their sender when links reorder packets (MPI's non-overtaking)") {
  temp_dir dir;
  const std::string topo = dir.path + "/reorder.toml";
  {
    std::ofstream f(topo);
    f << "[defaults]\nrate_gbps = 100\nlatency_ns = 1000\nreorder = 0.3\nreorder_delay_ns = 50000\n"
         "[[host]]\nname = \"h0\"\n[[host]]\nname = \"h1\"\n[[switch]]\nname = \"s0\"\n"
         "[[link]]\na = \"h0\"\nb = \"s0\"\n[[link]]\na = \"h1\"\nb = \"s0\"\n";
  }
  const std::string sock = dir.path + "/reorder.sock";
  child emu({SPIN_EMU_BIN, "--topology", topo, "--virtual-time", "--socket", sock, "--duration", "600"}, dir.path + "/reorder.log");
  auto c = connect_to(sock, emu);
  const pid_t kid = ::fork();
  REQUIRE(kid >= 0);
  constexpr std::uint64_t messages = 21;
  if (kid == 0) {  // node 1: 1 MB, then 20 messages of 10 bytes; message i has match bits i
    auto k = host::client::connect(sock);
    if (!k.ok() || !k.value().attach(1).ok()) ::_exit(2);
    for (std::uint64_t i = 1; i <= messages; ++i)
      if (!k.value().p2p_send(1, 0, i, i == 1 ? 1000000 : 10).ok()) ::_exit(3);
    ::_exit(0);
  }
  REQUIRE(c.attach(0).ok());
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 1; i <= messages; ++i) {
    REQUIRE(c.p2p_recv(0, i, 1, 0, ~0ull).ok());
    ids.push_back(i);
  }
  auto w = c.p2p_wait(0, ids, messages, 1s);
  REQUIRE_MESSAGE(w.ok(), (w.ok() ? std::string() : w.err().message));
  REQUIRE(w.value().size() == messages);
  for (const auto& m : w.value()) CHECK(m.match_bits == m.id);  // receive i got the i-th message sent
  int st = 0;
  REQUIRE(::waitpid(kid, &st, 0) == kid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  REQUIRE(c.stop_emulator().ok());
  REQUIRE_MESSAGE(emu.wait(60s), read_file(emu.out));
}
