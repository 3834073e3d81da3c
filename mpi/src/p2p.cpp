// libspin-mpi's point to point in virtual time (docs/virtual-time.md, "MPI programs").
//
// In virtual time each rank holds the simulation while it runs, so a rank that blocks in MPI
// waiting for another rank's message could wait for a rank that needs the simulation to move.
// Here no MPI call waits for that: every message's envelope goes through spin-emu
// (host::client::p2p_send and the rest). A receive waits there, in virtual time, until its
// message's bytes have crossed the simulated network (sim::cluster::send_host_traffic); only then
// does this rank take the bytes from MPI, and the sender handed them to MPI before the
// simulation could move past its send:
//  - a standard, buffered or ready send copies the bytes, posts the envelope and a PMPI_Isend
//    of the copy, and returns (a buffered send: complete at once in virtual time);
//  - a synchronous send does the same with an id on its envelope, then waits in virtual
//    time until a receive matched it and word of that came back;
//  - a receive posts its envelope receive, waits for the match, then PMPI_Recv's with the exact
//    source and tag the envelope carried.
// Matching is MPI's, applied by spin-emu to the envelopes (match bits: the communicator's
// context id << 32 | tag). The bytes are received in the envelopes' match order for each
// (communicator, source, tag), so MPI's own matching picks the same message.
//
// While this rank waits in spin-emu, through any client (spin::coll's too), its buffered sends
// keep moving (client::set_while_waiting): a receiver's PMPI_Recv of a large message may need
// the sender's MPI progress, and the receiver holds the simulation until it ends.
#include "vt.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace spin::mpi_detail {
namespace {

namespace proto = host::protocol;

constexpr std::uint64_t tag_mask = 0xFFFFFFFFull;
/// Waits for a message last at most this long in virtual time (spin-emu cuts them there too):
/// when every rank waits for a message none will send, each gets an error instead of a hang.
constexpr std::chrono::nanoseconds forever = std::chrono::hours(24 * 100);
/// A test (MPI_Test*, MPI_Iprobe) that finds nothing takes this much virtual time, so a loop of
/// tests moves the simulation on as a real one moves the clock.
constexpr std::chrono::nanoseconds poll_cost{1000};

/// A communicator's point-to-point identity in virtual time.
struct comm_info {
  std::uint32_t context = 0;
  std::vector<std::uint32_t> nodes;  // node of each rank
  int rank_of(std::uint32_t node) const {
    const auto it = std::find(nodes.begin(), nodes.end(), node);
    return it == nodes.end() ? MPI_UNDEFINED : static_cast<int>(it - nodes.begin());
  }
};
comm_info world_info, self_info;
int keyval = MPI_KEYVAL_INVALID;
std::uint32_t next_context = 2;  // 0: MPI_COMM_WORLD, 1: MPI_COMM_SELF

int free_info(MPI_Comm, int, void* v, void*) {
  delete static_cast<comm_info*>(v);
  return MPI_SUCCESS;
}

// The nodes of comm's ranks, in rank order.
std::vector<std::uint32_t> rank_nodes(MPI_Comm comm) {
  MPI_Group world_group, g;
  PMPI_Comm_group(MPI_COMM_WORLD, &world_group);
  PMPI_Comm_group(comm, &g);
  int n = 0;
  PMPI_Group_size(g, &n);
  std::vector<int> ranks(static_cast<std::size_t>(n)), in_world(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ranks[static_cast<std::size_t>(i)] = i;
  PMPI_Group_translate_ranks(g, n, ranks.data(), world_group, in_world.data());
  std::vector<std::uint32_t> out;
  for (int w : in_world) out.push_back(vt.world_nodes.at(static_cast<std::size_t>(w)));
  PMPI_Group_free(&g);
  PMPI_Group_free(&world_group);
  return out;
}

const comm_info* info_of(MPI_Comm comm) {
  if (comm == MPI_COMM_WORLD) return &world_info;
  if (comm == MPI_COMM_SELF) return &self_info;
  if (keyval == MPI_KEYVAL_INVALID || comm == MPI_COMM_NULL) return nullptr;
  void* v = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, keyval, &v, &found);
  return found ? static_cast<const comm_info*>(v) : nullptr;
}

// ---- buffered sends: copies handed to MPI, completed later ----

struct buffered {
  MPI_Request req = MPI_REQUEST_NULL;
  std::unique_ptr<std::byte[]> copy;
};
std::mutex sends_mu;
std::vector<buffered> sends;

/// Completes the buffered sends MPI has finished: one PMPI_Testsome over all of them (one
/// progress call, not one per send: a rank may have thousands pending).
void progress() {
  std::unique_lock lk(sends_mu, std::try_to_lock);
  if (!lk || sends.empty()) return;
  std::vector<MPI_Request> reqs;
  reqs.reserve(sends.size());
  for (const auto& b : sends) reqs.push_back(b.req);
  std::vector<int> idx(sends.size());
  int n = 0;
  PMPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &n, idx.data(), MPI_STATUSES_IGNORE);
  if (n <= 0) return;  // none, or MPI_UNDEFINED
  for (std::size_t i = 0; i < sends.size(); ++i) sends[i].req = reqs[i];
  std::erase_if(sends, [](const buffered& b) { return b.req == MPI_REQUEST_NULL; });
}

// ---- requests this layer owns ----

