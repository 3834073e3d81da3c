// spin::coll::communicator: the host side of the collective protocol (docs/collectives.md).
#include <spin/coll/coll.hpp>
#include <spin/coll/engine.hpp>
#include <spin/coll/kernels.hpp>
#include <spin/coll/protocol.hpp>
#include <spin/rt/package.hpp>

#include "cmd_key.hpp"
#include "engine_ec.hpp"
#include "job_secret.hpp"
#include "nic_handle.hpp"
#include "repair_timer.hpp"


#include <algorithm>
#include <bit>
#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace spin::coll {

std::span<const std::byte> std_package_bytes();  // generated (scripts/embed-bytes)

namespace detail {
// The standard package, decoded once per process.
result<engine_package> standard_package() {
  static std::mutex m;
  static std::unique_ptr<result<engine_package>> cached;
  std::lock_guard<std::mutex> g(m);
  if (!cached) {
    const auto bytes = std_package_bytes();
    auto pkg = rt::decode_package(bytes);
    if (!pkg.ok()) {
      cached = std::make_unique<result<engine_package>>(fail(pkg.err().code, "coll.spkg: " + pkg.err().message));
    } else {
      engine_package e;
      e.bytes.assign(bytes.begin(), bytes.end());
      e.package = std::make_shared<const rt::package>(std::move(pkg.value()));
      cached = std::make_unique<result<engine_package>>(std::move(e));
    }
  }
  return *cached;
}
} // namespace detail

namespace {
using clock = std::chrono::steady_clock;
namespace pr = proto;

// Arena layout: a control area, two staging buffers, then what alloc() hands out.
constexpr std::size_t members_off = 64;     // after the command key (proto::cmd_key_off, 16 bytes)
constexpr std::size_t desc_off = 4096;       // two start_desc slots, by epoch parity
constexpr std::size_t counters_off = 6144;   // engine_counters (cmd_stats)
constexpr std::size_t cmd_off = 8192;        // command slots, used in turn
constexpr std::size_t cmd_slots = 16;
constexpr std::size_t ctl_bytes = 64 * 1024;

static_assert(pr::cmd_key_off + 16 <= members_off && members_off + pr::max_ranks * sizeof(std::uint32_t) <= desc_off);
static_assert(desc_off + 2 * sizeof(pr::start_desc) <= counters_off);
static_assert(counters_off + sizeof(pr::engine_counters) <= cmd_off);
static_assert(cmd_off + cmd_slots * 64 <= ctl_bytes && sizeof(pr::cmd) <= 64);

// Groups in use per NIC in this process (by NIC key): two communicators of one group id on
// one NIC would share match bits, and the first installed EC would take the other's packets.
std::mutex groups_mutex;
std::set<std::pair<std::string, std::uint32_t>> groups_in_use;

error describe_mismatch(std::uint32_t detail) {
  const auto f = static_cast<pr::field>(detail >> 16);
  return fail(errc::invalid_argument, std::string("ranks disagree on the ") + pr::field_name(f) + ": rank " +
                                          std::to_string(detail & 0xffffu) + " differs from rank 0");
}

} // namespace

const char* name(algorithm a) {
  switch (a) {
  case algorithm::automatic: return "automatic";
  case algorithm::edge_ring: return "edge_ring";
  case algorithm::switch_agg: return "switch";
  case algorithm::host_ring: return "host_ring";
  }
  return "?";
}

std::uint32_t elem_bytes(dtype t) {
  std::uint32_t n = 0;
  with_standard(op::sum, t, [&]<class R>() { n = sizeof(typename R::elem); });
  return n;
}

namespace {
// What a collective reduces with: which engine (slot), the wire ids, the kernels.
struct op_spec {
  std::uint32_t slot = 0;
  std::uint8_t op = 0;
  std::uint8_t dtype = 0;
  std::uint32_t reduction_id = 0;
  kernels k;
};

// FNV-1a, 32 bits: the id of a reduction's name (0 is kept for the standard package).
std::uint32_t name_hash(const std::string& s) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h == 0 ? 1 : h;
}
} // namespace

struct communicator::impl {
  // One installed collective engine: slot 0 the standard package, 1..15 user reductions.
  struct engine_ec {
    std::uint32_t wire_id = 0;  // group id << 4 | slot
    rt::ec_id ec = 0;
    bool installed = false;
    std::uint32_t epoch = 0;
    std::string name;
    bool joined = false;  // holds a fabric membership
    fabric::lease lease;  // switch slots of this engine's group (none: lease.reason says why)
  };

  std::unique_ptr<detail::nic_handle> nic;
  group g;
  options o;
  std::uint32_t base_id = 0;  // group id << 4
  std::unique_ptr<detail::nic_memory> arena_mem;  // registered with the NIC
  std::byte* arena = nullptr;
  detail::cmd_key key;  // signs every command (protocol.hpp, cmd_key_off); in the arena at 0
  std::size_t arena_bytes = 0;
  rt::region_id region = 0;
  std::vector<engine_ec> engines;
  std::uint64_t next_msg = 1ull << 62;  // message ids of host commands
  std::uint32_t next_slot = 0;
  bool broken = false;
  std::string broken_why;
  comm_stats st;
  detail::repair_timer rto{{}, {}, {}};  // set by create
  std::map<std::size_t, std::size_t> free_list;  // offset -> bytes
  std::map<std::size_t, std::size_t> used;
  bool group_claimed = false;

  explicit impl(std::unique_ptr<detail::nic_handle> n) : nic(std::move(n)) {}
  ~impl() {
    for (auto& e : engines) {
      if (e.installed) (void)nic->uninstall(e.ec);
      if (e.joined) o.switches->leave(e.wire_id, g.me);
    }
    if (group_claimed) {
      std::lock_guard<std::mutex> l(groups_mutex);
      groups_in_use.erase({nic->key(), base_id});
    }
    arena_mem.reset();  // before the NIC handle: unregisters through it
  }

  std::uint32_t n() const { return static_cast<std::uint32_t>(g.members.size()); }
  std::size_t staging_in() const { return ctl_bytes; }
  std::size_t staging_out() const { return ctl_bytes + o.staging_bytes; }
  std::size_t heap_off() const { return ctl_bytes + 2 * o.staging_bytes; }

