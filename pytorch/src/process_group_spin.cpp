// spin_torch: a torch.distributed backend ("spin") whose collectives run through spin::coll
// (docs/pytorch.md). `import spin_torch` registers it; then
// torch.distributed.init_process_group("spin", ...) or new_group(backend="spin") create
// process groups whose allreduce, broadcast, allgather, _allgather_base, reduce_scatter,
// _reduce_scatter_base and barrier run on the emulated NICs (and switches). Every other
// operation raises torch's "ProcessGroup spin does not support ..." error.
//
// Set-up through the c10d store the launcher gives the group (no rendezvous of our own): each
// rank publishes its NIC's rank and a group id proposal; all take the members and the largest
// proposal, connect to their NIC's spin-emu, and publish whether that worked; a rank that
// failed makes every rank raise its reason.
//
// Threads: collectives run on the calling thread and complete before they return (the Work and
// its future are complete); one collective at a time per process group (a lock).
//
// Built as C++17 (libtorch 1.13's headers); spin::coll is reached through spin_group.hpp.
#include "spin_group.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/python.h>

#include <pybind11/chrono.h>
#include <pybind11/eval.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace tb = spin::torch_backend;

std::optional<std::uint64_t> env_u64(const char* name, std::uint64_t max = 0xffffffffu) {
  std::string error;
  auto v = tb::env_number(name, max, error);
  if (!error.empty()) throw std::invalid_argument("spin: " + error);
  return v;
}

struct config {
  std::string socket = "/run/spin-emu.sock";
  std::uint32_t node = 0;
  std::optional<std::uint32_t> switch_node;
  std::string switch_socket;
  std::optional<std::uint32_t> switch_rank;
  tb::algo algo = tb::algo::automatic;
};

config read_config(int global_rank) {
  config c;
  if (const char* s = std::getenv("SPIN_TORCH_SOCKET"); s != nullptr && *s != '\0') c.socket = s;
  std::optional<std::uint64_t> node = env_u64("SPIN_TORCH_NODE");
  for (const char* local : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (!node) node = env_u64(local);
  c.node = static_cast<std::uint32_t>(node.value_or(static_cast<std::uint64_t>(global_rank)));
  if (const char* a = std::getenv("SPIN_TORCH_ALGORITHM"); a != nullptr && *a != '\0') {
    const std::string s = a;
    if (s == "edge_ring")
      c.algo = tb::algo::edge_ring;
    else if (s == "host_ring")
      c.algo = tb::algo::host_ring;
    else if (s == "switch")
      c.algo = tb::algo::switch_agg;
    else if (s != "automatic")
      throw std::invalid_argument("spin: SPIN_TORCH_ALGORITHM='" + s + "' is not automatic, edge_ring, switch or host_ring");
  }
  if (auto n = env_u64("SPIN_TORCH_SWITCH_NODE")) c.switch_node = static_cast<std::uint32_t>(*n);
  if (auto r = env_u64("SPIN_TORCH_SWITCH_RANK", 0xfffffffeu)) c.switch_rank = static_cast<std::uint32_t>(*r);
  c.switch_socket = c.socket;
  if (const char* s = std::getenv("SPIN_TORCH_SWITCH_SOCKET"); s != nullptr && *s != '\0') c.switch_socket = s;
  return c;
}

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }

// This process's next group id (the members take the largest proposal; ids are per NIC).
std::atomic<std::uint32_t> next_group_id{1};

// For torch's own store-based barrier in virtual time (world_barrier): this process's spin-emu
// and node, and the nodes of each spin group size seen (the world's among them).
struct seen_groups {
  std::mutex mu;
  std::string socket;
  std::uint32_t node = 0;
  std::map<int, std::vector<std::uint32_t>> nodes_by_size;
} seen;