enum class kind { send, ssend, recv };
/// One nonblocking operation (or a blocking one's state). The user holds a generalized request
/// (MPI_Grequest_start) that is completed when the operation finishes.
struct op {
  kind k = kind::send;
  std::uint64_t id = 0;            // envelope id (ssend, recv)
  MPI_Comm comm = MPI_COMM_NULL;
  const comm_info* info = nullptr;
  void* buf = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  bool done_in_sim = false;        // recv: matched (m holds the envelope); ssend: acknowledged
  proto::p2p_match m;
  bool received = false;           // recv: the bytes are in buf (status holds MPI's status)
  int mpi_error = MPI_SUCCESS;     // recv: what PMPI_Recv returned (MPI_ERR_TRUNCATE, ...)
  MPI_Status status{};
};
std::recursive_mutex p2p_mu;  // one point-to-point call at a time per process
std::map<MPI_Request, std::unique_ptr<op>> ops;  // by the user's request handle
std::vector<op*> live;                           // every op whose envelope is pending (blocking ones too)
std::uint64_t next_id = 1;

int query_status(void* extra, MPI_Status* status) {
  const op& o = *static_cast<const op*>(extra);
  if (o.k == kind::recv) {
    *status = o.status;
  } else {
    PMPI_Status_set_elements(status, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(status, 0);
    status->MPI_SOURCE = MPI_ANY_SOURCE;
    status->MPI_TAG = MPI_ANY_TAG;
  }
  return MPI_SUCCESS;
}
int free_request(void*) { return MPI_SUCCESS; }
int cancel_request(void*, int) { return MPI_SUCCESS; }

int failed(MPI_Comm comm, const char* call, const error& e) {
  std::fprintf(stderr, "spin-mpi: rank %d: %s in virtual time: spin-emu: %s: %s\n", world_rank(), call, errc_name(e.code),
               e.message.c_str());
  PMPI_Comm_call_errhandler(comm == MPI_COMM_NULL ? MPI_COMM_WORLD : comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

/// Asks spin-emu which of the pending operations are complete (without waiting, or until
/// `need` of `of` are, when `need` > 0). Marks them.
result<void> learn(const std::vector<op*>& of, std::uint32_t need) {
  std::vector<std::uint64_t> ids;
  std::uint32_t already = 0;
  for (op* o : of) {
    if (o->k == kind::send) continue;
    if (o->done_in_sim)
      ++already;
    else
      ids.push_back(o->id);
  }
  if (ids.empty()) return {};
  const std::uint32_t want = need > already ? std::min<std::uint32_t>(need - already, static_cast<std::uint32_t>(ids.size())) : 0;
  std::lock_guard g(vt.mu);
  auto r = vt.cl->p2p_wait(vt.node, std::move(ids), std::max<std::uint32_t>(want, 1), want > 0 ? forever : std::chrono::nanoseconds(0));
  if (!r) {
    (void)vt.cl->sleep_for(vt.node, std::chrono::nanoseconds(0));  // an error reply carries no time: MPI_Wtime learns it
    return r.err();
  }
  for (const auto& d : r.value())
    for (op* o : live)
      if (o->id == d.id) {
        o->done_in_sim = true;
        o->m = d;
      }
  return {};
}

/// Takes the bytes of receive `o` (matched) from MPI: first those of receives of the same
/// communicator, source and tag that matched before it, so MPI matches the same messages. With
/// `message`, o's own message is not received but matched (PMPI_Mprobe) into it.
result<void> take(op& o, MPI_Message* message = nullptr) {
  if (o.received) return {};
  // What else has matched by now: their envelopes may come before o's.
  std::vector<op*> others;
  for (op* x : live)
    if (x != &o && x->k == kind::recv && !x->done_in_sim) others.push_back(x);
  if (auto r = learn(others, 0); !r) return r;
  std::vector<op*> before;
  for (op* x : live)
    if (x != &o && x->k == kind::recv && x->done_in_sim && !x->received && x->comm == o.comm && x->m.source == o.m.source &&
        x->m.match_bits == o.m.match_bits && x->m.order < o.m.order)
      before.push_back(x);
  std::sort(before.begin(), before.end(), [](const op* a, const op* b) { return a->m.order < b->m.order; });
  before.push_back(&o);
  for (op* x : before) {
    const int src = x->info->rank_of(x->m.source);
    const int tag = static_cast<int>(x->m.match_bits & tag_mask);
    if (src == MPI_UNDEFINED)
      return fail(errc::bad_state, "a message from node " + std::to_string(x->m.source) + ", which is no rank of the communicator");
    // MPI's own errors (a truncated message) are the receive's: its communicator's handler has
    // seen them, and its call returns them.
    x->mpi_error = x == &o && message != nullptr ? PMPI_Mprobe(src, tag, x->comm, message, &x->status)
                                                 : PMPI_Recv(x->buf, x->count, x->type, src, tag, x->comm, &x->status);
    x->received = true;
  }
  return {};
}

void forget(op* o) { std::erase(live, o); }

bool valid_rank(MPI_Comm comm, int r) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  return r >= 0 && r < size;
}
int tag_ub() {
  int* ub = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  return found && ub != nullptr ? *ub : 32767;
}

/// The bytes of `count` elements of `type` at `buf`, copied: the base pointer to send from and
/// the allocation.
std::pair<const void*, std::unique_ptr<std::byte[]>> copy_of(const void* buf, int count, MPI_Datatype type) {
  MPI_Aint lb = 0, extent = 0, tlb = 0, textent = 0;
  PMPI_Type_get_extent(type, &lb, &extent);
  PMPI_Type_get_true_extent(type, &tlb, &textent);
  const MPI_Aint span = count > 0 ? textent + static_cast<MPI_Aint>(count - 1) * extent : 0;
  auto copy = std::make_unique<std::byte[]>(static_cast<std::size_t>(std::max<MPI_Aint>(span, 1)));
  if (span > 0) std::memcpy(copy.get(), static_cast<const std::byte*>(buf) + tlb, static_cast<std::size_t>(span));
  const auto base = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(copy.get()) - static_cast<std::uintptr_t>(tlb));
  return {base, std::move(copy)};
}

std::uint64_t bytes_of(int count, MPI_Datatype type) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return static_cast<std::uint64_t>(std::max(0, count)) * static_cast<std::uint64_t>(std::max(0, size));
}

