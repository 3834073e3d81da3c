// The eBPF engine. A BPF handler cannot dereference a pointer it loaded from memory (DPDK's
// validator only trusts pointers it derived itself), so memory reaches it through the bridge
// call spin_bpf_ptr, which returns a pointer the validator knows to be bpf_window_bytes long.
// Safety rests on three facts, each kept here or in install:
//   1. every window the bridge hands out lies in memory of the calling EC: handler memory and
//      scratchpads carry bpf_window_bytes of zeroed guard after them (handler_set::guard_bytes),
//      and the packet is copied into a per-thread bounce buffer with the same slack; a refused
//      range gets null, whose window is the unmapped zero page: a handler that uses it without
//      checking faults and the runtime stops it (runtime_config::catch_faults);
//   2. the bridge never trusts the context the program sees: the program gets a copy, and the
//      bridge works on the runtime's own context (found through a thread-local), so a program
//      that scribbles over its copy changes nothing the runtime relies on;
//   3. the validator proves at load time that every access stays inside its window, that there
//      is no loop, and that pointers passed to the bridge point to validated memory.
#include "bpf_engine.hpp"

#include <rte_bpf.h>
#include <rte_errno.h>
#include <rte_log.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

namespace spin::rt::detail {

namespace {

constexpr std::uint64_t window = spin::bpf_window_bytes;
/// Largest payload a BPF handler can be given (the largest UDP/IPv4 payload).
constexpr std::uint64_t max_payload = 65536;

struct bpf_prog {
  rte_bpf* bpf = nullptr;
  std::uint64_t (*jit)(void*) = nullptr;
  std::string name;
};

struct bpf_module {
  std::vector<bpf_prog> progs;
  ~bpf_module() {
    for (auto& p : progs)
      if (p.bpf != nullptr) rte_bpf_destroy(p.bpf);
  }
};

// State of the BPF call running on this thread.
struct bpf_call {
  spin::ctx* trusted;            // the runtime's context of the invocation
  spin::ctx view;                // the program's copy
  std::uint8_t* base[3];         // packet (bounce buffer), handler memory, scratchpad
  std::uint64_t len[3];
  std::uint8_t* frame;           // the received payload, copied into the bounce buffer on first use
  bool bounced;
};

struct bounce_buffer {
  std::uint8_t* data = nullptr;
  std::uint64_t dirty = 0;       // bytes from 0 that may hold data of `owner_ec`
  std::uint32_t owner_ec = UINT32_MAX;
  ~bounce_buffer() { std::free(data); }
};

thread_local bpf_call* tls_call = nullptr;
thread_local bounce_buffer tls_bounce;

bpf_call* current(spin::ctx* c) noexcept {
  bpf_call* k = tls_call;
  return (k != nullptr && c == &k->view) ? k : nullptr;
}

constexpr std::int64_t bad = static_cast<std::int64_t>(errc::invalid_argument);

// Copies the payload into the bounce buffer the first time the program reaches the packet
// (a window, a send, a DMA): handlers that never look at their packet pay nothing for it.
void ensure_bounced(bpf_call& k) noexcept {
  if (k.bounced) return;
  k.bounced = true;
  bounce_buffer& bb = tls_bounce;
  const std::uint64_t len = k.len[0];
  // Bytes past the payload that a previous program could have written stay visible only to
  // the same EC; when the EC changes, they are cleared.
  if (bb.owner_ec != k.trusted->msg.ec_id) {
    if (bb.dirty > len) std::memset(bb.data + len, 0, std::min(bb.dirty, max_payload + window) - len);
    bb.owner_ec = k.trusted->msg.ec_id;
    bb.dirty = 0;
  }
  if (len > 0) std::memcpy(bb.data, k.frame, len);
  bb.dirty = std::max(bb.dirty, len + window);
}

bool range_ok(const bpf_call& k, std::uint64_t r, std::uint64_t off, std::uint64_t bytes, std::uint64_t align) noexcept {
  if (r > 2 || bytes > window || align == 0 || (align & (align - 1)) != 0) return false;
  if (off > k.len[r] || bytes > k.len[r] - off) return false;
  return (reinterpret_cast<std::uintptr_t>(k.base[r]) + off) % align == 0;
}

// A pointer a program passes to a send or a DMA may point into the packet (the bounce buffer,
// where every packet window and ctx->packet.data point): the packet must be there first.
std::uint64_t packet_addr(bpf_call& k, std::uint64_t a) noexcept {
  const auto b = reinterpret_cast<std::uintptr_t>(k.base[0]);
  if (k.len[0] != 0 && a >= b && a - b < k.len[0] + window) ensure_bounced(k);
  return a;
}

// ---- the bridge: what the extern symbols of the handler API's eBPF branch bind to ----------
// rte_bpf's JIT calls external functions with a stack that is not 16-byte aligned, which the
// x86-64 ABI requires (SSE spills fault otherwise): every bridge function realigns it.
#define SPIN_BRIDGE __attribute__((force_align_arg_pointer))
// A window of N bytes (the validator's view of the returned pointer) for the checked range
// [off, off + bytes). Handler memory and scratchpads have a guard of `window` bytes after them;
// the packet is the bounce buffer, which has the same slack. Every packet pointer of an
// invocation points into the bounce buffer, so all of them see the same bytes.
template <std::uint64_t N> SPIN_BRIDGE void* bridge_ptr(spin::ctx* c, std::uint64_t r, std::uint64_t off, std::uint64_t bytes, std::uint64_t align) {
  bpf_call* k = current(c);
  if (k == nullptr || bytes > N || !range_ok(*k, r, off, bytes, align)) return nullptr;
  if (r == 0) ensure_bounced(*k);
  return k->base[r] + off;
}
SPIN_BRIDGE std::int64_t bridge_dma_to_host(spin::ctx* c, std::uint64_t host_off, std::uint64_t src, std::uint64_t len) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_to_host(k->trusted, host_off, reinterpret_cast<const void*>(packet_addr(*k, src)), len, nullptr);
}
SPIN_BRIDGE std::int64_t bridge_dma_to_host_nb(spin::ctx* c, std::uint64_t host_off, std::uint64_t src, std::uint64_t len, spin::dma_handle* h) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_to_host(k->trusted, host_off, reinterpret_cast<const void*>(packet_addr(*k, src)), len, h);
}
SPIN_BRIDGE std::int64_t bridge_dma_from_host(spin::ctx* c, std::uint64_t dst, std::uint64_t host_off, std::uint64_t len) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_from_host(k->trusted, reinterpret_cast<void*>(packet_addr(*k, dst)), host_off, len, nullptr);
}
SPIN_BRIDGE std::int64_t bridge_dma_from_host_nb(spin::ctx* c, std::uint64_t dst, std::uint64_t host_off, std::uint64_t len, spin::dma_handle* h) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_from_host(k->trusted, reinterpret_cast<void*>(packet_addr(*k, dst)), host_off, len, h);
}
SPIN_BRIDGE std::int64_t bridge_dma_test(spin::ctx* c, std::uint64_t h) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_test(k->trusted, spin::dma_handle{h});
}
SPIN_BRIDGE std::int64_t bridge_dma_wait(spin::ctx* c, std::uint64_t h) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->dma_wait(k->trusted, spin::dma_handle{h});
}
SPIN_BRIDGE std::int64_t bridge_send(spin::ctx* c, const spin::send_desc* d) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  spin::send_desc local = *d;
  local.data = reinterpret_cast<const void*>(packet_addr(*k, reinterpret_cast<std::uint64_t>(d->data)));
  return k->trusted->api->send(k->trusted, &local);
}
SPIN_BRIDGE std::int64_t bridge_multicast(spin::ctx* c, const spin::send_desc* d, const std::uint32_t* dests, std::uint64_t count) {
  bpf_call* k = current(c);
  if (k == nullptr || count > spin::max_multicast) return bad;
  spin::send_desc local = *d;
  local.data = reinterpret_cast<const void*>(packet_addr(*k, reinterpret_cast<std::uint64_t>(d->data)));
  const auto* to = reinterpret_cast<const std::uint32_t*>(packet_addr(*k, reinterpret_cast<std::uint64_t>(dests)));
  return k->trusted->api->multicast(k->trusted, &local, to, static_cast<std::uint32_t>(count));
}
// The program's changes to its packet so far go with it: the runtime forwards the received
// frame, not the bounce buffer. A packet changed after it was forwarded cannot go again
// (bad_state): its frame is shared and is not written any more.
SPIN_BRIDGE std::int64_t bridge_forward(spin::ctx* c, std::uint64_t dest_rank) {
  bpf_call* k = current(c);
  if (k == nullptr || dest_rank > UINT32_MAX) return bad;
  if (k->bounced && k->len[0] > 0 && std::memcmp(k->frame, k->base[0], k->len[0]) != 0) {
    if (packet_forwarded(k->trusted)) return static_cast<std::int64_t>(errc::bad_state);
    std::memcpy(k->frame, k->base[0], k->len[0]);
  }
  return k->trusted->api->forward(k->trusted, static_cast<std::uint32_t>(dest_rank));
}
SPIN_BRIDGE std::int64_t bridge_post_event(spin::ctx* c, std::uint64_t v) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->post_event(k->trusted, v);
}
SPIN_BRIDGE std::int64_t bridge_lock(spin::ctx* c, std::uint64_t off) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->lock(k->trusted, off);
}
SPIN_BRIDGE std::int64_t bridge_unlock(spin::ctx* c, std::uint64_t off) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  return k->trusted->api->unlock(k->trusted, off);
}