  result<void> send_cmd(const engine_ec& e, pr::cmd c) {
    const std::size_t off = cmd_off + (next_slot++ % cmd_slots) * 64;
    key.sign(c);
    std::memcpy(arena + off, &c, sizeof(c));
    host::message m;
    m.dest_rank = nic->rank();
    m.match_bits = pr::match_bits(e.wire_id, pr::k_cmd);
    m.message_id = next_msg++;
    m.region = region;
    m.offset_bytes = off;
    m.len_bytes = sizeof(c);
    // Posted, not waited for (the NIC copies the 64-byte command when it queues it): a call
    // waits once, for the engine's answer, not also for the command's frame. A NIC handle that sends
    // and waits instead (a NIC in another process) may find its transmit queue full for a while
    // on a loaded machine: try again until the collective's own timeout.
    static_assert(sizeof(c) <= host::post_inline_bytes);
    const auto deadline = nic->now() + o.timeout;
    for (;;) {
      auto r = nic->post(m);
      if (r.ok() || r.err().code != errc::timeout || nic->now() >= deadline) return r;
    }
  }

  // Waits for a host event of engine `e` for which `want` returns true; `tick` runs every
  // repair interval (the repair timer's).
  template <class Want, class Tick>
  result<std::uint64_t> wait(const engine_ec& e, clock::time_point deadline, Want want, Tick tick, const std::string& what) {
    std::array<rt::host_event, 32> evs;
    auto next_tick = nic->now() + rto.interval();
    std::size_t got = nic->poll_events(e.ec, evs);
    for (;;) {
      // Every event goes to `want` (it may record those it does not wait for); the first it
      // accepts is returned once the batch is through.
      std::optional<std::uint64_t> hit;
      for (std::size_t i = 0; i < got; ++i) {
        const rt::host_event& ev = evs[i];
        if (ev.type == rt::host_event::kind::error)
          return fail(errc::fault, what + ": the collective engine's " +
                                       std::string(rt::to_string(static_cast<handler_kind>(ev.value))) + " handler failed (" +
                                       errc_name(ev.code) + ")");
        if (want(ev.value) && !hit) hit = ev.value;
      }
      if (hit) return *hit;
      const auto now = nic->now();
      if (now >= deadline)
        return fail(errc::timeout, what + " did not finish within " + std::to_string(o.timeout.count()) + " ms (rank " +
                                       std::to_string(g.me) + ", epoch " + std::to_string(e.epoch) + ")");
      if (now >= next_tick) {
        if (auto r = tick(); !r.ok()) return r.err();
        next_tick = now + rto.interval();
      }
      // Wait until the NIC posts an event (16 polls that yield the core, then a futex the NIC
      // wakes), the next repair tick or the deadline: a waiting rank uses almost no CPU.
      got = nic->wait_events(e.ec, evs, std::min(next_tick, deadline) - now);
    }
  }

  // Installs an engine from `pkg` in `slot` and tells it the members.
  result<void> install_engine(const engine_package& pkg, std::uint32_t slot, const std::string& what) {
    engine_ec e;
    e.wire_id = base_id | slot;
    e.name = what;
    rt::ec_config cfg;
    cfg.name = "coll." + std::to_string(g.id) + "." + what + ".rank" + std::to_string(g.me);
    detail::configure_engine_ec(cfg, e.wire_id, 1024);
    if (auto r = rt::raise_to_declared(pkg.package->manifest, cfg.name, cfg.handler_mem_bytes, cfg.scratchpad_bytes); !r.ok())
      return r.err();
    if (cfg.handler_mem_bytes < engine_state_bytes || cfg.scratchpad_bytes < pr::scratch_bytes)
      return fail(errc::invalid_argument, what + ": the package is not a collective engine of this version (it declares " +
                                              std::to_string(cfg.handler_mem_bytes) + " bytes of handler memory, the engine needs " +
                                              std::to_string(engine_state_bytes) + ")");
    cfg.window = rt::host_window{region, 0, arena_bytes};
    if (o.authenticate_frames) cfg.frame_key = detail::group_frame_key(o.job_secret, e.wire_id);
    auto ec = nic->install(pkg, cfg);
    if (!ec.ok() && ec.err().code == errc::no_memory) {
      std::size_t on_nic = 0;
      {
        std::lock_guard<std::mutex> l(groups_mutex);
        for (const auto& [key, id] : groups_in_use) on_nic += key == nic->key();
      }
      return fail(errc::no_memory, what + ": NIC " + nic->name() + " has no NIC memory left for another collective engine (" +
                                       std::to_string(on_nic - 1) + " communicators hold engines there already, each " +
                                       std::to_string((cfg.handler_mem_bytes + cfg.limits.max_messages * pr::scratch_bytes + 1023) / 1024) +
                                       " KiB; spin-emu --nic-memory-mib raises the NIC's memory): " + ec.err().message);
    }
    if (!ec.ok()) return fail(ec.err().code, what + ": installing the collective engine: " + ec.err().message);
    e.ec = ec.value();
    e.installed = true;
    engines.push_back(e);
    auto* table = reinterpret_cast<std::uint32_t*>(arena + members_off);
    for (std::size_t i = 0; i < g.members.size(); ++i) table[i] = g.members[i];
    pr::cmd c{};
    c.type = pr::cmd_setup;
    c.me = g.me;
    c.nranks = n();
    c.desc_off = members_off;
    if (auto r = send_cmd(engines.back(), c); !r.ok()) return r;
    auto ev = wait(
        engines.back(), nic->now() + o.timeout, [](std::uint64_t v) { return pr::event_type_of(v) == pr::ev_setup; },
        [] { return result<void>(); }, what + " set-up");
    if (!ev.ok()) return ev.err();
    if (pr::event_detail_of(ev.value()) != 0) return fail(errc::invalid_argument, what + " set-up: the NIC refused the member table");
    if (o.switches != nullptr) {
      engine_ec& me = engines.back();
      auto l = o.switches->join(me.wire_id, g.members, g.me, o.switch_slots, o.packet_bytes, o.switch_wait, pkg, o.job_secret,
                                  o.authenticate_frames);
      if (!l.ok()) return l.err();
      me.joined = true;
      me.lease = l.value();
      if (me.lease.slots == 0) say("group " + std::to_string(g.id) + " (" + what + ") runs without switch aggregation: " + me.lease.reason);
    }
    return {};
  }

