// dp_training: data-parallel training on Fashion-MNIST with in-network allreduce.
//
// N emulated hosts (cluster mode: a star of N hosts around one switch) each hold a replica of
// the model and a shard of every minibatch. Each step, every host computes the gradient of its
// shard, the hosts allreduce the gradients through the emulated network with spin::coll, and
// every host applies the same update. By default the switch aggregates (Core-INC, SwitchML's
// scheme); --algorithm edge_ring makes the NICs reduce along a ring (Edge-INC) and host_ring is
// the no-INC baseline.
//
// Gradients travel as 32-bit fixed point by default, as SwitchML does (Sapio et al., NSDI
// 2021, section 4.3): integer sums do not depend on any order, so training is deterministic and
// the program checks that its parameters equal those of a single process that trains on the
// same data in the same order. --aggregation float sends float32 instead, --gradients bf16, f16
// or a block format (OCP MX or block floating point: about a quarter of float32's bytes), and
// --sparsify topk:P only the largest P% of each rank's gradient, with error feedback, through
// allreduce_sparse; the ranks still agree bit for bit, and with single-process training that
// sums in spin::coll's fixed combination order (in float32, rounded or encoded once).
//
//   dp_training [--ranks 4] [--epochs 3] [--model mlp|softmax] [--algorithm switch|edge_ring|host_ring]
//               [--aggregation fixed|float] [--gradients bf16|mxfp8|mxint8|bfp|...] [--sparsify topk:P]
//               [--data DIR] [--out DIR] ... (--help lists them)
//
// Output: progress, a line per epoch, the checks; DIR/dp_training.json (summary),
// DIR/dp_training.png (loss and accuracy curves; needs gnuplot) and DIR/dp_training.dat.
// Exit status: 0 when training ran and every check passed; 1 when a check failed (or
// --min-accuracy was not reached); 2 on bad arguments, missing data or a cluster that cannot start.
#include "fashion_mnist.hpp"
#include "model.hpp"

#include <spin/coll/coll.hpp>
#include <spin/emu/cluster.hpp>
#include <spin/emu/eal.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

struct config {
  std::uint32_t ranks = 4;
  std::uint32_t epochs = 5;
  std::uint32_t batch = 32;  // images per rank per step
  float lr = 0.1f;
  std::string model = "mlp";
  std::uint32_t hidden = 64;
  std::string algorithm = "switch";
  std::string aggregation = "fixed";
  std::uint32_t fixed_bits = 16;  // fixed point: gradient x 2^fixed_bits
  std::string gradients;          // the gradients' datatype ("" : --aggregation decides)
  std::string sparsify;           // "topk:P" ("": dense)
  double topk_percent = 0;        // P of --sparsify topk:P
  std::uint32_t train_limit = 0, test_limit = 0;
  std::string data = dp::default_data_dir;
  std::string out = "dp_training-out";
  std::uint64_t seed = 1;
  bool reference = true;
  double min_accuracy = 0;
  double loss_rate = 0;
  std::uint32_t repair_ms = 0;  // 0: 10 ms with --loss-rate, else 1000 ms
};

int cannot_run(const std::string& msg) {
  std::fprintf(stderr, "dp_training: %s\n", msg.c_str());
  return 2;
}

