// One row of spin-bench coll's tables (nccl-tests' columns) and how rows travel between the
// benchmark and its peers (the Open MPI peer runs under mpirun and reports JSON).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace spin::bench {

/// One mode (out-of-place or in-place) of one message size.
struct coll_mode {
  double time_us = 0;       ///< mean over the timed iterations of the slowest rank's time
  double algbw_gbs = 0;     ///< bytes / time (GB = 1e9 B)
  double busbw_gbs = 0;     ///< algbw x 2(n-1)/n (allreduce)
  std::uint64_t wrong = 0;  ///< elements that differ from the exact sum, all ranks
  bool ran = false;
  std::string error;        ///< why the collective failed ("" when it did not)
};

struct coll_row {
  std::string algorithm;
  std::uint32_t ranks = 0;
  std::uint64_t bytes = 0;   ///< message size S (bytes of the buffer in `type`)
  std::uint64_t count = 0;   ///< elements of `type` (a block format's element is a block)
  std::uint64_t values = 0;  ///< values the message holds (float32 elements of the same tensor)
  std::string type = "f32";  ///< coll::name of the datatype
  std::uint32_t iters = 0;
  coll_mode oop, ip;
  double sent_bytes_per_rank = -1;  ///< frames each rank's NIC sent per out-of-place call (-1: not measured)
  std::int64_t repairs = -1;        ///< epochs a repair tick found stalled, all ranks, out-of-place calls (-1: not measured)
  /// Rank 0's out-of-place result against the exact float64 sum: max |error| / max |sum|
  /// (-1: not measured)
  double max_error = -1;
};

inline double busbw_factor(std::uint32_t n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

inline nlohmann::json to_json(const coll_mode& m) {
  nlohmann::json j = {{"ran", m.ran}, {"time_us", m.time_us}, {"algbw_gbs", m.algbw_gbs}, {"busbw_gbs", m.busbw_gbs}, {"wrong", m.wrong}};
  if (!m.error.empty()) j["error"] = m.error;
  return j;
}

inline nlohmann::json to_json(const coll_row& r) {
  nlohmann::json j = {{"algorithm", r.algorithm}, {"ranks", r.ranks}, {"bytes", r.bytes}, {"count", r.count}, {"values", r.values},
                      {"type", r.type},
                      {"redop", "sum"},           {"root", -1},         {"iters", r.iters}, {"out_of_place", to_json(r.oop)},
                      {"in_place", to_json(r.ip)}};
  if (r.sent_bytes_per_rank >= 0) j["sent_bytes_per_rank"] = r.sent_bytes_per_rank;
  if (r.repairs >= 0) j["repaired_epochs"] = r.repairs;
  if (r.max_error >= 0 || std::isnan(r.max_error)) j["max_error"] = std::isnan(r.max_error) ? nlohmann::json("nan") : nlohmann::json(r.max_error);
  return j;
}

inline coll_mode mode_from_json(const nlohmann::json& j) {
  coll_mode m;
  m.ran = j.value("ran", false);
  m.time_us = j.value("time_us", 0.0);
  m.algbw_gbs = j.value("algbw_gbs", 0.0);
  m.busbw_gbs = j.value("busbw_gbs", 0.0);
  m.wrong = j.value("wrong", std::uint64_t{0});
  m.error = j.value("error", std::string());
  return m;
}

inline coll_row row_from_json(const nlohmann::json& j) {
  coll_row r;
  r.algorithm = j.value("algorithm", std::string());
  r.ranks = j.value("ranks", 0u);
  r.bytes = j.value("bytes", std::uint64_t{0});
  r.count = j.value("count", std::uint64_t{0});
  r.values = j.value("values", r.count);
  r.type = j.value("type", std::string("f32"));
  r.iters = j.value("iters", 0u);
  if (j.contains("out_of_place")) r.oop = mode_from_json(j["out_of_place"]);
  if (j.contains("in_place")) r.ip = mode_from_json(j["in_place"]);
  r.sent_bytes_per_rank = j.value("sent_bytes_per_rank", -1.0);
  return r;
}

/// Fills time, algbw and busbw from the mean time of one call.
inline void set_rates(coll_mode& m, std::uint64_t bytes, std::uint32_t ranks, double mean_seconds) {
  m.ran = true;
  m.time_us = mean_seconds * 1e6;
  m.algbw_gbs = mean_seconds > 0 ? static_cast<double>(bytes) / mean_seconds / 1e9 : 0;
  m.busbw_gbs = m.algbw_gbs * busbw_factor(ranks);
}

} // namespace spin::bench
