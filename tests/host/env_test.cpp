// spin::host::env_number: the one parser of rank-side settings (SPIN_MPI_*, SPIN_TORCH_*).
#include <spin/host/env.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <limits>
#include <string>

using spin::host::env_number;
using spin::host::env_secret;
using spin::host::random_secret;
using spin::host::secret;

namespace {
constexpr const char* var = "SPIN_TEST_ENV_NUMBER";
std::string refusal(const char* value, std::uint64_t max) {
  ::setenv(var, value, 1);
  auto r = env_number(var, max);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == spin::errc::invalid_argument);
  return r.err().message;
}
} // namespace

TEST_SUITE("host") {
  TEST_CASE("an unset or empty variable is no setting") {
    ::unsetenv(var);
    auto r = env_number(var, 10);
    REQUIRE(r.ok());
    CHECK_FALSE(r.value().has_value());
    ::setenv(var, "", 1);
    auto e = env_number(var, 10);
    REQUIRE(e.ok());
    CHECK_FALSE(e.value().has_value());
  }

  TEST_CASE("a number up to the maximum is read exactly") {
    ::setenv(var, "0", 1);
    CHECK(env_number(var, 10).value() == std::optional<std::uint64_t>{0});
    ::setenv(var, "4294967295", 1);
    CHECK(env_number(var, 0xffffffffu).value() == std::optional<std::uint64_t>{0xffffffffu});
    ::setenv(var, "18446744073709551615", 1);
    CHECK(env_number(var, std::numeric_limits<std::uint64_t>::max()).value() ==
          std::optional<std::uint64_t>{std::numeric_limits<std::uint64_t>::max()});
  }

  TEST_CASE("a sign, a space, a suffix, a value above the maximum or beyond 64 bits is refused with the variable named") {
    CHECK(refusal("-1", 0xffffffffu) == "SPIN_TEST_ENV_NUMBER='-1' is not a whole number in 0..4294967295");
    CHECK(refusal("+3", 10).find("'+3'") != std::string::npos);
    CHECK(refusal(" 3", 10).find("' 3'") != std::string::npos);
    CHECK(refusal("3ms", 10).find("'3ms'") != std::string::npos);
    CHECK(refusal("0x10", 100).find("'0x10'") != std::string::npos);
    CHECK(refusal("4294967296", 0xffffffffu).find("0..4294967295") != std::string::npos);
    CHECK(refusal("18446744073709551616", std::numeric_limits<std::uint64_t>::max()).find("'18446744073709551616'") !=
          std::string::npos);
    CHECK(refusal("99999999999999999999999", std::numeric_limits<std::uint64_t>::max()).find(var) == 0);
    ::unsetenv(var);
  }
}

TEST_SUITE("host") {
  TEST_CASE("a job secret is 32 hexadecimal digits, read exactly, and a bad one is refused without showing it") {
    const char* var = "SPIN_TEST_ENV_SECRET";
    ::unsetenv(var);
    CHECK_FALSE(env_secret(var).value().has_value());
    ::setenv(var, "00112233445566778899aabbccddeeFF", 1);
    const auto s = env_secret(var);
    REQUIRE(s.ok());
    REQUIRE(s.value().has_value());
    CHECK(*s.value() == secret{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff});
    for (const char* bad : {"0011", "00112233445566778899aabbccddeeffa", "0011223344556677889gaabbccddeeff",
                            "00000000000000000000000000000000", " 0112233445566778899aabbccddeeff"}) {
      CAPTURE(bad);
      ::setenv(var, bad, 1);
      const auto r = env_secret(var);
      REQUIRE_FALSE(r.ok());
      CHECK(r.err().code == spin::errc::invalid_argument);
      CHECK(r.err().message == "SPIN_TEST_ENV_SECRET must be 32 hexadecimal digits (16 bytes), not all zero");
    }
    ::unsetenv(var);
    const auto a = random_secret(), b = random_secret();
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a.value() != b.value());
  }

  TEST_CASE("a 16-byte key round-trips through 32 hexadecimal digits, and anything else is no key") {
    const secret k{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
    CHECK(spin::host::secret_hex(k) == "00112233445566778899aabbccddeeff");
    CHECK(spin::host::parse_secret("00112233445566778899AABBCCDDEEFF") == k);
    CHECK(spin::host::parse_secret(spin::host::secret_hex(secret{})) == secret{});
    for (const char* bad : {"", "0011", "00112233445566778899aabbccddeeffa", "0011223344556677889gaabbccddeeff", "0x112233445566778899aabbccddeeff"})
      CHECK_FALSE(spin::host::parse_secret(bad).has_value());
  }
}
