// Helpers shared by the benchmarks (spin-bench, runtime_dispatch, handler_call): run conditions
// (build, load, CPU), statistics, output files (CSV, JSON, gnuplot). Nothing here measures
// anything by itself.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spin::bench {

/// The conditions a run was measured under, printed at the top of every report and stored in
/// its JSON, since debug, sanitizer or loaded runs give numbers that mean little.
struct run_conditions {
  std::string buildtype, optimization, sanitize;
  bool ndebug = false;
  std::string cpu_model;
  unsigned hardware_threads = 0;
  double tsc_ghz = 0;                       ///< rate of the cycle counter the cycle figures use (rt::cycle_counter_ghz)
  std::array<double, 3> load_before{-1, -1, -1};
  std::array<double, 3> load_after{-1, -1, -1};
  std::vector<std::string> warnings;        ///< why the numbers may not be representative
  nlohmann::json to_json() const;
  /// Prints the header lines (build, CPU, load) and every warning to stdout.
  void print(const char* benchmark) const;
};

/// Reads the build settings, CPU, load and the cycle-counter rate. The rate is the runtime's own
/// (rt::cycle_counter_ghz), so that cycle figures derived from its busy times are its ticks.
run_conditions measure_conditions();

/// /proc/loadavg's three figures, or -1 each when unreadable.
std::array<double, 3> load_average();

/// CPU time of the calling thread and of the whole process (seconds).
double thread_cpu_seconds();
double process_cpu_seconds();

double median(std::vector<double> v);
/// "1.234;2.345" with `sep` between values printed with `precision` decimals.
std::string join(const std::vector<double>& v, const char* sep, int precision = 3);

/// Writes `text` to `path`; false (and a message on stderr) when it cannot.
bool write_text(const std::string& path, const std::string& text);

/// Runs gnuplot on `script` (written to `script_path` first). Returns "" on success, else
/// why no plot was made (gnuplot missing, or its exit status and message).
std::string run_gnuplot(const std::string& script_path, const std::string& script);

/// CSV field: quoted when it holds a comma, quote or newline.
std::string csv_field(const std::string& s);

} // namespace spin::bench