// The order of epoch e's images: a seeded Fisher-Yates shuffle (the same in every run).
std::vector<std::uint32_t> epoch_order(std::uint32_t n, std::uint64_t seed, std::uint32_t epoch) {
  std::vector<std::uint32_t> p(n);
  for (std::uint32_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(seed * 1000003u + epoch);
  for (std::uint32_t i = n; i > 1; --i) std::swap(p[i - 1], p[static_cast<std::uint32_t>(rng() % i)]);
  return p;
}

// ---- gradients on the wire ----
// One rank's message: its summed gradient, then its summed loss. Fixed point, float32, bf16 and
// f16: one more element; a block format (--gradients): the gradient in blocks (the last one
// padded with zeros), then a block of its own for the loss, whose size would otherwise set the
// scale of the gradients that share its block.
struct codec {
  enum class kind { fixed, float32, narrowed } k = kind::fixed;
  spin::coll::dtype t = spin::coll::dtype::i32;  // the wire's datatype
  std::size_t n = 0;                             // parameters
  std::uint32_t eb = 4, nv = 1;                  // element bytes, values per element
  spin::coll::kernels kern;                      // the datatype's reduction (sum)
  float scale = 65536.0f;       // fixed point: value x scale
  std::int64_t limit = 0;       // |q| <= limit, so that the sum of all ranks fits int32
  float decode_mul = 0;         // wire sum -> mean gradient

  codec(const config& c, std::size_t params) : n(params) {
    if (!c.gradients.empty() && gradient_type(c.gradients) != spin::coll::dtype::f32) {
      k = kind::narrowed;
      t = gradient_type(c.gradients);
    } else if (c.aggregation == "float" || !c.gradients.empty()) {
      k = kind::float32;
      t = spin::coll::dtype::f32;
    }
    spin::coll::with_standard(spin::coll::op::sum, t, [&]<class R>() { kern = spin::coll::kernels_of<R>(); });
    eb = kern.elem_bytes;
    nv = spin::coll::block_values(t);
    scale = std::ldexp(1.0f, static_cast<int>(c.fixed_bits));
    limit = static_cast<std::int64_t>(0x7fffffff) / c.ranks;
    const float per_batch = 1.0f / static_cast<float>(std::uint64_t{c.ranks} * c.batch);
    decode_mul = k == kind::fixed ? per_batch / scale : per_batch;
  }
  /// "mxfp8" (OCP MXFP8 E4M3), "bfp" (bfp8_16), or a datatype's own name (f32, bf16, f16,
  /// mxint8, mxfp4_e2m1, ...); custom when it names none that sums in float32 accumulators.
  static spin::coll::dtype gradient_type(const std::string& g) {
    using spin::coll::dtype;
    dtype t = dtype::custom;
    if (g == "mxfp8") t = dtype::mxfp8_e4m3;
    else if (g == "bfp") t = dtype::bfp8_16;
    else if (!spin::coll::dtype_named(g.c_str(), t)) return dtype::custom;
    const bool float_acc = t == dtype::f32 || t == dtype::bf16 || t == dtype::f16 ||
                           (spin::coll::block_values(t) > 1 && !spin::coll::compact_type(t));
    return float_acc ? t : dtype::custom;
  }
  bool fixed() const { return k == kind::fixed; }
  std::string describe() const {
    if (k == kind::fixed) return "int32 fixed-point (2^" + std::to_string(static_cast<int>(std::log2(scale))) + ")";
    if (k == kind::float32) return "float32";
    if (nv == 1) return spin::coll::name(t);
    return std::string(spin::coll::name(t)) + " blocks (" + std::to_string(nv) + " values in " + std::to_string(eb) + " bytes)";
  }
  /// Elements on the wire, and their bytes.
  std::size_t count() const { return (n + nv - 1) / nv + 1; }
  std::size_t bytes() const { return count() * eb; }

  // Fixed point: round to nearest, saturate (counted).
  std::int32_t quantize(float g, std::uint64_t& saturated) const {
    const double v = std::nearbyint(static_cast<double>(g) * scale);
    if (v > static_cast<double>(limit)) {
      ++saturated;
      return static_cast<std::int32_t>(limit);
    }
    if (v < -static_cast<double>(limit)) {
      ++saturated;
      return static_cast<std::int32_t>(-limit);
    }
    return static_cast<std::int32_t>(v);
  }
  void encode(std::span<const float> grad, double loss, std::span<std::byte> wire, std::uint64_t& saturated) const {
    if (k == kind::fixed) {
      for (std::size_t i = 0; i < n; ++i) put(wire, i, quantize(grad[i], saturated));
      std::uint64_t ignore = 0;
      put(wire, n, quantize(static_cast<float>(loss), ignore));
    } else if (k == kind::float32) {
      std::memcpy(wire.data(), grad.data(), n * sizeof(float));
      put(wire, n, static_cast<float>(loss));
    } else {  // float32 values in the accumulator layout (their bits), then the reduction's own narrow step
      std::vector<std::uint32_t> acc(count() * nv, 0u);
      for (std::size_t i = 0; i < n; ++i) acc[i] = std::bit_cast<std::uint32_t>(grad[i]);
      acc[(count() - 1) * nv] = std::bit_cast<std::uint32_t>(static_cast<float>(loss));
      kern.narrow(wire.data(), acc.data(), static_cast<std::uint32_t>(count()));
    }
  }
  // The summed wire message -> the mean gradient; returns the summed loss of all ranks.
  double decode(std::span<const std::byte> wire, std::span<float> grad) const {
    if (k == kind::fixed) {
      for (std::size_t i = 0; i < n; ++i) grad[i] = static_cast<float>(get<std::int32_t>(wire, i)) * decode_mul;
      return static_cast<double>(get<std::int32_t>(wire, n)) / scale;
    }
    if (k == kind::float32) {
      for (std::size_t i = 0; i < n; ++i) grad[i] = get<float>(wire, i) * decode_mul;
      return get<float>(wire, n);
    }
    std::vector<std::uint32_t> acc(count() * nv);
    kern.widen(acc.data(), wire.data(), static_cast<std::uint32_t>(count()));
    for (std::size_t i = 0; i < n; ++i) grad[i] = std::bit_cast<float>(acc[i]) * decode_mul;
    return std::bit_cast<float>(acc[(count() - 1) * nv]);
  }

private:
  template <class T> static void put(std::span<std::byte> w, std::size_t i, T v) { std::memcpy(w.data() + i * sizeof(T), &v, sizeof v); }
  template <class T> static T get(std::span<const std::byte> w, std::size_t i) {
    T v;
    std::memcpy(&v, w.data() + i * sizeof(T), sizeof v);
    return v;
  }
};

// ---- sparsified gradients (--sparsify topk:P) ----
// Each step a rank sends the k entries of largest magnitude (k = P% of the parameters, at least
// one; ties go to the lower index) of its gradient plus the error it held back in earlier steps,
// and keeps back what it did not send, rounding included (error feedback: Stich, Cordonnier and
// Jaggi, "Sparsified SGD with Memory", NeurIPS 2018, algorithm 1; Lin et al., "Deep Gradient
// Compression", ICLR 2018, section 3), then its loss. allreduce_sparse adds the ranks' pairs
// (their union holds up to N x k entries) and hands every rank the dense sum. Values travel as
// f32, bf16 or f16, or as MX codes (float32 values in and out; the loss then starts a window of
// its own, so that its size does not set the scale of gradient values in its block).
struct sparsifier {
  spin::coll::dtype t = spin::coll::dtype::f32;  // the values' datatype
  bool mx = false;                               // t is an MX type
  spin::coll::mx::element e{};                   // ... of this element type
  std::size_t n = 0, k = 0;                      // parameters, entries sent per step
  std::size_t loss_at = 0, length = 0;           // the loss's index, the vector's length
  std::uint32_t vb = 4;                          // bytes per value in the caller's buffers
  float decode_mul = 0;                          // summed gradient -> mean gradient
  std::vector<float> memory;                     // what earlier steps held back (n values)
  std::vector<std::uint32_t> index;              // this step's pairs: ascending indices ...
  std::vector<std::byte> values;                 // ... their values, of t (MX: float32) ...
  std::vector<float> sent;                       // ... and what each stands for on the wire
  std::vector<std::byte> dense;                  // the sum: length values
  std::uint64_t window_bytes = 0;                // bytes of this step's sparse windows

  static constexpr std::size_t W = spin::coll::sparse::window_values;

  sparsifier(const config& c, std::size_t params, spin::coll::dtype vt)
      : t(vt), n(params), memory(params, 0.0f), _order(params), _window(W) {
    mx = spin::coll::mx_element_of(t, e);
    k = std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(c.topk_percent / 100.0 * static_cast<double>(n))), 1, n);
    vb = t == spin::coll::dtype::f32 || mx ? 4 : 2;
    loss_at = mx ? (n + W - 1) / W * W : n;
    length = loss_at + 1;
    dense.resize(length * vb);
    decode_mul = 1.0f / static_cast<float>(std::uint64_t{c.ranks} * c.batch);
  }
  std::string describe() const {
    char b[160];
    std::snprintf(b, sizeof b, "top-%zu of %zu sparse %s (%g%%, error feedback)", k, n, spin::coll::name(t),
                  100.0 * static_cast<double>(k) / static_cast<double>(n));
    return b;
  }
  // Float32 -> t's bits (rounded once; MX: float32 bits, encoded in allreduce_sparse), and back.
  std::uint32_t narrow(float f) const {
    const auto b = std::bit_cast<std::uint32_t>(f);
    if (t == spin::coll::dtype::bf16) return spin::coll::sparse_value_bf16::narrow(b);
    if (t == spin::coll::dtype::f16) return spin::coll::sparse_value_f16::narrow(b);
    if (mx) return b;
    return spin::coll::sparse_value_f32::narrow(b);
  }
  float widen(std::uint32_t v) const {
    if (t == spin::coll::dtype::bf16) return std::bit_cast<float>(spin::coll::sparse_value_bf16::widen(v));
    if (t == spin::coll::dtype::f16) return std::bit_cast<float>(spin::coll::sparse_value_f16::widen(v));
    return std::bit_cast<float>(v);
  }
  std::uint32_t value(const std::vector<std::byte>& v, std::size_t i) const {
    std::uint32_t x = 0;
    std::memcpy(&x, v.data() + i * vb, vb);  // little-endian: the low bytes
    return x;
  }
  // What the float32 values at `v` (a whole window) stand for once encoded as MX codes.
  void mx_round_trip(float* v) {
    std::memcpy(_window.data(), v, W * 4);
    spin::coll::sparse::mx_round_trip(e, _window.data());
    std::memcpy(v, _window.data(), W * 4);
  }
  // This step's pairs from the rank's gradient and loss; updates the memory.
  void select(std::span<const float> grad, double loss) {
    for (std::size_t i = 0; i < n; ++i) memory[i] += grad[i];
    for (std::size_t i = 0; i < n; ++i) _order[i] = static_cast<std::uint32_t>(i);
    const auto mag = [this](std::uint32_t i) { return std::bit_cast<std::uint32_t>(memory[i]) & 0x7fffffffu; };
    std::nth_element(_order.begin(), _order.begin() + static_cast<std::ptrdiff_t>(k), _order.end(), [&](std::uint32_t a, std::uint32_t b) {
      const auto ma = mag(a), mb = mag(b);
      return ma != mb ? ma > mb : a < b;
    });
    std::sort(_order.begin(), _order.begin() + static_cast<std::ptrdiff_t>(k));
    index.assign(_order.begin(), _order.begin() + static_cast<std::ptrdiff_t>(k));
    index.push_back(static_cast<std::uint32_t>(loss_at));
    values.resize(index.size() * vb);
    sent.resize(index.size());
    for (std::size_t j = 0; j < index.size(); ++j) {
      const std::uint32_t v = narrow(j < k ? memory[index[j]] : static_cast<float>(loss));
      std::memcpy(values.data() + j * vb, &v, vb);
      sent[j] = widen(v);
    }
    // Window by window: MX values become what their blocks' codes stand for; the windows'
    // bytes as they travel (a value whose bits are +0 is not listed).
    namespace sp = spin::coll::sparse;
    window_bytes = 0;
    std::vector<float> win(W);
    for (std::size_t j = 0, w = 0; w * W < length; ++w) {
      const std::size_t j0 = j;
      while (j < index.size() && index[j] < (w + 1) * W) ++j;
      std::uint32_t listed = 0;
      if (!mx) {
        for (std::size_t q = j0; q < j; ++q) listed += value(values, q) != 0 ? 1 : 0;
        window_bytes += sp::window_bytes(listed, vb);
        continue;
      }
      std::fill(win.begin(), win.end(), 0.0f);
      for (std::size_t q = j0; q < j; ++q) win[index[q] - w * W] = sent[q];
      mx_round_trip(win.data());
      std::uint32_t blocks = 0;
      for (std::uint32_t b = 0; b < sp::mx_blocks; ++b) {
        std::uint32_t in_block = 0;
        bool nan = false;
        for (std::size_t i = b * 32; i < std::min<std::size_t>(W, b * 32 + 32); ++i) {
          in_block += std::bit_cast<std::uint32_t>(win[i]) != 0 ? 1 : 0;
          nan = nan || std::isnan(win[i]);
        }
        if (nan) in_block = 0;  // a NaN scale: the block is listed, its codes are 0
        listed += in_block;
        blocks += in_block > 0 || nan ? 1 : 0;
      }
      const std::uint32_t bits = spin::coll::mx::spec_of(e).bits;
      window_bytes += sp::mx_pairs_smaller(listed, blocks, bits) ? sp::mx_pairs_bytes(listed, blocks) : sp::mx_dense_bytes(bits);
      for (std::size_t q = j0; q < j; ++q) sent[q] = win[index[q] - w * W];
    }
    for (std::size_t j = 0; j < k; ++j) memory[index[j]] -= sent[j];
  }
  // The dense sum -> the mean gradient; returns the summed loss of all ranks.
  double decode(std::span<float> grad) const {
    for (std::size_t i = 0; i < n; ++i) grad[i] = widen(value(dense, i)) * decode_mul;
    return widen(value(dense, loss_at));
  }

