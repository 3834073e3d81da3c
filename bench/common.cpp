#include "common.hpp"

#include <spin/rt/runtime.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <time.h>

#ifndef SPIN_BUILD_TYPE
#define SPIN_BUILD_TYPE "unknown"
#endif
#ifndef SPIN_BUILD_OPTIMIZATION
#define SPIN_BUILD_OPTIMIZATION "unknown"
#endif
#ifndef SPIN_BUILD_SANITIZE
#define SPIN_BUILD_SANITIZE "none"
#endif

namespace spin::bench {

namespace {
double clock_seconds(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown";
}
} // namespace

double thread_cpu_seconds() { return clock_seconds(CLOCK_THREAD_CPUTIME_ID); }
double process_cpu_seconds() { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

std::array<double, 3> load_average() {
  std::array<double, 3> l{-1, -1, -1};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l = {-1, -1, -1};
    std::fclose(f);
  }
  return l;
}

run_conditions measure_conditions() {
  run_conditions c;
  c.buildtype = SPIN_BUILD_TYPE;
  c.optimization = SPIN_BUILD_OPTIMIZATION;
  c.sanitize = SPIN_BUILD_SANITIZE;
#if defined(NDEBUG)
  c.ndebug = true;
#endif
  c.cpu_model = cpu_model_name();
  c.hardware_threads = std::thread::hardware_concurrency();
  c.load_before = load_average();
  // The runtime's own calibration: the cycle figures turn its busy_ns back into its ticks.
  c.tsc_ghz = rt::cycle_counter_ghz();
  bool sanitized = c.sanitize != "none" && !c.sanitize.empty();
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  sanitized = true;
#endif
#endif
  if (sanitized) c.warnings.push_back("sanitizer build (" + c.sanitize + "): numbers are not representative");
  if (c.optimization == "0" || c.optimization == "g")
    c.warnings.push_back("unoptimized build (-O" + c.optimization + "): numbers are not representative");
  if (c.load_before[0] >= 0.5) {
    char b[160];
    std::snprintf(b, sizeof b, "load average %.2f before the run: other processes compete for the %u hardware threads, numbers are noisy",
                  c.load_before[0], c.hardware_threads);
    c.warnings.push_back(b);
  }
  return c;
}

nlohmann::json run_conditions::to_json() const {
  return {{"build", {{"buildtype", buildtype}, {"optimization", optimization}, {"ndebug", ndebug}, {"sanitize", sanitize}}},
          {"cpu_model", cpu_model},
          {"hardware_threads", hardware_threads},
          {"tsc_ghz", tsc_ghz},
          {"load_average_before", load_before},
          {"load_average_after", load_after},
          {"warnings", warnings}};
}

void run_conditions::print(const char* benchmark) const {
  std::printf("%s: build buildtype=%s optimization=%s NDEBUG=%s sanitize=%s\n", benchmark, buildtype.c_str(), optimization.c_str(),
              ndebug ? "defined" : "undefined", sanitize.c_str());
  std::printf("cpu: %s, %u hardware threads, cycle counter %.3f GHz; load average %.2f %.2f %.2f\n", cpu_model.c_str(),
              hardware_threads, tsc_ghz, load_before[0], load_before[1], load_before[2]);
  for (const auto& w : warnings) std::printf("warning: %s\n", w.c_str());
  std::fflush(stdout);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

std::string join(const std::vector<double>& v, const char* sep, int precision) {
  std::string s;
  char b[48];
  for (double x : v) {
    std::snprintf(b, sizeof b, "%.*f", precision, x);
    s += (s.empty() ? "" : sep) + std::string(b);
  }
  return s;
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) {
    std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

std::string run_gnuplot(const std::string& script_path, const std::string& script) {
  if (!write_text(script_path, script)) return "cannot write " + script_path;
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return "gnuplot is not installed (Debian: gnuplot-nox); the script is " + script_path;
  const std::string cmd = "gnuplot '" + script_path + "' 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "cannot run gnuplot";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  if (rc != 0) return "gnuplot failed (status " + std::to_string(rc) + "): " + out;
  return "";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

} // namespace spin::bench