// Before torch's store-based barrier (init_process_group, new_group: every rank of the world
// waits in the store there, members of the new group after their set-up): in virtual time the
// world's ranks meet first, so none holds the simulation while waiting in the store for a
// member whose set-up waits on its NIC. Nothing in wall-clock time. Raises when no spin group
// spans the world yet (its nodes are unknown).
void world_barrier(int world_size) {
  std::string socket;
  std::uint32_t node = 0;
  std::vector<std::uint32_t> nodes;
  {
    std::lock_guard g(seen.mu);
    if (seen.socket.empty()) return;  // no spin group yet: nothing drives a NIC
    socket = seen.socket;
    node = seen.node;
    if (auto it = seen.nodes_by_size.find(world_size); it != seen.nodes_by_size.end()) nodes = it->second;
  }
  if (!tb::in_virtual_time(socket)) return;
  if (nodes.empty())
    throw std::runtime_error("spin: virtual time: torch's store-based barrier needs every rank's node, known once a \"spin\" "
                             "group of all " + std::to_string(world_size) + " ranks exists (init_process_group(\"spin\"), or "
                             "new_group(backend=\"spin\") over the world first)");
  if (std::string e = tb::virtual_time_barrier(socket, node, nodes); !e.empty()) throw std::runtime_error("spin: " + e);
}

std::optional<tb::elem> reduction_dtype(at::ScalarType t) {
  switch (t) {
  case at::kFloat: return tb::elem::f32;
  case at::kDouble: return tb::elem::f64;
  case at::kHalf: return tb::elem::f16;
  case at::kBFloat16: return tb::elem::bf16;
  case at::kInt: return tb::elem::i32;
  case at::kLong: return tb::elem::i64;
  default: return std::nullopt;
  }
}

tb::red reduction_op(const c10d::ReduceOp& o) {
  switch (o.op_) {
  case c10d::ReduceOp::SUM: return tb::red::sum;
  case c10d::ReduceOp::MIN: return tb::red::min;
  case c10d::ReduceOp::MAX: return tb::red::max;
  case c10d::ReduceOp::PRODUCT: return tb::red::prod;
  default: throw std::invalid_argument("spin: only SUM, MIN, MAX and PRODUCT reduce (not reduce op " + std::to_string(int(o.op_)) + ")");
  }
}

// A collective that already ran: complete, with its outputs and a completed future (DDP's
// reducer waits on the future of each bucket's allreduce).
class done_work : public c10d::Work {
public:
  done_work(std::vector<at::Tensor> outputs, c10d::OpType t) : Work(-1, t), _outputs(std::move(outputs)) {
    _future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    _future->markCompleted(c10::IValue(_outputs));
    finish();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return _outputs; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return _future; }

private:
  std::vector<at::Tensor> _outputs;
  c10::intrusive_ptr<c10::ivalue::Future> _future;
};