private:
  std::vector<std::uint32_t> _order;
  std::vector<std::uint32_t> _window;
};

// The sum of the ranks' pairs as allreduce_sparse adds them (docs/collectives.md, "Sparse
// allreduce"): what each rank's values stand for on the wire scattered into a float32 vector
// (+0 elsewhere), window w of chunk c added from rank c+1 around to rank c, rounded to t once
// (MX: encoded once, handed back decoded); written to s[0].dense.
void sparse_sum_in_order(std::vector<sparsifier>& s) {
  const auto ranks = static_cast<std::uint32_t>(s.size());
  const std::size_t len = s[0].length, W = sparsifier::W, nw = (len + W - 1) / W;
  std::vector<std::vector<float>> v(ranks, std::vector<float>(nw * W, 0.0f));
  for (std::uint32_t r = 0; r < ranks; ++r)
    for (std::size_t j = 0; j < s[r].index.size(); ++j) v[r][s[r].index[j]] = s[r].sent[j];
  std::vector<float> sum(nw * W, 0.0f);
  const std::size_t base = nw / ranks, extra = nw % ranks;
  for (std::size_t c = 0, lo = 0; c < ranks; ++c) {
    const std::size_t windows = base + (c < extra ? 1 : 0);
    for (std::size_t i = lo * W; i < (lo + windows) * W; ++i) {
      float acc = v[(c + 1) % ranks][i];
      for (std::uint32_t r = 2; r <= ranks; ++r) acc = acc + v[(c + r) % ranks][i];
      sum[i] = acc;
    }
    lo += windows;
  }
  if (s[0].mx)
    for (std::size_t w = 0; w < nw; ++w) s[0].mx_round_trip(sum.data() + w * W);
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t bits = s[0].narrow(sum[i]);
    std::memcpy(s[0].dense.data() + i * s[0].vb, &bits, s[0].vb);
  }
}

