// Packet capture and replay for spin-emu: classic pcap files (Ethernet link type, nanosecond
// timestamps) written and read through libpcap, so Wireshark, tshark and tcpdump read what we
// write and we replay what they captured. tools/spin.lua dissects the spin header in them.
#pragma once

#include <spin/result.hpp>
#include <spin/rt/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

// libpcap's handle types (pcap_t, pcap_dumper_t); their header stays out of ours.
struct pcap;
struct pcap_dumper;

namespace spin::emu {

/// Largest snapshot length a capture may have (libpcap's MAXIMUM_SNAPLEN), in bytes.
inline constexpr std::uint32_t pcap_max_snaplen_bytes = 262144;

/// Writes frames to a pcap file: link type Ethernet (DLT_EN10MB), nanosecond timestamp
/// precision, file snapshot length `snaplen_bytes`. Frames longer than the snapshot length are
/// stored cut to it with their original length kept in the record (readers see caplen < len).
///
/// Threads: one thread at a time (no internal locking); the object may move between threads.
/// Ownership: owns the file; move-only; the destructor closes it (dropping a close error; call
/// close() to see it).
class pcap_writer {
public:
  /// Creates (or truncates) `path` and writes the pcap file header. As in libpcap, the path "-"
  /// means standard output (closed by close()).
  /// `snaplen_bytes`: bytes kept of each frame, 1 to pcap_max_snaplen_bytes; a buffer of this
  /// size is allocated here so write() never allocates.
  /// Control path; may allocate and block. Errors: invalid_argument (snaplen_bytes is 0 or above
  /// pcap_max_snaplen_bytes; the file cannot be created — the message names the path and gives
  /// the system's reason, e.g. a missing directory or no permission), no_memory (libpcap could
  /// not allocate its handle).
  static result<pcap_writer> open(const std::string& path, std::uint32_t snaplen_bytes = 65535);

  /// Takes over `other`'s file and counters; `other` is then closed (is_open() false).
  pcap_writer(pcap_writer&& other) noexcept;
  /// Closes this writer's file first (dropping a close error), then takes over `other`'s.
  pcap_writer& operator=(pcap_writer&& other) noexcept;
  pcap_writer(const pcap_writer&) = delete;
  pcap_writer& operator=(const pcap_writer&) = delete;
  /// Flushes and closes the file if still open; a write error is dropped (call close() first).
  ~pcap_writer();

  /// Appends one frame split over `segs` (mbuf chain order; segments may have length 0) with
  /// timestamp `timestamp_ns` (nanoseconds since the Unix epoch; the pcap record holds seconds
  /// as 32 bits, so up to year 2106). The first snaplen_bytes() bytes are gathered into the
  /// preallocated buffer and stored; the record keeps the full length, and a cut frame counts in
  /// truncated(). Data path: never allocates, no exception; stdio buffers the write (a syscall
  /// only when its buffer fills).
  /// Returns errc::ok, or: invalid_argument (frame of 0 bytes or above 2^32 - 1 bytes, or a
  /// segment with a null pointer and a non-zero length; nothing written), bad_state (the writer
  /// is closed, or an earlier write to the file failed — see flush() for the reason).
  errc write(std::span<const rt::wire::segment> segs, std::uint64_t timestamp_ns) noexcept;

  /// Contiguous-frame form of write(segs, timestamp_ns); same rules and errors.
  errc write(std::span<const std::byte> frame, std::uint64_t timestamp_ns) noexcept;

  /// Pushes buffered records to the file (fflush). Control path. Errors: bad_state (the writer is
  /// closed, or the system refused a write; the message names the path and gives the reason,
  /// e.g. "No space left on device").
  result<void> flush();

  /// Flushes and closes the file. Idempotent: closing a closed writer returns ok. Errors:
  /// bad_state (a buffered or earlier write failed; the message names the path and the reason).
  /// The file is closed either way.
  result<void> close();

  /// True until close() (or a move away).
  bool is_open() const noexcept { return _dumper != nullptr; }
  /// The path given to open().
  const std::string& path() const noexcept { return _path; }
  /// The file's snapshot length in bytes.
  std::uint32_t snaplen_bytes() const noexcept { return _snaplen_bytes; }
  /// Frames written.
  std::uint64_t frames() const noexcept { return _frames; }
  /// Original (wire) bytes of the frames written, before any snaplen cut.
  std::uint64_t bytes() const noexcept { return _bytes; }
  /// Frames stored cut to snaplen_bytes() (their records keep the original length).
  std::uint64_t truncated() const noexcept { return _truncated; }

private:
  pcap_writer(std::string path, std::uint32_t snaplen_bytes, ::pcap* handle, ::pcap_dumper* dumper);
  void release() noexcept;

