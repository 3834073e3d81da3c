// Handler memory layouts of the standard handlers strided_unpack, histogram, filter,
// bcast_forward and fsum, shared by the handlers and the host code that configures and reads them.
// Freestanding (handler code includes it).
#pragma once

#include <spin/handler.hpp>

namespace spin::stdh {

/// strided_unpack: a message carries `blocks` blocks of `block_bytes` packed back to back; block
/// b lands at host window offset b * stride_bytes (an MPI vector datatype: count, blocklength,
/// stride; sPIN, SC17, section 5.2). The host sets the first three fields before traffic.
struct strided_state {
  u64 block_bytes;   ///< bytes per block, > 0
  u64 stride_bytes;  ///< distance between block starts in host memory, >= block_bytes
  u64 blocks;        ///< blocks per message
  u64 messages;      ///< messages unpacked completely
  u64 rejected;      ///< messages refused: length is not blocks * block_bytes, or a bad layout
  u64 dma_failed;    ///< pieces whose DMA failed (the window is smaller than the layout)
};

/// histogram: int32 values counted in `bins` bins of `bin_width` starting at `lo`; below lo
/// counts as underflow, at or above lo + bins * bin_width as overflow. When `expected_messages`
/// messages have completed, the result (histogram_result) is DMAed to host offset 0 and an
/// event carries the message count.
inline constexpr u32 histogram_max_bins = 256;
struct histogram_state {
  i64 lo;
  u64 bin_width;          ///< > 0
  u64 bins;               ///< 1 .. histogram_max_bins
  u64 expected_messages;  ///< 0: never DMA
  u64 messages;
  u64 rejected;           ///< packets whose length is not a multiple of 4, or a bad layout
  u64 underflow;
  u64 overflow;
  u64 counts[histogram_max_bins];
};
/// What histogram writes to the host.
struct histogram_result {
  u64 underflow;
  u64 overflow;
  u64 counts[histogram_max_bins];
};

/// filter: a message carries 16-byte records; records with key_lo <= key <= key_hi are appended
/// to the host window (as an array of records, in arrival order), up to capacity_records.
struct filter_record {
  u64 key;
  u64 value;
};
struct filter_state {
  u64 key_lo;
  u64 key_hi;
  u64 capacity_records;  ///< records the host window holds
  u64 cursor;            ///< records claimed so far (may exceed capacity: overflow)
  u64 kept;              ///< records written to the host
  u64 dropped;           ///< records outside the key range
  u64 overflow;          ///< matching records that found the host window full
  u64 rejected;          ///< packets whose length is not a multiple of 16
};

/// bcast_forward: each packet lands at its message offset in the host window and goes on, as it
/// arrives, to `next_rank` (unless has_next is 0: the end of the chain); the completion handler
/// posts the message id. A pipelined chain broadcast (Khalilov et al., SC24, section 3).
struct bcast_state {
  u32 next_rank;
  u32 has_next;
  u64 packets;         ///< packets landed
  u64 forward_failed;  ///< packets the TX queue refused (not forwarded; counted)
  u64 dma_failed;      ///< packets outside the host window (dropped; counted)
  u64 messages;        ///< messages completed
};

/// fsum: a streaming float32 sum (the reduction of SwitchML and SHARP, done by the NIC). Every
/// packet of every message adds its float32 elements into `acc` at the element index its message
/// offset gives; after `expected_messages` messages the sum is DMAed to host offset 0 (as
/// `elements` float32 values) and an event carries the message count. float32 addition is not
/// associative: the result depends on the order in which packets of different messages add into
/// an element (exact when every partial sum is an integer below 2^24). Native target only: eBPF
/// has no floating point.
inline constexpr u64 fsum_max_elements = 16384;        ///< longest vector (64 KiB)
inline constexpr u64 fsum_max_packet_elements = 2304;  ///< longest packet payload (9216 bytes)
inline constexpr u64 fsum_elements_per_lock = 512;
inline constexpr u64 fsum_locks = fsum_max_elements / fsum_elements_per_lock;
struct fsum_state {
  u64 elements;           ///< vector length every message must carry (1 .. fsum_max_elements)
  u64 expected_messages;  ///< contributions to wait for; 0: never DMA
  u64 messages;           ///< completed contributions
  u64 packets;            ///< payload packets added
  u64 rejected;           ///< messages refused (wrong length) and packets refused (bad size)
  u64 locks[fsum_locks];  ///< one spin lock per block of fsum_elements_per_lock elements
  float acc[fsum_max_elements];  ///< the sum
};

} // namespace spin::stdh
