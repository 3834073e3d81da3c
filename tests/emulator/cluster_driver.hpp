// Runs a cluster's poll loops on a thread for as long as it lives (tests).
#pragma once

#include <spin/emu/cluster.hpp>

#include <atomic>
#include <thread>

namespace spin::test {

struct cluster_driver {
  std::atomic<bool> stop{false};
  std::thread th;
  explicit cluster_driver(emu::cluster& c) {
    th = std::thread([this, &c] { c.run(stop); });
  }
  ~cluster_driver() {
    stop = true;
    th.join();
  }
  cluster_driver(const cluster_driver&) = delete;
  cluster_driver& operator=(const cluster_driver&) = delete;
};

} // namespace spin::test
