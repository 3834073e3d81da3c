#include <spin/rt/package.hpp>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fstream>
#include <iterator>

namespace spin::rt {

namespace {

// Header layout (all little-endian), docs/handler-package.md.
constexpr std::size_t off_magic = 0;
constexpr std::size_t off_version = 8;
constexpr std::size_t off_header_bytes = 12;
constexpr std::size_t off_manifest_off = 16;
constexpr std::size_t off_manifest_len = 24;
constexpr std::size_t off_object_off = 32;
constexpr std::size_t off_object_len = 40;
constexpr std::size_t off_crc = 48;
constexpr std::size_t off_total = 56;
constexpr std::size_t off_counted_off = 64;  // version 2
constexpr std::size_t off_counted_len = 72;
constexpr std::uint64_t object_align = 16;

void put_le(std::vector<std::byte>& b, std::size_t off, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) b[off + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

std::uint64_t get_le(std::span<const std::byte> b, std::size_t off, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(b[off + i]) << (8 * i);
  return v;
}

std::uint32_t crc_of(std::span<const std::byte> a, std::span<const std::byte> b, std::span<const std::byte> c = {}) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large inputs in pieces.
  for (auto part : {a, b, c}) {
    std::size_t done = 0;
    while (done < part.size()) {
      const std::size_t n = std::min<std::size_t>(part.size() - done, 1u << 30);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(part.data() + done), static_cast<uInt>(n));
      done += n;
    }
  }
  return static_cast<std::uint32_t>(crc);
}

nlohmann::json to_json(const package_manifest& m) {
  nlohmann::json j;
  j["format"] = package_format_version;
  j["abi_version"] = m.abi_version;
  j["target"] = std::string(to_string(m.target));
  j["march"] = m.march;
  j["compiler"] = m.compiler;
  j["source"] = {{"name", m.source_name}, {"sha256", m.source_sha256}};
  j["handler_mem_bytes"] = m.handler_mem_bytes;
  j["scratchpad_bytes"] = m.scratchpad_bytes;
  j["stack_limit_bytes"] = m.stack_limit_bytes;
  nlohmann::json hs = nlohmann::json::array();
  for (const auto& h : m.handlers)
    hs.push_back({{"name", h.name}, {"kind", std::string(to_string(h.kind))}, {"stack_bytes", h.stack_bytes}});
  j["handlers"] = hs;
  return j;
}

// Typed, range-checked access to manifest keys; every failure names the key.
struct reader {
  std::string problem;

