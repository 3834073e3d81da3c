// spin-bench coll's data in other datatypes than float32 (--dtype): the same values as
// coll_data.hpp (integers in [-4, 4], so that every sum is exact in float32 in any order),
// converted to the datatype by the standard reductions' own narrow step, and the exact sum
// converted the same way, which is what every rank must hold (spin/coll/types.hpp: for block
// formats, encode(the float32 sum); exact integer sums make the order irrelevant). A value
// index i of rank r is coll_input(r, i); element e of a block format holds values
// e x V .. e x V + V - 1 (V = coll::block_values). The elements repeat with period 9, so a
// period is built once and copied.
#pragma once

#include "coll_data.hpp"

#include <spin/coll/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace spin::bench {

/// Names --dtype accepts (coll::name of each dtype that holds the data: no unsigned types).
inline std::vector<std::string> coll_type_names() {
  std::vector<std::string> v;
  for (coll::dtype t : {coll::dtype::f32, coll::dtype::f64, coll::dtype::f16, coll::dtype::bf16, coll::dtype::i32, coll::dtype::i64,
                        coll::dtype::mxfp8_e4m3, coll::dtype::mxfp8_e5m2, coll::dtype::mxfp6_e3m2, coll::dtype::mxfp6_e2m3,
                        coll::dtype::mxfp4_e2m1, coll::dtype::mxint8, coll::dtype::bfp8_16, coll::dtype::bfp8_32,
                        coll::dtype::bfp16_16, coll::dtype::bfp16_32})
    v.emplace_back(coll::name(t));
  return v;
}

inline std::optional<coll::dtype> coll_type_of(const std::string& s) {
  coll::dtype t{};
  // Sparse windows are not a tensor's datatype: spin-bench sparse measures them.
  if (coll::dtype_named(s.c_str(), t) && !coll::compact_type(t)) return t;
  return std::nullopt;
}

/// One period (9 elements) of every rank's input and of the expected result, in datatype t.
class coll_typed_data {
public:
  coll_typed_data(coll::dtype t, std::uint32_t ranks) : _t(t) {
    coll::with_standard(coll::op::sum, t, [&]<class R>() {
      _eb = sizeof(typename R::elem);
      _ab = sizeof(typename R::acc);
      _narrow = &coll::narrow_n<R>;
      _widen = &coll::widen_n<R>;
    });
    _nv = coll::block_values(t);
    _in.assign(ranks, std::vector<std::byte>(9 * _eb));
    _want.resize(9 * _eb);
    std::vector<double>& sum = _sum;
    sum.assign(9 * std::size_t{_nv}, 0.0);
    std::vector<double> mine(9 * std::size_t{_nv});
    for (std::uint32_t r = 0; r < ranks; ++r) {
      for (std::uint64_t i = 0; i < mine.size(); ++i) {
        mine[i] = coll_input(r, i);
        sum[i] += mine[i];
      }
      convert(mine, _in[r].data());
    }
    convert(sum, _want.data());
    for (double s : sum) _max_sum = std::max(_max_sum, std::fabs(s));
  }
  std::uint32_t elem_bytes() const { return _eb; }
  std::uint32_t acc_bytes() const { return _ab; }
  std::uint32_t values_per_elem() const { return _nv; }
  /// Elements that hold `values` values.
  std::uint64_t count_for(std::uint64_t values) const { return (values + _nv - 1) / _nv; }
  /// Fills `count` elements at `out` with rank r's input.
  void fill(std::uint32_t r, void* out, std::uint64_t count) const { copy_period(_in[r].data(), out, count); }
  /// Elements of `got` (count of them) that differ from the expected sum, bit for bit.
  std::uint64_t wrong(const void* got, std::uint64_t count) const {
    std::uint64_t w = 0;
    const auto* g = static_cast<const std::byte*>(got);
    for (std::uint64_t e = 0; e < count; ++e) w += std::memcmp(g + e * _eb, _want.data() + (e % 9) * _eb, _eb) != 0;
    return w;
  }

  /// The largest |value of `got` - exact float64 sum| over `count` elements, divided by the
  /// largest |exact sum| (0 when every sum is 0): the datatype's error, since every partial sum
  /// is exact. NaN when a value of `got` is NaN.
  double max_error(const void* got, std::uint64_t count) const {
    const auto* g = static_cast<const std::byte*>(got);
    std::vector<std::byte> acc(_ab);
    double worst = 0;
    for (std::uint64_t e = 0; e < count; ++e) {
      _widen(acc.data(), g + e * _eb, 1);
      for (std::uint32_t k = 0; k < _nv; ++k) {
        const double d = std::fabs(value_at(acc.data(), k) - _sum[(e % 9) * _nv + k]);
        if (std::isnan(d)) return d;
        worst = std::max(worst, d);
      }
    }
    return _max_sum > 0 ? worst / _max_sum : worst;
  }

private:
  // Value k of one element's accumulator, as double.
  double value_at(const std::byte* acc, std::uint32_t k) const {
    if (_t == coll::dtype::f64) return load<double>(acc + 8 * k);
    if (_t == coll::dtype::i32) return load<std::int32_t>(acc + 4 * k);
    if (_t == coll::dtype::i64) return static_cast<double>(load<std::int64_t>(acc + 8 * k));
    return load<float>(acc + 4 * k);  // float32 accumulators
  }
  template <class T> static T load(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  // Values (9 x V of them) -> 9 elements, through the reduction's accumulator and narrow.
  void convert(const std::vector<double>& v, std::byte* out) const {
    std::vector<std::byte> acc(9 * std::size_t{_ab});
    const std::uint32_t per = _ab / _nv;  // accumulator bytes per value
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::byte* a = acc.data() + i * per;
      if (_t == coll::dtype::f64) {
        std::memcpy(a, &v[i], 8);
      } else if (_t == coll::dtype::i32) {
        const auto x = static_cast<std::int32_t>(v[i]);
        std::memcpy(a, &x, 4);
      } else if (_t == coll::dtype::i64) {
        const auto x = static_cast<std::int64_t>(v[i]);
        std::memcpy(a, &x, 8);
      } else {  // float32 accumulators: f32, f16, bf16 and the block formats
        const auto x = static_cast<float>(v[i]);
        std::memcpy(a, &x, 4);
      }
    }
    _narrow(out, acc.data(), 9);
  }
  void copy_period(const std::byte* period, void* out, std::uint64_t count) const {
    auto* o = static_cast<std::byte*>(out);
    const std::uint64_t whole = count / 9;
    for (std::uint64_t k = 0; k < whole; ++k) std::memcpy(o + k * 9 * _eb, period, 9 * std::size_t{_eb});
    std::memcpy(o + whole * 9 * _eb, period, (count % 9) * _eb);
  }

  coll::dtype _t;
  std::uint32_t _eb = 0, _ab = 0, _nv = 1;
  void (*_narrow)(void*, const void*, std::uint32_t) = nullptr;
  void (*_widen)(void*, const void*, std::uint32_t) = nullptr;
  std::vector<std::vector<std::byte>> _in;
  std::vector<double> _sum;  // the exact sums of one period (9 x V values)
  double _max_sum = 0;
  std::vector<std::byte> _want;
};

} // namespace spin::bench
