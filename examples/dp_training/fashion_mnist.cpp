#include "fashion_mnist.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/stat.h>

namespace dp {
namespace {

using spin::errc;
using spin::fail;

constexpr const char* package_hint = "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist; "
                                     "scripts/bootstrap does), or give --data DIR";

struct gz_closer {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// A gzip stream with errors that name the file.
class gz_reader {
public:
  static spin::result<gz_reader> open(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      return fail(errc::not_found, path + ": " + std::strerror(errno) + "; " + package_hint);
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) return fail(errc::not_found, path + ": cannot open: " + std::strerror(errno));
    gz_reader r;
    r._path = path;
    r._f.reset(f);
    if (gzdirect(f) != 0) return fail(errc::invalid_argument, path + " is damaged: not gzip-compressed");
    return r;
  }

  // Reads exactly `n` bytes, or says why not.
  spin::result<void> read(void* out, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30));
      const int got = gzread(_f.get(), p, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(_f.get(), &code);
        return fail(errc::invalid_argument, _path + " is damaged: " + (msg != nullptr ? msg : "gzip error") + " (reading " + what + ")");
      }
      if (got == 0) return fail(errc::invalid_argument, _path + " is damaged: it ends early (reading " + what + ")");
      p += got;
      n -= static_cast<std::size_t>(got);
    }
    return {};
  }

  // True when the stream has no byte left (a longer file is damaged too).
  bool at_end() {
    unsigned char c;
    return gzread(_f.get(), &c, 1) == 0 && gzeof(_f.get()) != 0;
  }

  const std::string& path() const { return _path; }

private:
  std::string _path;
  std::unique_ptr<gzFile_s, gz_closer> _f;
};

spin::result<std::uint32_t> be32(gz_reader& r, const char* what) {
  unsigned char b[4];
  if (auto x = r.read(b, 4, what); !x.ok()) return x.err();
  return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
}

// One images file and its labels file, `limit` images at most (0: all).
spin::result<split> load_split(const std::string& images_path, const std::string& labels_path, std::uint32_t limit) {
  split s;
  auto img = gz_reader::open(images_path);
  if (!img.ok()) return img.err();
  auto lab = gz_reader::open(labels_path);
  if (!lab.ok()) return lab.err();
  auto magic = be32(img.value(), "the header");
  if (!magic.ok()) return magic.err();
  if (magic.value() != 0x00000803)
    return fail(errc::invalid_argument, images_path + " is damaged: IDX magic " + std::to_string(magic.value()) +
                                            ", an image file has 2051 (0x803)");
  auto n = be32(img.value(), "the header");
  auto rows = n.ok() ? be32(img.value(), "the header") : n;
  auto cols = rows.ok() ? be32(img.value(), "the header") : rows;
  if (!cols.ok()) return cols.err();
  if (rows.value() != 28 || cols.value() != 28)
    return fail(errc::invalid_argument, images_path + " is damaged: images of " + std::to_string(rows.value()) + " x " +
                                            std::to_string(cols.value()) + " pixels, Fashion-MNIST has 28 x 28");
  auto lmagic = be32(lab.value(), "the header");
  if (!lmagic.ok()) return lmagic.err();
  if (lmagic.value() != 0x00000801)
    return fail(errc::invalid_argument, labels_path + " is damaged: IDX magic " + std::to_string(lmagic.value()) +
                                            ", a label file has 2049 (0x801)");
  auto ln = be32(lab.value(), "the header");
  if (!ln.ok()) return ln.err();
  if (ln.value() != n.value())
    return fail(errc::invalid_argument, labels_path + " is damaged: " + std::to_string(ln.value()) + " labels for " +
                                            std::to_string(n.value()) + " images in " + images_path);
  const std::uint32_t total = n.value();
  s.count = limit != 0 && limit < total ? limit : total;
  s.rows = rows.value();
  s.cols = cols.value();
  s.pixels.resize(std::size_t{s.count} * s.rows * s.cols);
  s.labels.resize(s.count);
  if (auto r = img.value().read(s.pixels.data(), s.pixels.size(), "the pixels"); !r.ok()) return r.err();
  if (auto r = lab.value().read(s.labels.data(), s.labels.size(), "the labels"); !r.ok()) return r.err();
  for (std::uint32_t i = 0; i < s.count; ++i)
    if (s.labels[i] > 9)
      return fail(errc::invalid_argument, labels_path + " is damaged: label " + std::to_string(s.labels[i]) + " at image " +
                                              std::to_string(i) + " (labels are 0..9)");
  if (s.count == total) {  // the whole file: it must end here, and its gzip trailer must check
    if (!img.value().at_end()) return fail(errc::invalid_argument, images_path + " is damaged: bytes after the last image, or a bad gzip trailer");
    if (!lab.value().at_end()) return fail(errc::invalid_argument, labels_path + " is damaged: bytes after the last label, or a bad gzip trailer");
  }
  return s;
}

} // namespace

spin::result<dataset> load(const std::string& dir, std::uint32_t train_limit, std::uint32_t test_limit) {
  dataset d;
  auto tr = load_split(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz", train_limit);
  if (!tr.ok()) return tr.err();
  auto te = load_split(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz", test_limit);
  if (!te.ok()) return te.err();
  d.train = std::move(tr.value());
  d.test = std::move(te.value());
  return d;
}

} // namespace dp