// ---- what the run records ----
struct epoch_record {
  std::uint32_t epoch = 0;
  double train_loss = 0, test_loss = 0, test_accuracy = 0, seconds = 0;
  std::uint64_t bytes_sent_per_host = 0;  // frames the host NIC sent (mean over hosts)
  std::uint64_t payload_per_host = 0;     // gradient bytes each host contributed (S per step)
  std::uint64_t ring_payload_per_host = 0;  // 2(N-1)/N x S per step (dense gradients)
  std::uint64_t float32_payload_per_host = 0;  // what float32 gradients would have been
};
struct curve_point {
  double epoch = 0;  // fractional
  double train_loss = 0;
};

spin::coll::algorithm parse_algorithm(const std::string& s) {
  if (s == "edge_ring") return spin::coll::algorithm::edge_ring;
  if (s == "host_ring") return spin::coll::algorithm::host_ring;
  return spin::coll::algorithm::switch_agg;
}

std::string mb(std::uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return b;
}

// ---- single-process training: the same images, order, rounding and sums on one thread ----
std::vector<float> train_reference(const config& c, const dp::dataset& d, const codec& cd, std::uint32_t steps) {
  dp::model m(d.train.pixels_per_image(), c.model == "mlp" ? c.hidden : 0, 10, c.seed);
  const std::size_t n = m.size();
  std::vector<float> grad(n), mean(n);
  std::vector<sparsifier> sparse;  // --sparsify: each rank's error feedback
  if (!c.sparsify.empty())
    for (std::uint32_t r = 0; r < c.ranks; ++r) sparse.emplace_back(c, n, cd.t);
  std::vector<std::vector<std::byte>> wire(c.ranks, std::vector<std::byte>(cd.bytes()));
  std::vector<std::byte> sum(cd.bytes());
  std::vector<std::byte> acc(cd.count() * cd.kern.acc_bytes);
  std::uint64_t saturated = 0;
  for (std::uint32_t e = 0; e < c.epochs; ++e) {
    const auto order = epoch_order(d.train.count, c.seed, e);
    for (std::uint32_t s = 0; s < steps; ++s) {
      for (std::uint32_t r = 0; r < c.ranks; ++r) {
        std::fill(grad.begin(), grad.end(), 0.0f);
        const std::span<const std::uint32_t> idx(order.data() + (std::size_t{s} * c.ranks + r) * c.batch, c.batch);
        const double loss = m.accumulate(d.train, idx, grad);
        if (!sparse.empty()) sparse[r].select(grad, loss);
        else cd.encode(grad, loss, wire[r], saturated);
      }
      if (!sparse.empty()) {
        sparse_sum_in_order(sparse);
        sparse[0].decode(mean);
        m.step(mean, c.lr);
        continue;
      }
      // The sum in spin::coll's combination order (docs/collectives.md): the count is cut into
      // one chunk per rank, and an element of chunk k is folded from rank k+1 around to rank k
      // (one epoch: the message is far below an epoch's size). Integer sums wrap, as
      // spin::coll's do; block formats add in float32 and encode once.
      const std::size_t count = cd.count(), base = count / c.ranks, extra = count % c.ranks;
      for (std::size_t k = 0, lo = 0; k < c.ranks; ++k) {
        const std::size_t len = base + (k < extra ? 1 : 0);
        std::byte* a = acc.data() + lo * cd.kern.acc_bytes;
        const auto at = [&](std::uint32_t r) { return wire[(k + r) % c.ranks].data() + lo * cd.eb; };
        cd.kern.widen(a, at(1), static_cast<std::uint32_t>(len));
        for (std::uint32_t r = 2; r <= c.ranks; ++r) cd.kern.fold(a, at(r), static_cast<std::uint32_t>(len));
        cd.kern.narrow(sum.data() + lo * cd.eb, a, static_cast<std::uint32_t>(len));
        lo += len;
      }
      cd.decode(sum, mean);
      m.step(mean, c.lr);
    }
  }
  return {m.params().begin(), m.params().end()};
}

} // namespace