  void say(const std::string& line) const {
    if (o.log != nullptr) o.log(line);
    else std::fprintf(stderr, "spin::coll: %s\n", line.c_str());
  }

  // Offset of [p, p + bytes) in the arena's allocatable part, or npos.
  static constexpr std::size_t npos = ~std::size_t{0};
  std::size_t arena_offset(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(arena), x = reinterpret_cast<std::uintptr_t>(p);
    if (p == nullptr || x < a + heap_off() || x - a > arena_bytes || bytes > arena_bytes - (x - a)) return npos;
    return x - a;
  }

  // One epoch: start it on the NIC and wait until this rank's part is done.
  // Writes epoch e.epoch + 1's start descriptor and starts it on the NIC.
  result<void> epoch_start(engine_ec& e, const pr::params& p, const pr::buffer_desc& in, const pr::buffer_desc& out,
                           std::uint32_t switch_rank, std::uint64_t recv_off) {
    ++e.epoch;
    ++st.epochs;
    pr::start_desc d{};
    d.p = p;
    d.in = in;
    d.out = out;
    d.window = o.window_packets;
    d.recovery = o.recovery ? 1 : 0;
    d.switch_rank = switch_rank;
    d.recv_off = recv_off;
    const std::size_t doff = desc_off + (e.epoch & 1) * sizeof(pr::start_desc);
    std::memcpy(arena + doff, &d, sizeof(d));
    pr::cmd c{};
    c.type = pr::cmd_start;
    c.epoch = e.epoch;
    c.desc_off = doff;
    return send_cmd(e, c);
  }

  result<void> repair_tick(engine_ec& e) {
    if (!o.recovery) return {};
    ++st.repair_ticks;
    pr::cmd t{};
    t.type = pr::cmd_repair;
    t.epoch = e.epoch;
    return send_cmd(e, t);
  }

  static error refused(const char* what, std::uint64_t v) {
    if (pr::event_type_of(v) == pr::ev_mismatch) return describe_mismatch(pr::event_detail_of(v));
    return fail(errc::invalid_argument, std::string(what) + ": the NIC refused the start descriptor (reason " +
                                            std::to_string(pr::event_detail_of(v)) + ")");
  }

  // One epoch of host_ring: the host folds each chunk; its NIC only moves chunks reliably
  // (docs/collectives.md, "Host ring"). The steps are the edge ring's, so are the bits.
  result<void> host_ring_epoch(engine_ec& e, const pr::params& p, const pr::buffer_desc& in, const pr::buffer_desc& out,
                               const op_spec& s, std::size_t recv_off, const char* what) {
    if (auto r = epoch_start(e, p, in, out, 0, recv_off); !r.ok()) return r;
    const std::uint32_t k = e.epoch, nr = n(), me = g.me, eb = s.k.elem_bytes, ab = s.k.acc_bytes;
    const auto deadline = nic->now() + o.timeout;
    std::set<std::uint32_t> recv, sent;  // phase << 16 | chunk
    std::optional<std::uint64_t> bad;
    auto record = [&](std::uint64_t v) {
      if (pr::event_epoch_of(v) != k) return false;
      switch (pr::event_type_of(v)) {
      case pr::ev_recv: recv.insert(pr::event_detail_of(v)); return true;
      case pr::ev_sent: sent.insert(pr::event_detail_of(v)); return true;
      case pr::ev_go: return true;
      case pr::ev_mismatch:
      case pr::ev_error: bad = v; return true;
      default: return false;
      }
    };
    auto tick = [&] { return repair_tick(e); };
    bool go = false;
    auto wait_until = [&](auto cond) -> result<void> {
      while (!cond() && !bad) {
        auto ev = wait(e, deadline, [&](std::uint64_t v) {
          const bool mine = record(v);
          if (pr::event_type_of(v) == pr::ev_go && pr::event_epoch_of(v) == k) go = true;
          return mine;
        }, tick, what);
        if (!ev.ok()) return ev.err();
      }
      if (bad) return refused(what, *bad);
      return {};
    };
    if (auto r = wait_until([&] { return go; }); !r.ok()) return r;

    const pr::ring_geom geo = pr::ring_geom::make(p.count, nr, p.pkt_elems);
    auto key = [](std::uint32_t phase, std::uint64_t c) { return static_cast<std::uint32_t>(phase << 16 | c); };
    std::optional<std::uint32_t> pending;  // the transfer in flight
    auto transfer = [&](std::uint32_t phase, std::uint64_t c, std::uint64_t off) -> result<void> {
      if (pending)
        if (auto r = wait_until([&] { return sent.count(*pending) != 0; }); !r.ok()) return r;
      pr::cmd x{};
      x.type = pr::cmd_xfer;
      x.epoch = k;
      x.phase = phase;
      x.chunk = static_cast<std::uint32_t>(c);
      x.desc_off = off;
      pending = key(phase, c);
      return send_cmd(e, x);
    };
    auto in_at = [&](std::uint64_t elem) { return arena + in.off + elem * eb; };
    auto out_at = [&](std::uint64_t elem) { return arena + out.off + elem * eb; };
    auto recv_at = [&](std::uint64_t elem) { return arena + recv_off + elem * ab; };
    auto for_chunk = [&](std::uint64_t c, auto f) {  // f(first element, elements) in pieces
      const std::uint64_t lo = geo.chunk_lo(c), len = geo.chunk_len(c);
      for (std::uint64_t i = 0; i < len; i += 65536) f(lo + i, static_cast<std::uint32_t>(std::min<std::uint64_t>(65536, len - i)));
    };
    // Reduce-scatter: chunk c leaves rank c+1 and is folded up to its owner c.
    const std::uint64_t first = (me + nr - 1) % nr;
    for_chunk(first, [&](std::uint64_t at, std::uint32_t m) { s.k.widen(recv_at(at), in_at(at), m); });
    nic->charge_host(host::work::copy, geo.chunk_len(first) * eb);
    if (auto r = transfer(pr::xfer_rs, first, recv_off + geo.chunk_lo(first) * ab); !r.ok()) return r;
    for (std::uint32_t step = 1; step < nr; ++step) {
      const std::uint64_t c = (me + 2 * nr - 1 - step) % nr;
      // A chunk without packets (fewer elements than ranks) never arrives: nothing to wait for.
      if (auto r = wait_until([&] { return geo.chunk_packets(c) == 0 || recv.count(key(pr::xfer_rs, c)) != 0; }); !r.ok())
        return r;
      for_chunk(c, [&](std::uint64_t at, std::uint32_t m) { s.k.fold(recv_at(at), in_at(at), m); });
      nic->charge_host(host::work::reduce, geo.chunk_len(c) * eb);
      if (step + 1 < nr) {
        if (auto r = transfer(pr::xfer_rs, c, recv_off + geo.chunk_lo(c) * ab); !r.ok()) return r;
      } else {  // c == me: round once, then start the allgather
        for_chunk(c, [&](std::uint64_t at, std::uint32_t m) { s.k.narrow(out_at(at), recv_at(at), m); });
        nic->charge_host(host::work::copy, geo.chunk_len(c) * eb);
        if (auto r = transfer(pr::xfer_ag, c, out.off + geo.chunk_lo(c) * eb); !r.ok()) return r;
      }
    }
    // Allgather: chunk c leaves its owner and stops at the owner's predecessor.
    for (std::uint32_t step = 1; step < nr; ++step) {
      const std::uint64_t c = (me + nr - step) % nr;
      if (auto r = wait_until([&] { return geo.chunk_packets(c) == 0 || recv.count(key(pr::xfer_ag, c)) != 0; }); !r.ok())
        return r;
      if ((me + 1) % nr != c)
        if (auto r = transfer(pr::xfer_ag, c, out.off + geo.chunk_lo(c) * eb); !r.ok()) return r;
    }
    if (pending)
      if (auto r = wait_until([&] { return sent.count(*pending) != 0; }); !r.ok()) return r;
    return {};
  }

