// libspin-mpi: MPI collectives through spin::coll, everything else through PMPI (spin_mpi.h,
// docs/mpi.md). A communicator gets its spin::coll communicator at its first collective that
// spin can run: every member is in that call (MPI's collective order), so the set-up is
// collective too. The members agree on the outcome, so all of them fall back or none.
#include <spin/coll/coll.hpp>
#include <spin/host/env.hpp>
#include <spin/host/host.hpp>
#include <spin/mpi/spin_mpi.h>

#include "vt.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace spin::mpi_detail {

virtual_time vt;

int world_rank() {
  int r = -1;
  int up = 0;
  MPI_Initialized(&up);
  if (up) PMPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The nodes of comm's members (both groups of an intercommunicator), sorted.
std::vector<std::uint32_t> member_nodes(MPI_Comm comm) {
  std::vector<std::uint32_t> out;
  MPI_Group world_group;
  PMPI_Comm_group(MPI_COMM_WORLD, &world_group);
  auto add = [&](MPI_Group g) {
    int n = 0;
    PMPI_Group_size(g, &n);
    std::vector<int> ranks(static_cast<std::size_t>(n)), in_world(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) ranks[static_cast<std::size_t>(i)] = i;
    PMPI_Group_translate_ranks(g, n, ranks.data(), world_group, in_world.data());
    for (int w : in_world)
      if (w != MPI_UNDEFINED && static_cast<std::size_t>(w) < vt.world_nodes.size()) out.push_back(vt.world_nodes[static_cast<std::size_t>(w)]);
    PMPI_Group_free(&g);
  };
  MPI_Group g;
  PMPI_Comm_group(comm, &g);
  add(g);
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  if (inter) {
    PMPI_Comm_remote_group(comm, &g);
    add(g);
  }
  PMPI_Group_free(&world_group);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Before a blocking MPI collective over `comm` (named `call`): its members meet in virtual
// time. MPI_SUCCESS, or the error the communicator's handler got.
int vt_sync(MPI_Comm comm, const char* call) {
  if (!vt.on || comm == MPI_COMM_NULL) return MPI_SUCCESS;
  std::vector<std::uint32_t> nodes = member_nodes(comm);
  std::lock_guard g(vt.mu);
  auto r = vt.cl->barrier(vt.node, std::move(nodes));
  if (r.ok()) return MPI_SUCCESS;
  std::fprintf(stderr, "spin-mpi: rank %d: %s in virtual time: the members' barrier failed: %s: %s\n", world_rank(), call,
               errc_name(r.err().code), r.err().message.c_str());
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

int vt_refuse(MPI_Comm comm, const char* call, const char* why) {
  std::fprintf(stderr, "spin-mpi: rank %d: %s is not supported in virtual time: %s (docs/virtual-time.md, \"MPI programs\")\n",
               world_rank(), call, why != nullptr ? why : "spin-emu --virtual-time cannot see what it waits for");
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

} // namespace spin::mpi_detail

namespace {

using namespace spin;
using namespace spin::mpi_detail;

// ---- configuration and counters ----------------------------------------------------------------

struct config {
  std::string socket = "/run/spin-emu.sock";
  std::optional<std::uint32_t> node;
  // Switch aggregation: node switch_node of the spin-emu at switch_socket, a switch linked to
  // every member's NIC (docs/mpi.md, "Switch aggregation").
  std::optional<std::uint32_t> switch_node;
  std::string switch_socket;
  // Or in-band: the switch of rank switch_rank, asked through each rank's own NIC (docs/mpi.md).
  std::optional<std::uint32_t> switch_rank;
  std::optional<host::secret> secret;  // SPIN_JOB_SECRET; else each communicator's rank 0 draws one
  bool frame_auth = true;              // SPIN_MPI_FRAME_AUTH (coll::options::authenticate_frames)
  coll::algorithm algo = coll::algorithm::automatic;
  std::chrono::milliseconds timeout{10000};
  int log = 0;
};

// A setting from the environment; a bad value is reported and ignored (an MPI library cannot
// refuse to start).
std::optional<std::uint64_t> env_u64(const char* name, std::uint64_t max) {
  auto r = host::env_number(name, max);
  if (r.ok()) return r.value();
  std::fprintf(stderr, "spin-mpi: %s; ignored\n", r.err().message.c_str());
  return std::nullopt;
}

constexpr std::uint64_t max_node = 0xffffffffu;
constexpr std::uint64_t max_timeout_ms = 24ull * 3600 * 1000;  // a day

config read_config() {
  config c;
  if (const char* s = std::getenv("SPIN_MPI_SOCKET"); s != nullptr && *s != '\0') c.socket = s;
  if (auto n = env_u64("SPIN_MPI_NODE", max_node)) {
    c.node = static_cast<std::uint32_t>(*n);
  } else {
    for (const char* local : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
      if (auto n = env_u64(local, max_node)) {
        c.node = static_cast<std::uint32_t>(*n);
        break;
      }
  }
  if (const char* a = std::getenv("SPIN_MPI_ALGORITHM"); a != nullptr && *a != '\0') {
    const std::string s = a;
    if (s == "edge_ring")
      c.algo = coll::algorithm::edge_ring;
    else if (s == "host_ring")
      c.algo = coll::algorithm::host_ring;
    else if (s != "automatic")
      std::fprintf(stderr, "spin-mpi: SPIN_MPI_ALGORITHM='%s' is not automatic, edge_ring or host_ring; using automatic\n", a);
  }
  if (auto n = env_u64("SPIN_MPI_SWITCH_NODE", max_node)) c.switch_node = static_cast<std::uint32_t>(*n);
  if (auto r = env_u64("SPIN_MPI_SWITCH_RANK", 0xfffffffeull)) c.switch_rank = static_cast<std::uint32_t>(*r);
  if (auto s = host::env_secret("SPIN_JOB_SECRET"); s.ok())
    c.secret = s.value();
  else
    std::fprintf(stderr, "spin-mpi: %s; ignored (each communicator draws a secret of its own)\n", s.err().message.c_str());
  c.switch_socket = c.socket;
  if (const char* s = std::getenv("SPIN_MPI_SWITCH_SOCKET"); s != nullptr && *s != '\0') c.switch_socket = s;
  if (auto t = env_u64("SPIN_MPI_TIMEOUT_MS", max_timeout_ms); t && *t > 0) c.timeout = std::chrono::milliseconds(*t);
  if (auto l = env_u64("SPIN_MPI_LOG", 2)) c.log = static_cast<int>(*l);
  if (auto a = env_u64("SPIN_MPI_FRAME_AUTH", 1)) c.frame_auth = *a == 1;
  return c;
}

const config& cfg() {
  static const config c = read_config();
  return c;
}

struct counters {
  std::array<std::atomic<std::uint64_t>, SPIN_MPI_CALLS> spin{}, fallback{};
  std::array<std::atomic<std::uint64_t>, SPIN_MPI_REASONS> reasons{};
  std::atomic<std::uint64_t> errors{0}, communicators{0}, switch_communicators{0}, switch_calls{0};
} stats;

constexpr const char* call_names[SPIN_MPI_CALLS] = {"MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather", "MPI_Bcast"};
constexpr const char* reason_names[SPIN_MPI_REASONS] = {"datatype", "op", "communicator", "arguments", "unavailable"};


// ---- what spin can run --------------------------------------------------------------------------

std::optional<coll::dtype> dtype_of(MPI_Datatype t) {
  // The C types of an LP64 machine (x86-64): long is 64 bits.
  if (t == MPI_FLOAT) return coll::dtype::f32;
  if (t == MPI_DOUBLE) return coll::dtype::f64;
  if (t == MPI_INT || t == MPI_INT32_T) return coll::dtype::i32;
  if (t == MPI_INT64_T || t == MPI_LONG || t == MPI_LONG_LONG) return coll::dtype::i64;
  if (t == MPI_UINT32_T || t == MPI_UNSIGNED) return coll::dtype::u32;
  if (t == MPI_UINT64_T || t == MPI_UNSIGNED_LONG || t == MPI_UNSIGNED_LONG_LONG) return coll::dtype::u64;
  return std::nullopt;
}

std::optional<coll::op> op_of(MPI_Op o) {
  if (o == MPI_SUM) return coll::op::sum;
  if (o == MPI_MIN) return coll::op::min;
  if (o == MPI_MAX) return coll::op::max;
  if (o == MPI_PROD) return coll::op::prod;
  return std::nullopt;
}

std::string type_name(MPI_Datatype t) {
  char buf[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  if (MPI_Type_get_name(t, buf, &len) != MPI_SUCCESS || len == 0) return "a derived datatype";
  return std::string(buf, static_cast<std::size_t>(len));
}

// ---- virtual time (spin-emu --virtual-time; docs/virtual-time.md, "MPI programs") ----------------
// Each rank is the host program of its node, attached from MPI_Init on. An MPI collective is a
// wait outside spin: before it, the members meet in virtual time (host::client::barrier), so
// they all enter it at the virtual time the last one came, and none of them waits in MPI for a
// rank that needs the simulation to move.


std::uint32_t my_node() { return cfg().node.value_or(static_cast<std::uint32_t>(std::max(0, world_rank()))); }

// After PMPI_Init: is this rank's spin-emu in virtual time? Every rank asks, and all agree (a
// collective over MPI_COMM_WORLD, before any rank can wait on the simulation).
void start_virtual_time() {
  std::uint32_t mine[2] = {0, my_node()};  // {in virtual time, node}
  std::unique_ptr<host::client> cl;
  std::string why;
  if (auto c = host::client::connect(cfg().socket); c.ok() && c.value().virtual_time()) {
    cl = std::make_unique<host::client>(std::move(c.value()));
    if (auto a = cl->attach(mine[1]); a.ok())
      mine[0] = 1;
    else
      why = std::string(errc_name(a.err().code)) + ": " + a.err().message;
  }
  int size = 0;
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::uint32_t> all(2 * static_cast<std::size_t>(size));
  PMPI_Allgather(mine, 2, MPI_UINT32_T, all.data(), 2, MPI_UINT32_T, MPI_COMM_WORLD);
  int in_vt = 0;
  for (int r = 0; r < size; ++r) in_vt += static_cast<int>(all[2 * static_cast<std::size_t>(r)]);
  if (in_vt == 0 && why.empty()) return;  // wall-clock spin-emu, or none: nothing changes
  if (in_vt != size) {
    std::fprintf(stderr, "spin-mpi: rank %d: virtual time is off: %d of %d ranks attached to a spin-emu in virtual time%s%s\n",
                 world_rank(), in_vt, size, why.empty() ? "" : "; this rank: ", why.c_str());
    return;  // closing `cl` ends this rank's host program
  }
  vt.cl = std::move(cl);
  vt.node = mine[1];
  for (int r = 0; r < size; ++r) vt.world_nodes.push_back(all[2 * static_cast<std::size_t>(r) + 1]);
  vt.on = true;
  p2p_start();
}

// ---- one spin communicator per MPI communicator ---------------------------------------------------

struct spin_comm {
  std::mutex mu;  // spin::coll: one thread at a time per communicator
  std::unique_ptr<coll::fabric> switches;    // with SPIN_MPI_SWITCH_NODE; outlives comm
  std::unique_ptr<coll::communicator> comm;  // null: this MPI communicator falls back
  std::string why;                           // when it falls back
  int rank = 0;
  std::uint64_t switch_seen = 0;             // comm's switch_collectives already counted
};

std::mutex registry_mu;
std::map<spin_comm*, std::unique_ptr<spin_comm>> registry;
int keyval = MPI_KEYVAL_INVALID;
std::uint32_t next_group_id = 1;  // this process's next group id (agreed with MAX over the members)
std::optional<std::uint32_t> nic_rank_cache;
std::string nic_error;

int delete_attr(MPI_Comm, int, void* value, void*) {
  std::lock_guard g(registry_mu);
  registry.erase(static_cast<spin_comm*>(value));
  return MPI_SUCCESS;
}

// This rank's NIC rank (its emulated address), asked once of spin-emu.
std::optional<std::uint32_t> nic_rank() {
  if (nic_rank_cache || !nic_error.empty()) return nic_rank_cache;
  const config& c = cfg();
  const std::uint32_t node = c.node.value_or(static_cast<std::uint32_t>(std::max(0, world_rank())));
  auto cl = host::client::connect(c.socket);
  if (!cl.ok()) {
    nic_error = "no spin-emu at " + c.socket + " (" + errc_name(cl.err().code) + ": " + cl.err().message + ")";
    return std::nullopt;
  }
  auto nodes = cl.value().nodes();
  if (!nodes.ok()) {
    nic_error = "spin-emu at " + c.socket + ": " + nodes.err().message;
    return std::nullopt;
  }
  for (const auto& n : nodes.value())
    if (n.node == node) return nic_rank_cache = n.rank;
  nic_error = "spin-emu at " + c.socket + " has no node " + std::to_string(node) + " (" + std::to_string(nodes.value().size()) +
              " nodes; set SPIN_MPI_NODE)";
  return std::nullopt;
}

// The spin communicator of `comm`, created at its first use (a collective call over `comm`).
spin_comm& spin_of(MPI_Comm comm) {
  static std::once_flag keyval_once;
  std::call_once(keyval_once, [] { PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_attr, &keyval, nullptr); });
  void* v = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, keyval, &v, &found);
  if (found) return *static_cast<spin_comm*>(v);

  auto sc = std::make_unique<spin_comm>();
  int size = 0;
  PMPI_Comm_rank(comm, &sc->rank);
  PMPI_Comm_size(comm, &size);
  // Every member's NIC rank, and a group id no member's NIC holds yet.
  const auto mine = nic_rank();
  std::uint32_t my_rank = mine.value_or(0);
  std::vector<std::uint32_t> members(static_cast<std::size_t>(size));
  // In virtual time the members meet first; nothing below waits on a NIC until the last
  // PMPI collective of the three.
  (void)vt_sync(comm, "the spin communicator's set-up");
  PMPI_Allgather(&my_rank, 1, MPI_UINT32_T, members.data(), 1, MPI_UINT32_T, comm);
  std::uint32_t gid = next_group_id;
  PMPI_Allreduce(MPI_IN_PLACE, &gid, 1, MPI_UINT32_T, MPI_MAX, comm);
  next_group_id = gid + 1;
  // The group's secret (coll::options::job_secret), agreed through MPI: SPIN_JOB_SECRET, else
  // rank 0's random bytes.
  host::secret secret = cfg().secret.value_or(host::secret{});
  if (!cfg().secret) {
    if (sc->rank == 0)
      if (auto r = host::random_secret(); r.ok()) secret = r.value();
    PMPI_Bcast(secret.data(), static_cast<int>(secret.size()), MPI_BYTE, 0, comm);
  }

  int ok = mine.has_value() ? 1 : 0;
  std::string why = mine ? "" : nic_error;
  if (ok && gid > 4095) {
    ok = 0;
    why = "group ids exhausted (4095 communicators per NIC)";
  }
  if (ok) {
    coll::group g;
    g.id = gid;
    g.members = members;
    g.me = static_cast<std::uint32_t>(sc->rank);
    coll::options o;
    o.timeout = cfg().timeout;
    o.job_secret = secret;
    o.authenticate_frames = cfg().frame_auth;
    if (cfg().switch_node || cfg().switch_rank) {
      // The switch's spin-emu keeps the slot pool and the group's one answer; this process's
      // fabric is a view of it over a connection of its own (closed with the communicator), or
      // in-band through this rank's own NIC.
      auto f = cfg().switch_node
                   ? coll::fabric::connect({coll::remote_switch{cfg().switch_socket, *cfg().switch_node, members}})
                   : coll::fabric::in_band({cfg().socket, cfg().node.value_or(static_cast<std::uint32_t>(std::max(0, world_rank()))),
                                            *cfg().switch_rank});
      if (f.ok()) {
        sc->switches = std::move(f.value());
        o.switches = sc->switches.get();
      } else {
        ok = 0;
        why = std::string(cfg().switch_node ? "the switch (SPIN_MPI_SWITCH_NODE): " : "the switch (SPIN_MPI_SWITCH_RANK): ") + errc_name(f.err().code) + ": " + f.err().message;
      }
    }
    auto c = !ok ? result<std::unique_ptr<coll::communicator>>(fail(errc::bad_state, why)) : coll::communicator::connect(cfg().socket, cfg().node.value_or(static_cast<std::uint32_t>(std::max(0, world_rank()))), g, o);
    if (c.ok()) {
      sc->comm = std::move(c.value());
    } else if (ok) {
      ok = 0;
      why = std::string("spin communicator: ") + errc_name(c.err().code) + ": " + c.err().message;
    }
  }
  // All members use spin, or none does. (The communicator's set-up waited on NICs.)
  (void)vt_sync(comm, "the spin communicator's set-up");
  int all = ok;
  PMPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  if (!all) {
    sc->comm.reset();
    sc->why = why.empty() ? "another rank could not set up its spin communicator" : why;
    if (!why.empty())
      std::fprintf(stderr, "spin-mpi: rank %d: %s; this communicator's collectives go to MPI\n", world_rank(), why.c_str());
  } else {
    stats.communicators.fetch_add(1, std::memory_order_relaxed);
    if (sc->comm->stats().switch_slots > 0) stats.switch_communicators.fetch_add(1, std::memory_order_relaxed);
  }
  spin_comm* raw = sc.get();
  {
    std::lock_guard g(registry_mu);
    registry.emplace(raw, std::move(sc));
  }
  PMPI_Comm_set_attr(comm, keyval, raw);
  return *raw;
}

// ---- the decision and the call ------------------------------------------------------------------

struct decision {
  bool spin = false;
  spin_mpi_reason reason = SPIN_MPI_R_UNAVAILABLE;
  std::string why;
};

decision fall_back(spin_mpi_reason r, std::string why) { return decision{false, r, std::move(why)}; }

// What does not depend on the arguments: is `comm` an intracommunicator of two or more ranks.
std::optional<decision> check_comm(MPI_Comm comm) {
  int inter = 0, size = 0;
  PMPI_Comm_test_inter(comm, &inter);
  if (inter) return fall_back(SPIN_MPI_R_COMMUNICATOR, "an intercommunicator");
  PMPI_Comm_size(comm, &size);
  if (size < 2) return fall_back(SPIN_MPI_R_COMMUNICATOR, "a communicator of one rank");
  if (size > 256) return fall_back(SPIN_MPI_R_COMMUNICATOR, "more than 256 ranks");
  return std::nullopt;
}

void note(spin_mpi_call call, const decision& d, const std::string& what) {
  if (d.spin) {
    stats.spin[call].fetch_add(1, std::memory_order_relaxed);
  } else {
    stats.fallback[call].fetch_add(1, std::memory_order_relaxed);
    stats.reasons[d.reason].fetch_add(1, std::memory_order_relaxed);
  }
  if (cfg().log >= 2)
    std::fprintf(stderr, "spin-mpi: rank %d: %s %s: %s%s\n", world_rank(), call_names[call], what.c_str(),
                 d.spin ? "spin" : "MPI: ", d.spin ? "" : d.why.c_str());
}

// A failed spin::coll call: the communicator's error handler, as MPI reports a failed call.
int failed(MPI_Comm comm, spin_mpi_call call, const error& e) {
  stats.errors.fetch_add(1, std::memory_order_relaxed);
  std::fprintf(stderr, "spin-mpi: rank %d: %s failed in spin::coll: %s: %s\n", world_rank(), call_names[call],
               errc_name(e.code), e.message.c_str());
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

// The end of a call that ran on spin::coll: counts it when it went through the switch, and
// reports a failure as failed() does. Under sc->mu.
int finish(spin_comm* sc, MPI_Comm comm, spin_mpi_call call, const result<void>& r) {
  const std::uint64_t through = sc->comm->stats().switch_collectives;
  if (through != sc->switch_seen) stats.switch_calls.fetch_add(through - sc->switch_seen, std::memory_order_relaxed);
  sc->switch_seen = through;
  return r.ok() ? MPI_SUCCESS : failed(comm, call, r.err());
}

// Decides for a call whose arguments passed `pre` (nullopt: spin can run them): the
// communicator's own state may still send it to MPI.
decision decide(MPI_Comm comm, std::optional<decision> pre, spin_comm** out) {
  if (pre) return *pre;
  if (auto c = check_comm(comm)) return *c;
  spin_comm& sc = spin_of(comm);
  if (!sc.comm) return fall_back(SPIN_MPI_R_UNAVAILABLE, sc.why);
  *out = &sc;
  return decision{true, SPIN_MPI_R_UNAVAILABLE, ""};
}

std::string shape(int count, MPI_Datatype t) { return std::to_string(count) + " x " + type_name(t); }

// ---- moving data as bytes -------------------------------------------------------------------------
// MPI_Bcast and MPI_Allgather move data without combining it, and MPI asks only that the ranks'
// type signatures match, not their datatypes (MPI-4.0 section 6.1): one rank may pass 4 MPI_INT,
// another a contiguous type of 4 MPI_INT, a third 16 MPI_BYTE. So these calls decide on byte
// counts and the root, which every rank agrees on, and spin::coll moves packed bytes (as 32-bit
// words, zero-padded): the datatype is used only to pack and unpack.

constexpr MPI_Count max_piece_bytes = MPI_Count{1} << 30;  // MPI_Pack counts bytes in an int

struct layout {             // `count` elements of a datatype
  MPI_Count bytes = 0;      // packed size
  MPI_Count elem_bytes = 0; // packed size of one element
  MPI_Aint extent = 0;      // from one element to the next
  MPI_Aint true_lb = 0;     // the first byte of data, from the buffer's address
  bool contiguous = false;  // the packed bytes lie as they are at buffer + true_lb
};

layout layout_of(int count, MPI_Datatype t) {
  layout l;
  if (count < 0) return l;
  MPI_Count size = 0, lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  if (PMPI_Type_size_x(t, &size) != MPI_SUCCESS || size == MPI_UNDEFINED || size < 0) return l;
  PMPI_Type_get_extent_x(t, &lb, &extent);
  PMPI_Type_get_true_extent_x(t, &true_lb, &true_extent);
  l.elem_bytes = size;
  l.bytes = size * count;
  l.extent = static_cast<MPI_Aint>(extent);
  l.true_lb = static_cast<MPI_Aint>(true_lb);
  l.contiguous = size == true_extent && (count <= 1 || extent == size);
  return l;
}

std::uint64_t words_of(MPI_Count bytes) { return static_cast<std::uint64_t>((bytes + 3) / 4); }

int comm_size(MPI_Comm comm) {
  int s = 0;
  PMPI_Comm_size(comm, &s);
  return s;
}

bool is_rank(MPI_Comm comm, int r) {
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  return inter != 0 || (r >= 0 && r < comm_size(comm));  // intercommunicators fall back anyway
}

// Calls f(first element, element count, packed offset) over `count` elements in pieces whose
// packed size is at most max_piece_bytes (the callers refused larger elements).
template <class F> void for_each_piece(int count, const layout& l, F f) {
  const int per_piece = static_cast<int>(std::max<MPI_Count>(1, max_piece_bytes / std::max<MPI_Count>(1, l.elem_bytes)));
  for (int i = 0; i < count; i += per_piece) f(i, std::min(per_piece, count - i), i * l.elem_bytes);
}

// Packs `count` elements of `t` at `buf` into `out` (l.bytes bytes).
void pack(const void* buf, int count, MPI_Datatype t, const layout& l, std::byte* out, MPI_Comm comm) {
  for_each_piece(count, l, [&](int i, int n, MPI_Count at) {
    int pos = 0;
    PMPI_Pack(static_cast<const std::byte*>(buf) + static_cast<MPI_Aint>(i) * l.extent, n, t, out + at,
              static_cast<int>(n * l.elem_bytes), &pos, comm);
  });
}

// Unpacks l.bytes bytes at `in` into `count` elements of `t` at `buf`.
void unpack(const std::byte* in, void* buf, int count, MPI_Datatype t, const layout& l, MPI_Comm comm) {
  for_each_piece(count, l, [&](int i, int n, MPI_Count at) {
    int pos = 0;
    PMPI_Unpack(in + at, static_cast<int>(n * l.elem_bytes), &pos, static_cast<std::byte*>(buf) + static_cast<MPI_Aint>(i) * l.extent,
                n, t, comm);
  });
}

} // namespace

// ---- the interposed calls -------------------------------------------------------------------------

extern "C" {

void spin_mpi_get_counters(struct spin_mpi_counters* out) {
  if (out == nullptr) return;
  for (int i = 0; i < SPIN_MPI_CALLS; ++i) {
    out->spin[i] = stats.spin[i].load(std::memory_order_relaxed);
    out->fallback[i] = stats.fallback[i].load(std::memory_order_relaxed);
  }
  for (int i = 0; i < SPIN_MPI_REASONS; ++i) out->reasons[i] = stats.reasons[i].load(std::memory_order_relaxed);
  out->errors = stats.errors.load(std::memory_order_relaxed);
  out->communicators = stats.communicators.load(std::memory_order_relaxed);
  out->switch_communicators = stats.switch_communicators.load(std::memory_order_relaxed);
  out->switch_calls = stats.switch_calls.load(std::memory_order_relaxed);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  std::optional<decision> pre;
  const auto t = dtype_of(datatype);
  const auto o = op_of(op);
  if (!t) pre = fall_back(SPIN_MPI_R_DATATYPE, type_name(datatype) + " is not supported");
  else if (!o) pre = fall_back(SPIN_MPI_R_OP, "the operation is not SUM, MIN, MAX or PROD");
  else if (count <= 0) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "count " + std::to_string(count));
  spin_comm* sc = nullptr;
  const decision d = decide(comm, pre, &sc);
  note(SPIN_MPI_ALLREDUCE, d, shape(count, datatype));
  if (!d.spin) {
    if (int e = vt_sync(comm, "MPI_Allreduce"); e != MPI_SUCCESS) return e;
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
  }
  const void* in = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  std::lock_guard g(sc->mu);
  auto r = sc->comm->allreduce(in, recvbuf, static_cast<std::uint64_t>(count), *t, *o, cfg().algo);
  return finish(sc, comm, SPIN_MPI_ALLREDUCE, r);
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm) {
  std::optional<decision> pre;
  const auto t = dtype_of(datatype);
  const auto o = op_of(op);
  if (!t) pre = fall_back(SPIN_MPI_R_DATATYPE, type_name(datatype) + " is not supported");
  else if (!o) pre = fall_back(SPIN_MPI_R_OP, "the operation is not SUM, MIN, MAX or PROD");
  else if (recvcount <= 0) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "count " + std::to_string(recvcount));
  spin_comm* sc = nullptr;
  const decision d = decide(comm, pre, &sc);
  note(SPIN_MPI_REDUCE_SCATTER_BLOCK, d, shape(recvcount, datatype));
  if (!d.spin) {
    if (int e = vt_sync(comm, "MPI_Reduce_scatter_block"); e != MPI_SUCCESS) return e;
    return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
  }
  std::lock_guard g(sc->mu);
  const std::uint64_t block = static_cast<std::uint64_t>(recvcount);
  if (sendbuf != MPI_IN_PLACE) {
    auto r = sc->comm->reduce_scatter(sendbuf, recvbuf, block, *t, *o, cfg().algo);
    return finish(sc, comm, SPIN_MPI_REDUCE_SCATTER_BLOCK, r);
  }
  // MPI's in place: the input is recvbuf (size x recvcount elements), the result lands at its
  // start. spin::coll's in place (NCCL's) leaves it at this rank's block: move it down.
  const std::size_t eb = coll::elem_bytes(*t);
  auto* base = static_cast<std::byte*>(recvbuf);
  std::byte* mine = base + static_cast<std::size_t>(sc->rank) * block * eb;
  auto r = sc->comm->reduce_scatter(recvbuf, mine, block, *t, *o, cfg().algo);
  if (int e = finish(sc, comm, SPIN_MPI_REDUCE_SCATTER_BLOCK, r); e != MPI_SUCCESS) return e;
  if (mine != base) std::memmove(base, mine, block * eb);
  return MPI_SUCCESS;
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  const bool in_place = sendbuf == MPI_IN_PLACE;
  const layout rl = layout_of(recvcount, recvtype);  // one block of recvbuf
  const layout sl = in_place ? rl : layout_of(sendcount, sendtype);
  std::optional<decision> pre;
  if (rl.bytes <= 0) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "0 bytes per rank");
  else if (sl.bytes != rl.bytes) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "send and receive sizes differ");
  else if (rl.elem_bytes > max_piece_bytes) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "an element of more than 1 GiB");
  spin_comm* sc = nullptr;
  const decision d = decide(comm, pre, &sc);
  note(SPIN_MPI_ALLGATHER, d, std::to_string(rl.bytes) + " bytes");
  if (!d.spin) {
    if (int e = vt_sync(comm, "MPI_Allgather"); e != MPI_SUCCESS) return e;
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  }
  std::lock_guard g(sc->mu);
  const std::uint64_t words = words_of(rl.bytes);
  auto* recv = static_cast<std::byte*>(recvbuf);
  const MPI_Aint stride = static_cast<MPI_Aint>(recvcount) * rl.extent;  // MPI's block j: recvbuf + j * stride
  std::byte* my_block = recv + static_cast<MPI_Aint>(sc->rank) * stride;
  if (rl.contiguous && sl.contiguous && rl.bytes % 4 == 0) {
    // Blocks abut (stride == bytes): spin::coll moves them where they are. MPI's in place is
    // NCCL's: this rank's block of recvbuf is the input.
    const void* in = in_place ? my_block + rl.true_lb : static_cast<const std::byte*>(sendbuf) + sl.true_lb;
    auto r = sc->comm->allgather(in, recv + rl.true_lb, words, coll::dtype::u32, cfg().algo);
    return finish(sc, comm, SPIN_MPI_ALLGATHER, r);
  }
  const int members = comm_size(comm);
  std::vector<std::byte> mine(words * 4), all(mine.size() * static_cast<std::size_t>(members));
  if (in_place)
    pack(my_block, recvcount, recvtype, rl, mine.data(), comm);
  else
    pack(sendbuf, sendcount, sendtype, sl, mine.data(), comm);
  auto r = sc->comm->allgather(mine.data(), all.data(), words, coll::dtype::u32, cfg().algo);
  if (int e = finish(sc, comm, SPIN_MPI_ALLGATHER, r); e != MPI_SUCCESS) return e;
  for (int j = 0; j < members; ++j)
    unpack(all.data() + static_cast<std::size_t>(j) * mine.size(), recv + static_cast<MPI_Aint>(j) * stride, recvcount,
           recvtype, rl, comm);
  return MPI_SUCCESS;
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  const layout l = layout_of(count, datatype);
  std::optional<decision> pre;
  if (l.bytes <= 0) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "0 bytes");
  else if (!is_rank(comm, root)) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "root " + std::to_string(root) + " is not a rank of the communicator");
  else if (l.elem_bytes > max_piece_bytes) pre = fall_back(SPIN_MPI_R_ARGUMENTS, "an element of more than 1 GiB");
  spin_comm* sc = nullptr;
  const decision d = decide(comm, pre, &sc);
  note(SPIN_MPI_BCAST, d, std::to_string(l.bytes) + " bytes");
  if (!d.spin) {
    if (int e = vt_sync(comm, "MPI_Bcast"); e != MPI_SUCCESS) return e;
    return PMPI_Bcast(buffer, count, datatype, root, comm);
  }
  std::lock_guard g(sc->mu);
  const std::uint64_t words = words_of(l.bytes);
  const auto from = static_cast<std::uint32_t>(root);
  if (l.contiguous && l.bytes % 4 == 0) {
    std::byte* p = static_cast<std::byte*>(buffer) + l.true_lb;
    auto r = sc->comm->broadcast(p, p, words, coll::dtype::u32, from, cfg().algo);
    return finish(sc, comm, SPIN_MPI_BCAST, r);
  }
  std::vector<std::byte> stage(words * 4);
  if (sc->rank == root) pack(buffer, count, datatype, l, stage.data(), comm);
  auto r = sc->comm->broadcast(stage.data(), stage.data(), words, coll::dtype::u32, from, cfg().algo);
  if (int e = finish(sc, comm, SPIN_MPI_BCAST, r); e != MPI_SUCCESS) return e;
  if (sc->rank != root) unpack(stage.data(), buffer, count, datatype, l, comm);
  return MPI_SUCCESS;
}

