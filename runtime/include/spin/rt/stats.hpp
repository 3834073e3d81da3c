// Runtime statistics: per EC and per handler kind; packets, bytes, drops by reason, handler
// time. Snapshots are plain values that print as text and JSON.
#pragma once

#include <spin/handler.hpp>
#include <spin/result.hpp>
#include <spin/rt/wire.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spin::rt {

/// Why the runtime dropped a packet that parsed correctly. Every dropped packet counts under
/// exactly one reason (frames that do not parse count under `wire::reject`, frames that match
/// no EC under `runtime_stats::unknown_ec`).
enum class drop_reason : std::uint8_t {
  duplicate,        ///< the packet (EC, source, message, seq) was already accepted
  out_of_window,    ///< seq is beyond the message's reorder window (ec_limits::window_packets)
  bad_sequence,     ///< seq at or past the packet count fixed by the end-of-message packet
  inconsistent,     ///< message length or packet count disagree with earlier packets
  no_message_slot,  ///< the EC already has ec_limits::max_messages open messages
  parking_full,     ///< payload packet waiting for its header handler, but no parking space left
  handler_drop,     ///< a handler returned drop (for a header handler: every packet of the message)
  bad_return,       ///< a handler returned a value that is not a `spin::ret`
  message_aborted,  ///< the message was aborted (a handler exceeded its budget)
  not_data,         ///< packet type other than data/result (ack, nack, control): not for handlers in v1
  ec_removed,       ///< the EC was uninstalled while the packet waited
  host_window,      ///< default deposit (no payload handler) outside the EC's host window
  unauthenticated,  ///< the EC has a frame key and the frame, from a link, has no tag or a tag that does not verify (ec_config::frame_key)
  no_private_copy,  ///< a two-buffer frame (a multicast copy) that had to be made contiguous (shared and the EC may write its packets, or its payload not exactly the second buffer) and could not be (no buffer, or no runtime_config::unshare)
  count_
};
inline constexpr std::size_t drop_reason_count = static_cast<std::size_t>(drop_reason::count_);
const char* drop_reason_name(drop_reason r);

/// Summary of a latency distribution (ns). Percentiles come from a log-linear histogram with
/// 8 sub-buckets per power of two: they are upper bounds within 12.5% of the exact value.
/// Handler times are wall-clock time of the invocation, so they include any time the OS took
/// the HPU thread away (the budget, in contrast, counts CPU time).
struct latency_summary {
  std::uint64_t count = 0;
  double mean_ns = 0;
  std::uint64_t p50_ns = 0;
  std::uint64_t p99_ns = 0;
  std::uint64_t max_ns = 0;
};

/// Per handler kind of one EC.
struct handler_stats {
  std::uint64_t invocations = 0;
  std::uint64_t bytes = 0;        ///< payload bytes the invocations saw
  std::uint64_t over_budget = 0;  ///< invocations that exceeded the EC's budget
  std::uint64_t faults = 0;       ///< invocations stopped by a fault (bad memory access, trap)
  latency_summary time;
};

/// Snapshot of one EC.
struct ec_stats {
  std::uint32_t ec_id = 0;
  std::string name;
  std::uint64_t packets_in = 0;
  std::uint64_t bytes_in = 0;  ///< payload bytes of accepted packets
  std::uint64_t packets_skipped = 0;  ///< accepted, but a proceed return skipped their payload handler
  std::uint64_t messages_started = 0;
  std::uint64_t messages_completed = 0;
  std::uint64_t messages_dropped = 0;  ///< header handler returned drop
  std::uint64_t messages_aborted = 0;  ///< a handler exceeded its budget
  std::array<std::uint64_t, drop_reason_count> drops{};
  std::uint64_t dma_to_host_bytes = 0;
  std::uint64_t dma_from_host_bytes = 0;
  std::uint64_t dma_ops = 0;
  std::uint64_t deposit_bytes = 0;  ///< default deposits (EC without payload handler)
  std::uint64_t sends = 0;
  std::uint64_t send_bytes = 0;
  std::uint64_t send_failed = 0;
  std::uint64_t events_posted = 0;
  std::uint64_t events_lost = 0;  ///< event queue full
  std::uint64_t api_errors = 0;   ///< API calls that returned an error
  std::uint64_t handler_mem_bytes = 0;
  std::uint64_t nic_mem_bytes = 0;  ///< NIC memory the EC holds (handler memory + scratchpads)
  std::array<handler_stats, 3> kinds{};  ///< indexed by spin::handler_kind
  std::uint64_t total_drops() const;
};