template <class T> std::int64_t atomic_on(spin::ctx* t, std::uint64_t op, std::uint64_t off, std::uint64_t value, std::uint64_t* old) {
  T prev{};
  errc e = errc::invalid_argument;
  const T v = static_cast<T>(value);
  switch (static_cast<spin::atomic_op>(op)) {
  case spin::atomic_op::fetch_add: e = t->fetch_add<T>(off, v, &prev); break;
  case spin::atomic_op::exchange: e = t->exchange<T>(off, v, &prev); break;
  case spin::atomic_op::fetch_min: e = t->fetch_min<T>(off, v, &prev); break;
  case spin::atomic_op::fetch_max: e = t->fetch_max<T>(off, v, &prev); break;
  case spin::atomic_op::load: e = t->load<T>(off, &prev); break;
  case spin::atomic_op::store: e = t->store<T>(off, v); break;
  }
  if (e == errc::ok) *old = static_cast<std::uint64_t>(prev);
  return static_cast<std::int64_t>(e);
}

SPIN_BRIDGE std::int64_t bridge_atomic(spin::ctx* c, std::uint64_t code, std::uint64_t off, std::uint64_t value, std::uint64_t* old) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  const std::uint64_t op = code & 0xff, width = (code >> 8) & 0xff, is_signed = (code >> 16) & 1;
  if ((code >> 17) != 0 || op < 1 || op > 6) return bad;
  // Signed values come sign-extended and go back sign-extended; unsigned zero-extended.
  if (width == 4 && is_signed) {
    const std::int64_t r = atomic_on<std::int32_t>(k->trusted, op, off, value, old);
    if (r == 0) *old = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(*old)));
    return r;
  }
  if (width == 4) return atomic_on<std::uint32_t>(k->trusted, op, off, value, old);
  if (width == 8 && is_signed) return atomic_on<std::int64_t>(k->trusted, op, off, value, old);
  if (width == 8) return atomic_on<std::uint64_t>(k->trusted, op, off, value, old);
  return bad;
}

