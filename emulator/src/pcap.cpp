#include <spin/emu/pcap.hpp>

#include <pcap/pcap.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace spin::emu {

namespace {

constexpr std::uint64_t ns_per_s = 1'000'000'000;

// libpcap prefixes file errors with the path ("x.pcap: No such file or directory"); our messages
// name the path themselves.
std::string strip_path(std::string why, const std::string& path) {
  const std::string prefix = path + ": ";
  if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
  return why;
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

}  // namespace

// ---- pcap_writer ----

pcap_writer::pcap_writer(std::string path, std::uint32_t snaplen_bytes, ::pcap* handle, ::pcap_dumper* dumper)
    : _path(std::move(path)), _snaplen_bytes(snaplen_bytes), _pcap(handle), _dumper(dumper), _buf(snaplen_bytes) {}

result<pcap_writer> pcap_writer::open(const std::string& path, std::uint32_t snaplen_bytes) {
  if (snaplen_bytes == 0 || snaplen_bytes > pcap_max_snaplen_bytes) {
    return fail(errc::invalid_argument, "capture file " + quoted(path) + ": snapshot length " +
                                            std::to_string(snaplen_bytes) + " bytes is outside 1 to " +
                                            std::to_string(pcap_max_snaplen_bytes));
  }
  pcap_t* handle = pcap_open_dead_with_tstamp_precision(DLT_EN10MB, static_cast<int>(snaplen_bytes),
                                                        PCAP_TSTAMP_PRECISION_NANO);
  if (handle == nullptr) {
    return fail(errc::no_memory, "capture file " + quoted(path) + ": libpcap cannot allocate a handle");
  }
  pcap_dumper_t* dumper = pcap_dump_open(handle, path.c_str());
  if (dumper == nullptr) {
    std::string why = strip_path(pcap_geterr(handle), path);
    pcap_close(handle);
    return fail(errc::invalid_argument, "cannot create capture file " + quoted(path) + ": " + why);
  }
  return pcap_writer(path, snaplen_bytes, handle, dumper);
}

pcap_writer::pcap_writer(pcap_writer&& other) noexcept
    : _path(std::move(other._path)), _snaplen_bytes(other._snaplen_bytes),
      _pcap(std::exchange(other._pcap, nullptr)), _dumper(std::exchange(other._dumper, nullptr)),
      _buf(std::move(other._buf)), _frames(other._frames), _bytes(other._bytes), _truncated(other._truncated),
      _errno(other._errno) {}

pcap_writer& pcap_writer::operator=(pcap_writer&& other) noexcept {
  if (this != &other) {
    release();
    _path = std::move(other._path);
    _snaplen_bytes = other._snaplen_bytes;
    _pcap = std::exchange(other._pcap, nullptr);
    _dumper = std::exchange(other._dumper, nullptr);
    _buf = std::move(other._buf);
    _frames = other._frames;
    _bytes = other._bytes;
    _truncated = other._truncated;
    _errno = other._errno;
  }
  return *this;
}

pcap_writer::~pcap_writer() { release(); }

void pcap_writer::release() noexcept {
  if (_dumper != nullptr) pcap_dump_close(_dumper);
  if (_pcap != nullptr) pcap_close(_pcap);
  _dumper = nullptr;
  _pcap = nullptr;
}

errc pcap_writer::write(std::span<const rt::wire::segment> segs, std::uint64_t timestamp_ns) noexcept {
  if (_dumper == nullptr) return errc::bad_state;
  std::uint64_t total = 0;
  const rt::wire::segment* first = nullptr;  // first non-empty segment
  for (const auto& s : segs) {
    if (s.len == 0) continue;
    if (s.data == nullptr) return errc::invalid_argument;
    if (first == nullptr) first = &s;
    total += s.len;
  }
  if (total == 0 || total > std::numeric_limits<std::uint32_t>::max()) return errc::invalid_argument;
  if (timestamp_ns / ns_per_s > std::numeric_limits<std::uint32_t>::max()) return errc::invalid_argument;
  FILE* file = pcap_dump_file(_dumper);
  if (std::ferror(file) != 0) return errc::bad_state;

  const auto caplen = static_cast<std::uint32_t>(std::min<std::uint64_t>(total, _snaplen_bytes));
  const std::byte* data = first->data;
  if (first->len < caplen) {
    // The stored bytes span segments: gather them (at most snaplen bytes).
    std::size_t at = 0;
    for (const auto& s : segs) {
      if (at == caplen) break;
      const std::size_t n = std::min<std::size_t>(s.len, caplen - at);
      if (n != 0) std::memcpy(_buf.data() + at, s.data, n);
      at += n;
    }
    data = _buf.data();
  }

  pcap_pkthdr rec{};
  rec.ts.tv_sec = static_cast<time_t>(timestamp_ns / ns_per_s);
  rec.ts.tv_usec = static_cast<suseconds_t>(timestamp_ns % ns_per_s);  // nanoseconds: the file is NSEC
  rec.caplen = caplen;
  rec.len = static_cast<bpf_u_int32>(total);
  pcap_dump(reinterpret_cast<u_char*>(_dumper), &rec, reinterpret_cast<const u_char*>(data));
  if (std::ferror(file) != 0) {
    _errno = errno;
    return errc::bad_state;
  }
  ++_frames;
  _bytes += total;
  if (caplen < total) ++_truncated;
  return errc::ok;
}

errc pcap_writer::write(std::span<const std::byte> frame, std::uint64_t timestamp_ns) noexcept {
  if (frame.size() > std::numeric_limits<std::uint32_t>::max()) return errc::invalid_argument;
  const rt::wire::segment s{frame.data(), static_cast<std::uint32_t>(frame.size())};
  return write(std::span<const rt::wire::segment>(&s, 1), timestamp_ns);
}

result<void> pcap_writer::flush() {
  if (_dumper == nullptr) return fail(errc::bad_state, "capture file " + quoted(_path) + " is closed");
  errno = 0;
  const bool flushed = pcap_dump_flush(_dumper) == 0;
  if (!flushed && _errno == 0) _errno = errno;
  if (!flushed || std::ferror(pcap_dump_file(_dumper)) != 0) {
    const std::string why = _errno != 0 ? std::strerror(_errno) : "write error";
    return fail(errc::bad_state, "cannot write capture file " + quoted(_path) + ": " + why);
  }
  return {};
}

result<void> pcap_writer::close() {
  if (_dumper == nullptr) return {};
  result<void> r = flush();
  release();
  return r;
}

// ---- pcap_reader ----

pcap_reader::pcap_reader(std::string path, ::pcap* handle)
    : _path(std::move(path)), _pcap(handle), _snaplen_bytes(static_cast<std::uint32_t>(pcap_snapshot(handle))) {}

result<pcap_reader> pcap_reader::open(const std::string& path) {
  if (path != "-") {  // "-" is standard input (libpcap's convention)
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return fail(errc::not_found, "cannot open capture file " + quoted(path) + ": " + std::strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
      return fail(errc::invalid_argument, "cannot read capture file " + quoted(path) + ": it is a directory");
    }
    if (::access(path.c_str(), R_OK) != 0) {
      return fail(errc::invalid_argument, "cannot read capture file " + quoted(path) + ": " + std::strerror(errno));
    }
  }
  char errbuf[PCAP_ERRBUF_SIZE] = {};
  pcap_t* handle = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, errbuf);
  if (handle == nullptr) {
    return fail(errc::invalid_argument, quoted(path) + " is not a pcap or pcapng file libpcap can read: " +
                                            strip_path(errbuf, path));
  }
  const int link = pcap_datalink(handle);
  if (link != DLT_EN10MB) {
    const char* name = pcap_datalink_val_to_name(link);
    pcap_close(handle);
    return fail(errc::not_supported, "capture file " + quoted(path) + " has link type " + std::to_string(link) +
                                         " (" + (name != nullptr ? name : "unknown") +
                                         "); spin-emu reads only Ethernet (EN10MB) captures");
  }
  return pcap_reader(path, handle);
}