int MPI_Init(int* argc, char*** argv) {
  const int r = PMPI_Init(argc, argv);
  if (r == MPI_SUCCESS) start_virtual_time();
  return r;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int r = PMPI_Init_thread(argc, argv, required, provided);
  if (r == MPI_SUCCESS) start_virtual_time();
  return r;
}

// In virtual time MPI_Wtime is this rank's virtual clock (seconds since the simulation began):
// an MPI program times itself in the simulation's time unchanged.
double MPI_Wtime(void) {
  if (vt.on) return static_cast<double>(vt.cl->virtual_now().count()) * 1e-9;
  return PMPI_Wtime();
}

// ---- the other blocking collectives: unchanged, but in virtual time the members meet first ----

#define SPIN_MPI_SYNCED(name, comm, ...)                                   \
  {                                                                         \
    if (int e = vt_sync(comm, #name); e != MPI_SUCCESS) return e;          \
    return P##name(__VA_ARGS__);                                            \
  }

int MPI_Barrier(MPI_Comm comm) SPIN_MPI_SYNCED(MPI_Barrier, comm, comm)
int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, int root, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Reduce, comm, sendbuf, recvbuf, count, datatype, op, root, comm)
int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Reduce_scatter, comm, sendbuf, recvbuf, recvcounts, datatype, op, comm)
int MPI_Scan(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Scan, comm, sendbuf, recvbuf, count, datatype, op, comm)
int MPI_Exscan(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Exscan, comm, sendbuf, recvbuf, count, datatype, op, comm)
int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype,
               int root, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Gather, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm)
