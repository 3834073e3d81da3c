// The transmitter: where packets produced by handlers go. The emulator plugs DPDK in
// behind it; tests use `memory_transmitter`.
#pragma once

#include <spin/rt/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace spin::rt {

/// A NIC's transmit side. The runtime calls `send` from HPU threads: HPU h only ever calls it
/// with `hpu == h`, so an implementation can keep one queue per HPU and needs no lock.
class transmitter {
public:
  virtual ~transmitter() = default;
  /// Transmits one packet with spin header `h` (h.payload_len == payload.size()) to rank
  /// `h`'s destination `dest_rank`. Must copy what it keeps; must not block or allocate.
  /// Returns ok, or no_space when the queue is full (the runtime counts a failed send and
  /// returns the error to the handler).
  virtual errc send(std::uint32_t hpu, std::uint32_t dest_rank, const wire::header& h,
                    std::span<const std::byte> payload) noexcept = 0;
  /// Largest payload (bytes) of one packet this port carries.
  virtual std::uint32_t max_payload_bytes() const noexcept = 0;
  /// Transmits `h` with `payload` to every rank of `dests`: copy i goes to dests[i] with
  /// message id h.message_id + i. Same thread rule as `send`; must not block or allocate.
  /// Returns the copies sent; `last_error` gets the error of the last copy that failed (it is
  /// left alone when all went). The default calls `send` once per destination; a port that can
  /// share the payload between the copies (the emulator's NIC) overrides it.
  virtual std::uint32_t multicast(std::uint32_t hpu, std::span<const std::uint32_t> dests, const wire::header& h,
                                  std::span<const std::byte> payload, errc& last_error) noexcept {
    std::uint32_t sent = 0;
    wire::header one = h;
    for (std::size_t i = 0; i < dests.size(); ++i) {
      one.message_id = h.message_id + i;
      const errc e = send(hpu, dests[i], one, payload);
      if (e == errc::ok) ++sent;
      else last_error = e;
    }
    return sent;
  }
  /// Transmits a packet with spin header `h` whose payload is `payload`, which lies inside the
  /// received frame `cookie` (rt::packet::cookie) of the handler calling `ctx::forward`: the
  /// runtime holds that frame until the packet's handlers have returned. A port that can send
  /// the frame's own buffer (the emulator's NIC: headers rewritten in place, or a header buffer
  /// chained in front of a reference to the payload) overrides this; it must leave the payload
  /// bytes as they are. The default copies, through `send`. Same thread rule and errors as
  /// `send`.
  virtual errc forward(std::uint32_t hpu, std::uint32_t dest_rank, const wire::header& h, std::uint64_t cookie,
                       std::span<const std::byte> payload) noexcept {
    (void)cookie;
    return send(hpu, dest_rank, h, payload);
  }
};

/// In-memory transmitter: each HPU appends encoded frames (wire format v1, addresses from
/// `wire::rank_endpoint`) to its own preallocated buffer; `take_frames` hands them to the test
/// after the runtime is quiescent. Capacity is fixed at construction; a full buffer gives
/// no_space.
class memory_transmitter final : public transmitter {
public:
  /// `hpus` queues of `capacity_bytes` each; frames carry `source_rank` as sender address.
  memory_transmitter(std::uint32_t hpus, std::size_t capacity_bytes, std::uint32_t source_rank,
                     std::uint32_t mtu_payload_bytes = 4096);
  errc send(std::uint32_t hpu, std::uint32_t dest_rank, const wire::header& h,
            std::span<const std::byte> payload) noexcept override;
  std::uint32_t max_payload_bytes() const noexcept override { return _mtu_payload; }

  /// One captured frame.
  struct frame {
    std::uint32_t hpu;
    std::uint32_t dest_rank;
    std::vector<std::byte> bytes;
  };
  /// Moves out every frame sent so far, HPU by HPU in send order. Call only while no HPU sends
  /// (after runtime::drain).
  std::vector<frame> take_frames();

private:
  struct queue {
    std::vector<std::byte> buf;
    std::size_t used = 0;
  };
  std::vector<queue> _q;
  std::uint32_t _source_rank;
  std::uint32_t _mtu_payload;
};

} // namespace spin::rt
