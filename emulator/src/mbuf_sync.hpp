// Allocating, freeing and copying mbufs so that ThreadSanitizer sees the order DPDK gives.
//
// DPDK's mempools and rings are not instrumented, so ThreadSanitizer cannot see the
// happens-before they give when an mbuf moves between threads (an HPU thread builds a frame, the
// poll thread frees it; the poll thread frees one, an HPU thread allocates it again). Every
// allocation acquires before it writes the mbuf; every free releases after its last access,
// right before the mbuf goes back to its pool. No-ops in other builds.
#pragma once

#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <cstdint>
#include <cstring>

#if defined(SPIN_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace spin::emu::detail {

inline void tsan_release(const void* p) noexcept {
#if defined(SPIN_TSAN)
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}
inline void tsan_acquire(const void* p) noexcept {
#if defined(SPIN_TSAN)
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

/// Marks a chain as handed to another thread through DPDK (a ring, a port).
inline void sync_out(const rte_mbuf* m) noexcept {
  for (; m != nullptr; m = m->next) tsan_release(m);
}
/// Marks a chain as taken from another thread through DPDK.
inline void sync_in(const rte_mbuf* m) noexcept {
  for (; m != nullptr; m = m->next) tsan_acquire(m);
}

/// rte_pktmbuf_alloc, with the acquire before the header is reset.
inline rte_mbuf* mbuf_alloc(rte_mempool* pool) noexcept {
  rte_mbuf* m = rte_mbuf_raw_alloc(pool);
  if (m == nullptr) return nullptr;
  tsan_acquire(m);
  rte_pktmbuf_reset(m);
  return m;
}

/// rte_pktmbuf_free, segment by segment, with the release after the last access to each. A
/// segment may be a clone (an indirect mbuf showing another mbuf's data, `ctx::multicast`):
/// whichever holder lets go of the data last returns the mbuf that owns it. Every holder
/// releases on that mbuf before it lets go, and the last acquires before it frees it, so that
/// ThreadSanitizer sees every reader of the shared data before the mbuf's next user. DPDK's own
/// detach would free that mbuf inside the library, where ThreadSanitizer sees nothing: the
/// reference taken around it keeps the freeing here.
inline void mbuf_free(rte_mbuf* m) noexcept {
  while (m != nullptr) {
    rte_mbuf* next = m->next;
    rte_mbuf* owner = RTE_MBUF_CLONED(m) ? rte_mbuf_from_indirect(m) : nullptr;
    if (owner != nullptr) {
      tsan_release(owner);
      rte_mbuf_refcnt_update(owner, 1);
    } else {
      tsan_release(m);  // a shared direct mbuf: the holder that frees it last acquires this
    }
    if (rte_mbuf* seg = rte_pktmbuf_prefree_seg(m); seg != nullptr) {
      tsan_acquire(seg);
      tsan_release(seg);
      rte_mempool_put(seg->pool, seg);
    }
    if (owner != nullptr && rte_mbuf_refcnt_update(owner, -1) == 0) {
      tsan_acquire(owner);
      owner->next = nullptr;
      owner->nb_segs = 1;
      rte_mbuf_refcnt_set(owner, 1);
      tsan_release(owner);
      rte_mempool_put(owner->pool, owner);
    }
    m = next;
  }
}

/// A deep copy of a whole frame into mbufs of `pool` (one per source segment); null when the
/// pool runs out (nothing is left allocated then).
inline rte_mbuf* mbuf_copy(const rte_mbuf* src, rte_mempool* pool) noexcept {
  rte_mbuf* head = nullptr;
  rte_mbuf* tail = nullptr;
  for (const rte_mbuf* s = src; s != nullptr; s = s->next) {
    rte_mbuf* d = mbuf_alloc(pool);
    if (d == nullptr || rte_pktmbuf_tailroom(d) < s->data_len) {
      if (d != nullptr) mbuf_free(d);
      mbuf_free(head);
      return nullptr;
    }
    std::memcpy(rte_pktmbuf_mtod(d, char*), rte_pktmbuf_mtod(s, const char*), s->data_len);
    d->data_len = s->data_len;
    if (head == nullptr) {
      head = d;
    } else {
      tail->next = d;
      ++head->nb_segs;
    }
    head->pkt_len += s->data_len;
    tail = d;
  }
  if (head != nullptr) {
    head->port = src->port;
    head->ol_flags = src->ol_flags;
    head->packet_type = src->packet_type;
  }
  return head;
}

} // namespace spin::emu::detail
