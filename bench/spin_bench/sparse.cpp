// spin-bench sparse (sparse.hpp). Each rank's vector: every index with probability `density`
// (drawn independently per rank, so the union fills in with the ranks), values of gradient-like
// magnitudes (2^-12 .. 2^4, both signs). A row's time is the slowest rank's per call, averaged
// over the timed calls, for the whole allreduce_sparse call (cutting the pairs into windows,
// the agreement on the arguments, the allreduce, the dense result). The dense baselines
// allreduce the scattered vectors, as float32 and as bfloat16, from arena buffers.
#include "sparse.hpp"

#include "../common.hpp"

#include <spin/coll/coll.hpp>
#include <spin/coll/sparse.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>

#include <algorithm>
#include <barrier>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>
#include <unistd.h>

namespace spin::bench {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::uint32_t W = coll::sparse::window_values;

struct row {
  std::uint32_t ranks = 0;
  std::string algorithm, type;
  double density = 0;  // of each rank's vector; -1: the dense baselines
  double union_density = 0;
  double ms = 0;
  double sent_per_rank = 0;  // bytes each rank's NIC sent per call (frames)
  double repaired = 0;       // epochs repaired per call, all ranks together (lost or late packets resent)
  double max_err = 0;        // max |result - exact float64 sum| / max |exact|
  std::uint64_t wrong = 0;
  std::string error;
};

std::uint32_t narrow(coll::dtype t, float f) {
  const auto a = std::bit_cast<std::uint32_t>(f);
  if (t == coll::dtype::f32) return (a & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : a;
  if (t == coll::dtype::bf16) return coll::f32_to_bf16_bits(a);
  return coll::f32_to_f16_bits(a);
}
float widen(coll::dtype t, std::uint32_t v) {
  if (t == coll::dtype::f32) return std::bit_cast<float>(v);
  if (t == coll::dtype::bf16) return std::bit_cast<float>(coll::bf16_to_f32_bits(static_cast<std::uint16_t>(v)));
  return std::bit_cast<float>(coll::f16_to_f32_bits(static_cast<std::uint16_t>(v)));
}

// MX value types: float32 values in and out; the windows carry MX codes in blocks of 32 (the
// last block of a window holds 28 values and is encoded as though padded with +0).
bool mx_type(coll::dtype t) {
  coll::mx::element e{};
  return coll::mx_element_of(t, e);
}
// v (whole windows) -> what those windows of MX values stand for (sparse::mx_round_trip).
void mx_round_trip(coll::dtype t, std::vector<float>& v) {
  coll::mx::element e{};
  coll::mx_element_of(t, e);
  std::uint32_t bits[W];
  for (std::size_t w = 0; w < v.size(); w += W) {
    std::memcpy(bits, v.data() + w, sizeof bits);
    coll::sparse::mx_round_trip(e, bits);
    std::memcpy(v.data() + w, bits, sizeof bits);
  }
}

// Runs `call(r)` on every rank at once, 1 warm-up and `iters` timed times; the mean of the
// slowest rank's time per call, in ms, or the first error.
double timed(std::uint32_t n, std::uint32_t iters, const std::function<std::string(std::uint32_t)>& call, std::string& error,
             const std::function<void()>& after_warmup) {
  std::vector<std::vector<double>> secs(n, std::vector<double>(iters + 1, 0));
  std::vector<std::string> errors(n);
  std::barrier sync(static_cast<std::ptrdiff_t>(n), [&]() noexcept {});
  std::barrier warm(static_cast<std::ptrdiff_t>(n), [&]() noexcept {
    if (after_warmup) after_warmup();
  });
  std::vector<std::thread> ts;
  for (std::uint32_t r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (std::uint32_t k = 0; k <= iters; ++k) {
        if (k == 1) warm.arrive_and_wait();
        sync.arrive_and_wait();
        const auto t0 = clock_type::now();
        std::string e = errors[r].empty() ? call(r) : std::string("skipped after an error");
        secs[r][k] = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (!e.empty() && errors[r].empty()) errors[r] = e;
      }
    });
  for (auto& t : ts) t.join();
  for (std::uint32_t r = 0; r < n; ++r)
    if (!errors[r].empty()) {
      error = "rank " + std::to_string(r) + ": " + errors[r];
      return 0;
    }
  double total = 0;
  for (std::uint32_t k = 1; k <= iters; ++k) {
    double slowest = 0;
    for (std::uint32_t r = 0; r < n; ++r) slowest = std::max(slowest, secs[r][k]);
    total += slowest;
  }
  return total / iters * 1e3;
}

bool run_ranks(const sparse_options& o, std::uint32_t n, std::vector<row>& rows) {
  emu::cluster_options clo;
  clo.lcores = o.lcores;
  auto cluster = emu::cluster::create(emu::star(n, {}), clo);
  if (!cluster) {
    std::fprintf(stderr, "spin-bench sparse: %s\n", cluster.err().message.c_str());
    return false;
  }
  emu::cluster_runner running(*cluster.value());
  auto fab = coll::fabric::create(*cluster.value());
  if (!fab) {
    std::fprintf(stderr, "spin-bench sparse: %s\n", fab.err().message.c_str());
    return false;
  }
  const std::uint64_t L = o.values, nw = (L + W - 1) / W;
  coll::options co;
  co.timeout = std::chrono::milliseconds(60'000 + L / (1 << 18) * 1000);
  co.staging_bytes = std::size_t{1} << 20;
  co.switches = fab.value().get();
  co.arena_bytes = nw * coll::elem_bytes(coll::dtype::sparse_f32) + 4 * L + 4 * co.staging_bytes + (std::size_t{8} << 20);
  co.log = [](const std::string& line) { std::fprintf(stderr, "spin-bench sparse: %s\n", line.c_str()); };
  coll::group g;
  for (std::uint32_t r = 0; r < n; ++r) g.members.push_back(r);
  std::vector<std::unique_ptr<coll::communicator>> comms;
  std::vector<std::span<std::byte>> dense(n);
  for (std::uint32_t r = 0; r < n; ++r) {
    g.me = r;
    auto c = coll::communicator::create(*cluster.value()->host(r), g, co);
    if (!c) {
      std::fprintf(stderr, "spin-bench sparse: communicator of rank %u: %s\n", r, c.err().message.c_str());
      return false;
    }
    comms.push_back(std::move(c.value()));
    dense[r] = comms[r]->alloc(4 * L);
    if (dense[r].size() < 4 * L) {
      std::fprintf(stderr, "spin-bench sparse: the arena of rank %u cannot hold %llu bytes\n", r, static_cast<unsigned long long>(4 * L));
      return false;
    }
  }
  auto repaired = [&] {
    std::uint64_t s = 0;
    for (std::uint32_t r = 0; r < n; ++r) s += comms[r]->stats().repaired_epochs;
    return s;
  };
  auto tx_bytes = [&] {
    std::uint64_t s = 0;
    for (std::uint32_t r = 0; r < n; ++r) s += cluster.value()->node(r).stats().ports[0].tx_bytes;
    return s;
  };
  std::printf("\n%u ranks: %u hosts and a switch emulated on %u lcores (of %u hardware threads), %u rank threads that sleep while "
              "their NIC works\n",
              n, n, cluster.value()->lcores(), std::max(1u, std::thread::hardware_concurrency()), n);
  for (const std::string& an : o.algorithms) {
    const coll::algorithm algo = an == "switch" ? coll::algorithm::switch_agg : coll::algorithm::edge_ring;
    // The dense baselines run once per algorithm, on the first type's densest vectors (a dense
    // allreduce's time and bytes do not depend on the values).
    for (const std::string& tn : o.dtypes) {
      coll::dtype t{};
      coll::dtype_named(tn.c_str(), t);
      const bool mx = mx_type(t);
      const std::uint32_t vb = t == coll::dtype::f32 || mx ? 4 : 2;
      for (double d : o.densities) {
        row rw;
        rw.ranks = n;
        rw.algorithm = an;
        rw.type = tn;
        rw.density = d;
        std::vector<std::vector<std::uint32_t>> idx(n);
        std::vector<std::vector<std::byte>> vals(n);
        std::vector<std::vector<float>> x(n, std::vector<float>(nw * W, 0.0f));  // the scattered vectors, widened (MX: decoded)
        for (std::uint32_t r = 0; r < n; ++r) {
          std::mt19937_64 rng(1000 * r + static_cast<std::uint64_t>(d * 1e6) + 7);
          std::uniform_real_distribution<double> u(0, 1);
          for (std::uint64_t i = 0; i < L; ++i) {
            if (u(rng) >= d) continue;
            const float f = static_cast<float>(std::ldexp(u(rng) * 2 - 1, static_cast<int>(rng() % 17) - 12));
            const std::uint32_t v = mx ? std::bit_cast<std::uint32_t>(f) : narrow(t, f);
            idx[r].push_back(static_cast<std::uint32_t>(i));
            vals[r].resize(vals[r].size() + vb);
            std::memcpy(vals[r].data() + vals[r].size() - vb, &v, vb);  // little endian: the low bytes
            x[r][i] = mx ? f : widen(t, v);
          }
          if (mx) mx_round_trip(t, x[r]);
        }
        std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(L * vb));
        std::uint64_t tx0 = 0, rep0 = 0;
        rw.ms = timed(
            n, o.iters,
            [&](std::uint32_t r) {
              auto res = comms[r]->allreduce_sparse(idx[r], vals[r].data(), L, t, out[r].data(), algo);
              return res ? std::string() : res.err().message;
            },
            rw.error, [&] {
              tx0 = tx_bytes();
              rep0 = repaired();
            });
        rw.sent_per_rank = static_cast<double>(tx_bytes() - tx0) / n / o.iters;
        rw.repaired = static_cast<double>(repaired() - rep0) / o.iters;
        if (rw.error.empty()) {
          // Exactness (the documented order: epochs of `seg` windows, each cut into n chunks,
          // window w of chunk c summed from rank c+1 around) and the error against the float64 sum.
          const std::uint64_t seg = std::min<std::uint64_t>(65536 - n, co.staging_bytes / coll::elem_bytes(coll::window_type_of(t)));
          double max_err = 0, max_sum = 0;
          std::uint64_t nnz = 0;
          std::vector<float> sum(nw * W, 0.0f);
          std::vector<double> exact(nw * W, 0.0);
          for (std::uint64_t e0 = 0; e0 < nw; e0 += seg) {
            const std::uint64_t m = std::min(seg, nw - e0), base = m / n, extra = m % n;
            for (std::uint64_t c = 0, lo = e0; c < n; ++c) {
              const std::uint64_t len = base + (c < extra ? 1 : 0);
              for (std::uint64_t i = lo * W; i < (lo + len) * W; ++i) {
                float acc = x[(c + 1) % n][i];
                double ex = x[(c + 1) % n][i];
                for (std::uint32_t k = 2; k <= n; ++k) {
                  acc = acc + x[(c + k) % n][i];
                  ex += x[(c + k) % n][i];
                }
                sum[i] = acc;
                exact[i] = ex;
              }
              lo += len;
            }
          }
          if (mx) mx_round_trip(t, sum);  // encoded once, handed back decoded
          for (std::uint64_t i = 0; i < L; ++i) {
            const std::uint32_t want = mx ? std::bit_cast<std::uint32_t>(sum[i]) : narrow(t, sum[i]);
            nnz += want != 0;
            for (std::uint32_t r = 0; r < n; ++r) {
              std::uint32_t got = 0;
              std::memcpy(&got, out[r].data() + i * vb, vb);
              rw.wrong += got != want;
            }
            max_err = std::max(max_err, std::fabs(static_cast<double>(mx ? sum[i] : widen(t, want)) - exact[i]));
            max_sum = std::max(max_sum, std::fabs(exact[i]));
          }
          rw.max_err = max_sum > 0 ? max_err / max_sum : 0;
          rw.union_density = static_cast<double>(nnz) / static_cast<double>(L);
        }
        std::fprintf(stderr, "  %u ranks %s %s density %g: %.2f ms%s\n", n, an.c_str(), tn.c_str(), d, rw.ms,
                     rw.error.empty() ? "" : (" FAILED: " + rw.error).c_str());
        rows.push_back(rw);
        if (!rw.error.empty()) return true;  // the communicators are broken
        // The dense baseline of this type once, after its densest row (its vectors).
        if (d == o.densities.back() && tn == o.dtypes.front()) {
          for (coll::dtype dt : {coll::dtype::f32, coll::dtype::bf16}) {
            row b;
            b.ranks = n;
            b.algorithm = an;
            b.type = std::string("dense ") + coll::name(dt);
            b.density = -1;
            const std::uint32_t db = dt == coll::dtype::f32 ? 4 : 2;
            auto fill = [&](std::uint32_t r) {
              for (std::uint64_t i = 0; i < L; ++i) {
                const std::uint32_t v = narrow(dt, x[r][i]);
                std::memcpy(dense[r].data() + i * db, &v, db);
              }
            };
            for (std::uint32_t r = 0; r < n; ++r) fill(r);
            std::uint64_t t0 = 0, r0 = 0;
            b.ms = timed(
                n, o.iters,
                [&](std::uint32_t r) {
                  auto res = comms[r]->allreduce(dense[r].data(), dense[r].data(), L, dt, coll::op::sum, algo);
                  return res ? std::string() : res.err().message;
                },
                b.error, [&] {
                  t0 = tx_bytes();
                  r0 = repaired();
                });
            b.sent_per_rank = static_cast<double>(tx_bytes() - t0) / n / o.iters;
            b.repaired = static_cast<double>(repaired() - r0) / o.iters;
            rows.push_back(b);
            if (!b.error.empty()) return true;
          }
        }
      }
    }
  }
  return true;
}

} // namespace