/// Snapshot of one HPU.
struct hpu_stats {
  std::uint32_t hpu = 0;
  std::uint64_t tasks = 0;      ///< handler invocations and default deposits run
  std::uint64_t busy_ns = 0;    ///< wall time inside handlers and default deposits
  std::uint64_t preempted = 0;  ///< invocations stopped by the budget's preemption signal
  std::uint64_t frames = 0;     ///< frames this HPU took to completion (its own and steered to it)
  std::uint64_t steered = 0;    ///< frames it handed to the inbox of the HPU owning their message
};

/// Snapshot of the whole runtime.
struct runtime_stats {
  std::uint64_t frames_accepted = 0;
  std::array<std::uint64_t, wire::reject_count> frames_rejected{};
  std::uint64_t unknown_ec = 0;
  std::uint64_t nic_mem_capacity_bytes = 0;
  std::uint64_t nic_mem_used_bytes = 0;
  std::uint64_t nic_mem_peak_bytes = 0;
  /// Times the handler-budget watchdog thread woke since this runtime started: about 1000 per
  /// second while handlers run in any runtime of the process, 10 per second once none ran for
  /// 64 ticks (idle NICs cost almost no CPU). One thread serves every runtime of the process.
  std::uint64_t watchdog_wakeups = 0;
  std::vector<hpu_stats> hpus;
  std::vector<ec_stats> ecs;
};

/// Human-readable text: a line of totals, then tables of the HPUs, the ECs and their handlers,
/// then one line per EC for its other non-zero counters (zero counters omitted). What spin-emu
/// prints at exit and `spinctl stats` prints.
std::string to_text(const runtime_stats& s);
/// JSON object with every counter (zeros included), stable key names (docs/emulator.md,
/// "Statistics").
std::string to_json(const runtime_stats& s);
/// Reads what to_json wrote. Errors: invalid_argument when `text` is not JSON, or a key is
/// missing or has the wrong type (the message names the key). Keys it does not know are ignored.
result<runtime_stats> runtime_stats_from_json(std::string_view text);

/// Columns of text for the statistics' to_text: a header row, then rows; each column as wide as
/// its widest cell, text left-aligned and numbers right-aligned.
class text_table {
public:
  explicit text_table(std::vector<std::string> header) : _rows{std::move(header)} {}
  void row(std::vector<std::string> cells) { _rows.push_back(std::move(cells)); }
  std::size_t rows() const noexcept { return _rows.size() - 1; }
  /// Every row on its own line, each line starting with `indent`.
  std::string str(std::string_view indent) const;

private:
  std::vector<std::vector<std::string>> _rows;
};

/// Counter written by one thread, read by any: relaxed load+store, no read-modify-write.
class counter {
public:
  void add(std::uint64_t n) noexcept { _v.store(_v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return _v.load(std::memory_order_relaxed); }
  void reset() noexcept { _v.store(0, std::memory_order_relaxed); }

private:
  std::atomic<std::uint64_t> _v{0};
};

namespace detail {

/// Log-linear histogram of ns values: 64 powers of two x 8 sub-buckets. Single writer.
class latency_histogram {
public:
  static constexpr unsigned sub_bits = 3;
  static constexpr unsigned buckets = 64 << sub_bits;
  void record(std::uint64_t ns) noexcept;
  latency_summary summary() const;
  /// One summary of several histograms (the HPUs' shares of one EC).
  static latency_summary merged(const latency_histogram* const* hs, std::size_t n);
  static unsigned bucket_of(std::uint64_t v) noexcept;
  static std::uint64_t bucket_upper(unsigned b) noexcept;

private:
  std::array<counter, buckets> _b;
  counter _count, _sum, _max;
};

struct kind_counters {
  counter invocations, bytes, over_budget, faults;
  latency_histogram time;
};

/// Live counters of one HPU's share of one EC, written by the thread driving that HPU.
struct ec_counters {
  counter packets_in, bytes_in, messages_started, messages_completed, messages_dropped, messages_aborted;
  std::array<counter, drop_reason_count> drops;
  std::array<kind_counters, 3> kinds;
  /// Sums the counters of `n` HPUs into `out` (its other fields untouched).
  static void snapshot(const ec_counters* const* cs, std::size_t n, ec_stats& out);
};

} // namespace detail
} // namespace spin::rt