  result<void> epoch_run(engine_ec& e, const pr::params& p, const pr::buffer_desc& in, const pr::buffer_desc& out,
                         const char* what, std::uint32_t switch_rank) {
    const auto t0 = nic->now();
    if (auto r = epoch_start(e, p, in, out, switch_rank, 0); !r.ok()) return r;
    const std::uint32_t k = e.epoch;
    auto ev = wait(
        e, nic->now() + o.timeout,
        [&](std::uint64_t v) {
          const std::uint32_t ty = pr::event_type_of(v);
          return pr::event_epoch_of(v) == k && (ty == pr::ev_done || ty == pr::ev_mismatch || ty == pr::ev_error);
        },
        [&] { return repair_tick(e); }, what);
    if (!ev.ok()) return ev.err();
    if (pr::event_type_of(ev.value()) != pr::ev_done) return refused(what, ev.value());
    // The repair timer: a round-trip sample from an epoch no tick repaired; after one that a tick
    // repaired, no sample (Karn's rule: its time includes the wait for the tick) but back-off.
    const std::uint32_t done = pr::event_detail_of(ev.value());
    if (!o.recovery) return {};
    if (pr::done_repaired(done)) {
      ++st.repaired_epochs;
      rto.back_off();
    } else {
      rto.sample(detail::repair_timer::epoch_sample(nic->now() - t0, pr::done_packets(done), o.window_packets));
    }
    return {};
  }

  // Elements in one epoch of a collective of `kind` whose elements and accumulators take eb and
  // ab bytes. Every rank cuts the same epochs: they depend on options only, never on the
  // buffers, nor on the algorithm (the ring's packets are the smaller), so that every algorithm
  // combines an element in the same order (docs/collectives.md, "Combination order").
  std::uint64_t epoch_elems(pr::coll_kind kind, std::uint32_t eb, std::uint32_t ab) const {
    const std::uint32_t nr = n();
    const std::uint32_t ring_pkt_elems = o.packet_bytes / std::max(eb, ab);
    const std::uint32_t chunks = kind == pr::coll_kind::broadcast ? 1 : nr;
    std::uint64_t seg = std::min<std::uint64_t>(std::uint64_t{pr::max_packets - chunks} * ring_pkt_elems, o.staging_bytes / eb);
    if (kind == pr::coll_kind::reduce_scatter || kind == pr::coll_kind::allgather) seg /= nr;
    return std::max<std::uint64_t>(seg, 1);
  }

  result<op_spec> standard(dtype t, op o_, const char* what) const {
    op_spec s;
    if (!with_standard(o_, t, [&]<class R>() { s.k = kernels_of<R>(); }))
      return fail(errc::invalid_argument, std::string(what) + ": no standard reduction " + name(o_) + " over " + name(t));
    s.op = static_cast<std::uint8_t>(o_);
    s.dtype = static_cast<std::uint8_t>(t);
    return s;
  }
  result<op_spec> custom(const custom_op& r, const char* what) const {
    if (r.slot == 0 || r.slot >= engines.size() || r.elem_bytes == 0)
      return fail(errc::invalid_argument, std::string(what) + ": not a reduction added to this communicator");
    op_spec s;
    s.slot = r.slot;
    s.op = static_cast<std::uint8_t>(op::custom);
    s.dtype = static_cast<std::uint8_t>(dtype::custom);
    s.reduction_id = r.id;
    s.k = custom_kernels[r.slot];
    return s;
  }
  std::vector<kernels> custom_kernels = std::vector<kernels>(16);
  std::span<std::byte> host_ring_area;  // host_ring's partial sums, from the arena

