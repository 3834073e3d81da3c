// The host side of command authentication (protocol.hpp, cmd_key_off): a random key per engine
// EC, written into its host window, and the MAC every command carries.
#pragma once

#include <spin/coll/protocol.hpp>
#include <spin/siphash.hpp>
#include <spin/result.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <sys/random.h>

namespace spin::coll::detail {

class cmd_key {
public:
  /// A fresh key from the kernel's CSPRNG (getrandom). Errors: bad_state (getrandom failed).
  static result<cmd_key> random() {
    cmd_key k;
    std::uint64_t words[2] = {0, 0};
    while (words[0] == 0 && words[1] == 0) {  // an all-zero key is "no key" to the engine
      std::size_t got = 0;
      while (got < sizeof(words)) {
        const ssize_t n = ::getrandom(reinterpret_cast<char*>(words) + got, sizeof(words) - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail(errc::bad_state, std::string("getrandom: ") + std::strerror(errno));
        got += static_cast<std::size_t>(n);
      }
    }
    k._k0 = words[0];
    k._k1 = words[1];
    return k;
  }
  /// Writes the key where the engine reads it: `window` is the start of the EC's host window.
  void write(std::byte* window) const {
    std::memcpy(window + proto::cmd_key_off, &_k0, 8);
    std::memcpy(window + proto::cmd_key_off + 8, &_k1, 8);
  }
  /// Numbers and signs `c` (its nonce and mac fields).
  void sign(proto::cmd& c) {
    c.nonce = ++_nonce;
    c.mac = siphash24(_k0, _k1, reinterpret_cast<const u8*>(&c), proto::cmd_mac_bytes);
  }

private:
  std::uint64_t _k0 = 0, _k1 = 0, _nonce = 0;
};

} // namespace spin::coll::detail
