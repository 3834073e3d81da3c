#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace dp {
namespace {
constexpr float pixel_scale = 1.0f / 255.0f;

// Dot product of n floats in a fixed order: eight lanes, then the lanes left to right. The
// lanes let the compiler use vector registers without reassociating anything.
float dot(const float* a, const float* b, std::uint32_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += a[i + k] * b[i + k];
  float s = 0;
  for (int k = 0; k < 8; ++k) s += lane[k];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
} // namespace

model::model(std::uint32_t inputs, std::uint32_t hidden, std::uint32_t classes, std::uint64_t seed)
    : _in(inputs), _hid(hidden), _out(classes) {
  const std::size_t n = hidden > 0 ? std::size_t{hidden} * inputs + hidden + std::size_t{classes} * hidden + classes
                                   : std::size_t{classes} * inputs + classes;
  _w.assign(n, 0.0f);
  std::mt19937_64 rng(seed);
  auto uniform = [&](float limit) {  // in [-limit, limit), from 24 random bits
    const float u = static_cast<float>(rng() >> 40) * (1.0f / 16777216.0f);
    return (2.0f * u - 1.0f) * limit;
  };
  if (hidden > 0) {
    const float l1 = std::sqrt(6.0f / static_cast<float>(inputs)), l2 = std::sqrt(6.0f / static_cast<float>(hidden));
    for (std::size_t i = 0; i < std::size_t{hidden} * inputs; ++i) _w[i] = uniform(l1);
    const std::size_t w2 = std::size_t{hidden} * inputs + hidden;
    for (std::size_t i = 0; i < std::size_t{classes} * hidden; ++i) _w[w2 + i] = uniform(l2);
  }
  // Softmax regression starts at zero: the loss is convex, and zero is the usual start.
}

void model::forward(const std::uint8_t* px, float* h, float* z) const {
  float x[1024];
  for (std::uint32_t i = 0; i < _in; ++i) x[i] = static_cast<float>(px[i]) * pixel_scale;
  if (_hid > 0) {
    const float* w1 = _w.data();
    const float* b1 = w1 + std::size_t{_hid} * _in;
    const float* w2 = b1 + _hid;
    const float* b2 = w2 + std::size_t{_out} * _hid;
    for (std::uint32_t j = 0; j < _hid; ++j) h[j] = std::max(0.0f, b1[j] + dot(w1 + std::size_t{j} * _in, x, _in));
    for (std::uint32_t k = 0; k < _out; ++k) z[k] = b2[k] + dot(w2 + std::size_t{k} * _hid, h, _hid);
  } else {
    const float* w = _w.data();
    const float* b = w + std::size_t{_out} * _in;
    for (std::uint32_t k = 0; k < _out; ++k) z[k] = b[k] + dot(w + std::size_t{k} * _in, x, _in);
  }
}

namespace {
// Softmax of z in place; returns the cross-entropy of class y.
double softmax(float* z, std::uint32_t n, std::uint32_t y) {
  float mx = z[0];
  for (std::uint32_t k = 1; k < n; ++k) mx = std::max(mx, z[k]);
  float sum = 0;
  for (std::uint32_t k = 0; k < n; ++k) sum += std::exp(z[k] - mx);
  const float log_sum = std::log(sum);
  const double loss = static_cast<double>(log_sum) - static_cast<double>(z[y] - mx);
  for (std::uint32_t k = 0; k < n; ++k) z[k] = std::exp(z[k] - mx - log_sum);
  return loss;
}
} // namespace

double model::accumulate(const split& s, std::span<const std::uint32_t> idx, std::span<float> grad) const {
  std::vector<float> h(std::max<std::uint32_t>(_hid, 1)), dh(std::max<std::uint32_t>(_hid, 1)), z(_out);
  float x[1024];
  double loss = 0;
  const std::uint32_t ppi = s.pixels_per_image();
  for (std::uint32_t n : idx) {
    const std::uint8_t* px = s.pixels.data() + std::size_t{n} * ppi;
    forward(px, h.data(), z.data());
    const std::uint32_t y = s.labels[n];
    loss += softmax(z.data(), _out, y);
    z[y] -= 1.0f;  // dL/dz = p - onehot(y)
    for (std::uint32_t i = 0; i < _in; ++i) x[i] = static_cast<float>(px[i]) * pixel_scale;
    if (_hid > 0) {
      float* gw1 = grad.data();
      float* gb1 = gw1 + std::size_t{_hid} * _in;
      float* gw2 = gb1 + _hid;
      float* gb2 = gw2 + std::size_t{_out} * _hid;
      const float* w2 = _w.data() + std::size_t{_hid} * _in + _hid;
      for (std::uint32_t k = 0; k < _out; ++k) {
        gb2[k] += z[k];
        for (std::uint32_t j = 0; j < _hid; ++j) gw2[std::size_t{k} * _hid + j] += z[k] * h[j];
      }
      for (std::uint32_t j = 0; j < _hid; ++j) {
        float d = 0;
        if (h[j] > 0)
          for (std::uint32_t k = 0; k < _out; ++k) d += w2[std::size_t{k} * _hid + j] * z[k];
        dh[j] = d;
      }
      for (std::uint32_t j = 0; j < _hid; ++j) {
        if (dh[j] == 0) continue;
        gb1[j] += dh[j];
        float* row = gw1 + std::size_t{j} * _in;
        for (std::uint32_t i = 0; i < _in; ++i) row[i] += dh[j] * x[i];
      }
    } else {
      float* gw = grad.data();
      float* gb = gw + std::size_t{_out} * _in;
      for (std::uint32_t k = 0; k < _out; ++k) {
        gb[k] += z[k];
        float* row = gw + std::size_t{k} * _in;
        for (std::uint32_t i = 0; i < _in; ++i) row[i] += z[k] * x[i];
      }
    }
  }
  return loss;
}

void model::step(std::span<const float> g, float lr) {
  for (std::size_t i = 0; i < _w.size(); ++i) _w[i] -= lr * g[i];
}

model::score model::evaluate(const split& s) const {
  std::vector<float> h(std::max<std::uint32_t>(_hid, 1)), z(_out);
  score sc;
  std::uint64_t right = 0;
  for (std::uint32_t n = 0; n < s.count; ++n) {
    forward(s.pixels.data() + std::size_t{n} * s.pixels_per_image(), h.data(), z.data());
    const std::uint32_t y = s.labels[n];
    const auto best = static_cast<std::uint32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    right += best == y;
    sc.loss += softmax(z.data(), _out, y);
  }
  if (s.count > 0) {
    sc.loss /= s.count;
    sc.accuracy = static_cast<double>(right) / s.count;
  }
  return sc;
}

} // namespace dp
