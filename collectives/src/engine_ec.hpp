// What every EC of the collective engine gets, on NICs and on switches alike.
#pragma once

#include <spin/coll/protocol.hpp>
#include <spin/rt/runtime.hpp>

#include <chrono>
#include <cstdint>

namespace spin::coll::detail {

/// The match rule of engine `wire_id` (group id << 4 | engine slot) and the limits its traffic
/// needs: one-packet messages, a long duplicate history (a repeat is a new message, a link's copy
/// is not), `event_depth` host events.
inline void configure_engine_ec(rt::ec_config& cfg, std::uint32_t wire_id, std::uint32_t event_depth) {
  cfg.match.bits = proto::match_bits(wire_id, 0);
  cfg.match.ignore_mask = proto::match_ignore_mask;
  // The engine writes its scratchpad before it reads it (temporary packet buffers): clearing
  // 8 KiB per packet would cost more than the packet's reduction.
  cfg.scratchpad = rt::scratchpad_init::undefined;
  // Every engine message is one packet, which opens and retires within one run of the handler
  // on its HPU (run to completion): only messages a lost packet cut short stay open. 16 of them
  // hold 128 KiB of scratchpads (256 held 2 MiB, and about 30 communicators filled a NIC).
  cfg.limits.max_messages = 16;
  // Every repeat is a new message (docs/collectives.md, "Message ids") and the engine is
  // idempotent (bitmaps, shadow copies): the runtime's history only spares it the copies a link
  // made, which arrive close behind their originals. A small history keeps the message table
  // in the lcore's cache: 65536 entries made a table lookup 18% of a 64 MiB switch allreduce
  // (a cache miss per packet).
  cfg.limits.retired_history = 1024;
  cfg.limits.window_packets = 64;
  cfg.limits.max_parked_packets = 256;
  cfg.limits.event_queue_depth = event_depth;
  // One invocation sends at most a few windows of packets, each with a DMA: milliseconds in a
  // sanitizer build on a loaded machine, above the runtime's default budget of 10 ms. The
  // budget still stops a handler that hangs.
  cfg.limits.handler_budget = std::chrono::seconds(1);
  // Results the switch multicasts (k_down, k_mdown) are only read (copied to the host, to a
  // slot): each NIC's handler reads the one payload all copies share.
  cfg.limits.read_only_multicast = true;
}

} // namespace spin::coll::detail