/// Posts a send's envelope and hands a copy of the bytes to MPI (a PMPI_Isend completed later:
/// progress, p2p_finalize). Synchronous: `o` gets the envelope id, and completes when spin-emu
/// says a receive matched it; its bytes do not wait in MPI for that receive's PMPI_Recv, which
/// the receiving rank may post only after the simulation has moved on (it could wait for a
/// synchronous send of its own: the textbook Irecv, Ssend, Wait exchange).
int post_send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, bool sync, op& o, const char* call) {
  const comm_info* info = info_of(comm);
  if (info == nullptr)
    return vt_refuse(comm, call, "the communicator was not made by a call libspin-mpi wraps (MPI_Comm_dup, _split, _split_type, "
                                 "_create), so it has no context id in virtual time");
  o.k = sync ? kind::ssend : kind::send;
  o.comm = comm;
  o.info = info;
  const std::uint64_t bits = static_cast<std::uint64_t>(info->context) << 32 | static_cast<std::uint32_t>(tag);
  const std::uint32_t to = info->nodes[static_cast<std::size_t>(dest)];
  if (sync) o.id = next_id++;
  {
    std::lock_guard g(vt.mu);
    if (auto r = vt.cl->p2p_send(vt.node, to, bits, bytes_of(count, type), o.id); !r) return failed(comm, call, r.err());
  }
  if (sync) live.push_back(&o);
  auto [base, copy] = copy_of(buf, count, type);
  buffered b;
  b.copy = std::move(copy);
  const int e = PMPI_Isend(base, count, type, dest, tag, comm, &b.req);
  if (e == MPI_SUCCESS) {
    bool tidy = false;
    {
      std::lock_guard g(sends_mu);
      sends.push_back(std::move(b));
      tidy = sends.size() % 64 == 0;
    }
    if (tidy) progress();  // keeps the list short when a rank sends many
  }
  return e;
}

/// Posts a receive's envelope.
int post_recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, op& o, const char* call) {
  const comm_info* info = info_of(comm);
  if (info == nullptr)
    return vt_refuse(comm, call, "the communicator was not made by a call libspin-mpi wraps (MPI_Comm_dup, _split, _split_type, "
                                 "_create), so it has no context id in virtual time");
  o.k = kind::recv;
  o.id = next_id++;
  o.comm = comm;
  o.info = info;
  o.buf = buf;
  o.count = count;
  o.type = type;
  const std::uint32_t from = source == MPI_ANY_SOURCE ? proto::any_source : info->nodes[static_cast<std::size_t>(source)];
  const std::uint64_t bits = static_cast<std::uint64_t>(info->context) << 32 | (tag == MPI_ANY_TAG ? 0 : static_cast<std::uint32_t>(tag));
  {
    std::lock_guard g(vt.mu);
    if (auto r = vt.cl->p2p_recv(vt.node, o.id, from, bits, tag == MPI_ANY_TAG ? tag_mask : 0); !r) return failed(comm, call, r.err());
  }
  live.push_back(&o);
  return MPI_SUCCESS;
}

/// Finishes `o`, complete in the simulation: takes a receive's bytes, waits for a synchronous
/// send's PMPI_Issend. Fills `status` (may be MPI_STATUS_IGNORE).
int finish(op& o, MPI_Status* status, const char* call) {
  int e = MPI_SUCCESS;
  if (o.k == kind::recv) {
    if (auto r = take(o); !r)
      e = failed(o.comm, call, r.err());
    else
      e = o.mpi_error;
    if (status != MPI_STATUS_IGNORE) *status = o.status;
  } else if (status != MPI_STATUS_IGNORE) {
    query_status(&o, status);
  }
  forget(&o);
  return e;
}

/// Checks of the arguments MPI would refuse: such a call goes to PMPI, which reports the error
/// without waiting.
bool bad_send_args(int count, int dest, int tag, MPI_Comm comm) {
  return comm == MPI_COMM_NULL || count < 0 || tag < 0 || tag > tag_ub() || !valid_rank(comm, dest);
}
bool bad_recv_args(int count, int source, int tag, MPI_Comm comm) {
  return comm == MPI_COMM_NULL || count < 0 || (tag != MPI_ANY_TAG && (tag < 0 || tag > tag_ub())) ||
         (source != MPI_ANY_SOURCE && !valid_rank(comm, source));
}
bool intercomm(MPI_Comm comm) {
  int inter = 0;
  if (comm != MPI_COMM_NULL) PMPI_Comm_test_inter(comm, &inter);
  return inter != 0;
}