  std::span<std::byte> alloc_span(std::size_t bytes) {
    const std::size_t want = (std::max<std::size_t>(bytes, 1) + 63) & ~std::size_t{63};
    for (auto it = free_list.begin(); it != free_list.end(); ++it) {
      if (it->second < want) continue;
      const std::size_t off = it->first, len = it->second;
      free_list.erase(it);
      if (len > want) free_list[off + want] = len - want;
      used[off] = want;
      return {arena + off, bytes};
    }
    return {};
  }
  void release_span(std::span<std::byte> buffer) {
    if (buffer.data() == nullptr) return;
    const std::size_t off = static_cast<std::size_t>(buffer.data() - arena);
    auto it = used.find(off);
    if (it == used.end()) return;
    std::size_t start = off, len = it->second;
    used.erase(it);
    auto next = free_list.lower_bound(start);
    if (next != free_list.end() && start + len == next->first) {
      len += next->second;
      next = free_list.erase(next);
    }
    if (next != free_list.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_list.erase(prev);
      }
    }
    free_list[start] = len;
  }

  // The collective as a series of epochs. Units: allreduce and broadcast cut the vector;
  // reduce-scatter and allgather cut every block the same way.
  result<void> collective(pr::coll_kind kind, const void* in, void* out, std::uint64_t count, const op_spec& s,
                          std::uint32_t root, algorithm a, const char* what) {
    if (broken) return fail(errc::bad_state, std::string(what) + ": communicator is broken by an earlier failure: " + broken_why);
    engine_ec& e = engines[s.slot];
    if (a == algorithm::automatic)
      a = kind != pr::coll_kind::reduce_scatter && e.lease.slots > 0 ? algorithm::switch_agg : algorithm::edge_ring;
    if (a == algorithm::switch_agg) {
      if (kind == pr::coll_kind::reduce_scatter)
        return fail(errc::not_supported, std::string(what) + ": the switch runs allreduce, allgather and broadcast, not reduce-scatter");
      if (e.lease.slots == 0)
        return fail(errc::not_supported, std::string(what) + ": no switch slots: " +
                                             (o.switches == nullptr ? std::string("the communicator has no fabric") : e.lease.reason));
    } else if (a == algorithm::host_ring) {
      if (kind != pr::coll_kind::allreduce)
        return fail(errc::not_supported, std::string(what) + ": host_ring runs allreduce only");
    } else if (a != algorithm::edge_ring) {
      return fail(errc::invalid_argument, std::string(what) + ": unknown algorithm");
    }
    const bool via_switch = a == algorithm::switch_agg, via_host = a == algorithm::host_ring;
    // Sparse windows travel in the bytes their form takes: the NICs and the switch add them,
    // host_ring's hosts do not (its transfers carry whole elements).
    const bool packed = s.op != static_cast<std::uint8_t>(op::custom) && compact_type(static_cast<dtype>(s.dtype));
    if (packed && (kind != pr::coll_kind::allreduce || via_host))
      return fail(errc::not_supported, std::string(what) + ": sparse windows (" + name(static_cast<dtype>(s.dtype)) +
                                           ") are reduced by allreduce on edge_ring or the switch only");
    // Through a two-level tree, reductions whose result no order changes go to this rank's
    // leaf first (integers, min, max); the others to the root, whose fixed order gives the
    // edge ring's bits (docs/collectives.md, "Hierarchies").
    // Block formats are not: a leaf's partial is encoded once more, and the scale it chooses
    // can round values that the flat reduction keeps.
    const bool block_format = s.op != static_cast<std::uint8_t>(op::custom) && block_values(static_cast<dtype>(s.dtype)) > 1;
    const bool order_free = !block_format &&
                            (s.op == static_cast<std::uint8_t>(op::min) || s.op == static_cast<std::uint8_t>(op::max) ||
                             (s.op != static_cast<std::uint8_t>(op::custom) &&
                              (s.dtype == static_cast<std::uint8_t>(dtype::i32) || s.dtype == static_cast<std::uint8_t>(dtype::i64) ||
                               s.dtype == static_cast<std::uint8_t>(dtype::u32) || s.dtype == static_cast<std::uint8_t>(dtype::u64))));
    const std::uint32_t switch_rank = !via_switch ? 0
                                      : kind == pr::coll_kind::allreduce && order_free && !e.lease.leaf_rank.empty()
                                          ? e.lease.leaf_rank[g.me]
                                          : e.lease.switch_rank;
    const bool blocks = kind == pr::coll_kind::reduce_scatter || kind == pr::coll_kind::allgather;
    const std::uint32_t nr = n(), eb = s.k.elem_bytes, ab = s.k.acc_bytes;
    if (root >= nr) return fail(errc::invalid_argument, std::string(what) + ": root " + std::to_string(root) + " is not a rank");
    if (count > (std::uint64_t{1} << 40) / (blocks ? nr : 1))
      return fail(errc::invalid_argument, std::string(what) + ": count above 2^40 elements");
    const std::uint64_t in_elems = kind == pr::coll_kind::reduce_scatter ? count * nr : count;
    const std::uint64_t out_elems = kind == pr::coll_kind::allgather ? count * nr : count;
    const bool reads_in = kind != pr::coll_kind::broadcast || g.me == root;
    if (count != 0 && ((reads_in && in == nullptr) || out == nullptr))
      return fail(errc::invalid_argument, std::string(what) + ": null buffer");
    // In place, as NCCL defines it: the same buffer (allreduce, broadcast); allgather's input is
    // this rank's block of the output; reduce-scatter's output is this rank's block of the input.
    const auto* inb = static_cast<const std::byte*>(in);
    const auto* outb = static_cast<const std::byte*>(out);
    const bool in_place = kind == pr::coll_kind::allgather        ? inb == outb + std::uint64_t{g.me} * count * eb
                          : kind == pr::coll_kind::reduce_scatter ? outb == inb + std::uint64_t{g.me} * count * eb
                                                                  : in == out;
    if (reads_in && count != 0 && !in_place && overlaps_ranges(in, in_elems * eb, out, out_elems * eb))
      return fail(errc::invalid_argument, std::string(what) +
                                              ": input and output overlap without being in place (allgather: the input is this "
                                              "rank's block of the output; reduce-scatter: the output is this rank's block of the input)");
    // A packet carries whole elements and, on the rings, whole accumulators: a block format's
    // are 17 to 128 bytes, more than the smallest packets hold.
    if (std::max(eb, ab) > o.packet_bytes)
      return fail(errc::invalid_argument, std::string(what) + ": an element of " + name(static_cast<dtype>(s.dtype)) + " needs " +
                                              std::to_string(std::max(eb, ab)) + " bytes of packet (element " + std::to_string(eb) +
                                              ", accumulator " + std::to_string(ab) + "); options::packet_bytes is " +
                                              std::to_string(o.packet_bytes));
    if (packed && count != 0) {
      // The NICs trust their host's windows (those from the network they check): a malformed
      // one is refused here, before any is sent.
      for (std::uint64_t w = 0; w < count; ++w) {
        const auto* win = reinterpret_cast<const std::uint8_t*>(in) + w * eb;
        if (!compact_elem_ok(static_cast<dtype>(s.dtype), win))
          return fail(errc::invalid_argument, std::string(what) + ": window " + std::to_string(w) + " of " +
                                                  name(static_cast<dtype>(s.dtype)) +
                                                  " is malformed (spin/coll/sparse.hpp: form, count, ascending offsets below " +
                                                  std::to_string(sparse::window_values) + " (a span's: below " +
                                                  std::to_string(sparse::span_values_max) + "), MX windows: each in a listed block)");
      }
    }
    if (nr == 1) return local(kind, in, out, count, s);

    // Packets carry elements, and on the rings also accumulators (reduce-scatter's partial
    // sums): a packet holds as many of the larger as fit. Through the switch only elements
    // travel; the switch combines a packet in parts whose accumulators fit its scratchpad.
    const std::uint32_t ring_pkt_elems = o.packet_bytes / std::max(eb, ab);
    // A sparse window travels alone in its packet, in the bytes its form takes.
    const std::uint32_t pkt_elems = packed ? 1 : via_switch ? o.packet_bytes / eb : ring_pkt_elems;
    std::uint64_t seg = epoch_elems(kind, eb, ab);  // the same on every rank: "Combination order"
    const std::size_t in_arena = reads_in ? arena_offset(in, in_elems * eb) : npos;
    const std::size_t out_arena = arena_offset(out, out_elems * eb);
    pr::params p{};
    p.kind = static_cast<std::uint8_t>(kind);
    p.op = s.op;
    p.dtype = s.dtype;
    p.algo = static_cast<std::uint8_t>(via_switch ? pr::algo::switch_agg : via_host ? pr::algo::host_ring : pr::algo::edge_ring);
    std::size_t recv_off = 0;
    if (via_host && count > 0) {  // where reduce-scatter partials land
      const std::size_t want = static_cast<std::size_t>(seg * ab);
      if (host_ring_area.size() < want) {
        if (!host_ring_area.empty()) release_span(host_ring_area);
        host_ring_area = alloc_span(want);
        if (host_ring_area.size() < want)
          return fail(errc::no_memory, std::string(what) + ": the arena cannot hold host_ring's " + std::to_string(want) +
                                           " bytes of partial sums");
      }
      recv_off = static_cast<std::size_t>(host_ring_area.data() - arena);
    }
    p.slots = via_switch ? e.lease.slots : 0;
    p.nranks = nr;
    p.total_count = blocks ? count * nr : count;  // the units of p.count
    p.elem_bytes = eb;
    p.acc_bytes = ab;
    p.pkt_elems = pkt_elems;
    p.reduction_id = s.reduction_id;
    p.root = root;
    std::uint64_t done = 0;
    do {  // count 0 still runs one epoch: every rank learns whether the others agree
      const std::uint64_t m = std::min(seg, count - done);
      p.count = blocks ? m * nr : m;
      const std::uint64_t at = done * eb, mb = m * eb;
      pr::buffer_desc bi{}, bo{};
      // Input.
      if (kind == pr::coll_kind::reduce_scatter) {
        bi.blocked = 1;
        if (in_arena != npos) {
          bi.off = in_arena + at;
          bi.stride = count * eb;
        } else {
          bi.off = staging_in();
          bi.stride = mb;
          for (std::uint32_t c = 0; c < nr && mb > 0; ++c)  // count 0 may come with null buffers
            std::memcpy(arena + bi.off + c * mb, static_cast<const std::byte*>(in) + c * count * eb + at, mb);
          st.staged_bytes += mb * nr;
          nic->charge_host(host::work::copy, mb * nr);
        }
      } else if (kind == pr::coll_kind::allgather) {
        bi.blocked = 1;  // this rank's block only
        bi.stride = 0;
        bi.off = in_arena != npos ? in_arena + at : staging_in();
        if (in_arena == npos && mb > 0) {
          std::memcpy(arena + bi.off, static_cast<const std::byte*>(in) + at, mb);
          st.staged_bytes += mb;
          nic->charge_host(host::work::copy, mb);
        }
      } else {
        bi.off = in_arena != npos ? in_arena + at : staging_in();
        if (reads_in && in_arena == npos && mb > 0) {
          std::memcpy(arena + bi.off, static_cast<const std::byte*>(in) + at, mb);
          st.staged_bytes += mb;
          nic->charge_host(host::work::copy, mb);
        }
      }
      // Output.
      if (kind == pr::coll_kind::allgather) {
        bo.blocked = 1;
        bo.off = out_arena != npos ? out_arena + at : staging_out();
        bo.stride = out_arena != npos ? count * eb : mb;
      } else if (kind == pr::coll_kind::reduce_scatter) {
        bo.blocked = 1;  // this rank's block only
        bo.stride = 0;
        bo.off = out_arena != npos ? out_arena + at : staging_out();
      } else {
        bo.off = out_arena != npos ? out_arena + at : staging_out();
        if (in == out && in_arena == npos && out_arena == npos) bo.off = bi.off;  // in place stays in place
      }
      auto r = via_host ? host_ring_epoch(e, p, bi, bo, s, recv_off, what)
                        : epoch_run(e, p, bi, bo, what, switch_rank);
      if (!r.ok()) {
        ++st.failures;
        if (r.err().code == errc::timeout || r.err().code == errc::fault) {
          broken = true;
          broken_why = r.err().message;
        }
        return r;
      }
      if (out_arena == npos && mb > 0) {
        if (kind == pr::coll_kind::allgather) {
          for (std::uint32_t c = 0; c < nr; ++c)
            std::memcpy(static_cast<std::byte*>(out) + c * count * eb + at, arena + bo.off + c * mb, mb);
          st.staged_bytes += mb * nr;
          nic->charge_host(host::work::copy, mb * nr);
        } else {
          std::memcpy(static_cast<std::byte*>(out) + at, arena + bo.off, mb);
          st.staged_bytes += mb;
          nic->charge_host(host::work::copy, mb);
        }
      }
      done += m;
    } while (done < count);
    ++st.collectives;
    if (via_switch) ++st.switch_collectives;
    return {};
  }

  static bool overlaps_ranges(const void* a, std::size_t an, const void* b, std::size_t bn) {
    const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
    return x < y + bn && y < x + an;
  }

  // One-rank groups: the result is the rank's own input, rounded like every result.
  result<void> local(pr::coll_kind kind, const void* in, void* out, std::uint64_t count, const op_spec& s) {
    const std::uint32_t eb = s.k.elem_bytes;
    if (kind == pr::coll_kind::allgather || kind == pr::coll_kind::broadcast) {
      if (in != out && count != 0) std::memmove(out, in, count * eb);
    } else {
      std::vector<std::byte> acc(std::size_t(std::min<std::uint64_t>(count, 4096)) * s.k.acc_bytes);
      for (std::uint64_t i = 0; i < count; i += 4096) {
        const auto m = static_cast<std::uint32_t>(std::min<std::uint64_t>(4096, count - i));
        s.k.widen(acc.data(), static_cast<const std::byte*>(in) + i * eb, m);
        s.k.narrow(static_cast<std::byte*>(out) + i * eb, acc.data(), m);
      }
    }
    ++st.collectives;
    return {};
  }
};

