// Test helpers: spin-emu processes spawned by a test, with their logs and statistics in a
// private temporary directory (multiproc_test.cpp, tests/collectives/remote_test.cpp).
#pragma once

#include <spin/host/host.hpp>

#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace spin::test {

using namespace std::chrono_literals;

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// True when `name` is "spinmp-<pid>-..." and process <pid> is gone: a run that was killed
/// before its cleanup (a meson timeout) left it.
inline bool stale_name(const std::string& name) {
  if (name.rfind("spinmp-", 0) != 0) return false;
  const long pid = std::strtol(name.c_str() + 7, nullptr, 10);
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

/// A private temporary directory /tmp/spinmp-<pid>-XXXXXX, removed with everything in it (kept,
/// and named on stderr, when SPIN_TEST_KEEP is set: the emulators' logs and statistics files
/// are in it). Stale ones of killed runs are removed first.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/tmp", ec))
      if (e.is_directory(ec) && stale_name(e.path().filename().string())) std::filesystem::remove_all(e.path(), ec);
    std::string tmpl = "/tmp/spinmp-" + std::to_string(::getpid()) + "-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    if (std::getenv("SPIN_TEST_KEEP") != nullptr) {
      std::fprintf(stderr, "multiproc_test: kept %s\n", path.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// One spin-emu process: spawned with its output in a log file, killed (SIGTERM, then SIGKILL)
/// when this object goes if it has not exited. It also dies with the test (PR_SET_PDEATHSIG)
/// and after --duration at the latest.
class emu_process {
public:
  emu_process(std::string name, const std::string& dir) : _name(std::move(name)) {
    socket = dir + "/" + _name + ".sock";
    stats_file = dir + "/" + _name + ".json";
    log_file = dir + "/" + _name + ".log";
  }
  emu_process(const emu_process&) = delete;
  emu_process& operator=(const emu_process&) = delete;
  ~emu_process() { kill(); }

  /// Starts `prefix` (e.g. {"ip", "netns", "exec", NS}, may be empty) + spin-emu + EAL args +
  /// "--" + app args (the control socket, stats file and --duration are added here).
  void start(const std::vector<std::string>& prefix, const std::vector<std::string>& eal, std::vector<std::string> app) {
    app.insert(app.end(), {"--name", _name, "--socket", socket, "--stats-json", stats_file, "--duration", "120"});
    std::vector<std::string> args = prefix;
    args.push_back(SPIN_EMU_BIN);
    args.insert(args.end(), eal.begin(), eal.end());
    args.push_back("--");
    args.insert(args.end(), app.begin(), app.end());
    for (const auto& a : args) command += (command.empty() ? "" : " ") + a;
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int log = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(log >= 0);
    const pid_t parent = ::getpid();
    _pid = ::fork();
    REQUIRE(_pid >= 0);
    if (_pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log);
  }

  /// True while the process runs. An exited process is not reaped here: its state and wait
  /// status come from /proc/<pid>/stat (field 52, exit_code). Reaping (wait4) an exited memif
  /// client can block in the kernel until its memif server process exits too (seen here: a
  /// 118 s wait4 on Linux 6.x), so reap() runs only in the destructor, after the test has
  /// stopped every process of its memif network.
  bool running() {
    if (_pid <= 0 || _exited) return false;
    std::ifstream f("/proc/" + std::to_string(_pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    if (!f.good() && text.empty()) {  // no /proc entry: reap to learn more
      reap();
      return false;
    }
    if (close == std::string::npos || close + 2 >= text.size()) return true;
    const char state = text[close + 2];
    if (state != 'Z' && state != 'X') return true;
    std::istringstream fields(text.substr(close + 2));
    std::string tok;
    for (int field = 3; field <= 52 && fields >> tok; ++field)
      if (field == 52) _status = std::stoi(tok);
    _exited = true;
    return false;
  }

  /// Reaps the process once it has exited (blocks until it has).
  void reap() {
    if (_pid <= 0) return;
    int st = 0;
    if (::waitpid(_pid, &st, 0) == _pid && !_exited) _status = st;
    _exited = true;
    _pid = -1;
  }

  /// Waits until the control socket answers "hello", up to `limit`. Fails with the log when
  /// the process dies first or the time runs out.
  host::client connect(std::chrono::milliseconds limit = 60s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    std::string last;
    while (std::chrono::steady_clock::now() < end) {
      if (!running()) FAIL("spin-emu " << _name << " exited (" << status_text() << ") before its control socket answered\n" << diag());
      if (std::filesystem::exists(socket)) {
        auto c = host::client::connect(socket);
        if (c) return std::move(c.value());
        last = c.err().message;
      }
      std::this_thread::sleep_for(50ms);
    }
    FAIL("spin-emu " << _name << ": control socket " << socket << " did not answer within " << limit.count() << " ms (last error: "
                     << last << ")\n" << diag());
    std::abort();  // not reached: FAIL throws
  }

  /// Waits up to `limit` for the process to exit (without reaping it); returns its wait
  /// status, or nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (running() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(20ms);
    if (!_exited) return std::nullopt;
    return _status;
  }

  /// SIGTERM, then SIGKILL after 5 s; then reaps.
  void kill() {
    if (running()) {
      ::kill(_pid, SIGTERM);
      if (!wait_exit(5s)) {
        ::kill(_pid, SIGKILL);
        (void)wait_exit(5s);
      }
    }
    reap();
  }

  /// SIGKILL without waiting or reaping (a crash: the process says nothing to anyone; reaping a
  /// memif client may block until its server exits, so the destructor reaps).
  void crash() {
    if (running()) ::kill(_pid, SIGKILL);
  }

  /// SIGTERM without waiting.
  void terminate() {
    if (running()) ::kill(_pid, SIGTERM);
  }

  std::string status_text() const {
    if (_status < 0) return "still running";
    if (WIFEXITED(_status)) return "exit status " + std::to_string(WEXITSTATUS(_status));
    if (WIFSIGNALED(_status)) return "killed by signal " + std::to_string(WTERMSIG(_status));
    return "wait status " + std::to_string(_status);
  }
  /// The command line and everything the process printed.
  std::string diag() const { return "$ " + command + "\n" + read_file(log_file); }
  const std::string& name() const { return _name; }

  std::string socket, stats_file, log_file, command;

private:
  std::string _name;
  pid_t _pid = -1;   // until reaped
  bool _exited = false;
  int _status = -1;
};

/// EAL arguments of one emulator: no hugepages, shared config or PCI, its own file prefix.
inline std::vector<std::string> eal_args(const std::string& prefix, const std::string& vdev) {
  return {"--no-huge", "-m", "1024", "--no-shconf", "--no-pci", "--file-prefix=" + prefix, "--no-telemetry",
          "--log-level=lib.eal:error", "--log-level=pmd.net:error", "--vdev=" + vdev};
}


} // namespace spin::test