  std::string _path;
  std::uint32_t _snaplen_bytes = 0;
  ::pcap* _pcap = nullptr;
  ::pcap_dumper* _dumper = nullptr;
  std::vector<std::byte> _buf;  // gather buffer, snaplen bytes
  std::uint64_t _frames = 0;
  std::uint64_t _bytes = 0;
  std::uint64_t _truncated = 0;
  int _errno = 0;  // errno of the first failed write, for flush()'s message
};

/// One frame read from a capture. `bytes` points into the reader's buffer and stays valid until
/// the reader's next call to next(), its move or its destruction.
struct frame_view {
  std::span<const std::byte> bytes;  ///< captured bytes (the record's caplen)
  std::uint32_t orig_len = 0;        ///< bytes of the frame on the wire (the record's len)
  std::uint64_t timestamp_ns = 0;    ///< nanoseconds since the Unix epoch
  /// True when the capture kept fewer bytes than the frame had (caplen < len).
  bool truncated() const noexcept { return bytes.size() < orig_len; }
};

/// Reads frames from a pcap or pcapng file with link type Ethernet, in file order. Timestamps
/// come in nanoseconds whatever the file's precision (microsecond files are scaled).
///
/// Threads: one thread at a time; the object may move between threads. Ownership: owns the
/// file; move-only; the destructor closes it.
class pcap_reader {
public:
  /// Opens `path` and reads its file header. As in libpcap, the path "-" means standard input.
  /// Control path. Errors (each message names the file and the problem): not_found (no such file,
  /// or a directory on its path cannot be searched), invalid_argument (a directory; a file we may
  /// not read — the message gives the system's reason; not a pcap/pcapng file libpcap can read,
  /// e.g. an empty file, bad magic or a file header cut short), not_supported (the capture's link
  /// type is not Ethernet; the message gives the link type's number and name).
  static result<pcap_reader> open(const std::string& path);

  /// Takes over `other`'s file, position, error and counters; `other` then returns no frames.
  pcap_reader(pcap_reader&& other) noexcept;
  /// Closes this reader's file, then takes over `other`'s as the move constructor does.
  pcap_reader& operator=(pcap_reader&& other) noexcept;
  pcap_reader(const pcap_reader&) = delete;
  pcap_reader& operator=(const pcap_reader&) = delete;
  /// Closes the file.
  ~pcap_reader();

  /// Reads the next frame into `out` (see frame_view for how long it stays valid). Frames stored
  /// cut (caplen < len) are returned like the others; `out.truncated()` tells them apart. Returns
  /// false at the end of the file or on a read error; after that it keeps returning false, and
  /// error() says which (a file cut in the middle of a record is an error; the frames before it
  /// were returned). We allocate only for the error message; libpcap reads into its own buffer.
  bool next(frame_view& out) noexcept;

  /// The read error that ended next(), if any: code invalid_argument, message naming the file
  /// and libpcap's reason (e.g. "truncated dump file; tried to read 60 captured bytes, only got
  /// 50"). Empty while reading and after a clean end of file.
  const std::optional<spin::error>& error() const noexcept { return _error; }

  /// The path given to open().
  const std::string& path() const noexcept { return _path; }
  /// The file's snapshot length in bytes.
  std::uint32_t snaplen_bytes() const noexcept { return _snaplen_bytes; }
  /// Frames returned by next().
  std::uint64_t frames() const noexcept { return _frames; }
  /// Captured bytes of the frames returned (sum of their caplen).
  std::uint64_t bytes() const noexcept { return _bytes; }
  /// Frames returned that were stored cut (caplen < len).
  std::uint64_t truncated() const noexcept { return _truncated; }

private:
  pcap_reader(std::string path, ::pcap* handle);

  std::string _path;
  ::pcap* _pcap = nullptr;
  std::uint32_t _snaplen_bytes = 0;
  bool _done = false;
  std::optional<spin::error> _error;
  std::uint64_t _frames = 0;
  std::uint64_t _bytes = 0;
  std::uint64_t _truncated = 0;
};

/// Reads every frame of `path` (captured bytes only; timestamps and original lengths are
/// dropped): for tests and tools. Errors: those of pcap_reader::open, and the reader's error()
/// when the file ends inside a record (the frames read before are discarded).
result<std::vector<std::vector<std::byte>>> read_all_frames(const std::string& path);

} // namespace spin::emu