  const nlohmann::json* field(const nlohmann::json& j, const char* key, const char* where) {
    if (!problem.empty()) return nullptr;
    auto it = j.find(key);
    if (it == j.end()) {
      problem = std::string("manifest: missing key '") + where + key + "'";
      return nullptr;
    }
    return &*it;
  }
  std::uint64_t u64(const nlohmann::json& j, const char* key, std::uint64_t max, const char* where = "") {
    const nlohmann::json* f = field(j, key, where);
    if (f == nullptr) return 0;
    if (!f->is_number_unsigned() || f->get<std::uint64_t>() > max) {
      problem = std::string("manifest: key '") + where + key + "' must be an integer in [0, " + std::to_string(max) + "]";
      return 0;
    }
    return f->get<std::uint64_t>();
  }
  std::string str(const nlohmann::json& j, const char* key, const char* where = "") {
    const nlohmann::json* f = field(j, key, where);
    if (f == nullptr) return {};
    if (!f->is_string()) {
      problem = std::string("manifest: key '") + where + key + "' must be a string";
      return {};
    }
    return f->get<std::string>();
  }
};

// A C identifier of at most 255 characters: what a handler's symbol can be.
bool identifier(const std::string& n) {
  if (n.empty() || n.size() > 255) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// A name from a manifest as it may appear in a message: printable, at most 64 characters.
std::string shown(const std::string& n) {
  std::string out;
  for (char c : n.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return n.size() > 64 ? out + "..." : out;
}

result<package_manifest> parse_manifest(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return fail(errc::invalid_argument, "manifest: not a JSON object (package corrupted?)");
  reader r;
  package_manifest m;
  const std::uint64_t format = r.u64(j, "format", UINT32_MAX);
  if (r.problem.empty() && format != package_format_version)
    return fail(errc::not_supported, "manifest: format " + std::to_string(format) + " is not supported (this runtime reads " +
                                         std::to_string(package_format_version) + ")");
  m.abi_version = static_cast<std::uint32_t>(r.u64(j, "abi_version", UINT32_MAX));
  const std::string target = r.str(j, "target");
  if (r.problem.empty()) {
    if (target == to_string(package_target::native_x86_64))
      m.target = package_target::native_x86_64;
    else if (target == to_string(package_target::ebpf))
      m.target = package_target::ebpf;
    else
      r.problem = "manifest: unknown target '" + shown(target) + "' (expected x86_64 or ebpf)";
  }
  m.march = r.str(j, "march");
  m.compiler = r.str(j, "compiler");
  if (const nlohmann::json* src = r.field(j, "source", ""); src != nullptr) {
    if (!src->is_object()) {
      r.problem = "manifest: key 'source' must be an object";
    } else {
      m.source_name = r.str(*src, "name", "source.");
      m.source_sha256 = r.str(*src, "sha256", "source.");
    }
  }
  m.handler_mem_bytes = r.u64(j, "handler_mem_bytes", UINT64_MAX);
  m.scratchpad_bytes = r.u64(j, "scratchpad_bytes", UINT64_MAX);
  m.stack_limit_bytes = static_cast<std::uint32_t>(r.u64(j, "stack_limit_bytes", UINT32_MAX));
  if (const nlohmann::json* hs = r.field(j, "handlers", ""); hs != nullptr) {
    if (!hs->is_array() || hs->size() > 3) {
      r.problem = "manifest: key 'handlers' must be an array of at most 3 handlers";
    } else {
      bool seen[3] = {false, false, false};
      for (const auto& h : *hs) {
        if (!r.problem.empty()) break;
        if (!h.is_object()) {
          r.problem = "manifest: every entry of 'handlers' must be an object";
          break;
        }
        package_handler ph;
        ph.name = r.str(h, "name", "handlers[].");
        const std::string kind = r.str(h, "kind", "handlers[].");
        ph.stack_bytes = static_cast<std::uint32_t>(r.u64(h, "stack_bytes", UINT32_MAX, "handlers[]."));
        if (!r.problem.empty()) break;
        if (kind == "header")
          ph.kind = handler_kind::header;
        else if (kind == "payload")
          ph.kind = handler_kind::payload;
        else if (kind == "completion")
          ph.kind = handler_kind::completion;
        else {
          r.problem = "manifest: handler '" + shown(ph.name) + "' has unknown kind '" + shown(kind) + "'";
          break;
        }
        if (!identifier(ph.name)) {
          r.problem = "manifest: handler name '" + shown(ph.name) + "' is not a C identifier of at most 255 characters";
          break;
        }
        if (seen[static_cast<unsigned>(ph.kind)]) {
          r.problem = "manifest: two " + kind + " handlers";
          break;
        }
        for (const auto& other : m.handlers)
          if (other.name == ph.name) r.problem = "manifest: handler name '" + ph.name + "' appears twice";
        seen[static_cast<unsigned>(ph.kind)] = true;
        m.handlers.push_back(std::move(ph));
      }
    }
  }
  if (r.problem.empty() && (m.source_sha256.size() != 64 ||
                            m.source_sha256.find_first_not_of("0123456789abcdef") != std::string::npos))
    r.problem = "manifest: 'source.sha256' must be 64 lowercase hex digits";
  if (!r.problem.empty()) return fail(errc::invalid_argument, r.problem);
  return m;
}

} // namespace

std::string_view to_string(package_target t) {
  switch (t) {
  case package_target::native_x86_64: return "x86_64";
  case package_target::ebpf: return "ebpf";
  }
  return "unknown";
}

std::string_view to_string(handler_kind k) {
  switch (k) {
  case handler_kind::header: return "header";
  case handler_kind::payload: return "payload";
  case handler_kind::completion: return "completion";
  }
  return "unknown";
}

std::string handler_section(const package_handler& h) { return ".spin." + std::string(to_string(h.kind)) + "." + h.name; }

std::string manifest_json(const package_manifest& m) { return to_json(m).dump(2) + "\n"; }

std::vector<std::byte> encode_package(const package& p) {
  const std::string manifest = manifest_json(p.manifest);
  const bool counted = !p.counted_object.empty();
  const std::uint64_t header = counted ? package_counted_header_bytes : package_header_bytes;
  const std::uint64_t manifest_off = header;
  const std::uint64_t object_off = (manifest_off + manifest.size() + object_align - 1) / object_align * object_align;
  const std::uint64_t counted_off = (object_off + p.object.size() + object_align - 1) / object_align * object_align;
  const std::uint64_t total = counted ? counted_off + p.counted_object.size() : object_off + p.object.size();
  std::vector<std::byte> b(total, std::byte{0});
  std::memcpy(b.data() + off_magic, package_magic, sizeof(package_magic));
  put_le(b, off_version, counted ? package_counted_format_version : package_format_version, 4);
  put_le(b, off_header_bytes, header, 4);
  if (counted) {
    put_le(b, off_counted_off, counted_off, 8);
    put_le(b, off_counted_len, p.counted_object.size(), 8);
    std::memcpy(b.data() + counted_off, p.counted_object.data(), p.counted_object.size());
  }
  put_le(b, off_manifest_off, manifest_off, 8);
  put_le(b, off_manifest_len, manifest.size(), 8);
  put_le(b, off_object_off, object_off, 8);
  put_le(b, off_object_len, p.object.size(), 8);
  put_le(b, off_total, total, 8);
  std::memcpy(b.data() + manifest_off, manifest.data(), manifest.size());
  if (!p.object.empty()) std::memcpy(b.data() + object_off, p.object.data(), p.object.size());
  const auto bytes = std::span<const std::byte>(b);
  put_le(b, off_crc, crc_of(bytes.subspan(manifest_off, manifest.size()), bytes.subspan(object_off, p.object.size()),
                            counted ? bytes.subspan(counted_off, p.counted_object.size()) : std::span<const std::byte>()), 4);
  return b;
}

result<package> decode_package(std::span<const std::byte> b) {
  if (b.size() < package_header_bytes)
    return fail(errc::invalid_argument, "package truncated: " + std::to_string(b.size()) + " bytes, the header alone needs " +
                                            std::to_string(package_header_bytes));
  if (std::memcmp(b.data(), package_magic, sizeof(package_magic)) != 0)
    return fail(errc::invalid_argument, "not a spinnic package (bad magic; expected \"SPINPKG\")");
  const std::uint64_t version = get_le(b, off_version, 4);
  if (version != package_format_version && version != package_counted_format_version)
    return fail(errc::not_supported, "package format version " + std::to_string(version) + " is not supported (this runtime reads " +
                                         std::to_string(package_format_version) + " and " +
                                         std::to_string(package_counted_format_version) + ")");
  const bool counted = version == package_counted_format_version;
  const std::uint64_t header = counted ? package_counted_header_bytes : package_header_bytes;
  if (get_le(b, off_header_bytes, 4) != header)
    return fail(errc::invalid_argument, "package header size is " + std::to_string(get_le(b, off_header_bytes, 4)) + ", expected " +
                                            std::to_string(header) + " (corrupted)");
  if (b.size() < header)
    return fail(errc::invalid_argument, "package truncated: " + std::to_string(b.size()) + " bytes, the header alone needs " +
                                            std::to_string(header));
  const std::uint64_t total = get_le(b, off_total, 8);
  if (total != b.size())
    return fail(errc::invalid_argument, total > b.size() ? "package truncated: header says " + std::to_string(total) +
                                                               " bytes, file has " + std::to_string(b.size())
                                                         : "package has " + std::to_string(b.size() - total) +
                                                               " trailing bytes after its declared end (corrupted)");
  const std::uint64_t m_off = get_le(b, off_manifest_off, 8), m_len = get_le(b, off_manifest_len, 8);
  const std::uint64_t o_off = get_le(b, off_object_off, 8), o_len = get_le(b, off_object_len, 8);
  const std::uint64_t c_off = counted ? get_le(b, off_counted_off, 8) : 0, c_len = counted ? get_le(b, off_counted_len, 8) : 0;
  auto inside = [&](std::uint64_t off, std::uint64_t len) { return off >= header && off <= total && len <= total - off; };
  auto overlap = [](std::uint64_t a, std::uint64_t al, std::uint64_t c, std::uint64_t cl) { return a < c ? a + al > c : c + cl > a; };
  if (!inside(m_off, m_len)) return fail(errc::invalid_argument, "package corrupted: manifest range lies outside the file");
  if (!inside(o_off, o_len)) return fail(errc::invalid_argument, "package corrupted: object range lies outside the file");
  if (overlap(m_off, m_len, o_off, o_len)) return fail(errc::invalid_argument, "package corrupted: manifest and object overlap");
  if (counted) {
    if (!inside(c_off, c_len)) return fail(errc::invalid_argument, "package corrupted: counted object range lies outside the file");
    if (c_len == 0) return fail(errc::invalid_argument, "package corrupted: format 2 with an empty counted object");
    if (overlap(m_off, m_len, c_off, c_len) || overlap(o_off, o_len, c_off, c_len))
      return fail(errc::invalid_argument, "package corrupted: the counted object overlaps the manifest or the object");
  }
  const std::uint32_t stored = static_cast<std::uint32_t>(get_le(b, off_crc, 4));
  const std::uint32_t computed = crc_of(b.subspan(m_off, m_len), b.subspan(o_off, o_len), b.subspan(c_off, c_len));
  if (stored != computed) {
    char msg[128];
    std::snprintf(msg, sizeof msg, "package corrupted: CRC-32 is 0x%08x, the header says 0x%08x", computed, stored);
    return fail(errc::invalid_argument, msg);
  }
  auto m = parse_manifest(std::string_view(reinterpret_cast<const char*>(b.data() + m_off), m_len));
  if (!m) return m.err();
  package p;
  p.manifest = std::move(m.value());
  p.object.assign(b.begin() + static_cast<std::ptrdiff_t>(o_off), b.begin() + static_cast<std::ptrdiff_t>(o_off + o_len));
  if (p.object.empty()) return fail(errc::invalid_argument, "package has no object");
  if (counted) {
    if (p.manifest.target != package_target::native_x86_64)
      return fail(errc::invalid_argument, "package has a counted object, which only native packages may have");
    p.counted_object.assign(b.begin() + static_cast<std::ptrdiff_t>(c_off), b.begin() + static_cast<std::ptrdiff_t>(c_off + c_len));
  }
  return p;
}

result<package> read_package_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer. Only regular files of bounded size are
  // read (a device such as /dev/zero would never end).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(errc::not_found, "cannot open package '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(errc::invalid_argument, "package '" + path + "' is not a regular file");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_package_bytes) {
    ::close(fd);
    return fail(errc::invalid_argument, "package '" + path + "' has " + std::to_string(st.st_size) + " bytes, more than the " +
                                            std::to_string(max_package_bytes) + " a package may have");
  }
  std::vector<char> raw(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  const int err = errno;
  ::close(fd);
  if (got != raw.size())
    return fail(errc::invalid_argument, "cannot read package '" + path + "': " + (got < raw.size() ? std::strerror(err) : "size changed"));
  auto p = decode_package(std::as_bytes(std::span<const char>(raw)));
  if (!p) return fail(p.err().code, path + ": " + p.err().message);
  return p;
}

result<void> write_package_file(const std::string& path, const package& p) {
  const std::vector<std::byte> b = encode_package(p);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return fail(errc::invalid_argument, "cannot write package '" + path + "': " + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  out.close();
  if (!out) return fail(errc::invalid_argument, "cannot write package '" + path + "': " + std::strerror(errno));
  return {};
}

result<void> raise_to_declared(const package_manifest& m, std::string_view ec_name, std::uint64_t& handler_mem_bytes,
                               std::uint64_t& scratchpad_bytes) {
  auto raise = [&](std::uint64_t have, std::uint64_t want, const char* what) -> result<std::uint64_t> {
    if (have == 0) have = want;
    if (have < want)
      return fail(errc::invalid_argument, "EC \"" + std::string(ec_name) + "\": " + what + " of " + std::to_string(have) +
                                              " bytes is smaller than the " + std::to_string(want) + " bytes package '" +
                                              m.source_name + "' declares");
    return have;
  };
  auto mem = raise(handler_mem_bytes, m.handler_mem_bytes, "handler memory");
  if (!mem) return mem.err();
  auto scratch = raise(scratchpad_bytes, m.scratchpad_bytes, "scratchpad");
  if (!scratch) return scratch.err();
  handler_mem_bytes = *mem;
  scratchpad_bytes = *scratch;
  return {};
}

} // namespace spin::rt