class process_group_spin final : public c10d::ProcessGroup {
public:
  process_group_spin(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size), _cfg(read_config(env_u64("RANK").value_or(static_cast<std::uint64_t>(rank)))) {
    if (size < 1 || size > 256) throw std::invalid_argument("spin: a process group has 1..256 ranks, not " + std::to_string(size));
    // This rank's NIC and a group id proposal, published; then everyone's.
    std::string failure;
    const std::uint32_t nic_rank = tb::nic_rank(_cfg.socket, _cfg.node, failure);
    const std::string me = std::to_string(rank);
    store->set("spin/nic/" + me, bytes_of(std::to_string(nic_rank)));
    store->set("spin/gid/" + me, bytes_of(std::to_string(next_group_id.load())));
    store->set("spin/node/" + me, bytes_of(std::to_string(_cfg.node)));
    std::vector<std::uint32_t> members, nodes;
    std::uint32_t gid = 0;
    for (int r = 0; r < size; ++r) {
      members.push_back(static_cast<std::uint32_t>(std::stoul(string_of(store->get("spin/nic/" + std::to_string(r))))));
      nodes.push_back(static_cast<std::uint32_t>(std::stoul(string_of(store->get("spin/node/" + std::to_string(r))))));
      gid = std::max<std::uint32_t>(gid, static_cast<std::uint32_t>(std::stoul(string_of(store->get("spin/gid/" + std::to_string(r))))));
    }
    next_group_id = gid + 1;
    {
      std::lock_guard g(seen.mu);
      if (seen.socket.empty()) {
        seen.socket = _cfg.socket;
        seen.node = _cfg.node;
      }
      std::vector<std::uint32_t> sorted = nodes;
      std::sort(sorted.begin(), sorted.end());
      seen.nodes_by_size.emplace(size, std::move(sorted));
    }
    // The group's secret (spin::coll::options::job_secret), agreed through the store:
    // SPIN_JOB_SECRET, else rank 0's random bytes.
    std::string secret_error;
    std::optional<tb::secret> secret = tb::env_secret("SPIN_JOB_SECRET", secret_error);
    if (!secret_error.empty()) throw std::invalid_argument("spin: " + secret_error);
    if (!secret) {
      if (rank == 0) {
        const tb::secret s = tb::random_secret(secret_error);
        if (!secret_error.empty()) throw std::runtime_error("spin: " + secret_error);
        store->set("spin/secret", std::vector<std::uint8_t>(s.begin(), s.end()));
      }
      const std::vector<std::uint8_t> got = store->get("spin/secret");
      tb::secret s{};
      if (got.size() == s.size()) std::copy(got.begin(), got.end(), s.begin());
      secret = s;
    }
    if (failure.empty() && gid > 4095) failure = "group ids exhausted (4095 process groups per NIC)";
    if (failure.empty() && size > 1) {
      _comm = std::make_unique<tb::group>(_cfg.socket, _cfg.node, gid, members, static_cast<std::uint32_t>(rank), timeout,
                                          _cfg.algo, _cfg.switch_socket, _cfg.switch_node, _cfg.switch_rank, *secret,
                                          failure);
      if (!failure.empty()) _comm.reset();
    }
    // Everyone learns whether everyone is ready. In virtual time the members meet first: the
    // store's waits below are outside spin, and a member still setting up waits on its NIC
    // (docs/virtual-time.md, "PyTorch programs"). Until its communicator bound it, a process
    // holds nothing: the exchange above needs no barrier. Every member comes, also one that
    // failed: the others wait for it there.
    if (size > 1)
      if (std::string b = tb::virtual_time_barrier(_cfg.socket, _cfg.node, nodes); failure.empty()) failure = b;
    store->set("spin/ok/" + me, bytes_of(failure.empty() ? "ok" : failure));
    for (int r = 0; r < size; ++r) {
      const std::string s = string_of(store->get("spin/ok/" + std::to_string(r)));
      if (s != "ok") {
        _comm.reset();
        throw std::runtime_error("spin: rank " + std::to_string(r) + " could not join the process group: " + s);
      }
    }
  }