/// A request the user got for `o` (a generalized request, completed by complete_request).
int new_request(std::unique_ptr<op> o, MPI_Request* request) {
  op* p = o.get();
  const int e = PMPI_Grequest_start(query_status, free_request, cancel_request, p, request);
  if (e != MPI_SUCCESS) {
    forget(p);
    return e;
  }
  ops[*request] = std::move(o);
  return MPI_SUCCESS;
}

/// Finishes the operation of user request `*request` and frees the request.
int complete_request(MPI_Request* request, MPI_Status* status, const char* call) {
  auto it = ops.find(*request);
  op& o = *it->second;
  MPI_Status mine{};
  const int e = finish(o, &mine, call);
  PMPI_Grequest_complete(*request);
  PMPI_Wait(request, MPI_STATUS_IGNORE);  // frees it: MPI_REQUEST_NULL
  if (status != MPI_STATUS_IGNORE) *status = mine;
  ops.erase(it);
  return e;
}

op* ours(MPI_Request r) {
  auto it = ops.find(r);
  return it == ops.end() ? nullptr : it->second.get();
}

/// Requests of other origins (a nonblocking collective through MPI): in virtual time they are
/// accepted only when complete already (testing them does not wait).
bool foreign_pending(int count, MPI_Request requests[]) {
  for (int i = 0; i < count; ++i) {
    MPI_Request& r = requests[i];
    if (r == MPI_REQUEST_NULL || ours(r) != nullptr) continue;
    int done = 0;
    MPI_Status st;
    PMPI_Request_get_status(r, &done, &st);
    if (!done) return true;
  }
  return false;
}

bool complete_now(const op& o) { return o.k == kind::send || o.done_in_sim; }

/// Virtual time a test that found nothing takes.
void poll_wait() {
  std::lock_guard g(vt.mu);
  (void)vt.cl->sleep_for(vt.node, poll_cost);
}

} // namespace

void p2p_start() {
  world_info.context = 0;
  world_info.nodes = vt.world_nodes;
  self_info.context = 1;
  self_info.nodes = {vt.node};
  host::client::set_while_waiting(progress, std::chrono::milliseconds(1));
}

void p2p_comm_created(MPI_Comm newcomm) {
  if (!vt.on || newcomm == MPI_COMM_NULL || intercomm(newcomm)) return;
  std::lock_guard g(p2p_mu);
  if (keyval == MPI_KEYVAL_INVALID) PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_info, &keyval, nullptr);
  // Every member of newcomm is in this call: they agree on an id none of them uses yet.
  std::uint32_t agreed = 0;
  PMPI_Allreduce(&next_context, &agreed, 1, MPI_UINT32_T, MPI_MAX, newcomm);
  next_context = agreed + 1;
  auto* info = new comm_info{agreed, rank_nodes(newcomm)};
  PMPI_Comm_set_attr(newcomm, keyval, info);
}

void p2p_finalize() {
  if (!vt.on) return;
  host::client::set_while_waiting(nullptr, std::chrono::milliseconds(1));
  std::lock_guard g(sends_mu);
  for (auto& b : sends) PMPI_Wait(&b.req, MPI_STATUS_IGNORE);
  sends.clear();
}

} // namespace spin::mpi_detail

using namespace spin::mpi_detail;

extern "C" {

// ---- point to point: in virtual time through the envelopes above; else straight to PMPI ----

#define SPIN_MPI_VT_ONLY(call, ...)                                        \
  if (!vt.on) return P##call(__VA_ARGS__);                                  \
  if (intercomm(comm)) return vt_refuse(comm, #call, "point to point on an intercommunicator is not supported");

namespace {
int send_common(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, bool sync, const char* call) {
  std::lock_guard g(p2p_mu);
  op o;
  if (int e = post_send(buf, count, type, dest, tag, comm, sync, o, call); e != MPI_SUCCESS) {
    forget(&o);
    return e;
  }
  if (!sync) return MPI_SUCCESS;
  if (auto r = learn({&o}, 1); !r) {
    forget(&o);
    return failed(comm, call, r.err());
  }
  return finish(o, MPI_STATUS_IGNORE, call);
}

int recv_common(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Status* status, const char* call) {
  std::lock_guard g(p2p_mu);
  op o;
  if (int e = post_recv(buf, count, type, source, tag, comm, o, call); e != MPI_SUCCESS) return e;
  if (auto r = learn({&o}, 1); !r) {
    forget(&o);
    return failed(comm, call, r.err());
  }
  return finish(o, status, call);
}
} // namespace

int MPI_Send(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  SPIN_MPI_VT_ONLY(MPI_Send, buf, count, datatype, dest, tag, comm)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Send(buf, count, datatype, dest, tag, comm);
  return send_common(buf, count, datatype, dest, tag, comm, false, "MPI_Send");
}
int MPI_Bsend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  SPIN_MPI_VT_ONLY(MPI_Bsend, buf, count, datatype, dest, tag, comm)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Bsend(buf, count, datatype, dest, tag, comm);
  return send_common(buf, count, datatype, dest, tag, comm, false, "MPI_Bsend");
}
int MPI_Rsend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  SPIN_MPI_VT_ONLY(MPI_Rsend, buf, count, datatype, dest, tag, comm)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Rsend(buf, count, datatype, dest, tag, comm);
  return send_common(buf, count, datatype, dest, tag, comm, false, "MPI_Rsend");
}
int MPI_Ssend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm) {
  SPIN_MPI_VT_ONLY(MPI_Ssend, buf, count, datatype, dest, tag, comm)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Ssend(buf, count, datatype, dest, tag, comm);
  return send_common(buf, count, datatype, dest, tag, comm, true, "MPI_Ssend");
}

