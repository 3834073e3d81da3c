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
  caller = 6,  // a typed form refused its arguments (the detail says why)
};
const char* why(fault f) {
  switch (f) {
  case fault::none: return "";
  case fault::not_ascending: return "its indices are not strictly ascending";
  case fault::out_of_range: return "an index is not below length";
  case fault::null_buffer: return "a null buffer with pairs or a result to give";
  case fault::bad_type: return "its datatype is not f32, bf16, f16 or an MX type";
  case fault::too_long: return "length exceeds 2^32 (indices are 32-bit)";
  case fault::caller: return "its arguments do not match";
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

// An element (at `out`) of `windows` windows from `base`, from the pairs idx[p0..p1) (all inside
// it), values of vb bytes at `vals`: the values whose bits are +0 are left out, as the format
// says. One window takes pairs or dense form, whichever is smaller; several, the span form.
void encode_element(std::uint8_t* out, std::uint64_t base, std::uint32_t windows, const std::uint32_t* idx,
                    const std::byte* vals, std::uint64_t p0, std::uint64_t p1, std::uint32_t vb) {
  std::uint32_t n = 0;
  for (std::uint64_t k = p0; k < p1; ++k) n += value_bits(vals, vb, k) != 0 ? 1 : 0;
  if (windows == 1 && !sp::pairs_smaller(n, vb)) {
    sp::store16(out, static_cast<std::uint16_t>(W));
    sp::store16(out + 2, sp::form_dense);
    std::uint8_t* d = out + sp::head_bytes;
    std::memset(d, 0, std::size_t{W} * vb);
    for (std::uint64_t k = p0; k < p1; ++k) std::memcpy(d + (idx[k] - base) * vb, vals + k * vb, vb);
    return;
  }
  sp::store16(out, static_cast<std::uint16_t>(n));
  sp::store16(out + 2, windows == 1 ? sp::form_pairs : sp::form_span);
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

// One element of the sum: windows [first, first + windows) of the vector.
struct span {
  std::uint64_t first = 0;
  std::uint32_t windows = 1;
};

// The spans every rank cuts alike from the agreed largest count of each window over the ranks
// (sparse.hpp, "Spans"): consecutive windows, at most span_windows_max, whose union bounds
// (ranks x largest count, at most W) add up to at most `cap` form one span; a window whose bound
// is larger travels alone.
std::vector<span> plan_spans(const std::uint64_t* largest, std::uint64_t nw, std::uint32_t ranks, std::uint32_t cap) {
  std::vector<span> out;
  auto bound = [&](std::uint64_t w) { return std::min<std::uint64_t>(W, largest[w] * ranks); };
  for (std::uint64_t w = 0; w < nw;) {
    span s{w, 1};
    std::uint64_t sum = bound(w);
    while (sum <= cap && w + s.windows < nw && s.windows < sp::span_windows_max && sum + bound(w + s.windows) <= cap)
      sum += bound(w + s.windows++);
    out.push_back(s);
    w += s.windows;
  }
  return out;
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

// Windows and spans of f32, bf16 or f16 values, summed epoch by epoch, each epoch cut as the
// allreduce of the windows would cut it (communicator::epoch_elements windows, chunks of them,
// docs/collectives.md "Combination order"), so that every value is added in the order the
// windows would add it: the result is theirs bit for bit. Within each chunk, spans
// (plan_spans); every chunk is padded with empty spans to the count of the chunk with most, so
// that the allreduce of the epoch's elements cuts its chunks where the windows' were. An epoch
// whose padded count would not be below its windows' sends its windows.
template <class Read>
static result<void> sparse_epochs(communicator& c, std::span<const std::uint32_t> index, const std::byte* vals, std::uint64_t length,
                                  const std::vector<std::uint64_t>& largest, dtype wt, std::uint32_t vb, std::uint32_t eb,
                                  algorithm a, Read& read) {
  const std::uint64_t nw = (length + W - 1) / W, seg = std::max<std::uint64_t>(c.epoch_elements(wt), 1);
  const std::uint32_t n = c.size(), cap = sp::max_pairs(vb);
  struct element {
    span s;
    bool pad = false;
  };
  // All epochs' elements are built before the first call and read after the last: the result
  // may be where the values were (in place).
  std::vector<element> els;
  std::vector<std::uint64_t> cut{0};  // epoch boundaries in els
  for (std::uint64_t e0 = 0; e0 < nw; e0 += std::min(seg, nw - e0)) {
    const std::uint64_t m = std::min(seg, nw - e0), per = m / n, extra = m % n;
    std::vector<std::vector<span>> chunk(n);
    std::size_t most = 0;
    for (std::uint64_t ci = 0, lo = e0; ci < n; ++ci) {
      const std::uint64_t len = per + (ci < extra ? 1 : 0);
      for (span s : plan_spans(largest.data() + lo, len, n, cap)) chunk[ci].push_back(span{lo + s.first, s.windows});
      most = std::max(most, chunk[ci].size());
      lo += len;
    }
    if (std::uint64_t{n} * most < m) {
      for (std::uint32_t ci = 0; ci < n; ++ci) {
        for (span s : chunk[ci]) els.push_back({s, false});
        for (std::size_t p = chunk[ci].size(); p < most; ++p) els.push_back({span{0, 2}, true});
      }
    } else {
      for (std::uint64_t w = e0; w < e0 + m; ++w) els.push_back({span{w, 1}, false});
    }
    cut.push_back(els.size());
  }
  if (nw == 0) cut.push_back(0);  // length 0 still runs one call: every rank learns whether the others agree
  window_buffer buf(c, els.size() * eb);
  std::uint64_t k = 0;  // the next pair
  for (std::size_t e = 0; e < els.size(); ++e) {
    std::uint8_t* out = buf.data + e * eb;
    if (els[e].pad) {
      encode_element(out, 0, 2, nullptr, nullptr, 0, 0, vb);  // an empty span
      continue;
    }
    const std::uint64_t base = els[e].s.first * W, end = base + std::uint64_t{els[e].s.windows} * W;
    const std::uint64_t p0 = k;
    while (k < index.size() && index[k] < end) ++k;
    encode_element(out, base, els[e].s.windows, index.data(), vals, p0, k, vb);
  }
  for (std::size_t q = 0; q + 1 < cut.size(); ++q) {
    std::uint8_t* at = buf.data == nullptr ? nullptr : buf.data + cut[q] * eb;
    if (auto r = c.allreduce(at, at, cut[q + 1] - cut[q], wt, op::sum, a); !r.ok()) return r;
  }
  // Every element must be in the form the plan gave it before any is read (the NICs check what
  // arrives, but a faulty or hostile peer could send a valid window where a span belongs).
  for (std::size_t e = 0; e < els.size(); ++e) {
    const std::uint8_t* win = buf.data + e * eb;
    const std::uint32_t f = sp::form_of(win);
    const bool span_form = els[e].pad || els[e].s.windows > 1;
    if ((span_form ? f != sp::form_span : f == sp::form_span) || !sp::valid(win, sp::length(win, vb), vb))
      return fail(errc::fault, "allreduce_sparse: element " + std::to_string(e) + " of the result is not the " +
                                   (span_form ? "span" : "window") + " the ranks planned (form " + std::to_string(f) + ")");
  }
  for (std::size_t e = 0; e < els.size(); ++e) {
    if (els[e].pad) continue;
    const std::uint64_t base = els[e].s.first * W;
    read(base, std::min<std::uint64_t>(std::uint64_t{els[e].s.windows} * W, length - base), buf.data + e * eb, vb);
  }
  return {};
}

// Agreement, spans, allreduce; read(base, count, element, vb) takes each element of the result:
// the `count` values from index `base`, a window or span of values of vb bytes.
template <class Read>
static result<void> sparse_run(communicator& c, std::span<const std::uint32_t> index, const void* values,
                               std::uint64_t length, dtype t, bool out_null, algorithm a, Read read,
                               const char* refused = nullptr) {
  const std::string what = "allreduce_sparse";
  // 1. Every rank's arguments, checked here, then agreed on by every rank: the maximum of each
  //    value and of its complement gives the largest and the smallest, so any difference
  //    shows; the fault word names the lowest rank at fault.
  fault f = fault::none;
  std::string detail;
  const dtype wt = window_type_of(t);
  if (refused != nullptr) {
    f = fault::caller;
    detail = refused;
  } else if (wt == dtype::custom) f = fault::bad_type;
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
  // With f32, bf16 and f16 values the agreement also carries each window's count of values this
  // rank lists (their maximum over the ranks cuts the spans). A rank whose own length differs
  // sends its own number of counts: the lengths differ, which the agreement reports before any
  // count is used. So every rank sends as many as the largest length needs: a rank with a
  // shorter length pads with zeros.
  const bool mx_values = block_values(t) > 1;
  const std::uint32_t vb = t == dtype::f32 || mx_values ? 4 : 2, eb = elem_bytes(wt);
  const std::uint64_t nw = (length + W - 1) / W;
  std::vector<std::uint64_t> v{length, ~length, static_cast<std::uint64_t>(t), ~static_cast<std::uint64_t>(t),
                               static_cast<std::uint64_t>(a), ~static_cast<std::uint64_t>(a),
                               f == fault::none ? 0 : (std::uint64_t{0xffffffffu - me} << 8) | static_cast<std::uint64_t>(f)};
  const std::size_t head = v.size();
  if (!mx_values && f == fault::none) {
    v.resize(head + nw, 0);
    const auto* vals0 = static_cast<const std::byte*>(values);
    for (std::size_t k = 0; k < index.size(); ++k) v[head + index[k] / W] += value_bits(vals0, vb, k) != 0 ? 1 : 0;
  }
  // The ranks agree on the number of counts first (the largest), then on the counts.
  std::array<std::uint64_t, 8> first{};
  for (std::size_t i = 0; i < head; ++i) first[i] = v[i];
  first[7] = v.size() - head;
  if (auto r = c.allreduce(first.data(), first.data(), first.size(), dtype::u64, op::max, algorithm::edge_ring); !r.ok())
    return fail(r.err().code, what + ": agreeing on the arguments: " + r.err().message);
  for (std::size_t i = 0; i < head; ++i) v[i] = first[i];
  if (v[6] != 0) {
    const auto rank = static_cast<std::uint32_t>(0xffffffffu - (v[6] >> 8));
    const auto code = static_cast<fault>(v[6] & 0xff);
    std::string m = what + ": rank " + std::to_string(rank) + "'s arguments are refused: " +
                    (code == fault::caller && rank == me ? detail.c_str() : why(code));
    if (rank == me && !detail.empty() && code != fault::caller) m += " (" + detail + ")";
    return fail(errc::invalid_argument, m);
  }
  if (v[0] != ~v[1]) return fail(errc::invalid_argument, what + ": the ranks give different lengths (" + std::to_string(~v[1]) +
                                                             " to " + std::to_string(v[0]) + ")");
  if (v[2] != ~v[3]) return fail(errc::invalid_argument, what + ": the ranks give different datatypes");
  if (v[4] != ~v[5]) return fail(errc::invalid_argument, what + ": the ranks give different algorithms");
  if (a == algorithm::host_ring)
    return fail(errc::not_supported, what + ": host_ring carries no sparse windows (edge_ring or switch add them in handlers)");
  const auto* vals = static_cast<const std::byte*>(values);
  if (!mx_values) {
    // 2. Every rank has the same length, datatype and algorithm now, and valid pairs: the
    //    largest count of each window over the ranks, then the elements, epoch by epoch.
    std::vector<std::uint64_t> largest(v.begin() + static_cast<std::ptrdiff_t>(head), v.end());
    largest.resize(first[7], 0);
    if (!largest.empty())
      if (auto r = c.allreduce(largest.data(), largest.data(), largest.size(), dtype::u64, op::max, a); !r.ok())
        return fail(r.err().code, what + ": agreeing on the spans: " + r.err().message);
    return sparse_epochs(c, index, vals, length, largest, wt, vb, eb, a, read);
  }
  // 2. MX values (float32 in the caller's buffers): a window per element. Each window's values
  //    are scattered into a float32 window and encoded by the reduction itself, each block's
  //    scale chosen from this rank's values.
  window_buffer buf(c, static_cast<std::size_t>(nw * eb));
  std::uint64_t k = 0;
  for (std::uint64_t w = 0; w < nw; ++w) {
    const std::uint64_t base = w * W, end = base + W;
    const std::uint64_t p0 = k;
    while (k < index.size() && index[k] < end) ++k;
    with_mx_windows(wt, [&]<class R>(typename R::acc& acc) {
      for (std::uint32_t i = 0; i < W; ++i) acc.bits[i] = 0;
      for (std::uint64_t j = p0; j < k; ++j) acc.bits[index[j] - base] = value_bits(vals, 4, j);
      R::narrow_into(*reinterpret_cast<typename R::elem*>(buf.data + w * eb), acc);
    });
  }
  // 3. The sum, in place.
  if (auto r = c.allreduce(buf.data, buf.data, nw, wt, op::sum, a); !r.ok()) return r;
  // 4. The result: decoded into float32 (exact), read as float32 windows.
  // Read in the dense form: packing each into its smaller form first cost more than the read
  // (profile of spin-bench sparse --dtype mxfp8_e4m3 at 10%: 10% of all cycles).
  std::vector<std::uint8_t> f32_window(sp::dense_bytes(4));
  sp::store16(f32_window.data(), static_cast<std::uint16_t>(W));
  sp::store16(f32_window.data() + 2, sp::form_dense);
  for (std::uint64_t w = 0; w < nw; ++w)
    with_mx_windows(wt, [&]<class R>(typename R::acc& acc) {
      R::widen_into(acc, *reinterpret_cast<const typename R::elem*>(buf.data + w * eb));
      std::memcpy(f32_window.data() + sp::head_bytes, acc.bits, sizeof acc.bits);
      read(w * W, std::min<std::uint64_t>(W, length - w * W), f32_window.data(), 4);
    });
  return {};
}

result<void> communicator::allreduce_sparse(std::span<const std::uint32_t> index, const void* values, std::uint64_t length,
                                            dtype t, void* dense_out, algorithm a) {
  auto* out = static_cast<std::byte*>(dense_out);
  return sparse_run(*this, index, values, length, t, dense_out == nullptr, a,
                    [&](std::uint64_t base, std::uint64_t m, const std::uint8_t* win, std::uint32_t vb) {
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
  auto r = sparse_run(*this, index, values, length, t, false, a,
                      [&](std::uint64_t base, std::uint64_t m, const std::uint8_t* win, std::uint32_t vb) {
    auto put = [&](std::uint32_t i, const std::uint8_t* v) {
      if (i >= m || value_bits(reinterpret_cast<const std::byte*>(v), vb, 0) == 0) return;
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

result<void> communicator::sparse_refused(const char* why, std::uint64_t length, dtype t, algorithm a) {
  return sparse_run(*this, {}, nullptr, length, t, false, a, [](std::uint64_t, std::uint64_t, const std::uint8_t*, std::uint32_t) {}, why);
}

} // namespace spin::coll