  const std::string getBackendName() const override { return "spin"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    at::Tensor& t = single(tensors, "allreduce");
    const auto dt = reduction_dtype(t.scalar_type());
    if (!dt) throw std::invalid_argument(std::string("spin: allreduce of ") + c10::toString(t.scalar_type()) + " tensors is not supported");
    const tb::red op = reduction_op(opts.reduceOp);
    in_place(t, [&](void* p) { check(_comm->allreduce(p, static_cast<std::uint64_t>(t.numel()), *dt, op), "allreduce"); });
    return done(tensors, c10d::OpType::ALLREDUCE);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    at::Tensor& t = single(tensors, "broadcast");
    if (opts.rootTensor != 0) throw std::invalid_argument("spin: broadcast takes one tensor per rank (rootTensor 0)");
    in_place(t, [&](void* p) {
      const auto [dt, count] = raw_dtype(t);
      if (t.nbytes() % 2 != 0) {  // odd byte counts: through a padded copy
        std::vector<std::uint32_t> buf((t.nbytes() + 3) / 4);
        std::memcpy(buf.data(), p, t.nbytes());
        check(_comm->broadcast(buf.data(), buf.size(), tb::elem::u32, static_cast<std::uint32_t>(opts.rootRank)), "broadcast");
        std::memcpy(p, buf.data(), t.nbytes());
        return;
      }
      check(_comm->broadcast(p, count, dt, static_cast<std::uint32_t>(opts.rootRank)), "broadcast");
    });
    return done(tensors, c10d::OpType::BROADCAST);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    at::Tensor& in = single(inputs, "allgather");
    if (outputs.size() != 1 || outputs[0].size() != static_cast<std::size_t>(getSize()))
      throw std::invalid_argument("spin: allgather needs one list of " + std::to_string(getSize()) + " output tensors");
    for (const auto& o : outputs[0])
      if (o.scalar_type() != in.scalar_type() || o.numel() != in.numel() || o.device() != in.device())
        throw std::invalid_argument("spin: allgather's output tensors must match the input's dtype, size and device");
    auto flat = gather_flat(in);
    for (int r = 0; r < getSize(); ++r) outputs[0][static_cast<std::size_t>(r)].copy_(flat[r].view_as(in));
    return done(outputs[0], c10d::OpType::ALLGATHER);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) override {
    check_cpu(input, "_allgather_base");
    if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * getSize())
      throw std::invalid_argument("spin: _allgather_base's output must hold world_size x the input, of its dtype");
    auto flat = gather_flat(input);
    output.copy_(flat.view_as(output));
    std::vector<at::Tensor> outs{output};
    return done(outs, c10d::OpType::_ALLGATHER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    at::Tensor& out = single(outputs, "reduce_scatter");
    if (inputs.size() != 1 || inputs[0].size() != static_cast<std::size_t>(getSize()))
      throw std::invalid_argument("spin: reduce_scatter needs one list of " + std::to_string(getSize()) + " input tensors");
    for (const auto& i : inputs[0])
      if (i.scalar_type() != out.scalar_type() || i.numel() != out.numel())
        throw std::invalid_argument("spin: reduce_scatter's input tensors must match the output's dtype and size");
    at::Tensor flat = at::cat(at::TensorList(inputs[0])).contiguous();
    scatter_flat(out, flat, opts.reduceOp);
    return done(outputs, c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_cpu(input, "_reduce_scatter_base");
    if (input.scalar_type() != output.scalar_type() || input.numel() != output.numel() * getSize())
      throw std::invalid_argument("spin: _reduce_scatter_base's input must hold world_size x the output, of its dtype");
    at::Tensor flat = input.contiguous();
    scatter_flat(output, flat, opts.reduceOp);
    std::vector<at::Tensor> outs{output};
    return done(outs, c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    std::int32_t one = 1;
    if (_comm) {
      std::lock_guard g(_mu);
      check(_comm->allreduce(&one, 1, tb::elem::i32, tb::red::sum), "barrier");
    }
    std::vector<at::Tensor> none;
    return done(none, c10d::OpType::BARRIER);
  }

private:
  template <class F> void in_place(at::Tensor& t, F&& f) {
    check_cpu(t, "collective");
    if (t.numel() == 0 || !_comm) return;  // a group of one: the result is the input
    std::lock_guard g(_mu);
    if (t.is_contiguous()) {
      f(t.data_ptr());
      return;
    }
    at::Tensor c = t.contiguous();
    f(c.data_ptr());
    t.copy_(c);
  }

  // Element type and count that move the tensor's bytes unchanged (no arithmetic).
  static std::pair<tb::elem, std::uint64_t> raw_dtype(const at::Tensor& t) {
    const std::uint64_t n = t.nbytes();
    if (n % 8 == 0) return {tb::elem::u64, n / 8};
    if (n % 4 == 0) return {tb::elem::u32, n / 4};
    return {tb::elem::f16, n / 2};  // 2-byte units, copied bit for bit
  }

  // Every rank's `in`, as a [size, in.numel()] tensor.
  at::Tensor gather_flat(const at::Tensor& in) {
    check_cpu(in, "allgather");
    at::Tensor src = in.contiguous();
    const std::uint64_t block = src.nbytes();
    const std::uint64_t padded = (block + 7) / 8 * 8;  // blocks of whole u64 words
    std::vector<std::uint64_t> out(padded / 8 * static_cast<std::uint64_t>(getSize()));
    if (_comm && block > 0) {
      std::vector<std::uint64_t> mine(padded / 8);
      std::memcpy(mine.data(), src.data_ptr(), block);
      std::lock_guard g(_mu);
      check(_comm->allgather(mine.data(), out.data(), padded / 8, tb::elem::u64), "allgather");
    } else if (block > 0) {
      std::memcpy(out.data(), src.data_ptr(), block);
    }
    at::Tensor result = at::empty({getSize(), src.numel()}, src.options());
    auto* dst = static_cast<std::byte*>(result.data_ptr());
    for (int r = 0; r < getSize(); ++r)
      std::memcpy(dst + static_cast<std::size_t>(r) * block, reinterpret_cast<const std::byte*>(out.data()) + static_cast<std::size_t>(r) * padded, block);
    return result;
  }

  // out = this rank's block of the reduction of `flat` (size blocks of out.numel()).
  void scatter_flat(at::Tensor& out, const at::Tensor& flat, const c10d::ReduceOp& rop) {
    check_cpu(out, "reduce_scatter");
    const auto dt = reduction_dtype(out.scalar_type());
    if (!dt) throw std::invalid_argument(std::string("spin: reduce_scatter of ") + c10::toString(out.scalar_type()) + " tensors is not supported");
    const tb::red op = reduction_op(rop);
    if (!_comm) {
      out.copy_(flat.view_as(out));
      return;
    }
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    {
      std::lock_guard g(_mu);
      check(_comm->reduce_scatter(flat.data_ptr(), dst.data_ptr(), static_cast<std::uint64_t>(out.numel()), *dt, op),
            "reduce_scatter");
    }
    if (!out.is_contiguous()) out.copy_(dst);
  }

  static at::Tensor& single(std::vector<at::Tensor>& ts, const char* what) {
    if (ts.size() != 1) throw std::invalid_argument(std::string("spin: ") + what + " takes one tensor per rank, not " + std::to_string(ts.size()));
    return ts[0];
  }
  static void check_cpu(const at::Tensor& t, const char* what) {
    if (!t.device().is_cpu()) throw std::invalid_argument(std::string("spin: ") + what + ": tensors must be on the CPU (the emulated NICs DMA host memory)");
  }
  static void check(const std::string& error, const char* what) {
    if (!error.empty()) throw std::runtime_error(std::string("spin: ") + what + " failed: " + error);
  }
  static c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor>& outs, c10d::OpType t) {
    return c10::make_intrusive<done_work>(outs, t);
  }

  config _cfg;
  std::mutex _mu;
  std::unique_ptr<tb::group> _comm;  // null in a group of one
};

c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<process_group_spin>(store, rank, size,
                                                 std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

} // namespace

PYBIND11_MODULE(spin_torch, m) {
  m.doc() = "torch.distributed backend 'spin': collectives through spinnic's emulated NICs and switches (docs/pytorch.md)";
  m.def("create_process_group", &create, "the backend's creator: (store, rank, size, timeout) -> ProcessGroup",
        pybind11::arg("store"), pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"));
  m.def(
      "virtual_time_ns",
      [] {
        const char* s = std::getenv("SPIN_TORCH_SOCKET");
        const std::int64_t t = tb::virtual_time_ns(s != nullptr && *s != '\0' ? s : "/run/spin-emu.sock");
        return t < 0 ? pybind11::object(pybind11::none()) : pybind11::object(pybind11::int_(t));
      },
      "this process's virtual time in ns (spin-emu --virtual-time at SPIN_TORCH_SOCKET), or None in wall-clock time");
  pybind11::object dist = pybind11::module::import("torch.distributed");
  dist.attr("Backend").attr("register_backend")("spin", m.attr("create_process_group"));
  // Waits in the store that torch itself makes every rank of the world do: new_group's start
  // (the new group's members exchange through the store before their set-up) and the
  // store-based barrier that ends init_process_group and new_group (torch 1.13). In virtual
  // time the world's ranks meet in the simulation before each (world_barrier); in wall-clock
  // time the wrappers only call torch's functions.
  // It waits without the GIL (other Python threads run on), as torch's own barrier sleeps.
  m.def("_world_barrier", &world_barrier, "virtual time: the world's ranks meet before a wait of torch's in the store",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::object c10d = pybind11::module::import("torch.distributed.distributed_c10d");
  if (pybind11::hasattr(c10d, "_store_based_barrier") && pybind11::hasattr(c10d, "new_group")) {
    pybind11::dict scope;
    scope["c10d"] = c10d;
    scope["dist"] = dist;
    scope["meet"] = m.attr("_world_barrier");
    pybind11::exec(R"(
import functools
_torch_store_based_barrier = c10d._store_based_barrier
def _store_based_barrier(rank, store, timeout):
    meet(c10d.get_world_size())
    return _torch_store_based_barrier(rank, store, timeout)
c10d._store_based_barrier = _store_based_barrier
_torch_new_group = c10d.new_group
@functools.wraps(_torch_new_group)
def new_group(*args, **kwargs):
    if c10d.is_initialized():
        meet(c10d.get_world_size())
    return _torch_new_group(*args, **kwargs)
c10d.new_group = new_group
dist.new_group = new_group
)", scope);
  }
}
