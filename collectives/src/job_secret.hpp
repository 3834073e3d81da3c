// What the collectives derive from the job secret (options::job_secret, docs/collectives.md,
// "Authenticated frames"): the proof a switch join carries and each group's frame key. Both are
// SipHash-2-4 (spin/siphash.hpp) under the secret, with a label of their own, so that neither
// reveals the secret or the other.
#pragma once

#include <spin/siphash.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace spin::coll::detail {

using job_key = std::array<std::uint8_t, 16>;

// SipHash-2-4 under `secret` of `label` followed by the little-endian words `words`.
inline std::uint64_t keyed(const job_key& secret, const char* label, const std::vector<std::uint32_t>& words) {
  std::vector<std::uint8_t> msg(label, label + std::strlen(label));
  for (std::uint32_t v : words)
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  return siphash24(secret.data(), msg.data(), msg.size());
}

/// The proof of the job secret a join carries: SipHash-2-4 under the secret over "spin-join",
/// the group's wire id, slots and members; 0 without a secret.
inline std::uint64_t join_proof(const job_key& secret, std::uint32_t wire_id, std::uint32_t slots,
                                const std::vector<std::uint32_t>& members) {
  if (secret == job_key{}) return 0;
  std::vector<std::uint32_t> w{wire_id, slots};
  w.insert(w.end(), members.begin(), members.end());
  const std::uint64_t p = keyed(secret, "spin-join", w);
  return p == 0 ? 1 : p;  // 0 means "no proof"
}

/// The frame key of engine `wire_id` (rt::ec_config::frame_key): SipHash-2-4 under the secret
/// of "spin-frame-key", the wire id and the half's index (0: bytes 0..7, 1: bytes 8..15,
/// little-endian). All zero without a secret (frames are then not authenticated).
inline job_key group_frame_key(const job_key& secret, std::uint32_t wire_id) {
  job_key k{};
  if (secret == job_key{}) return k;
  for (std::uint32_t half = 0; half < 2; ++half) {
    const std::uint64_t v = keyed(secret, "spin-frame-key", {wire_id, half});
    for (int i = 0; i < 8; ++i) k[8 * half + static_cast<std::uint32_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
  }
  if (k == job_key{}) k[0] = 1;  // all zero means "none"
  return k;
}

} // namespace spin::coll::detail
