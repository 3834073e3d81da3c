// The repair timer of a communicator: how long its NIC may go without progress before a tick
// repairs (docs/collectives.md, "Repair timer"). TCP's retransmission timer (RFC 6298) applied
// to the collective engine: the interval follows the round trips the host measures, so a lost
// packet costs round trips, not a fixed interval.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace spin::coll::detail {

/// RFC 6298's estimator with K = 4, alpha = 1/8, beta = 1/4, and its exponential back-off, the
/// interval kept within [min, max]. Before the first sample the interval is `start` (RFC 6298
/// 2.1). The ceiling is separate from the start, as RFC 6298 2.5 keeps it (at least 60 s there):
/// a ceiling below the round trips the host measures would repair every epoch that lasts
/// longer, on lossless links (issue 20: 16 ranks on 2 cores measured 15 to 20 ms against a 10 ms
/// ceiling, and resent 60 % more bytes). One thread uses it (the communicator's caller).
class repair_timer {
public:
  using duration = std::chrono::nanoseconds;

  /// 0 < min <= start <= max (the communicator checks its options).
  repair_timer(duration min, duration start, duration max) : min_(min), max_(max), rto_(start) {}

  /// The current interval between repair ticks.
  duration interval() const { return rto_; }
  /// Smoothed round trip and its variation (zero before the first sample).
  duration srtt() const { return srtt_; }
  duration rttvar() const { return rttvar_; }
  std::uint64_t samples() const { return samples_; }

  /// One round-trip sample (RFC 6298 2.2 and 2.3). It ends any back-off: the interval is
  /// computed again from the estimate. Karn's rule is the caller's: no sample from an epoch
  /// that was repaired.
  void sample(duration r) {
    if (r < duration::zero()) r = duration::zero();
    if (samples_++ == 0) {
      srtt_ = r;
      rttvar_ = r / 2;
    } else {
      const duration diff = srtt_ > r ? srtt_ - r : r - srtt_;
      rttvar_ = (3 * rttvar_ + diff) / 4;
      srtt_ = (7 * srtt_ + r) / 8;
    }
    rto_ = std::clamp(srtt_ + std::max(granularity, 4 * rttvar_), min_, max_);
  }

  /// An epoch that a tick found stalled, so that the NIC repaired (RFC 6298 5.5, per epoch: the
  /// host learns of repairs when the epoch ends): double the interval, up to max.
  void back_off() { rto_ = std::min(max_, rto_ * 2); }

  /// Round-trip sample of one epoch: it took `elapsed` and this rank originated `packets`
  /// packets, at most `window` in flight. A self-clocked sender moves one window per round
  /// trip, so a round trip is elapsed x window / packets; an epoch of at most one window is
  /// one round trip (plus the hello exchange: the sample errs long, which only delays repair).
  static duration epoch_sample(duration elapsed, std::uint64_t packets, std::uint32_t window) {
    const std::uint64_t w = std::max<std::uint32_t>(window, 1);
    if (packets <= w) return elapsed;
    return duration(static_cast<std::int64_t>(static_cast<double>(elapsed.count()) * static_cast<double>(w) /
                                              static_cast<double>(packets)));
  }

  /// RFC 6298's clock granularity G: the host wakes for a tick no more precisely than this.
  static constexpr duration granularity = std::chrono::microseconds(100);

private:
  duration min_, max_, rto_;
  duration srtt_{0}, rttvar_{0};
  std::uint64_t samples_ = 0;
};

}  // namespace spin::coll::detail