int MPI_Recv(void* buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Status* status) {
  SPIN_MPI_VT_ONLY(MPI_Recv, buf, count, datatype, source, tag, comm, status)
  if (source == MPI_PROC_NULL || bad_recv_args(count, source, tag, comm))
    return PMPI_Recv(buf, count, datatype, source, tag, comm, status);
  return recv_common(buf, count, datatype, source, tag, comm, status, "MPI_Recv");
}

int MPI_Sendrecv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag, void* recvbuf, int recvcount,
                 MPI_Datatype recvtype, int source, int recvtag, MPI_Comm comm, MPI_Status* status) {
  SPIN_MPI_VT_ONLY(MPI_Sendrecv, sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm,
                   status)
  if ((dest != MPI_PROC_NULL && bad_send_args(sendcount, dest, sendtag, comm)) ||
      (source != MPI_PROC_NULL && bad_recv_args(recvcount, source, recvtag, comm)))
    return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm, status);
  if (dest != MPI_PROC_NULL)
    if (int e = send_common(sendbuf, sendcount, sendtype, dest, sendtag, comm, false, "MPI_Sendrecv"); e != MPI_SUCCESS) return e;
  if (source == MPI_PROC_NULL) return PMPI_Recv(recvbuf, recvcount, recvtype, source, recvtag, comm, status);
  return recv_common(recvbuf, recvcount, recvtype, source, recvtag, comm, status, "MPI_Sendrecv");
}

int MPI_Sendrecv_replace(void* buf, int count, MPI_Datatype datatype, int dest, int sendtag, int source, int recvtag,
                         MPI_Comm comm, MPI_Status* status) {
  SPIN_MPI_VT_ONLY(MPI_Sendrecv_replace, buf, count, datatype, dest, sendtag, source, recvtag, comm, status)
  if ((dest != MPI_PROC_NULL && bad_send_args(count, dest, sendtag, comm)) ||
      (source != MPI_PROC_NULL && bad_recv_args(count, source, recvtag, comm)))
    return PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm, status);
  // The send copies the bytes before the receive overwrites them.
  if (dest != MPI_PROC_NULL)
    if (int e = send_common(buf, count, datatype, dest, sendtag, comm, false, "MPI_Sendrecv_replace"); e != MPI_SUCCESS) return e;
  if (source == MPI_PROC_NULL) return PMPI_Recv(buf, count, datatype, source, recvtag, comm, status);
  return recv_common(buf, count, datatype, source, recvtag, comm, status, "MPI_Sendrecv_replace");
}

namespace {
int isend_common(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, bool sync, MPI_Request* request,
                 const char* call) {
  std::lock_guard g(p2p_mu);
  auto o = std::make_unique<op>();
  if (int e = post_send(buf, count, type, dest, tag, comm, sync, *o, call); e != MPI_SUCCESS) {
    forget(o.get());
    return e;
  }
  return new_request(std::move(o), request);
}
} // namespace

int MPI_Isend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  SPIN_MPI_VT_ONLY(MPI_Isend, buf, count, datatype, dest, tag, comm, request)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
  return isend_common(buf, count, datatype, dest, tag, comm, false, request, "MPI_Isend");
}
int MPI_Ibsend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  SPIN_MPI_VT_ONLY(MPI_Ibsend, buf, count, datatype, dest, tag, comm, request)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Ibsend(buf, count, datatype, dest, tag, comm, request);
  return isend_common(buf, count, datatype, dest, tag, comm, false, request, "MPI_Ibsend");
}
int MPI_Irsend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  SPIN_MPI_VT_ONLY(MPI_Irsend, buf, count, datatype, dest, tag, comm, request)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Irsend(buf, count, datatype, dest, tag, comm, request);
  return isend_common(buf, count, datatype, dest, tag, comm, false, request, "MPI_Irsend");
}
int MPI_Issend(const void* buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm, MPI_Request* request) {
  SPIN_MPI_VT_ONLY(MPI_Issend, buf, count, datatype, dest, tag, comm, request)
  if (dest == MPI_PROC_NULL || bad_send_args(count, dest, tag, comm)) return PMPI_Issend(buf, count, datatype, dest, tag, comm, request);
  return isend_common(buf, count, datatype, dest, tag, comm, true, request, "MPI_Issend");
}

int MPI_Irecv(void* buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm, MPI_Request* request) {
  SPIN_MPI_VT_ONLY(MPI_Irecv, buf, count, datatype, source, tag, comm, request)
  if (source == MPI_PROC_NULL || bad_recv_args(count, source, tag, comm))
    return PMPI_Irecv(buf, count, datatype, source, tag, comm, request);
  std::lock_guard g(p2p_mu);
  auto o = std::make_unique<op>();
  if (int e = post_recv(buf, count, datatype, source, tag, comm, *o, "MPI_Irecv"); e != MPI_SUCCESS) return e;
  return new_request(std::move(o), request);
}