int MPI_Gatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                const int displs[], MPI_Datatype recvtype, int root, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Gatherv, comm, sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, root, comm)
int MPI_Scatter(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype,
                int root, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Scatter, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm)
int MPI_Scatterv(const void* sendbuf, const int sendcounts[], const int displs[], MPI_Datatype sendtype, void* recvbuf,
                 int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Scatterv, comm, sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype, root, comm)
int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                   const int displs[], MPI_Datatype recvtype, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Allgatherv, comm, sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm)
int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype,
                 MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Alltoall, comm, sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)
int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype, void* recvbuf,
                  const int recvcounts[], const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Alltoallv, comm, sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm)
int MPI_Alltoallw(const void* sendbuf, const int sendcounts[], const int sdispls[], const MPI_Datatype sendtypes[], void* recvbuf,
                  const int recvcounts[], const int rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm)
    SPIN_MPI_SYNCED(MPI_Alltoallw, comm, sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls, recvtypes, comm)

#undef SPIN_MPI_SYNCED

// Communicators: created after the members met, then given the context id their point-to-point
// messages carry in virtual time.
#define SPIN_MPI_CREATES(name, comm, newcomm, ...)                         \
  {                                                                         \
    if (int e = vt_sync(comm, #name); e != MPI_SUCCESS) return e;          \
    const int r = P##name(__VA_ARGS__);                                     \
    if (r == MPI_SUCCESS) p2p_comm_created(*(newcomm));                     \
    return r;                                                               \
  }

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) SPIN_MPI_CREATES(MPI_Comm_dup, comm, newcomm, comm, newcomm)
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm)
    SPIN_MPI_CREATES(MPI_Comm_split, comm, newcomm, comm, color, key, newcomm)
