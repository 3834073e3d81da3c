// The part of the "spin" torch.distributed backend that talks to spin::coll, behind types that
// both C++ standards of the backend can see: spin::coll is C++20, and Debian's libtorch 1.13
// headers compile only as C++17 under clang 16 (incomplete c10::IValue in std::vector). The
// process group (process_group_spin.cpp) is built C++17; this file's implementation C++20.
// Errors come back as text (empty: it worked); the process group raises them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <array>
#include <optional>
#include <string>
#include <vector>

namespace spin::torch_backend {

/// Element types (the values of spin::coll::dtype).
enum class elem : std::uint8_t { f32 = 1, f64 = 2, f16 = 3, bf16 = 4, i32 = 5, i64 = 6, u32 = 7, u64 = 8 };
/// Reductions.
enum class red : std::uint8_t { sum, min, max, prod };
/// Who does the work: automatic, edge_ring, host_ring (docs/collectives.md, "Algorithms").
/// switch_agg: allreduce, allgather and broadcast through the switch; reduce-scatter, which the
/// switch does not run, on the edge ring.
enum class algo : std::uint8_t { automatic, edge_ring, host_ring, switch_agg };

/// Environment variable `name` as a decimal number in 0..`max` (spin::host::env_number);
/// nullopt when unset or empty. A sign, a suffix or a value above `max` sets `error`.
std::optional<std::uint64_t> env_number(const char* name, std::uint64_t max, std::string& error);

/// A job secret (spin::coll::options::job_secret).
using secret = std::array<std::uint8_t, 16>;
/// Environment variable `name` as a job secret (spin::host::env_secret: 32 hex digits); nullopt
/// when unset or empty. A bad value sets `error`.
std::optional<secret> env_secret(const char* name, std::string& error);
/// A random secret; on failure `error` says why.
secret random_secret(std::string& error);

/// The NIC rank (emulated address) of node `node` of the spin-emu at `socket`; on failure
/// `error` says why and the result is 0.
std::uint32_t nic_rank(const std::string& socket, std::uint32_t node, std::string& error);

/// Virtual time (spin-emu --virtual-time; docs/virtual-time.md, "PyTorch programs"). Whether
/// the spin-emu at `socket` runs in virtual time: the first call per socket asks it once (a
/// connection of its own, kept for the barriers below). False when it does not, or cannot be
/// reached. Any thread.
bool in_virtual_time(const std::string& socket);
/// In virtual time: waits until the host programs of every node in `nodes` (this process's own,
/// `node`, among them) have called it over the same nodes as often; all return at the virtual
/// time the last one called (spin::host::client::barrier). Call before a wait outside spin (the
/// c10d store) that needs every member. "" when it worked or the spin-emu runs in wall-clock
/// time; else why it failed.
std::string virtual_time_barrier(const std::string& socket, std::uint32_t node, std::vector<std::uint32_t> nodes);
/// This process's virtual time at `socket` in nanoseconds (its last wait's end), or -1 when
/// that spin-emu does not run in virtual time. Any thread.
std::int64_t virtual_time_ns(const std::string& socket);

/// One rank's spin::coll communicator. Not thread-safe: one call at a time.
class group {
public:
  /// Connects node `node` of the spin-emu at `socket` as member `me` of group `id` whose NIC
  /// ranks are `members`; with `switch_node`, the group asks node `switch_node` of the spin-emu
  /// at `switch_socket` (a switch linked to every member) for aggregator slots; with
  /// `switch_rank` instead, the switch of that rank, in-band through this rank's own NIC. On
  /// failure `error` says why and every call fails.
  group(const std::string& socket, std::uint32_t node, std::uint32_t id, const std::vector<std::uint32_t>& members,
        std::uint32_t me, std::chrono::milliseconds timeout, algo a, const std::string& switch_socket,
        std::optional<std::uint32_t> switch_node, std::optional<std::uint32_t> switch_rank, const secret& job_secret,
        std::string& error);
  ~group();
  group(const group&) = delete;
  group& operator=(const group&) = delete;

  // Each returns "" or why it failed (spin::coll's errc and message).
  std::string allreduce(void* data, std::uint64_t count, elem t, red r);
  std::string broadcast(void* data, std::uint64_t count, elem t, std::uint32_t root);
  std::string allgather(const void* in, void* out, std::uint64_t block_count, elem t);
  std::string reduce_scatter(const void* in, void* out, std::uint64_t block_count, elem t, red r);

private:
  struct impl;
  std::unique_ptr<impl> _p;
};

} // namespace spin::torch_backend
