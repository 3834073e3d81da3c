// A classifier in plain C++: softmax regression (hidden = 0) or a multilayer perceptron with one
// hidden layer of ReLU units, trained by minibatch SGD on the cross-entropy loss. Every loop runs
// in a fixed order on one thread, so the same inputs give the same bits.
#pragma once

#include "fashion_mnist.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace dp {

class model {
public:
  /// `inputs` pixels, `hidden` units (0: softmax regression), `classes` outputs. Weights start
  /// from a seeded uniform He initialisation; biases at 0.
  model(std::uint32_t inputs, std::uint32_t hidden, std::uint32_t classes, std::uint64_t seed);

  /// Number of parameters (the length of every gradient).
  std::size_t size() const { return _w.size(); }
  std::span<const float> params() const { return _w; }

  /// Adds the gradient of the summed cross-entropy over images `idx` of `s` to `grad` (size()
  /// floats) and returns the summed loss.
  double accumulate(const split& s, std::span<const std::uint32_t> idx, std::span<float> grad) const;

  /// w -= lr * g for every parameter.
  void step(std::span<const float> g, float lr);

  /// Mean loss and accuracy over the whole split.
  struct score {
    double loss = 0;
    double accuracy = 0;
  };
  score evaluate(const split& s) const;

private:
  // Logits of one image into z (classes floats); h receives the hidden activations.
  void forward(const std::uint8_t* px, float* h, float* z) const;
  std::uint32_t _in, _hid, _out;
  std::vector<float> _w;  // [W1 (hid x in), b1 (hid), W2 (out x hid or out x in), b2 (out)]
};

} // namespace dp
