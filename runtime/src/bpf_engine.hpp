// The eBPF engine (internal): loads the BPF handlers of a package with libbpf and DPDK's
// rte_bpf, and runs them with the handler API bridged to the runtime's function table.
#pragma once

#include <spin/rt/loader.hpp>

#include <memory>
#include <string>

namespace spin::rt::detail {

/// Loads every handler of the eBPF package `p` (manifest already checked) into `out`
/// (handler refs and guard_bytes). `owner` receives the object that keeps the programs alive.
result<void> load_bpf_handlers(const package& p, bpf_exec mode, handler_set& out, std::shared_ptr<const void>& owner);

/// True when the packet of the invocation whose runtime context is `c` went out by
/// `ctx::forward` (in this invocation or, for a payload handler, in the packet's header handler):
/// its frame is shared with the outgoing frame and must not be written. Defined by the runtime
/// (actions.cpp); the thread running the invocation only.
bool packet_forwarded(const spin::ctx* c) noexcept;

} // namespace spin::rt::detail