int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm)
    SPIN_MPI_CREATES(MPI_Comm_split_type, comm, newcomm, comm, split_type, key, info, newcomm)
int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* newcomm)
    SPIN_MPI_CREATES(MPI_Comm_create, comm, newcomm, comm, group, newcomm)
int MPI_Cart_create(MPI_Comm comm_old, int ndims, const int dims[], const int periods[], int reorder, MPI_Comm* comm_cart)
    SPIN_MPI_CREATES(MPI_Cart_create, comm_old, comm_cart, comm_old, ndims, dims, periods, reorder, comm_cart)
int MPI_Cart_sub(MPI_Comm comm, const int remain_dims[], MPI_Comm* newcomm)
    SPIN_MPI_CREATES(MPI_Cart_sub, comm, newcomm, comm, remain_dims, newcomm)
int MPI_Graph_create(MPI_Comm comm_old, int nnodes, const int index[], const int edges[], int reorder, MPI_Comm* comm_graph)
    SPIN_MPI_CREATES(MPI_Graph_create, comm_old, comm_graph, comm_old, nnodes, index, edges, reorder, comm_graph)
int MPI_Dist_graph_create_adjacent(MPI_Comm comm_old, int indegree, const int sources[], const int sourceweights[], int outdegree,
                                   const int destinations[], const int destweights[], MPI_Info info, int reorder,
                                   MPI_Comm* comm_dist_graph)
    SPIN_MPI_CREATES(MPI_Dist_graph_create_adjacent, comm_old, comm_dist_graph, comm_old, indegree, sources, sourceweights, outdegree,
                     destinations, destweights, info, reorder, comm_dist_graph)