namespace {
/// Probes: the envelope first (waiting in virtual time, or not), then MPI's probe of exactly
/// that message, which is there already. flag null: blocking.
int probe_common(int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status, const char* call) {
  std::lock_guard g(p2p_mu);
  const comm_info* info = info_of(comm);
  if (info == nullptr)
    return vt_refuse(comm, call, "the communicator was not made by a call libspin-mpi wraps, so it has no context id in virtual time");
  const std::uint32_t from = source == MPI_ANY_SOURCE ? proto::any_source : info->nodes[static_cast<std::size_t>(source)];
  const std::uint64_t bits = static_cast<std::uint64_t>(info->context) << 32 | (tag == MPI_ANY_TAG ? 0 : static_cast<std::uint32_t>(tag));
  spin::result<std::optional<proto::p2p_match>> m = std::optional<proto::p2p_match>();
  {
    std::lock_guard v(vt.mu);
    m = vt.cl->p2p_probe(vt.node, from, bits, tag == MPI_ANY_TAG ? tag_mask : 0, flag == nullptr ? forever : std::chrono::nanoseconds(0));
  }
  if (!m) return failed(comm, call, m.err());
  if (!m.value()) {
    if (flag == nullptr) return failed(comm, call, spin::error{spin::errc::timeout, "no message came within 100 days of virtual time"});
    *flag = 0;
    poll_wait();
    return MPI_SUCCESS;
  }
  // Receives that matched earlier messages of that source and tag take their bytes first.
  op probe;
  probe.k = kind::recv;
  probe.comm = comm;
  probe.info = info;
  probe.m = *m.value();
  probe.m.order = std::numeric_limits<std::uint64_t>::max();
  std::vector<op*> others;
  for (op* x : live)
    if (x->k == kind::recv && !x->done_in_sim) others.push_back(x);
  if (auto r = learn(others, 0); !r) return failed(comm, call, r.err());
  for (op* x : std::vector<op*>(live))
    if (x->k == kind::recv && x->done_in_sim && !x->received && x->comm == comm && x->m.source == probe.m.source &&
        x->m.match_bits == probe.m.match_bits)
      if (auto r = take(*x); !r) return failed(comm, call, r.err());
  if (flag != nullptr) *flag = 1;
  return PMPI_Probe(info->rank_of(probe.m.source), static_cast<int>(probe.m.match_bits & tag_mask), comm, status);
}
} // namespace

int MPI_Probe(int source, int tag, MPI_Comm comm, MPI_Status* status) {
  SPIN_MPI_VT_ONLY(MPI_Probe, source, tag, comm, status)
  if (source == MPI_PROC_NULL || bad_recv_args(0, source, tag, comm)) return PMPI_Probe(source, tag, comm, status);
  return probe_common(source, tag, comm, nullptr, status, "MPI_Probe");
}
int MPI_Iprobe(int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status) {
  SPIN_MPI_VT_ONLY(MPI_Iprobe, source, tag, comm, flag, status)
  if (source == MPI_PROC_NULL || bad_recv_args(0, source, tag, comm)) return PMPI_Iprobe(source, tag, comm, flag, status);
  return probe_common(source, tag, comm, flag, status, "MPI_Iprobe");
}
namespace {
/// Matched probes: the envelope probe, then a receive of exactly that envelope (it matches at
/// once: no earlier message of that source and match bits is left), then MPI's matched probe
/// of exactly that message, which MPI_Mrecv and MPI_Imrecv (straight to PMPI) receive.
int mprobe_common(int source, int tag, MPI_Comm comm, int* flag, MPI_Message* message, MPI_Status* status, const char* call) {
  std::lock_guard g(p2p_mu);
  const comm_info* info = info_of(comm);
  if (info == nullptr)
    return vt_refuse(comm, call, "the communicator was not made by a call libspin-mpi wraps, so it has no context id in virtual time");
  const std::uint32_t from = source == MPI_ANY_SOURCE ? proto::any_source : info->nodes[static_cast<std::size_t>(source)];
  const std::uint64_t bits = static_cast<std::uint64_t>(info->context) << 32 | (tag == MPI_ANY_TAG ? 0 : static_cast<std::uint32_t>(tag));
  spin::result<std::optional<proto::p2p_match>> m = std::optional<proto::p2p_match>();
  {
    std::lock_guard v(vt.mu);
    m = vt.cl->p2p_probe(vt.node, from, bits, tag == MPI_ANY_TAG ? tag_mask : 0, flag == nullptr ? forever : std::chrono::nanoseconds(0));
  }
  if (!m) return failed(comm, call, m.err());
  if (!m.value()) {
    if (flag == nullptr) return failed(comm, call, spin::error{spin::errc::timeout, "no message came within 100 days of virtual time"});
    *flag = 0;
    *message = MPI_MESSAGE_NULL;
    poll_wait();
    return MPI_SUCCESS;
  }
  op o;
  const int tag_of = static_cast<int>(m.value()->match_bits & tag_mask);
  if (int e = post_recv(nullptr, 0, MPI_BYTE, info->rank_of(m.value()->source), tag_of, comm, o, call); e != MPI_SUCCESS) return e;
  if (auto r = learn({&o}, 1); !r) {
    forget(&o);
    return failed(comm, call, r.err());
  }
  auto r = take(o, message);
  forget(&o);
  if (!r) return failed(comm, call, r.err());
  if (status != MPI_STATUS_IGNORE) *status = o.status;
  if (flag != nullptr) *flag = 1;
  return o.mpi_error;
}
} // namespace

