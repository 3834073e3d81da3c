// spin-bench reductions (reductions.hpp). A measurement: `repeats` passes of one kernel over a
// buffer of `values` values, the median pass time divided by the values. The inputs are the
// narrowed form of values drawn over a range of binades (so widen and narrow see ordinary
// data), the same for every datatype; fold folds the buffer into accumulators that already
// hold it.
#include "reductions.hpp"

#include "../common.hpp"

#include <spin/coll/types.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace spin::bench {

namespace {

struct row {
  std::string type;
  double widen_ns = 0, fold_ns = 0, narrow_ns = 0;  // per value
  std::uint64_t round_trip_wrong = 0;
};

template <class F> double median_ns_per_value(std::uint32_t repeats, std::uint64_t values, F&& pass) {
  std::vector<double> t;
  for (std::uint32_t k = 0; k < repeats; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(values));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class R> row measure(coll::dtype t, const reductions_options& o) {
  using elem = typename R::elem;
  using acc = typename R::acc;
  const std::uint32_t nv = coll::block_values(t);
  const std::uint64_t n = std::max<std::uint64_t>(1, o.values / nv);
  // Values over 2^-8 .. 2^8 with a sign, converted to float32 accumulators, then narrowed: the
  // input elements. Integer types get integers in [-1000, 1000].
  std::mt19937_64 rng(7);
  std::vector<acc> a(n), back(n);
  std::vector<elem> in(n), out(n);
  const std::uint32_t per = sizeof(acc) / nv;
  for (std::uint64_t i = 0; i < n; ++i) {
    auto* p = reinterpret_cast<unsigned char*>(&a[i]);
    for (std::uint32_t j = 0; j < nv; ++j) {
      const double v = std::ldexp(1.0 + static_cast<double>(rng() % 1000) / 1000.0, static_cast<int>(rng() % 17) - 8) *
                       ((rng() & 1) != 0 ? -1.0 : 1.0);
      if (t == coll::dtype::i32 || t == coll::dtype::i64 || t == coll::dtype::u32 || t == coll::dtype::u64) {
        const std::int64_t x = static_cast<std::int64_t>(rng() % 2001) - 1000;
        std::memcpy(p + j * per, &x, per);  // little endian: the low bytes for 32-bit types
      } else if (per == 8) {
        std::memcpy(p + j * per, &v, 8);
      } else {
        const float f = static_cast<float>(v);
        std::memcpy(p + j * per, &f, 4);
      }
    }
  }
  coll::narrow_n<R>(in.data(), a.data(), static_cast<std::uint32_t>(n));
  row r;
  r.type = coll::name(t);
  const auto nn = static_cast<std::uint32_t>(n);
  r.widen_ns = median_ns_per_value(o.repeats, n * nv, [&] { coll::widen_n<R>(a.data(), in.data(), nn); });
  r.fold_ns = median_ns_per_value(o.repeats, n * nv, [&] { coll::fold_n<R>(a.data(), in.data(), nn); });
  coll::widen_n<R>(a.data(), in.data(), nn);
  r.narrow_ns = median_ns_per_value(o.repeats, n * nv, [&] { coll::narrow_n<R>(out.data(), a.data(), nn); });
  // The check: every input is an encoded value, so narrow(widen(x)) == x bit for bit.
  for (std::uint64_t i = 0; i < n; ++i) r.round_trip_wrong += std::memcmp(&out[i], &in[i], sizeof(elem)) != 0;
  return r;
}

} // namespace

int run_reductions(const reductions_options& o) {
  std::vector<coll::dtype> types;
  if (o.dtypes.empty()) {
    for (unsigned k = 1; k < 255; ++k)
      if (coll::with_standard(coll::op::sum, static_cast<coll::dtype>(k), []<class R>() {}) &&
          !coll::compact_type(static_cast<coll::dtype>(k)))  // sparse windows: spin-bench sparse
        types.push_back(static_cast<coll::dtype>(k));
  } else {
    for (const auto& s : o.dtypes) {
      coll::dtype t{};
      const bool found = coll::dtype_named(s.c_str(), t) && coll::with_standard(coll::op::sum, t, []<class R>() {}) &&
                         !coll::compact_type(t);
      if (found) types.push_back(t);
      if (!found) {
        std::fprintf(stderr, "spin-bench reductions: unknown datatype %s (sparse windows: spin-bench sparse)\n", s.c_str());
        return 2;
      }
    }
  }
  if (std::find(types.begin(), types.end(), coll::dtype::f32) == types.end()) types.insert(types.begin(), coll::dtype::f32);
  run_conditions cond = measure_conditions();
  cond.print("spin-bench reductions");
  std::printf("sum kernels of spin/coll/types.hpp on one thread, %llu values per buffer, median of %u passes; ns per value, and "
              "x f32: against float32's kernel in this run\n",
              static_cast<unsigned long long>(o.values), o.repeats);
  std::vector<row> rows;
  for (coll::dtype t : types) coll::with_standard(coll::op::sum, t, [&]<class R>() { rows.push_back(measure<R>(t, o)); });
  const row& base = rows.front();
  std::printf("%-12s %10s %7s %10s %7s %10s %7s %8s\n", "type", "widen", "x f32", "fold", "x f32", "narrow", "x f32", "#wrong");
  bool ok = true;
  for (const row& r : rows) {
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf("%-12s %10.3f %7.1f %10.3f %7.1f %10.3f %7.1f %8llu\n", r.type.c_str(), r.widen_ns, ratio(r.widen_ns, base.widen_ns),
                r.fold_ns, ratio(r.fold_ns, base.fold_ns), r.narrow_ns, ratio(r.narrow_ns, base.narrow_ns),
                static_cast<unsigned long long>(r.round_trip_wrong));
    ok = ok && r.round_trip_wrong == 0;
  }
  std::printf("#wrong: elements for which narrow(widen(x)) differs from x (each input is an encoded value)\n");
  std::printf("result: %s\n", ok ? "every round trip exact" : "ROUND TRIPS CHANGED ELEMENTS (exit status 1)");
  return ok ? 0 : 1;
}

} // namespace spin::bench
