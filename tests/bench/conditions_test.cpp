// bench/common's run conditions: the cycle-counter rate the benchmarks turn busy time into
// cycles with is the runtime's own, not a second measurement.
#include "../../bench/common.hpp"

#include <spin/rt/runtime.hpp>

#include <doctest/doctest.h>

TEST_SUITE("bench") {

TEST_CASE("the run conditions carry the runtime's cycle-counter rate") {
  const spin::bench::run_conditions c = spin::bench::measure_conditions();
  CHECK(c.tsc_ghz == spin::rt::cycle_counter_ghz());
  CHECK(c.to_json().at("tsc_ghz").get<double>() == spin::rt::cycle_counter_ghz());
}

} // TEST_SUITE