int MPI_Mprobe(int source, int tag, MPI_Comm comm, MPI_Message* message, MPI_Status* status) {
  if (!vt.on) return PMPI_Mprobe(source, tag, comm, message, status);
  if (intercomm(comm)) return vt_refuse(comm, "MPI_Mprobe", "point to point on an intercommunicator is not supported");
  if (source == MPI_PROC_NULL || bad_recv_args(0, source, tag, comm)) return PMPI_Mprobe(source, tag, comm, message, status);
  return mprobe_common(source, tag, comm, nullptr, message, status, "MPI_Mprobe");
}
int MPI_Improbe(int source, int tag, MPI_Comm comm, int* flag, MPI_Message* message, MPI_Status* status) {
  if (!vt.on) return PMPI_Improbe(source, tag, comm, flag, message, status);
  if (intercomm(comm)) return vt_refuse(comm, "MPI_Improbe", "point to point on an intercommunicator is not supported");
  if (source == MPI_PROC_NULL || bad_recv_args(0, source, tag, comm)) return PMPI_Improbe(source, tag, comm, flag, message, status);
  return mprobe_common(source, tag, comm, flag, message, status, "MPI_Improbe");
}

#undef SPIN_MPI_VT_ONLY

// ---- completions ----

int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  if (!vt.on || *request == MPI_REQUEST_NULL) return PMPI_Wait(request, status);
  std::lock_guard g(p2p_mu);
  op* o = ours(*request);
  if (o == nullptr) {
    if (foreign_pending(1, request))
      return vt_refuse(MPI_COMM_WORLD, "MPI_Wait", "it waits for a request libspin-mpi did not make (a nonblocking collective, a persistent request)");
    return PMPI_Wait(request, status);
  }
  if (auto r = learn({o}, 1); !r) return failed(o->comm, "MPI_Wait", r.err());
  return complete_request(request, status, "MPI_Wait");
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (!vt.on) return PMPI_Waitall(count, requests, statuses);
  std::lock_guard g(p2p_mu);
  if (foreign_pending(count, requests))
    return vt_refuse(MPI_COMM_WORLD, "MPI_Waitall", "it waits for a request libspin-mpi did not make (a nonblocking collective, a persistent request)");
  std::vector<op*> mine;
  for (int i = 0; i < count; ++i)
    if (op* o = requests[i] != MPI_REQUEST_NULL ? ours(requests[i]) : nullptr) mine.push_back(o);
  std::uint32_t need = 0;
  for (op* o : mine) need += o->k == kind::send ? 0 : 1;
  if (auto r = learn(mine, need); !r) return failed(MPI_COMM_WORLD, "MPI_Waitall", r.err());
  int err = MPI_SUCCESS;
  for (int i = 0; i < count; ++i) {
    MPI_Status* st = statuses == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE : &statuses[i];
    const int e = ours(requests[i]) != nullptr ? complete_request(&requests[i], st, "MPI_Waitall") : PMPI_Wait(&requests[i], st);
    if (e != MPI_SUCCESS) err = MPI_ERR_IN_STATUS;
    if (st != MPI_STATUS_IGNORE) st->MPI_ERROR = e;
  }
  return err;
}

namespace {
/// Waitany, Waitsome, Testany, Testsome: complete the requests of ours that are complete
/// (after waiting for one, when `wait`); with `one`, only the first in array order. Foreign
/// requests that are complete count too.
int some(int count, MPI_Request requests[], bool wait, bool one, std::vector<int>& done, std::vector<MPI_Status>& sts, const char* call) {
  if (foreign_pending(count, requests))
    return vt_refuse(MPI_COMM_WORLD, call, "it waits for a request libspin-mpi did not make (a nonblocking collective, a persistent request)");
  std::vector<op*> mine;
  bool any_active = false;
  for (int i = 0; i < count; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    any_active = true;
    if (op* o = ours(requests[i])) mine.push_back(o);
  }
  if (!any_active) return MPI_SUCCESS;  // done stays empty: MPI_UNDEFINED
  const bool foreign_done = mine.size() < static_cast<std::size_t>(std::count_if(requests, requests + count, [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  if (auto r = learn(mine, wait && !foreign_done ? 1 : 0); !r) return failed(MPI_COMM_WORLD, call, r.err());
  for (int i = 0; i < count; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    op* o = ours(requests[i]);
    if (o != nullptr && !complete_now(*o)) continue;
    MPI_Status st{};
    const int e = o != nullptr ? complete_request(&requests[i], &st, call) : PMPI_Wait(&requests[i], &st);
    if (e != MPI_SUCCESS) return e;
    done.push_back(i);
    sts.push_back(st);
    if (one) break;
  }
  return MPI_SUCCESS;
}
} // namespace

int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (!vt.on) return PMPI_Waitany(count, requests, index, status);
  std::lock_guard g(p2p_mu);
  std::vector<int> done;
  std::vector<MPI_Status> sts;
  if (int e = some(count, requests, true, true, done, sts, "MPI_Waitany"); e != MPI_SUCCESS) return e;
  if (done.empty()) return PMPI_Waitany(count, requests, index, status);  // every request is null: MPI's answer
  *index = done[0];
  if (status != MPI_STATUS_IGNORE) *status = sts[0];
  return MPI_SUCCESS;
}

int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  if (!vt.on) return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
  std::lock_guard g(p2p_mu);
  std::vector<int> done;
  std::vector<MPI_Status> sts;
  if (int e = some(incount, requests, true, false, done, sts, "MPI_Waitsome"); e != MPI_SUCCESS) return e;
  if (done.empty()) return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
  *outcount = static_cast<int>(done.size());
  for (std::size_t i = 0; i < done.size(); ++i) {
    indices[i] = done[i];
    if (statuses != MPI_STATUSES_IGNORE) statuses[i] = sts[i];
  }
  return MPI_SUCCESS;
}

int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (!vt.on || *request == MPI_REQUEST_NULL || ours(*request) == nullptr) return PMPI_Test(request, flag, status);
  std::lock_guard g(p2p_mu);
  op* o = ours(*request);
  if (auto r = learn({o}, 0); !r) return failed(o->comm, "MPI_Test", r.err());
  if (!complete_now(*o)) {
    *flag = 0;
    poll_wait();
    return MPI_SUCCESS;
  }
  *flag = 1;
  return complete_request(request, status, "MPI_Test");
}