pcap_reader::pcap_reader(pcap_reader&& other) noexcept
    : _path(std::move(other._path)), _pcap(std::exchange(other._pcap, nullptr)), _snaplen_bytes(other._snaplen_bytes),
      _done(std::exchange(other._done, true)), _error(std::move(other._error)), _frames(other._frames),
      _bytes(other._bytes), _truncated(other._truncated) {}

pcap_reader& pcap_reader::operator=(pcap_reader&& other) noexcept {
  if (this != &other) {
    if (_pcap != nullptr) pcap_close(_pcap);
    _path = std::move(other._path);
    _pcap = std::exchange(other._pcap, nullptr);
    _snaplen_bytes = other._snaplen_bytes;
    _done = std::exchange(other._done, true);
    _error = std::move(other._error);
    _frames = other._frames;
    _bytes = other._bytes;
    _truncated = other._truncated;
  }
  return *this;
}

pcap_reader::~pcap_reader() {
  if (_pcap != nullptr) pcap_close(_pcap);
}

bool pcap_reader::next(frame_view& out) noexcept {
  if (_done || _pcap == nullptr) return false;
  pcap_pkthdr* rec = nullptr;
  const u_char* data = nullptr;
  const int rc = pcap_next_ex(_pcap, &rec, &data);
  if (rc == 1) {
    out.bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), rec->caplen);
    out.orig_len = rec->len;
    // The handle was opened with nanosecond precision: tv_usec holds nanoseconds. Record seconds
    // are 32 bits; libpcap sign-extends them, we read them unsigned (as Wireshark does) so that
    // timestamps after 2038 come back as written.
    const auto sec = static_cast<std::uint32_t>(rec->ts.tv_sec);
    out.timestamp_ns = std::uint64_t{sec} * ns_per_s + static_cast<std::uint64_t>(rec->ts.tv_usec);
    ++_frames;
    _bytes += rec->caplen;
    if (rec->caplen < rec->len) ++_truncated;
    return true;
  }
  _done = true;
  if (rc != PCAP_ERROR_BREAK) {  // PCAP_ERROR_BREAK: clean end of the file
    try {
      _error = spin::error{errc::invalid_argument, "cannot read capture file " + quoted(_path) + " after frame " +
                                                       std::to_string(_frames) + ": " + pcap_geterr(_pcap)};
    } catch (...) {
      _error.reset();
      _error.emplace();  // an empty message is better than none; bad_alloc is not ours to throw here
      _error->code = errc::invalid_argument;
    }
  }
  return false;
}

result<std::vector<std::vector<std::byte>>> read_all_frames(const std::string& path) {
  auto reader = pcap_reader::open(path);
  if (!reader) return reader.err();
  std::vector<std::vector<std::byte>> frames;
  frame_view f;
  while (reader->next(f)) frames.emplace_back(f.bytes.begin(), f.bytes.end());
  if (reader->error()) return *reader->error();
  return frames;
}

}  // namespace spin::emu