SPIN_BRIDGE std::int64_t bridge_cas(spin::ctx* c, std::uint64_t width, std::uint64_t off, std::uint64_t* expected, std::uint64_t desired) {
  bpf_call* k = current(c);
  if (k == nullptr) return bad;
  if (width == 4) {
    std::uint32_t exp = static_cast<std::uint32_t>(*expected);
    const errc e = k->trusted->compare_exchange<std::uint32_t>(off, &exp, static_cast<std::uint32_t>(desired));
    if (e == errc::bad_state) *expected = exp;
    return static_cast<std::int64_t>(e);
  }
  if (width == 8) {
    std::uint64_t exp = *expected;
    const errc e = k->trusted->compare_exchange<std::uint64_t>(off, &exp, desired);
    if (e == errc::bad_state) *expected = exp;
    return static_cast<std::int64_t>(e);
  }
  return bad;
}

// ---- running a program ---------------------------------------------------------------------

std::int32_t run_bpf(const void* prog, spin::ctx* c) noexcept {
  const auto& p = *static_cast<const bpf_prog*>(prog);
  bounce_buffer& bb = tls_bounce;
  if (bb.data == nullptr) {
    // Once per HPU thread: room for the largest payload plus one window of slack.
    bb.data = static_cast<std::uint8_t*>(std::calloc(1, max_payload + window));
    if (bb.data == nullptr) return static_cast<std::int32_t>(ret::drop);
    bb.dirty = 0;
  }
  const std::uint64_t len = c->packet.len_bytes;
  if (len > max_payload) return static_cast<std::int32_t>(ret::drop);
  // From here on the packet is the bounce buffer, for the program and for the runtime's checks
  // of sends and DMAs; ensure_bounced fills it when the program first reaches it.
  const spin::byte_view frame_view = c->packet;
  c->packet = spin::byte_view{bb.data, len};
  bpf_call k{c, *c, {bb.data, c->handler_mem.data, c->scratch.data},
             {len, c->handler_mem.len_bytes, c->scratch.data != nullptr ? c->scratch.len_bytes : 0}, frame_view.data, false};
  tls_call = &k;
  const std::uint64_t r = p.jit != nullptr ? p.jit(&k.view) : rte_bpf_exec(p.bpf, &k.view);
  tls_call = nullptr;
  // In-place packet changes reach the received frame, as for native handlers. Only changes: a
  // payload that multicast copies share (ec_limits::read_only_multicast) is not written when
  // the program left it alone. Changes after a forward stay in the bounce buffer (above).
  if (k.bounced && len > 0 && !packet_forwarded(c) && std::memcmp(frame_view.data, bb.data, len) != 0)
    std::memcpy(frame_view.data, bb.data, len);
  c->packet = frame_view;
  return static_cast<std::int32_t>(static_cast<std::int64_t>(r));
}