int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status) {
  if (!vt.on) return PMPI_Testany(count, requests, index, flag, status);
  std::lock_guard g(p2p_mu);
  std::vector<int> done;
  std::vector<MPI_Status> sts;
  if (int e = some(count, requests, false, true, done, sts, "MPI_Testany"); e != MPI_SUCCESS) return e;
  if (done.empty()) {
    const bool active = std::any_of(requests, requests + count, [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
    if (!active) return PMPI_Testany(count, requests, index, flag, status);
    *flag = 0;
    *index = MPI_UNDEFINED;
    poll_wait();
    return MPI_SUCCESS;
  }
  *flag = 1;
  *index = done[0];
  if (status != MPI_STATUS_IGNORE) *status = sts[0];
  return MPI_SUCCESS;
}

int MPI_Testsome(int incount, MPI_Request requests[], int* outcount, int indices[], MPI_Status statuses[]) {
  if (!vt.on) return PMPI_Testsome(incount, requests, outcount, indices, statuses);
  std::lock_guard g(p2p_mu);
  std::vector<int> done;
  std::vector<MPI_Status> sts;
  if (int e = some(incount, requests, false, false, done, sts, "MPI_Testsome"); e != MPI_SUCCESS) return e;
  const bool active = std::any_of(requests, requests + incount, [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  if (!active && done.empty()) return PMPI_Testsome(incount, requests, outcount, indices, statuses);
  *outcount = static_cast<int>(done.size());
  for (std::size_t i = 0; i < done.size(); ++i) {
    indices[i] = done[i];
    if (statuses != MPI_STATUSES_IGNORE) statuses[i] = sts[i];
  }
  if (done.empty()) poll_wait();
  return MPI_SUCCESS;
}

int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  if (!vt.on) return PMPI_Testall(count, requests, flag, statuses);
  std::lock_guard g(p2p_mu);
  if (foreign_pending(count, requests)) {  // MPI's answer for those: not all complete
    *flag = 0;
    poll_wait();
    return MPI_SUCCESS;
  }
  std::vector<op*> mine;
  for (int i = 0; i < count; ++i)
    if (op* o = requests[i] != MPI_REQUEST_NULL ? ours(requests[i]) : nullptr) mine.push_back(o);
  if (auto r = learn(mine, 0); !r) return failed(MPI_COMM_WORLD, "MPI_Testall", r.err());
  if (!std::all_of(mine.begin(), mine.end(), [](const op* o) { return complete_now(*o); })) {
    *flag = 0;
    poll_wait();
    return MPI_SUCCESS;
  }
  *flag = 1;
  int err = MPI_SUCCESS;
  for (int i = 0; i < count; ++i) {
    MPI_Status* st = statuses == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE : &statuses[i];
    const int e = ours(requests[i]) != nullptr ? complete_request(&requests[i], st, "MPI_Testall") : PMPI_Wait(&requests[i], st);
    if (e != MPI_SUCCESS) err = MPI_ERR_IN_STATUS;
    if (st != MPI_STATUS_IGNORE) st->MPI_ERROR = e;
  }
  return err;
}

// Requests of ours freed, cancelled or looked at without completing them.
int MPI_Request_free(MPI_Request* request) {
  if (!vt.on || *request == MPI_REQUEST_NULL || ours(*request) == nullptr) return PMPI_Request_free(request);
  std::lock_guard g(p2p_mu);
  op* o = ours(*request);
  if (o->k != kind::send)
    return vt_refuse(o->comm, "MPI_Request_free", "of a pending receive or synchronous send; wait for it or test it instead");
  return complete_request(request, MPI_STATUS_IGNORE, "MPI_Request_free");  // a buffered send is complete
}

int MPI_Cancel(MPI_Request* request) {
  if (!vt.on || *request == MPI_REQUEST_NULL || ours(*request) == nullptr) return PMPI_Cancel(request);
  return vt_refuse(ours(*request)->comm, "MPI_Cancel", "cancelling a point-to-point operation is not supported");
}

int MPI_Request_get_status(MPI_Request request, int* flag, MPI_Status* status) {
  if (!vt.on || request == MPI_REQUEST_NULL || ours(request) == nullptr) return PMPI_Request_get_status(request, flag, status);
  std::lock_guard g(p2p_mu);
  op* o = ours(request);
  if (auto r = learn({o}, 0); !r) return failed(o->comm, "MPI_Request_get_status", r.err());
  if (!complete_now(*o)) {
    *flag = 0;
    poll_wait();
    return MPI_SUCCESS;
  }
  // A receive's status needs its bytes: they are taken now, and its wait only frees it.
  if (o->k == kind::recv)
    if (auto r = take(*o); !r) return failed(o->comm, "MPI_Request_get_status", r.err());
  *flag = 1;
  if (status != MPI_STATUS_IGNORE) query_status(o, status);
  return MPI_SUCCESS;
}

} // extern "C"
