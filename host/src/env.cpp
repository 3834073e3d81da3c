#include <spin/host/env.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <sys/random.h>

namespace spin::host {

result<std::optional<std::uint64_t>> env_number(const char* name, std::uint64_t max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<std::uint64_t>{};
  const auto refuse = [&] {
    return fail(errc::invalid_argument,
                std::string(name) + "='" + v + "' is not a whole number in 0.." + std::to_string(max));
  };
  std::uint64_t x = 0;
  for (const char* p = v; *p != '\0'; ++p) {
    if (*p < '0' || *p > '9') return refuse();
    const auto d = static_cast<std::uint64_t>(*p - '0');
    if (x > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return refuse();
    x = x * 10 + d;
  }
  if (x > max) return refuse();
  return std::optional<std::uint64_t>{x};
}

result<std::optional<secret>> env_secret(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<secret>{};
  // The value is not echoed: it is a secret.
  const auto refuse = [&] { return fail(errc::invalid_argument, std::string(name) + " must be 32 hexadecimal digits (16 bytes), not all zero"); };
  const auto s = parse_secret(v);
  if (!s || *s == secret{}) return refuse();
  return s;
}

std::optional<secret> parse_secret(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  secret s{};
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    s[i / 2] = static_cast<std::uint8_t>(s[i / 2] | (i % 2 == 0 ? d << 4 : d));
  }
  return s;
}

std::string secret_hex(const secret& s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string t(32, '0');
  for (std::size_t i = 0; i < s.size(); ++i) {
    t[2 * i] = hex[s[i] >> 4];
    t[2 * i + 1] = hex[s[i] & 15];
  }
  return t;
}

result<secret> random_secret() {
  secret s{};
  std::size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errc::bad_state, std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return s;
}

} // namespace spin::host
