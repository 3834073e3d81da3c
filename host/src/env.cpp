#include <spin/host/env.hpp>

#include <cstdlib>
#include <limits>
#include <string>

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

} // namespace spin::host