// ---- loading -------------------------------------------------------------------------------

rte_bpf_arg raw() { return rte_bpf_arg{RTE_BPF_ARG_RAW, sizeof(std::uint64_t), 0}; }
rte_bpf_arg ptr(std::size_t size) { return rte_bpf_arg{RTE_BPF_ARG_PTR, size, 0}; }

rte_bpf_xsym func(const char* name, void* fn, std::initializer_list<rte_bpf_arg> args, rte_bpf_arg ret) {
  rte_bpf_xsym x{};
  x.name = name;
  x.type = RTE_BPF_XTYPE_FUNC;
  x.func.val = reinterpret_cast<uint64_t (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t)>(fn);
  x.func.nb_args = static_cast<uint32_t>(args.size());
  std::uint32_t i = 0;
  for (const auto& a : args) x.func.args[i++] = a;
  x.func.ret = ret;
  return x;
}

std::vector<rte_bpf_xsym> bridge_symbols() {
  const rte_bpf_arg c = ptr(sizeof(spin::ctx));
  return {
      func("spin_bpf_ptr", reinterpret_cast<void*>(&bridge_ptr<window>), {c, raw(), raw(), raw(), raw()}, ptr(window)),
      func("spin_bpf_ptr_8", reinterpret_cast<void*>(&bridge_ptr<8>), {c, raw(), raw(), raw(), raw()}, ptr(8)),
      func("spin_bpf_ptr_16", reinterpret_cast<void*>(&bridge_ptr<16>), {c, raw(), raw(), raw(), raw()}, ptr(16)),
      func("spin_bpf_ptr_32", reinterpret_cast<void*>(&bridge_ptr<32>), {c, raw(), raw(), raw(), raw()}, ptr(32)),
      func("spin_bpf_ptr_64", reinterpret_cast<void*>(&bridge_ptr<64>), {c, raw(), raw(), raw(), raw()}, ptr(64)),
      func("spin_bpf_ptr_128", reinterpret_cast<void*>(&bridge_ptr<128>), {c, raw(), raw(), raw(), raw()}, ptr(128)),
      func("spin_bpf_ptr_256", reinterpret_cast<void*>(&bridge_ptr<256>), {c, raw(), raw(), raw(), raw()}, ptr(256)),
      func("spin_bpf_ptr_512", reinterpret_cast<void*>(&bridge_ptr<512>), {c, raw(), raw(), raw(), raw()}, ptr(512)),
      func("spin_bpf_ptr_1024", reinterpret_cast<void*>(&bridge_ptr<1024>), {c, raw(), raw(), raw(), raw()}, ptr(1024)),
      func("spin_bpf_ptr_2048", reinterpret_cast<void*>(&bridge_ptr<2048>), {c, raw(), raw(), raw(), raw()}, ptr(2048)),
      func("spin_bpf_dma_to_host", reinterpret_cast<void*>(&bridge_dma_to_host), {c, raw(), raw(), raw()}, raw()),
      func("spin_bpf_dma_to_host_nb", reinterpret_cast<void*>(&bridge_dma_to_host_nb), {c, raw(), raw(), raw(), ptr(sizeof(spin::dma_handle))}, raw()),
      func("spin_bpf_dma_from_host", reinterpret_cast<void*>(&bridge_dma_from_host), {c, raw(), raw(), raw()}, raw()),
      func("spin_bpf_dma_from_host_nb", reinterpret_cast<void*>(&bridge_dma_from_host_nb), {c, raw(), raw(), raw(), ptr(sizeof(spin::dma_handle))}, raw()),
      func("spin_bpf_dma_test", reinterpret_cast<void*>(&bridge_dma_test), {c, raw()}, raw()),
      func("spin_bpf_dma_wait", reinterpret_cast<void*>(&bridge_dma_wait), {c, raw()}, raw()),
      func("spin_bpf_send", reinterpret_cast<void*>(&bridge_send), {c, ptr(sizeof(spin::send_desc))}, raw()),
      func("spin_bpf_multicast", reinterpret_cast<void*>(&bridge_multicast), {c, ptr(sizeof(spin::send_desc)), raw(), raw()}, raw()),
      func("spin_bpf_forward", reinterpret_cast<void*>(&bridge_forward), {c, raw()}, raw()),
      func("spin_bpf_post_event", reinterpret_cast<void*>(&bridge_post_event), {c, raw()}, raw()),
      func("spin_bpf_lock", reinterpret_cast<void*>(&bridge_lock), {c, raw()}, raw()),
      func("spin_bpf_unlock", reinterpret_cast<void*>(&bridge_unlock), {c, raw()}, raw()),
      func("spin_bpf_atomic", reinterpret_cast<void*>(&bridge_atomic), {c, raw(), raw(), raw(), ptr(sizeof(std::uint64_t))}, raw()),
      func("spin_bpf_cas", reinterpret_cast<void*>(&bridge_cas), {c, raw(), raw(), ptr(sizeof(std::uint64_t)), raw()}, raw()),
  };
}