int MPI_Dist_graph_create(MPI_Comm comm_old, int n, const int sources[], const int degrees[], const int destinations[],
                          const int weights[], MPI_Info info, int reorder, MPI_Comm* comm_dist_graph)
    SPIN_MPI_CREATES(MPI_Dist_graph_create, comm_old, comm_dist_graph, comm_old, n, sources, degrees, destinations, weights, info,
                     reorder, comm_dist_graph)
// Collective over both groups of the intercommunicator (member_nodes takes both).
int MPI_Intercomm_merge(MPI_Comm intercomm, int high, MPI_Comm* newintracomm)
    SPIN_MPI_CREATES(MPI_Intercomm_merge, intercomm, newintracomm, intercomm, high, newintracomm)

#undef SPIN_MPI_CREATES

// Constructors whose members virtual time cannot name before the call: MPI_Comm_create_group is
// collective over a group, not a communicator, and MPI_Intercomm_create's leaders talk over a
// peer communicator to a group this rank does not know yet. Refused in virtual time.
int MPI_Comm_create_group(MPI_Comm comm, MPI_Group group, int tag, MPI_Comm* newcomm) {
  if (vt.on) return vt_refuse(comm, "MPI_Comm_create_group", "its members meet outside what the simulation can see");
  return PMPI_Comm_create_group(comm, group, tag, newcomm);
}
int MPI_Intercomm_create(MPI_Comm local_comm, int local_leader, MPI_Comm peer_comm, int remote_leader, int tag,
                         MPI_Comm* newintercomm) {
  if (vt.on) return vt_refuse(local_comm, "MPI_Intercomm_create", "its leaders meet outside what the simulation can see");
  return PMPI_Intercomm_create(local_comm, local_leader, peer_comm, remote_leader, tag, newintercomm);
}