communicator::communicator(std::unique_ptr<impl> p) : _p(std::move(p)) {}
communicator::~communicator() = default;

namespace {
error check_group(const group& g, const options& o) {
  if (g.members.empty() || g.members.size() > pr::max_ranks)
    return fail(errc::invalid_argument, "communicator: a group has 1 to " + std::to_string(pr::max_ranks) + " members");
  if (g.me >= g.members.size()) return fail(errc::invalid_argument, "communicator: me is not a member index");
  if (g.id < 1 || g.id > 4095) return fail(errc::invalid_argument, "communicator: group id out of 1..4095");
  for (std::size_t i = 0; i < g.members.size(); ++i)
    for (std::size_t j = i + 1; j < g.members.size(); ++j)
      if (g.members[i] == g.members[j])
        return fail(errc::invalid_argument, "communicator: members " + std::to_string(i) + " and " + std::to_string(j) +
                                                " share NIC rank " + std::to_string(g.members[i]) +
                                                "; each member needs a NIC of its own (an emulated host per rank)");
  if (o.window_packets < 1 || o.window_packets > pr::max_window)
    return fail(errc::invalid_argument, "communicator: window_packets out of 1..256");
  if (o.packet_bytes != 0 && (o.packet_bytes < 16 || o.packet_bytes > pr::max_packet_bytes))
    return fail(errc::invalid_argument, "communicator: packet_bytes out of 16..4096 (or 0: the NIC's largest)");
  if (o.timeout.count() <= 0 || o.repair_interval.count() <= 0 || o.repair_min_interval.count() <= 0 ||
      o.repair_max_interval.count() <= 0)
    return fail(errc::invalid_argument,
                "communicator: timeout, repair_interval, repair_min_interval and repair_max_interval must be positive");
  if (o.repair_min_interval > o.repair_interval || o.repair_interval > o.repair_max_interval)
    return fail(errc::invalid_argument, "communicator: the repair intervals must satisfy repair_min_interval (" +
                                            std::to_string(o.repair_min_interval.count()) + " us) <= repair_interval (" +
                                            std::to_string(o.repair_interval.count()) + " us) <= repair_max_interval (" +
                                            std::to_string(o.repair_max_interval.count()) + " us)");
  if (o.staging_bytes < 4096 || o.arena_bytes < ctl_bytes + 2 * o.staging_bytes)
    return fail(errc::invalid_argument, "communicator: arena_bytes must hold 64 KiB and two staging buffers of at least 4 KiB");
  return error{};
}
} // namespace

