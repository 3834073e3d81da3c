// communicator::allreduce_sparse (docs/collectives.md, "Sparse allreduce"): the ranks agree on
// their arguments, cut their pairs into sparse windows (spin/coll/sparse.hpp) in arena memory,
// allreduce the windows in place (NIC or switch handlers add them: sum_sparse in types.hpp),
// and read the result out dense or as pairs.
#include <spin/coll/coll.hpp>
#include <spin/coll/sparse.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace spin::coll {
namespace {

namespace sp = sparse;
constexpr std::uint32_t W = sp::window_values;

// Why a rank's arguments are refused (the agreement carries the code).
enum class fault : std::uint8_t {
  none = 0,
  not_ascending = 1,
  out_of_range = 2,
  null_buffer = 3,
  bad_type = 4,
  too_long = 5,
};
const char* why(fault f) {
  switch (f) {
  case fault::none: return "";
  case fault::not_ascending: return "its indices are not strictly ascending";
  case fault::out_of_range: return "an index is not below length";
  case fault::null_buffer: return "a null buffer with pairs or a result to give";
  case fault::bad_type: return "its datatype is not f32, bf16, f16 or an MX type";
  case fault::too_long: return "length exceeds 2^32 (indices are 32-bit)";
  }
  return "?";
}

std::uint32_t value_bits(const std::byte* v, std::uint32_t vb, std::uint64_t k) {
  if (vb == 4) {
    std::uint32_t x;
    std::memcpy(&x, v + 4 * k, 4);
    return x;
  }
  std::uint16_t x;
  std::memcpy(&x, v + 2 * k, 2);
  return x;
}

// Window `w` (at `out`, eb bytes) from the pairs idx[p0..p1) (all inside the window), values of
// vb bytes at `vals`: the values whose bits are +0 are left out, as the format says.
void encode_window(std::uint8_t* out, std::uint64_t base, const std::uint32_t* idx, const std::byte* vals,
                   std::uint64_t p0, std::uint64_t p1, std::uint32_t vb) {
  std::uint32_t n = 0;
  for (std::uint64_t k = p0; k < p1; ++k) n += value_bits(vals, vb, k) != 0 ? 1 : 0;
  if (!sp::pairs_smaller(n, vb)) {
    sp::store16(out, static_cast<std::uint16_t>(W));
    sp::store16(out + 2, sp::form_dense);
    std::uint8_t* d = out + sp::head_bytes;
    std::memset(d, 0, std::size_t{W} * vb);
    for (std::uint64_t k = p0; k < p1; ++k) std::memcpy(d + (idx[k] - base) * vb, vals + k * vb, vb);
    return;
  }
  sp::store16(out, static_cast<std::uint16_t>(n));
  sp::store16(out + 2, sp::form_pairs);
  std::uint8_t* off = out + sp::head_bytes;
  std::uint8_t* val = off + sp::offset_bytes(n);
  if ((n & 1) != 0) sp::store16(off + 2 * n, 0);
  std::uint32_t j = 0;
  for (std::uint64_t k = p0; k < p1; ++k) {
    if (value_bits(vals, vb, k) == 0) continue;
    sp::store16(off + 2 * j, static_cast<std::uint16_t>(idx[k] - base));
    std::memcpy(val + std::size_t{j} * vb, vals + k * vb, vb);
    ++j;
  }
}

// Windows in arena memory when it holds them (no staging copy), else on the heap.
struct window_buffer {
  communicator& c;
  std::span<std::byte> arena;
  std::unique_ptr<std::uint32_t[]> heap;
  std::uint8_t* data = nullptr;
  window_buffer(communicator& comm, std::size_t bytes) : c(comm) {
    if (bytes == 0) return;
    arena = c.alloc(bytes);
    if (arena.size() >= bytes) {
      data = reinterpret_cast<std::uint8_t*>(arena.data());
    } else {
      if (!arena.empty()) c.free(arena);
      arena = {};
      heap.reset(new std::uint32_t[(bytes + 3) / 4]);
      data = reinterpret_cast<std::uint8_t*>(heap.get());
    }
  }
  ~window_buffer() {
    if (!arena.empty()) c.free(arena);
  }
  window_buffer(const window_buffer&) = delete;
  window_buffer& operator=(const window_buffer&) = delete;
};

// Calls f.template operator()<R>(acc) with the reduction R of MX window type wt and a float32
// window of scratch (one per thread: a window's accumulator is 4 KiB).
template <class F> void with_mx_windows(dtype wt, F&& f) {
  thread_local sum_sparse<sparse_value_f32>::acc acc;
  with_standard(op::sum, wt, [&]<class R>() {
    if constexpr (detail::is_compact<R>() && std::is_same_v<typename R::acc, sum_sparse<sparse_value_f32>::acc>)
      f.template operator()<R>(acc);
  });
}

} // namespace