int run_sparse(const sparse_options& o) {
  if (o.values < 1 || o.values > (std::uint64_t{1} << 30) || o.iters < 1) {
    std::fprintf(stderr, "spin-bench sparse: --values must be in 1..2^30 and --iters at least 1\n");
    return 2;
  }
  for (std::uint32_t n : o.ranks)
    if (n < 2 || n > 64) {
      std::fprintf(stderr, "spin-bench sparse: ranks must be in 2..64 (got %u)\n", n);
      return 2;
    }
  for (double d : o.densities)
    if (!(d > 0 && d <= 1)) {
      std::fprintf(stderr, "spin-bench sparse: densities must be in (0, 1] (got %g)\n", d);
      return 2;
    }
  for (const auto& a : o.algorithms)
    if (a != "switch" && a != "edge_ring") {
      std::fprintf(stderr, "spin-bench sparse: unknown algorithm %s (switch, edge_ring)\n", a.c_str());
      return 2;
    }
  for (const auto& t : o.dtypes) {
    coll::dtype d{};
    if (!coll::dtype_named(t.c_str(), d) || coll::window_type_of(d) == coll::dtype::custom) {
      std::fprintf(stderr, "spin-bench sparse: unknown value type %s (f32, bf16, f16, or an MX type: mxfp8_e4m3, mxfp8_e5m2, "
                           "mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8)\n",
                   t.c_str());
      return 2;
    }
  }
  if (o.ranks.empty() || o.densities.empty() || o.algorithms.empty() || o.dtypes.empty()) {
    std::fprintf(stderr, "spin-bench sparse: nothing to run\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "spin-bench sparse: cannot create %s: %s\n", o.out_dir.c_str(), ec.message().c_str());
    return 2;
  }
  if (auto r = emu::eal_init(emu::default_eal_args("spin-bench-sparse-" + std::to_string(::getpid()))); !r) {
    std::fprintf(stderr, "spin-bench sparse: %s\n", r.err().message.c_str());
    return 2;
  }
  run_conditions cond = measure_conditions();
  cond.print("spin-bench sparse");
  std::printf("allreduce_sparse of a vector of %llu values (%.1f MiB as float32), windows of %u values; every row in this run, "
              "dense rows: allreduce of the scattered vectors; ms per call (slowest rank, mean of %u calls after one warm-up)\n",
              static_cast<unsigned long long>(o.values), static_cast<double>(o.values) * 4 / (1 << 20), W, o.iters);
  std::vector<row> rows;
  bool ok = true;
  for (std::uint32_t n : o.ranks) ok = run_ranks(o, n, rows) && ok;
  std::printf("\n%5s %-9s %-10s %8s %8s %10s %11s %8s %8s %8s %8s %10s %7s %7s\n", "ranks", "algorithm", "type", "density", "union",
              "ms", "MB/rank", "B/value", "x f32 B", "x bf16 B", "x f32 t", "max err", "#wrong", "repairs");
  FILE* csv = std::fopen((o.out_dir + "/sparse.csv").c_str(), "w");
  if (csv != nullptr)
    std::fprintf(csv, "ranks,algorithm,type,density,union_density,ms,sent_bytes_per_rank,bytes_per_value,max_rel_error,wrong,"
                      "repaired_epochs_per_call,error\n");
  for (const row& r : rows) {
    const row* f32 = nullptr;
    const row* bf16 = nullptr;
    for (const row& b : rows)
      if (b.ranks == r.ranks && b.algorithm == r.algorithm && b.density < 0) {
        if (b.type == "dense f32") f32 = &b;
        if (b.type == "dense bf16") bf16 = &b;
      }
    auto ratio = [](double a, const row* b, double row::*m) { return b != nullptr && b->*m > 0 ? a / (b->*m) : 0.0; };
    char dens[16] = "-", uni[16] = "-", err[16] = "-";
    if (r.density >= 0) {
      std::snprintf(dens, sizeof dens, "%.3g%%", r.density * 100);
      std::snprintf(uni, sizeof uni, "%.3g%%", r.union_density * 100);
      std::snprintf(err, sizeof err, "%.2e", r.max_err);
    }
    std::printf("%5u %-9s %-10s %8s %8s %10.2f %11.3f %8.3f %8.3f %8.3f %8.2f %10s %7llu %7.1f%s\n", r.ranks, r.algorithm.c_str(),
                r.type.c_str(), dens, uni, r.ms, r.sent_per_rank / 1e6, r.sent_per_rank / static_cast<double>(o.values),
                ratio(r.sent_per_rank, f32, &row::sent_per_rank), ratio(r.sent_per_rank, bf16, &row::sent_per_rank),
                ratio(r.ms, f32, &row::ms), err, static_cast<unsigned long long>(r.wrong), r.repaired,
                r.error.empty() ? "" : ("  FAILED: " + r.error).c_str());
    if (csv != nullptr)
      std::fprintf(csv, "%u,%s,%s,%g,%g,%.4f,%.1f,%.5f,%.3e,%llu,%.2f,\"%s\"\n", r.ranks, r.algorithm.c_str(), r.type.c_str(),
                   r.density, r.union_density, r.ms, r.sent_per_rank, r.sent_per_rank / static_cast<double>(o.values), r.max_err,
                   static_cast<unsigned long long>(r.wrong), r.repaired, r.error.c_str());
    ok = ok && r.error.empty() && r.wrong == 0;
  }
  if (csv != nullptr) std::fclose(csv);
  std::printf("density: of each rank's vector; union: of the result (values not +0); B/value: bytes each rank's NIC sent per value of "
              "the vector (frames, heads included); x f32 B, x bf16 B: against the dense allreduce of the same vectors in this run; "
              "x f32 t: time against dense float32; max err: max |result - exact float64 sum| / max |exact sum|; #wrong: values, on "
              "all ranks, that differ from the float32 sum in the documented order; repairs: epochs repaired per call, all ranks together "
              "(lost or late packets resent: their frames count in the bytes)\n");
  std::printf("result: %s; wrote %s/sparse.csv\n", ok ? "every result exact" : "WRONG RESULTS OR FAILURES (exit status 1)", o.out_dir.c_str());
  return ok ? 0 : 1;
}

} // namespace spin::bench
