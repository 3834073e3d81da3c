// How a polling loop waits: idle_backoff's steps and the doorbell's handshake.
#include <doctest/doctest.h>

#include <spin/emu/lcore.hpp>

#include <atomic>
#include <chrono>
#include <thread>

using namespace spin;
using namespace std::chrono_literals;

TEST_CASE("idle_backoff spins 256 empty rounds, then sleeps in steps that double from 10 us up to its limit") {
  for (std::uint32_t pause : {0u, 64u}) {
    CAPTURE(pause);
    emu::idle_backoff b(std::chrono::microseconds(200), pause);
    for (std::uint32_t k = 1; k < emu::idle_backoff::spin_rounds; ++k) REQUIRE_FALSE(b.idle());
    CHECK(b.idle());
    CHECK(b.empty_rounds() == emu::idle_backoff::spin_rounds);
    CHECK(b.sleep_step() == 10us);
    CHECK(b.sleep_step() == 20us);
    CHECK(b.sleep_step() == 40us);
    CHECK(b.sleep_step() == 80us);
    CHECK(b.sleep_step() == 160us);
    CHECK(b.sleep_step() == 200us);
    CHECK(b.sleep_step() == 200us);
    // Work starts the sequence again.
    b.busy();
    CHECK(b.empty_rounds() == 0);
    CHECK_FALSE(b.idle());
    for (std::uint32_t k = 2; k < emu::idle_backoff::spin_rounds; ++k) REQUIRE_FALSE(b.idle());
    CHECK(b.idle());
    CHECK(b.sleep_step() == 10us);
  }
  // More pause rounds than spin rounds: it pauses that many, then sleeps.
  emu::idle_backoff p(std::chrono::microseconds(100), 300);
  for (std::uint32_t k = 1; k <= 300; ++k) REQUIRE_FALSE(p.idle());
  CHECK(p.idle());
}

TEST_CASE("a doorbell wakes its sleeping owner, and a ring while nobody sleeps costs the next sleep nothing") {
  emu::doorbell bell;
  // Nobody armed: the ring is one load and leaves nothing behind.
  bell.ring();
  bell.arm();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(bell.sleep(20ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 20ms);

  // A ring while the owner sleeps wakes it long before its timeout.
  std::atomic<bool> armed{false};
  std::thread owner([&] {
    bell.arm();
    armed = true;
    CHECK(bell.sleep(std::chrono::microseconds(30'000'000)));
  });
  while (!armed) std::this_thread::yield();
  bell.ring();
  owner.join();
}
