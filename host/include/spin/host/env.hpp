// Settings a rank-side library reads from its environment (libspin-mpi's SPIN_MPI_*, spin_torch's
// SPIN_TORCH_*, a launcher's local rank): one parser, so every variable is refused the same way.
#pragma once

#include <spin/result.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spin::host {

/// Environment variable `name` read as a decimal number in 0..`max`.
/// Returns nullopt when `name` is unset or empty. Errors (errc::invalid_argument, the message
/// names the variable, its value and the range): the value is not all decimal digits (a sign,
/// a space or a suffix is refused, so "-1" never wraps to 2^64-1), or it is above `max`.
/// Thread: any, as std::getenv (no thread may set the environment meanwhile).
result<std::optional<std::uint64_t>> env_number(const char* name, std::uint64_t max);

/// A job secret: 16 bytes. The same shape carries the keys derived from it (frame keys) and the
/// fabric's management key.
using secret = std::array<std::uint8_t, 16>;
/// `text` as 16 bytes: exactly 32 hexadecimal digits, either case (all zero is allowed here).
/// nullopt for anything else. Thread: any.
std::optional<secret> parse_secret(std::string_view text);
/// `s` as 32 lower-case hexadecimal digits. Thread: any.
std::string secret_hex(const secret& s);
/// Environment variable `name` read as a job secret: exactly 32 hexadecimal digits (either
/// case). Returns nullopt when `name` is unset or empty. Errors (errc::invalid_argument, the
/// message names the variable but not its value): anything else, or all zeros (no secret).
/// Thread: as env_number.
result<std::optional<secret>> env_secret(const char* name);
/// 16 bytes from the kernel's CSPRNG (getrandom). Errors: bad_state (getrandom failed).
result<secret> random_secret();

} // namespace spin::host