int main(int argc, char** argv) {
  // ---- arguments ----
  config c;
  CLI::App app{"Data-parallel training on Fashion-MNIST with in-network allreduce (spin::coll on an emulated cluster)"};
  app.add_option("--ranks", c.ranks, "emulated hosts, one model replica each")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--epochs", c.epochs, "passes over the training set")->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--batch", c.batch, "images per rank per step")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate (SGD)")->check(CLI::Range(1e-6, 10.0))->capture_default_str();
  app.add_option("--model", c.model, "mlp (one hidden layer of ReLU units) or softmax (regression)")
      ->check(CLI::IsMember({"mlp", "softmax"}))
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "hidden units of the mlp")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--algorithm", c.algorithm, "switch (Core-INC), edge_ring (Edge-INC) or host_ring (no INC)")
      ->check(CLI::IsMember({"switch", "edge_ring", "host_ring"}))
      ->capture_default_str();
  app.add_option("--aggregation", c.aggregation, "fixed (int32 fixed point: deterministic) or float (float32)")
      ->check(CLI::IsMember({"fixed", "float"}))
      ->capture_default_str();
  app.add_option("--gradients", c.gradients,
                     "the gradients' datatype: f32, bf16, f16, or a block format: mxfp8 (OCP MXFP8 E4M3), mxint8, bfp "
                     "(8-bit mantissas, blocks of 16) or any block datatype's name (mxfp4_e2m1, bfp16_32, ...); sums are "
                     "float32, rounded or encoded once (overrides --aggregation)")
          ->check([](const std::string& g) {
            return codec::gradient_type(g) != spin::coll::dtype::custom
                       ? std::string()
                       : "not a gradient datatype (f32, bf16, f16 or a block format): " + g;
          });
  app.add_option("--sparsify", c.sparsify,
                 "topk:P: each rank sends only the P% of its gradient entries of largest magnitude (0 < P <= 100), "
                 "keeps the rest for later steps (error feedback), and the ranks add them with allreduce_sparse; the "
                 "values travel as --gradients (f32, bf16, f16 or an MX type such as mxfp8; default f32)")
      ->check([&c](const std::string& v) {
        char* end = nullptr;
        const double p = v.rfind("topk:", 0) == 0 ? std::strtod(v.c_str() + 5, &end) : 0;
        if (end == nullptr || end == v.c_str() + 5 || *end != 0 || !(p > 0 && p <= 100))
          return std::string("want topk:P with 0 < P <= 100 (a percent of the parameters), not ") + v;
        c.topk_percent = p;
        return std::string();
      });
  app.add_option("--fixed-bits", c.fixed_bits, "fractional bits of the fixed-point gradients")->check(CLI::Range(4, 24))->capture_default_str();
  app.add_option("--train-limit", c.train_limit, "use the first N training images (0: all 60000)")->capture_default_str();
  app.add_option("--test-limit", c.test_limit, "use the first N test images (0: all 10000)")->capture_default_str();
  app.add_option("--data", c.data, "directory of the gzip-compressed IDX files")->capture_default_str();
  app.add_option("--out", c.out, "directory for dp_training.json, .png and .dat")->capture_default_str();
  app.add_option("--seed", c.seed, "initialisation and data order")->capture_default_str();
  app.add_option("--loss-rate", c.loss_rate, "packet loss of every link (0..0.1): spin::coll repairs it")
      ->check(CLI::Range(0.0, 0.1))
      ->capture_default_str();
  app.add_option("--repair-ms", c.repair_ms,
                 "spin::coll's longest and first repair interval; the interval then follows measured round trips, "
                 "from 1 ms up (0: 10 ms on lossy links; 1000 ms without loss)")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  app.add_flag("!--no-reference", c.reference,
               "skip the single-process comparison (which sums in spin::coll's combination order, so float32 and block "
               "formats compare bit for bit too)");
  app.add_option("--min-accuracy", c.min_accuracy, "exit status 1 when the final test accuracy is lower")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError with exit code 0; bad arguments: 2
  }
  if (!c.sparsify.empty()) {
    if (app.count("--aggregation") > 0 && c.aggregation == "fixed")
      return cannot_run("--sparsify sends float values (f32, bf16, f16 or MX by --gradients), not --aggregation fixed");
    if (c.algorithm == "host_ring")
      return cannot_run("--sparsify needs NIC or switch handlers to add the sparse windows: --algorithm switch or edge_ring");
    const auto t = c.gradients.empty() ? spin::coll::dtype::f32 : codec::gradient_type(c.gradients);
    if (spin::coll::window_type_of(t) == spin::coll::dtype::custom)
      return cannot_run("--sparsify: sparse windows carry f32, bf16, f16 or MX values, not --gradients " + c.gradients);
    c.aggregation = "float";
  }
  const bool tty = ::isatty(1) != 0;

  // ---- data ----
  auto data = dp::load(c.data, c.train_limit, c.test_limit);
  if (!data) return cannot_run(data.err().message);
  const dp::dataset& d = data.value();
  const std::uint32_t global_batch = c.ranks * c.batch;
  const std::uint32_t steps = d.train.count / global_batch;
  if (steps == 0)
    return cannot_run(std::to_string(d.train.count) + " training images do not fill one step of " + std::to_string(c.ranks) +
                      " ranks x " + std::to_string(c.batch) + " images");
  const spin::coll::algorithm algo = parse_algorithm(c.algorithm);

  // ---- the emulated cluster: N hosts around one switch ----
  if (auto r = spin::emu::eal_init(spin::emu::default_eal_args("dp-training-" + std::to_string(getpid()))); !r)
    return cannot_run(r.err().message);
  spin::emu::link_model lm;
  lm.loss = c.loss_rate;
  auto cluster = spin::emu::cluster::create(spin::emu::star(c.ranks, lm), {});
  if (!cluster) return cannot_run(cluster.err().message);
  std::atomic<bool> stop{false};
  std::thread driver([&] { cluster.value()->run(stop); });
  auto stop_driver = [&] {
    stop = true;
    driver.join();
  };
  auto fab = spin::coll::fabric::create(*cluster.value());
  if (!fab) {
    stop_driver();
    return cannot_run(fab.err().message);
  }
  spin::coll::options co;
  co.timeout = std::chrono::seconds(60);  // rank 0 evaluates the model while the others wait
  if (c.repair_ms == 0) c.repair_ms = c.loss_rate > 0 ? 10 : 1000;
  co.repair_interval = co.repair_max_interval = std::chrono::milliseconds(c.repair_ms);
  co.switches = fab.value().get();
  co.log = [](const std::string& line) { std::fprintf(stderr, "dp_training: %s\n", line.c_str()); };
  spin::coll::group g;
  g.id = 1;
  for (std::uint32_t r = 0; r < c.ranks; ++r) g.members.push_back(r);
  std::vector<std::unique_ptr<spin::coll::communicator>> comms;
  for (std::uint32_t r = 0; r < c.ranks; ++r) {
    g.me = r;
    auto comm = spin::coll::communicator::create(*cluster.value()->host(r), g, co);
    if (!comm) {
      comms.clear();
      stop_driver();
      return cannot_run(comm.err().message);
    }
    comms.push_back(std::move(comm.value()));
  }

  // ---- training: one thread per rank ----
  const std::uint32_t hidden = c.model == "mlp" ? c.hidden : 0;
  std::vector<dp::model> replicas;
  for (std::uint32_t r = 0; r < c.ranks; ++r) replicas.emplace_back(d.train.pixels_per_image(), hidden, 10, c.seed);
  const std::size_t n_params = replicas[0].size();
  const codec cd(c, n_params);
  const bool sparse = !c.sparsify.empty();
  std::vector<sparsifier> sparsifiers;
  if (sparse)
    for (std::uint32_t r = 0; r < c.ranks; ++r) sparsifiers.emplace_back(c, n_params, cd.t);
  std::vector<std::atomic<std::uint64_t>> window_bytes(c.ranks);  // --sparsify: bytes of each rank's windows
  const std::uint64_t f32_bytes = (n_params + 1) * 4;
  const std::uint64_t wire_bytes = sparse ? 0 : cd.bytes();  // sparse: it varies (the epoch lines give it)
  std::printf("dp_training: %u hosts + 1 switch (emulated), %s (%zu parameters), %u epochs of %u steps x %u images, "
              "allreduce by %s, %s gradients (%s per step)\n",
              c.ranks, c.model == "mlp" ? ("mlp " + std::to_string(c.hidden) + " hidden").c_str() : "softmax regression",
              n_params, c.epochs, steps, global_batch, c.algorithm.c_str(),
              sparse ? sparsifiers[0].describe().c_str() : cd.describe().c_str(),
              sparse ? ("float32 would be " + mb(f32_bytes)).c_str() : mb(wire_bytes).c_str());
  if (!sparse && wire_bytes != f32_bytes)
    std::printf("dp_training: %s of gradients per step against %s in float32 (%.3f x)\n", mb(wire_bytes).c_str(),
                mb(f32_bytes).c_str(), static_cast<double>(wire_bytes) / static_cast<double>(f32_bytes));
  std::fflush(stdout);

  std::vector<epoch_record> records;
  std::vector<curve_point> curve;
  const auto initial = replicas[0].evaluate(d.test);  // epoch 0: before the first step
  std::vector<std::uint64_t> tx_before(c.ranks, 0);
  auto host_tx = [&](std::uint32_t r) { return cluster.value()->node(r).stats().ports[0].tx_bytes; };
  for (std::uint32_t r = 0; r < c.ranks; ++r) tx_before[r] = host_tx(r);
  std::atomic<std::uint64_t> saturated{0};
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_m;
  auto epoch_start = steady::now();
  double window_loss = 0;
  std::uint32_t window_steps = 0, epoch_now = 0;
  double epoch_loss = 0;
  const std::uint32_t window = std::max<std::uint32_t>(1, steps / 10);

  // At the end of each epoch, once every rank has applied its last update: evaluate, count
  // the traffic, report.
  auto end_of_epoch = [&]() noexcept {
    if (failed) return;
    epoch_record er;
    er.epoch = epoch_now + 1;
    er.train_loss = epoch_loss / (static_cast<double>(steps) * global_batch);
    const auto sc = replicas[0].evaluate(d.test);
    er.test_loss = sc.loss;
    er.test_accuracy = sc.accuracy;
    er.seconds = std::chrono::duration<double>(steady::now() - epoch_start).count();
    std::uint64_t sent = 0;
    for (std::uint32_t r = 0; r < c.ranks; ++r) {
      const std::uint64_t now = host_tx(r);
      sent += now - tx_before[r];
      tx_before[r] = now;
    }
    er.bytes_sent_per_host = sent / c.ranks;
    er.float32_payload_per_host = f32_bytes * steps;
    if (sparse) {
      std::uint64_t windows = 0;
      for (auto& w : window_bytes) windows += w.exchange(0);
      er.payload_per_host = windows / c.ranks;
    } else {
      er.payload_per_host = wire_bytes * steps;
      er.ring_payload_per_host = c.ranks > 1 ? 2 * (c.ranks - 1) * wire_bytes * steps / c.ranks : 0;
    }
    records.push_back(er);
    char payload[160];
    if (sparse)
      std::snprintf(payload, sizeof payload, "its sparse windows %s, %.3f x float32's %s", mb(er.payload_per_host).c_str(),
                    static_cast<double>(er.payload_per_host) / static_cast<double>(er.float32_payload_per_host),
                    mb(er.float32_payload_per_host).c_str());
    else
      std::snprintf(payload, sizeof payload, "payload %s; a ring would send %s", mb(er.payload_per_host).c_str(),
                    mb(er.ring_payload_per_host).c_str());
    std::printf("%sepoch %u/%u  loss %.4f  test loss %.4f  test accuracy %.4f  %.1f s  sent per host %s (%s)\n",
                tty ? "\r\033[K" : "", er.epoch, c.epochs, er.train_loss, er.test_loss, er.test_accuracy, er.seconds,
                mb(er.bytes_sent_per_host).c_str(), payload);
    std::fflush(stdout);
    epoch_loss = 0;
    ++epoch_now;
    epoch_start = steady::now();
  };
  std::barrier sync(static_cast<std::ptrdiff_t>(c.ranks), end_of_epoch);

  auto rank_main = [&](std::uint32_t r) {
    dp::model& m = replicas[r];
    std::vector<float> grad(n_params), mean(n_params);
    std::vector<std::byte> wire(cd.bytes());
    std::uint64_t sat = 0;
    for (std::uint32_t e = 0; e < c.epochs; ++e) {
      const auto order = epoch_order(d.train.count, c.seed, e);
      for (std::uint32_t s = 0; s < steps && !failed; ++s) {
        std::fill(grad.begin(), grad.end(), 0.0f);
        const std::span<const std::uint32_t> idx(order.data() + (std::size_t{s} * c.ranks + r) * c.batch, c.batch);
        const double loss = m.accumulate(d.train, idx, grad);
        spin::result<void> res;
        if (sparse) {
          auto& sp = sparsifiers[r];
          sp.select(grad, loss);
          window_bytes[r] += sp.window_bytes;
          res = comms[r]->allreduce_sparse(sp.index, sp.values.data(), sp.length, sp.t, sp.dense.data(), algo);
        } else {
          cd.encode(grad, loss, wire, sat);
          res = comms[r]->allreduce(wire.data(), wire.data(), cd.count(), cd.t, spin::coll::op::sum, algo);
        }
        if (!res) {
          std::lock_guard<std::mutex> l(failure_m);
          if (!failed) failure = "rank " + std::to_string(r) + (sparse ? ": allreduce_sparse: " : ": allreduce: ") + res.err().message;
          failed = true;
          break;
        }
        const double total_loss = sparse ? sparsifiers[r].decode(mean) : cd.decode(wire, mean);
        m.step(mean, c.lr);
        if (r == 0) {
          epoch_loss += total_loss;
          window_loss += total_loss;
          if (++window_steps == window || s + 1 == steps) {
            curve.push_back({e + static_cast<double>(s + 1) / steps, window_loss / (static_cast<double>(window_steps) * global_batch)});
            if (tty) {
              std::printf("\r\033[Kepoch %u/%u  step %u/%u  loss %.4f", e + 1, c.epochs, s + 1, steps, curve.back().train_loss);
              std::fflush(stdout);
            }
            window_loss = 0;
            window_steps = 0;
          }
        }
      }
      saturated += sat;
      sat = 0;
      if (failed) {
        sync.arrive_and_drop();
        return;
      }
      sync.arrive_and_wait();
    }
  };
  const auto t0 = steady::now();
  {
    std::vector<std::thread> threads;
    for (std::uint32_t r = 0; r < c.ranks; ++r) threads.emplace_back(rank_main, r);
    for (auto& t : threads) t.join();
  }
  const double train_seconds = std::chrono::duration<double>(steady::now() - t0).count();
  comms.clear();
  fab.value().reset();
  stop_driver();
  if (failed) {
    std::fprintf(stderr, "dp_training: training failed: %s\n", failure.c_str());
    return 1;
  }

  // ---- checks ----
  int status = 0;
  bool identical = true;
  for (std::uint32_t r = 1; r < c.ranks; ++r)
    identical = identical && std::memcmp(replicas[r].params().data(), replicas[0].params().data(), n_params * sizeof(float)) == 0;
  std::printf("check: all %u ranks hold bitwise-identical parameters: %s\n", c.ranks, identical ? "yes" : "NO");
  if (!identical) status = 1;
  std::string reference = "not run";
  if (c.reference) {
    if (tty) {
      std::printf("check: training the same model on one process (same data order, same rounding) ...");
      std::fflush(stdout);
    }
    const auto ref = train_reference(c, d, cd, steps);
    const bool same = std::memcmp(ref.data(), replicas[0].params().data(), n_params * sizeof(float)) == 0;
    reference = same ? "equal" : "different";
    std::printf("%scheck: the parameters equal those of single-process training on the same data order: %s\n", tty ? "\r\033[K" : "",
                same ? "yes" : "NO");
    if (!same) status = 1;
  }
  if (saturated > 0 && cd.fixed())
    std::printf("note: %llu gradient values saturated the fixed-point range (raise --fixed-bits' headroom: lower it)\n",
                static_cast<unsigned long long>(saturated.load()));
  const double final_acc = records.empty() ? 0 : records.back().test_accuracy;
  std::printf("dp_training: final test accuracy %.4f after %u epochs, %.1f s\n", final_acc, c.epochs, train_seconds);
  {
    // Where the emulated cluster's lcores spent the run (spin::emu::cluster_lcore_stats).
    std::uint64_t busy_ns = 0, sleeps = 0, unrung = 0;
    const auto lcs = cluster.value()->lcore_stats();
    for (const auto& l : lcs) {
      busy_ns += l.busy_ns;
      sleeps += l.sleeps;
      unrung += l.unrung_wakeups;
    }
    std::printf("cluster: %zu lcores, busy %.2f s, %llu sleeps, %llu woke by timeout to work that did not ring them\n", lcs.size(),
                static_cast<double>(busy_ns) / 1e9, static_cast<unsigned long long>(sleeps), static_cast<unsigned long long>(unrung));
  }
  if (final_acc < c.min_accuracy) {
    std::printf("dp_training: accuracy below --min-accuracy %.4f\n", c.min_accuracy);
    status = 1;
  }

  // ---- JSON summary, curves, plot ----
  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  if (ec) return cannot_run("cannot create " + c.out + ": " + ec.message());
  nlohmann::json j;
  j["config"] = {{"ranks", c.ranks}, {"epochs", c.epochs}, {"batch_per_rank", c.batch}, {"lr", c.lr}, {"model", c.model},
                 {"hidden", hidden}, {"parameters", n_params}, {"algorithm", c.algorithm}, {"aggregation", c.aggregation},
                 {"gradients", cd.fixed() ? "int32" : spin::coll::name(cd.t)},
                 {"sparsify", c.sparsify}, {"topk_per_rank", sparse ? sparsifiers[0].k : 0},
                 {"wire_bytes_per_step", wire_bytes}, {"float32_bytes_per_step", f32_bytes},
                 {"fixed_bits", c.fixed_bits}, {"train_images", d.train.count}, {"test_images", d.test.count},
                 {"steps_per_epoch", steps}, {"seed", c.seed}, {"loss_rate", c.loss_rate},
                 {"repair_interval_ms", c.repair_ms}};
  for (const auto& er : records)
    j["epochs"].push_back({{"epoch", er.epoch}, {"train_loss", er.train_loss}, {"test_loss", er.test_loss},
                           {"test_accuracy", er.test_accuracy}, {"seconds", er.seconds},
                           {"bytes_sent_per_host", er.bytes_sent_per_host}, {"payload_bytes_per_host", er.payload_per_host},
                           {"ring_payload_bytes_per_host", er.ring_payload_per_host},
                           {"float32_payload_bytes_per_host", er.float32_payload_per_host}});
  j["initial_test_accuracy"] = initial.accuracy;
  j["final_test_accuracy"] = final_acc;
  j["train_seconds"] = train_seconds;
  j["identical_across_ranks"] = identical;
  j["single_process_reference"] = reference;
  j["saturated_values"] = saturated.load();
  const std::string base = c.out + "/dp_training";
  {
    std::ofstream f(base + ".json");
    f << j.dump(2) << "\n";
    if (!f) return cannot_run("cannot write " + base + ".json");
  }
  {
    std::ofstream f(base + ".dat");
    f << "# epoch train_loss (curve)\n";
    for (const auto& p : curve) f << p.epoch << " " << p.train_loss << "\n";
    f << "\n\n# epoch test_loss test_accuracy\n0 " << initial.loss << " " << initial.accuracy << "\n";
    for (const auto& er : records) f << er.epoch << " " << er.test_loss << " " << er.test_accuracy << "\n";
    if (!f) return cannot_run("cannot write " + base + ".dat");
  }
  const std::string script =
      "set terminal pngcairo size 900,540 noenhanced\nset output '" + base + ".png'\n" +
      "set title 'dp_training: " + std::to_string(c.ranks) + " hosts, " + c.model + ", allreduce by " + c.algorithm + "'\n" +
      "set xlabel 'epoch'\nset ylabel 'loss'\nset y2label 'test accuracy'\nset y2range [0:1]\nset ytics nomirror\nset y2tics\n"
      "set key center right\nset grid\n"
      "plot '" + base + ".dat' index 0 using 1:2 with lines lw 2 title 'training loss', " +
      "'' index 1 using 1:2 with linespoints lw 2 title 'test loss', " +
      "'' index 1 using 1:3 axes x1y2 with linespoints lw 2 title 'test accuracy'\n";
  FILE* gp = ::popen("gnuplot 2>&1", "w");
  bool plotted = false;
  if (gp != nullptr) {
    std::fputs(script.c_str(), gp);
    plotted = ::pclose(gp) == 0 && std::filesystem::exists(base + ".png");
  }
  std::printf("wrote %s.json, %s.dat%s\n", base.c_str(), base.c_str(),
              plotted ? (" and " + base + ".png").c_str() : " (no plot: gnuplot is missing; apt-get install gnuplot-nox)");
  return status;
}