// Agreement, windows, allreduce; `read` takes the result windows.
template <class Read>
static result<void> sparse_run(communicator& c, std::span<const std::uint32_t> index, const void* values,
                               std::uint64_t length, dtype t, bool out_null, algorithm a, Read read) {
  const std::string what = "allreduce_sparse";
  // 1. Every rank's arguments, checked here, then agreed on by every rank: the maximum of each
  //    value and of its complement gives the largest and the smallest, so any difference
  //    shows; the fault word names the lowest rank at fault.
  fault f = fault::none;
  std::string detail;
  const dtype wt = window_type_of(t);
  if (wt == dtype::custom) f = fault::bad_type;
  else if (length > (std::uint64_t{1} << 32)) f = fault::too_long;
  else if ((!index.empty() && (values == nullptr || index.data() == nullptr)) || (length > 0 && out_null)) f = fault::null_buffer;
  else
    for (std::size_t k = 0; k < index.size(); ++k) {
      if (index[k] >= length) {
        f = fault::out_of_range;
        detail = "index[" + std::to_string(k) + "] = " + std::to_string(index[k]) + " is not below length " + std::to_string(length);
        break;
      }
      if (k > 0 && index[k] <= index[k - 1]) {
        f = fault::not_ascending;
        detail = "index[" + std::to_string(k) + "] = " + std::to_string(index[k]) + " is not above index[" + std::to_string(k - 1) +
                 "] = " + std::to_string(index[k - 1]);
        break;
      }
    }
  const auto me = c.rank();
  std::array<std::uint64_t, 7> v{length, ~length, static_cast<std::uint64_t>(t), ~static_cast<std::uint64_t>(t),
                                 static_cast<std::uint64_t>(a), ~static_cast<std::uint64_t>(a),
                                 f == fault::none ? 0 : (std::uint64_t{0xffffffffu - me} << 8) | static_cast<std::uint64_t>(f)};
  if (auto r = c.allreduce(v.data(), v.data(), v.size(), dtype::u64, op::max, algorithm::edge_ring); !r.ok())
    return fail(r.err().code, what + ": agreeing on the arguments: " + r.err().message);
  if (v[6] != 0) {
    const auto rank = static_cast<std::uint32_t>(0xffffffffu - (v[6] >> 8));
    const auto code = static_cast<fault>(v[6] & 0xff);
    std::string m = what + ": rank " + std::to_string(rank) + "'s arguments are refused: " + why(code);
    if (rank == me && !detail.empty()) m += " (" + detail + ")";
    return fail(errc::invalid_argument, m);
  }
  if (v[0] != ~v[1]) return fail(errc::invalid_argument, what + ": the ranks give different lengths (" + std::to_string(~v[1]) +
                                                             " to " + std::to_string(v[0]) + ")");
  if (v[2] != ~v[3]) return fail(errc::invalid_argument, what + ": the ranks give different datatypes");
  if (v[4] != ~v[5]) return fail(errc::invalid_argument, what + ": the ranks give different algorithms");
  if (a == algorithm::host_ring)
    return fail(errc::not_supported, what + ": host_ring carries no sparse windows (edge_ring or switch add them in handlers)");

  // 2. The windows. MX values (float32 in the caller's buffers): each window's values are
  //    scattered into a float32 window and encoded by the reduction itself, each block's scale
  //    chosen from this rank's values.
  const bool mx_values = block_values(t) > 1;
  const std::uint32_t vb = t == dtype::f32 || mx_values ? 4 : 2, eb = elem_bytes(wt);
  const std::uint64_t nw = (length + W - 1) / W;
  window_buffer buf(c, static_cast<std::size_t>(nw * eb));
  const auto* vals = static_cast<const std::byte*>(values);
  std::uint64_t k = 0;
  for (std::uint64_t w = 0; w < nw; ++w) {
    const std::uint64_t base = w * W, end = base + W;
    const std::uint64_t p0 = k;
    while (k < index.size() && index[k] < end) ++k;
    if (!mx_values) {
      encode_window(buf.data + w * eb, base, index.data(), vals, p0, k, vb);
      continue;
    }
    with_mx_windows(wt, [&]<class R>(typename R::acc& acc) {
      for (std::uint32_t i = 0; i < W; ++i) acc.bits[i] = 0;
      for (std::uint64_t j = p0; j < k; ++j) acc.bits[index[j] - base] = value_bits(vals, 4, j);
      R::narrow_into(*reinterpret_cast<typename R::elem*>(buf.data + w * eb), acc);
    });
  }
  // 3. The sum, in place.
  if (auto r = c.allreduce(buf.data, buf.data, nw, wt, op::sum, a); !r.ok()) return r;
  // 4. The result. MX windows: decoded into float32 (exact), read as float32 windows.
  if (!mx_values) {
    for (std::uint64_t w = 0; w < nw; ++w) read(w, buf.data + w * eb, vb);
    return {};
  }
  // Read in the dense form: packing each into its smaller form first cost more than the read
  // (profile of spin-bench sparse --dtype mxfp8_e4m3 at 10%: 10% of all cycles).
  std::vector<std::uint8_t> f32_window(sp::dense_bytes(4));
  sp::store16(f32_window.data(), static_cast<std::uint16_t>(W));
  sp::store16(f32_window.data() + 2, sp::form_dense);
  for (std::uint64_t w = 0; w < nw; ++w)
    with_mx_windows(wt, [&]<class R>(typename R::acc& acc) {
      R::widen_into(acc, *reinterpret_cast<const typename R::elem*>(buf.data + w * eb));
      std::memcpy(f32_window.data() + sp::head_bytes, acc.bits, sizeof acc.bits);
      read(w, f32_window.data(), 4);
    });
  return {};
}

