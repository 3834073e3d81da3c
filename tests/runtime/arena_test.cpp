#include <spin/rt/arena.hpp>

#include <doctest/doctest.h>

using namespace spin;

TEST_SUITE("runtime") {

TEST_CASE("NIC memory allocations are 64-byte aligned, zeroed and accounted") {
  rt::nic_arena a(4096);
  auto b1 = a.allocate(100);
  REQUIRE(b1.ok());
  CHECK(b1->len_bytes == 128);
  CHECK(reinterpret_cast<std::uintptr_t>(a.data(*b1)) % 64 == 0);
  CHECK(a.used_bytes() == 128);
  a.data(*b1)[5] = std::byte{7};
  a.free(*b1);
  CHECK(a.used_bytes() == 0);
  auto b2 = a.allocate(100);
  REQUIRE(b2.ok());
  CHECK(a.data(*b2)[5] == std::byte{0});
  CHECK(a.peak_bytes() == 128);
}

TEST_CASE("an allocation larger than the free NIC memory fails with a message naming the sizes") {
  rt::nic_arena a(1024);
  auto b = a.allocate(2048);
  REQUIRE_FALSE(b.ok());
  CHECK(b.err().code == errc::no_memory);
  CHECK(b.err().message.find("2048") != std::string::npos);
  auto c = a.allocate(512);
  auto d = a.allocate(512);
  REQUIRE(c.ok());
  REQUIRE(d.ok());
  auto e = a.allocate(64);
  CHECK_FALSE(e.ok());
}

TEST_CASE("freed neighbours coalesce so that a large block fits again") {
  rt::nic_arena a(1024);
  auto x = a.allocate(256), y = a.allocate(256), z = a.allocate(512);
  REQUIRE((x.ok() && y.ok() && z.ok()));
  a.free(*x);
  a.free(*z);
  CHECK(a.largest_free_bytes() == 512);
  a.free(*y);
  CHECK(a.largest_free_bytes() == 1024);
  CHECK(a.allocate(1024).ok());
}

TEST_CASE("freeing a block twice or a block never allocated changes nothing") {
  rt::nic_arena a(1024);
  auto x = a.allocate(256);
  REQUIRE(x.ok());
  a.free(*x);
  a.free(*x);
  a.free(rt::arena_block{512, 64});
  CHECK(a.used_bytes() == 0);
  CHECK(a.largest_free_bytes() == 1024);
}

} // TEST_SUITE