result<std::unique_ptr<communicator>> communicator::create_on(std::unique_ptr<detail::nic_handle> nic, const group& g,
                                                               const options& o) {
  if (auto e = check_group(g, o); e.code != errc::ok) return e;
  if (g.members[g.me] != nic->rank())
    return fail(errc::invalid_argument, "communicator: members[me] is " + std::to_string(g.members[g.me]) +
                                            " but the NIC's rank is " + std::to_string(nic->rank()));
  // Packets as large as the NIC carries, up to 4 KiB, in a power of two (every member of a
  // group on alike NICs picks the same size); an explicit size must fit.
  const std::uint32_t nic_payload = nic->max_payload_bytes();
  std::uint32_t packet_bytes = o.packet_bytes;
  if (packet_bytes == 0) {
    packet_bytes = std::bit_floor(std::min<std::uint32_t>(nic_payload, pr::max_packet_bytes));
    if (packet_bytes < 16)
      return fail(errc::invalid_argument, "communicator: NIC " + nic->name() + " carries only " + std::to_string(nic_payload) +
                                              " bytes of payload per packet (at least 16 needed)");
  } else if (packet_bytes > nic_payload) {
    return fail(errc::invalid_argument, "communicator: packet_bytes " + std::to_string(packet_bytes) + " do not fit the packets of NIC " +
                                            nic->name() + " (at most " + std::to_string(nic_payload) +
                                            " bytes of payload: its frames); lower options::packet_bytes or leave it 0");
  }
  auto p = std::make_unique<impl>(std::move(nic));
  p->g = g;
  p->o = o;
  p->o.packet_bytes = packet_bytes;
  p->rto = detail::repair_timer(o.repair_min_interval, o.repair_interval, o.repair_max_interval);
  p->base_id = g.id << 4;
  {
    std::lock_guard<std::mutex> l(groups_mutex);
    if (!groups_in_use.insert({p->nic->key(), p->base_id}).second)
      return fail(errc::exists, "communicator: group " + std::to_string(g.id) + " already has a communicator on NIC " +
                                    p->nic->name());
    p->group_claimed = true;
  }
  auto mem = p->nic->alloc(o.arena_bytes);
  if (!mem.ok()) return fail(mem.err().code, "communicator: the arena: " + mem.err().message);
  p->arena_mem = std::move(mem.value());
  p->arena = p->arena_mem->bytes.data();
  {
    auto k = detail::cmd_key::random();
    if (!k.ok()) return fail(k.err().code, "communicator: " + k.err().message);
    p->key = k.value();
    p->key.write(p->arena);
  }
  p->arena_bytes = p->arena_mem->bytes.size();
  p->region = p->arena_mem->region;
  p->free_list[p->heap_off()] = o.arena_bytes - p->heap_off();

  auto pkg = detail::standard_package();
  if (!pkg.ok()) return pkg.err();
  if (auto r = p->install_engine(pkg.value(), 0, "standard"); !r.ok()) return fail(r.err().code, "communicator: " + r.err().message);
  return std::unique_ptr<communicator>(new communicator(std::move(p)));
}

