// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017) as Debian's dataset-fashion-mnist package
// installs it: four gzip-compressed IDX files (LeCun's MNIST format) in
// /usr/share/datasets/fashion-mnist.
#pragma once

#include <spin/result.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// Where Debian's package puts the files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

/// One split: `count` images of rows x cols pixels (0..255, row-major, image after image) and
/// their labels (0..9).
struct split {
  std::uint32_t count = 0;
  std::uint32_t rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  ///< count * rows * cols bytes
  std::vector<std::uint8_t> labels;  ///< count bytes
  std::uint32_t pixels_per_image() const { return rows * cols; }
};

struct dataset {
  split train, test;
};

/// Reads train-{images,labels} and t10k-{images,labels} from `dir`, at most `train_limit` and
/// `test_limit` images of each (0: all). Errors (the message names the file):
///   not_found: a file is missing; the message says which Debian package installs it;
///   invalid_argument: a file is damaged: not gzip, gzip data error, truncated, a wrong IDX
///     magic number, dimensions that are not 28 x 28, image and label counts that differ, a
///     label above 9.
spin::result<dataset> load(const std::string& dir, std::uint32_t train_limit = 0, std::uint32_t test_limit = 0);

} // namespace dp