// DPDK reports problems through their logs; capture them for the error message.
// rte_openlog_stream is process-wide, so loads are serialised.
std::mutex log_mu;

struct captured_log {
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = nullptr;
  captured_log() {
    f = open_memstream(&buf, &len);
    if (f != nullptr) rte_openlog_stream(f);
  }
  std::string text() {
    if (f == nullptr) return {};
    std::fflush(f);
    std::string s(buf, len);
    // Keep the lines that say what went wrong, not DPDK's register dumps.
    std::string out;
    std::size_t pos = 0;
    while (pos < s.size()) {
      std::size_t nl = s.find('\n', pos);
      if (nl == std::string::npos) nl = s.size();
      std::string line = s.substr(pos, nl - pos);
      if (line.find("pc") != std::string::npos || line.find("loop") != std::string::npos ||
          line.find("fail") != std::string::npos || line.find("invalid") != std::string::npos ||
          line.find("unknown") != std::string::npos || line.find("not") != std::string::npos)
        out += (out.empty() ? "" : "; ") + line;
      pos = nl + 1;
    }
    return out;
  }
  ~captured_log() {
    if (f != nullptr) {
      rte_openlog_stream(nullptr);
      std::fclose(f);
    }
    std::free(buf);
  }
};

// A file name for the object: rte_bpf_elf_load reads ELF files, so the package's object goes
// to an anonymous memory file.
struct memfd {
  int fd = -1;
  explicit memfd(std::span<const std::byte> bytes) {
    fd = memfd_create("spin-bpf-object", MFD_CLOEXEC);
    if (fd < 0) return;
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) {
        ::close(fd);
        fd = -1;
        return;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  ~memfd() {
    if (fd >= 0) ::close(fd);
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
};

} // namespace

result<void> load_bpf_handlers(const package& p, bpf_exec mode, handler_set& out, std::shared_ptr<const void>& owner) {
  std::lock_guard lk(log_mu);
  // rte_bpf: relocate against the bridge, validate, JIT.
  memfd file(p.object);
  if (file.fd < 0) return fail(errc::no_memory, std::string("eBPF object: cannot create a memory file: ") + std::strerror(errno));
  auto module = std::make_shared<bpf_module>();
  const std::vector<rte_bpf_xsym> xsyms = bridge_symbols();
  rte_bpf_prm prm{};
  prm.xsym = xsyms.data();
  prm.nb_xsym = static_cast<uint32_t>(xsyms.size());
  prm.prog_arg = ptr(sizeof(spin::ctx));
  module->progs.reserve(p.manifest.handlers.size());
  for (const auto& h : p.manifest.handlers) {
    rte_bpf* b = nullptr;
    std::string log;
    {
      captured_log cap;
      b = rte_bpf_elf_load(&prm, file.path().c_str(), handler_section(h).c_str());
      if (b == nullptr) log = cap.text();
    }
    if (b == nullptr)
      return fail(errc::invalid_argument, "eBPF handler '" + h.name + "' rejected by rte_bpf (" + std::strerror(rte_errno) + ")" +
                                              (log.empty() ? std::string() : ": " + log));
    bpf_prog bp;
    bp.bpf = b;
    bp.name = h.name;
    if (mode == bpf_exec::jit) {
      rte_bpf_jit jit{};
      if (rte_bpf_get_jit(b, &jit) != 0 || jit.func == nullptr) {
        rte_bpf_destroy(b);
        return fail(errc::not_supported, "eBPF handler '" + h.name + "': rte_bpf has no JIT on this machine (load with bpf_exec::interpreter)");
      }
      bp.jit = jit.func;
    }
    module->progs.push_back(bp);
  }
  for (std::size_t i = 0; i < p.manifest.handlers.size(); ++i) {
    handler_ref ref;
    ref.engine = &run_bpf;
    ref.prog = &module->progs[i];
    switch (p.manifest.handlers[i].kind) {
    case handler_kind::header: out.header = ref; break;
    case handler_kind::payload: out.payload = ref; break;
    case handler_kind::completion: out.completion = ref; break;
    }
  }
  out.guard_bytes = window;
  owner = module;
  return {};
}

} // namespace spin::rt::detail