result<std::unique_ptr<communicator>> communicator::connect(const std::string& socket, std::uint32_t node, const group& g,
                                                            const options& o) {
  if (auto e = check_group(g, o); e.code != errc::ok) return e;
  auto nic = detail::remote_nic(socket, node);
  if (!nic.ok()) return fail(nic.err().code, "communicator: " + nic.err().message);
  return create_on(std::move(nic.value()), g, o);
}

std::uint32_t communicator::rank() const noexcept { return _p->g.me; }
std::uint32_t communicator::size() const noexcept { return _p->n(); }
std::uint64_t communicator::epoch_elements(dtype t) const noexcept {
  std::uint64_t e = 0;
  with_standard(op::sum, t, [&]<class R>() {
    e = _p->epoch_elems(pr::coll_kind::allreduce, sizeof(typename R::elem), sizeof(typename R::acc));
  });
  return e;
}

result<void> communicator::allreduce(const void* in, void* out, std::uint64_t count, dtype t, op o, algorithm a) {
  auto s = _p->standard(t, o, "allreduce");
  if (!s.ok()) return s.err();
  return _p->collective(proto::coll_kind::allreduce, in, out, count, s.value(), 0, a, "allreduce");
}

result<void> communicator::allreduce(const void* in, void* out, std::uint64_t count, const custom_op& r, algorithm a) {
  auto s = _p->custom(r, "allreduce");
  if (!s.ok()) return s.err();
  return _p->collective(proto::coll_kind::allreduce, in, out, count, s.value(), 0, a, "allreduce");
}

result<void> communicator::reduce_scatter(const void* in, void* out, std::uint64_t block_count, dtype t, op o, algorithm a) {
  auto s = _p->standard(t, o, "reduce_scatter");
  if (!s.ok()) return s.err();
  return _p->collective(proto::coll_kind::reduce_scatter, in, out, block_count, s.value(), 0, a, "reduce_scatter");
}

result<void> communicator::reduce_scatter(const void* in, void* out, std::uint64_t block_count, const custom_op& r,
                                           algorithm a) {
  auto s = _p->custom(r, "reduce_scatter");
  if (!s.ok()) return s.err();
  return _p->collective(proto::coll_kind::reduce_scatter, in, out, block_count, s.value(), 0, a, "reduce_scatter");
}

result<void> communicator::allgather(const void* in, void* out, std::uint64_t block_count, dtype t, algorithm a) {
  const std::uint32_t eb = elem_bytes(t);
  if (eb == 0) return fail(errc::invalid_argument, std::string("allgather: unknown datatype ") + name(t));
  op_spec s;
  s.dtype = static_cast<std::uint8_t>(t);
  s.k.elem_bytes = s.k.acc_bytes = eb;
  return _p->collective(proto::coll_kind::allgather, in, out, block_count, s, 0, a, "allgather");
}

result<void> communicator::broadcast(const void* in, void* out, std::uint64_t count, dtype t, std::uint32_t root, algorithm a) {
  const std::uint32_t eb = elem_bytes(t);
  if (eb == 0) return fail(errc::invalid_argument, std::string("broadcast: unknown datatype ") + name(t));
  op_spec s;
  s.dtype = static_cast<std::uint8_t>(t);
  s.k.elem_bytes = s.k.acc_bytes = eb;
  return _p->collective(proto::coll_kind::broadcast, in, out, count, s, root, a, "broadcast");
}

result<custom_op> communicator::add_reduction(const reduction& r) {
  if (_p->engines.size() >= 16) return fail(errc::no_space, "add_reduction: a communicator holds at most 15 reductions");
  if (r.name.empty()) return fail(errc::invalid_argument, "add_reduction: the reduction needs a name");
  if (r.host.elem_bytes == 0 || r.host.acc_bytes == 0 || r.host.elem_bytes > proto::max_packet_bytes ||
      r.host.acc_bytes > proto::max_packet_bytes || r.host.widen == nullptr || r.host.narrow == nullptr)
    return fail(errc::invalid_argument, "add_reduction " + r.name + ": host kernels missing or element sizes out of 1..4096");
  if (std::max(r.host.elem_bytes, r.host.acc_bytes) > _p->o.packet_bytes)
    return fail(errc::invalid_argument, "add_reduction " + r.name + ": an element is larger than a packet");
  // The package is loaded where the engine runs: by the NIC's process (its errors come back
  // from install_engine).
  engine_package pkg;
  pkg.bytes = rt::encode_package(r.package);
  pkg.package = std::make_shared<const rt::package>(r.package);
  const auto slot = static_cast<std::uint32_t>(_p->engines.size());
  if (auto res = _p->install_engine(pkg, slot, r.name); !res.ok()) return res.err();
  _p->custom_kernels[slot] = r.host;
  custom_op c;
  c.slot = slot;
  c.id = name_hash(r.name);
  c.elem_bytes = r.host.elem_bytes;
  c.acc_bytes = r.host.acc_bytes;
  return c;
}

std::span<std::byte> communicator::alloc(std::size_t bytes) { return _p->alloc_span(bytes); }

void communicator::free(std::span<std::byte> buffer) {
  if (buffer.data() == _p->host_ring_area.data()) return;  // not the caller's
  _p->release_span(buffer);
}

std::chrono::steady_clock::time_point communicator::now() const noexcept { return _p->nic->now(); }

comm_stats communicator::stats() const {
  comm_stats s = _p->st;
  s.repair_interval = std::chrono::duration_cast<std::chrono::microseconds>(_p->rto.interval());
  s.srtt = std::chrono::duration_cast<std::chrono::microseconds>(_p->rto.srtt());
  s.rtt_samples = _p->rto.samples();
  s.switch_slots = _p->engines.empty() ? 0 : _p->engines[0].lease.slots;
  return s;
}

result<proto::engine_counters> communicator::engine_counters() {
  pr::cmd c{};
  c.type = pr::cmd_stats;
  c.desc_off = counters_off;
  auto& e = _p->engines[0];
  if (auto r = _p->send_cmd(e, c); !r.ok()) return r.err();
  auto ev = _p->wait(
      e, _p->nic->now() + _p->o.timeout, [](std::uint64_t v) { return pr::event_type_of(v) == pr::ev_stats; },
      [] { return result<void>(); }, "engine statistics");
  if (!ev.ok()) return ev.err();
  pr::engine_counters k;
  std::memcpy(&k, _p->arena + counters_off, sizeof(k));
  return k;
}

} // namespace spin::coll