result<void> communicator::allreduce_sparse(std::span<const std::uint32_t> index, const void* values, std::uint64_t length,
                                            dtype t, void* dense_out, algorithm a) {
  auto* out = static_cast<std::byte*>(dense_out);
  return sparse_run(*this, index, values, length, t, dense_out == nullptr, a,
                    [&](std::uint64_t w, const std::uint8_t* win, std::uint32_t vb) {
                      const std::uint64_t base = w * W, m = std::min<std::uint64_t>(W, length - base);
                      std::byte* o = out + base * vb;
                      if (sp::form_of(win) == sp::form_dense) {
                        std::memcpy(o, sp::dense_values(win), m * vb);
                        return;
                      }
                      std::memset(o, 0, m * vb);
                      const std::uint32_t n = sp::count_of(win);
                      const std::uint8_t* val = sp::pair_values(win);
                      for (std::uint32_t j = 0; j < n; ++j) {
                        const std::uint32_t i = sp::load16(sp::offsets(win) + 2 * j);
                        if (i < m) std::memcpy(o + std::size_t{i} * vb, val + std::size_t{j} * vb, vb);
                      }
                    });
}

result<void> communicator::allreduce_sparse(std::span<const std::uint32_t> index, const void* values, std::uint64_t length,
                                            dtype t, std::vector<std::uint32_t>& index_out, std::vector<std::byte>& values_out,
                                            algorithm a) {
  std::vector<std::uint32_t> idx;
  std::vector<std::byte> out;
  auto r = sparse_run(*this, index, values, length, t, false, a, [&](std::uint64_t w, const std::uint8_t* win, std::uint32_t vb) {
    const std::uint64_t base = w * W;
    auto put = [&](std::uint32_t i, const std::uint8_t* v) {
      if (base + i >= length || value_bits(reinterpret_cast<const std::byte*>(v), vb, 0) == 0) return;
      idx.push_back(static_cast<std::uint32_t>(base + i));
      out.insert(out.end(), reinterpret_cast<const std::byte*>(v), reinterpret_cast<const std::byte*>(v) + vb);
    };
    if (sp::form_of(win) == sp::form_dense) {
      for (std::uint32_t i = 0; i < W; ++i) put(i, sp::dense_values(win) + std::size_t{i} * vb);
      return;
    }
    const std::uint32_t n = sp::count_of(win);
    for (std::uint32_t j = 0; j < n; ++j) put(sp::load16(sp::offsets(win) + 2 * j), sp::pair_values(win) + std::size_t{j} * vb);
  });
  if (!r.ok()) return r;
  index_out = std::move(idx);
  values_out = std::move(out);
  return r;
}

} // namespace spin::coll