int MPI_Finalize(void) {
  if (cfg().log >= 1) {
    spin_mpi_counters c{};
    spin_mpi_get_counters(&c);
    std::string line = "spin-mpi: rank " + std::to_string(world_rank()) + ": spin";
    for (int i = 0; i < SPIN_MPI_CALLS; ++i) line += std::string(" ") + call_names[i] + "=" + std::to_string(c.spin[i]);
    line += "; MPI";
    for (int i = 0; i < SPIN_MPI_CALLS; ++i) line += std::string(" ") + call_names[i] + "=" + std::to_string(c.fallback[i]);
    line += "; reasons";
    for (int i = 0; i < SPIN_MPI_REASONS; ++i) line += std::string(" ") + reason_names[i] + "=" + std::to_string(c.reasons[i]);
    line += "; errors=" + std::to_string(c.errors) + " communicators=" + std::to_string(c.communicators) +
            " switch_communicators=" + std::to_string(c.switch_communicators) + " switch_calls=" + std::to_string(c.switch_calls);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  // Spin communicators go before MPI does (MPI_COMM_WORLD's attributes may outlive Finalize).
  {
    std::lock_guard g(registry_mu);
    registry.clear();
  }
  // MPI_Finalize is collective over MPI_COMM_WORLD: the ranks meet, and then leave the
  // simulation together.
  (void)vt_sync(MPI_COMM_WORLD, "MPI_Finalize");
  p2p_finalize();
  const int r = PMPI_Finalize();
  vt.on = false;
  vt.cl.reset();
  return r;
}

} // extern "C"
