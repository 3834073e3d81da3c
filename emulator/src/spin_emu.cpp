// spin-emu: the sPIN NIC emulator (docs/emulator.md).
//
//   spin-emu [EAL arguments --] [options]
//
// Without EAL arguments it runs EAL without hugepages, shared config or PCI scan (any machine).
// Modes: `nic` drives one emulated NIC on DPDK ports named with --port (a real NIC bound to
// vfio-pci, net_memif, net_af_packet, net_pcap, ...); `cluster` emulates every host and switch
// of a topology file in this process. Both serve the control socket (spinctl, spin::host).
// Flow: arguments -> EAL -> NICs -> control socket -> poll loop on the main lcore until a
// signal, `spinctl stop` or --duration -> statistics.
#include <spin/emu/cluster.hpp>
#include <spin/emu/control.hpp>
#include <spin/emu/eal.hpp>
#include <spin/emu/lcore.hpp>
#include <spin/emu/nic.hpp>
#include <spin/emu/pcap.hpp>
#include <spin/emu/port.hpp>
#include <spin/emu/topology.hpp>

#include <CLI/CLI.hpp>

#include <rte_eal.h>
#include <rte_ethdev.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <vector>

#ifdef SPIN_EMU_GROUP_AGENTS
#include <spin/coll/switch_agent.hpp>
#include <spin/emu/group_agent.hpp>
#include <spin/host/env.hpp>
#endif

#ifdef SPIN_EMU_VIRTUAL_TIME
#include <spin/sim/cluster.hpp>
#include <spin/sim/remote.hpp>
#endif

#ifdef SPIN_EMU_TRUSTED_ENGINE
namespace spin::emu {
std::span<const std::byte> trusted_coll_engine();  // the standard collective engine (trusted_engine.cpp)
}
#endif

namespace {

std::atomic<bool> stop_flag{false};
extern "C" void on_signal(int) { stop_flag.store(true); }

std::string default_socket() {
  if (const char* s = std::getenv("SPIN_EMU_SOCKET"); s != nullptr && *s != '\0') return s;
  return "/run/spin-emu.sock";
}

int die(const std::string& msg) {
  std::fprintf(stderr, "spin-emu: %s\n", msg.c_str());
  return 1;
}

int usage(const std::string& msg) {
  std::fprintf(stderr, "spin-emu: %s (see --help)\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Split DPDK's EAL arguments (before "--") from ours.
  std::vector<std::string> eal;
  int app_start = 1;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--") {
      eal.assign(argv, argv + i);
      app_start = i + 1;
      break;
    }
  std::vector<std::string> app_args;
  for (int i = app_start; i < argc; ++i) app_args.emplace_back(argv[i]);

  CLI::App app{"spin-emu [EAL arguments --] [options]: sPIN SmartNIC emulator on DPDK (docs/emulator.md).\n"
               "EAL arguments go first, ended by `--` (e.g. `--vdev=net_memif0,role=server --`); without them\n"
               "EAL runs without hugepages, shared config and PCI scan. Exit status: 0 after a clean stop,\n"
               "1 on a run-time error, 2 on a command-line error."};
  app.option_defaults()->always_capture_default();
  app.name("spin-emu");
  std::string mode, topology_file, socket_path = default_socket(), capture, capture_dir, replay, stats_json, name = "nic0";
  std::vector<std::string> port_names;
  std::uint32_t rank = 0, hpus = 1, payload = 1024, burst = 32, max_frame = 9216, mbuf_bytes = 2048, pool = 8191;
  std::uint32_t nic_mem_mib = 64, lcores = 0;
  std::uint16_t udp_port = spin::rt::wire::default_udp_port;
  std::vector<int> hpu_cpus;
  double duration_s = 0;
  bool no_socket = false, quiet = false, plain_hpus = false;
  std::uint32_t progress_s = 0;
  std::vector<std::string> route_specs;
  std::string native_packages;
  bool virtual_time = false;
  std::uint32_t actors = 0;
  app.add_flag("--virtual-time", virtual_time,
               "cluster mode: run the topology in virtual time (spin::sim, docs/virtual-time.md): every NIC, link and "
               "switch is modelled, host programs of other processes are actors that attach over the control socket");
  app.add_option("--actors", actors,
                 "virtual time: host programs (one process per host node, nodes 0..N-1 of the topology's hosts) that must "
                 "attach before virtual time starts; a round ends when all have left (default: every host)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--mode", mode,
                 "nic (one NIC on --port devices), switch (a switch on two or more --port devices, forwarding by "
                 "--route), or cluster (a --topology); default: cluster when --topology is given")
      ->check(CLI::IsMember({"nic", "switch", "cluster"}));
  app.add_option("--route", route_specs,
                 "switch mode: RANK=PORT or FIRST-LAST=PORT: frames for these ranks leave on --port number PORT "
                 "(0-based); repeatable");
  app.add_option("--native-packages", native_packages,
                 "which native handler packages the control socket installs: any, or trusted (only the standard "
                 "collective engine: user code on a switch that several jobs share must be eBPF); default: trusted in "
                 "switch mode, any otherwise")
      ->check(CLI::IsMember({"any", "trusted"}));
  std::uint32_t group_lease_ms = 3000;
  app.add_option("--group-lease-ms", group_lease_ms,
                 "in-band groups: the lease this NIC asks of a switch for its joins, renewed by keep-alives every quarter "
                 "of it; a switch releases the joins of a member NIC that stays silent this long")
      ->check(CLI::Range(100, 3600 * 1000));
  app.add_option("--topology", topology_file, "cluster topology file (TOML; docs/emulator.md)")->check(CLI::ExistingFile);
  app.add_option("--port", port_names, "nic mode: DPDK port by device name (net_memif0, 0000:3b:00.0, ...); repeatable");
  app.add_option("--rank", rank,
                 "nic and switch modes: this node's rank (its address: MAC 02:53:50:00:hi:lo, IPv4 10.83.hi.lo); "
                 "switch mode default 65535")
      ->check(CLI::Range(0, 65535));
  app.add_option("--name", name, "nic mode: name in statistics and on the control socket");
  app.add_option("--hpus", hpus,
                 "nic mode: HPUs, each an lcore (thread) that polls and runs its messages' handlers to completion; "
                 "HPU 0 also owns the ports (cluster mode: from the topology)")
      ->check(CLI::Range(1, 256));
  app.add_option("--hpu-cpus", hpu_cpus, "nic mode: pin the lcore of HPU i to CPU list[i % n]");
  // Removed with the run-to-completion data path: say so instead of "unknown option".
  app.add_flag("--plain-hpu-threads", plain_hpus)->group("");
  app.add_option("--lcores", lcores, "cluster mode: lcores the nodes' HPUs and the links are spread over (default: every CPU this process may use)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--nic-memory-mib", nic_mem_mib, "NIC memory per node (MiB): handler memory and scratchpads")->check(CLI::Range(1, 65536));
  app.add_option("--payload-bytes", payload, "payload bytes per packet of host messages")->check(CLI::Range(1, 65000));
  app.add_option("--max-frame", max_frame, "largest frame (bytes); longer ones are dropped as oversize")->check(CLI::Range(128, 65535));
  app.add_option("--mbuf-bytes", mbuf_bytes, "mbuf data room (bytes); frames longer than this need RX scatter")->check(CLI::Range(128, 65000));
  app.add_option("--pool-mbufs", pool, "mbufs per port pool")->check(CLI::Range(64, 1 << 22));
  app.add_option("--burst", burst, "RX/TX burst (packets)")->check(CLI::Range(1, 512));
  app.add_option("--udp-port", udp_port, "UDP port of spin packets");
  app.add_option("--socket", socket_path, "control socket path (default $SPIN_EMU_SOCKET or /run/spin-emu.sock)");
  app.add_flag("--no-socket", no_socket, "do not open a control socket");
  app.add_option("--capture", capture, "nic mode: write every frame of the NIC to this pcap file (cluster mode: --capture-dir)");
  app.add_option("--capture-dir", capture_dir, "cluster mode: write <node>.pcap for every node into this directory");
  app.add_option("--replay", replay, "nic mode: feed the frames of this pcap file into the NIC at start")->check(CLI::ExistingFile);
  app.add_option("--duration", duration_s, "stop after this many seconds (0: run until a signal or `spinctl stop`)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--progress", progress_s, "print a one-line status every N seconds (0: off)");
  app.add_option("--stats-json", stats_json, "write the final statistics as JSON to this file");
  app.add_flag("-q,--quiet", quiet, "do not print the final statistics");
  try {
    std::reverse(app_args.begin(), app_args.end());
    app.parse(app_args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError too
  }
  if (plain_hpus)
    return usage("--plain-hpu-threads is gone: HPUs are now the lcores that poll (run to completion), registered with EAL");
  if (mode.empty()) mode = topology_file.empty() ? "nic" : "cluster";
  for (int cpu : hpu_cpus)
    if (const long online = sysconf(_SC_NPROCESSORS_ONLN); cpu < 0 || cpu >= CPU_SETSIZE || (online > 0 && cpu >= online))
      return usage("--hpu-cpus: CPU " + std::to_string(cpu) + " is not online (this machine has " + std::to_string(online) + ")");
  const bool switch_mode = mode == "switch";
  if (switch_mode) {
    mode = "nic";  // a switch is a NIC with several ports and a route table
    if (app.count("--rank") == 0) rank = spin::emu::max_rank;
    if (app.count("--name") == 0) name = "switch0";
  }
  if (!switch_mode && !route_specs.empty()) return usage("--route is for switch mode");
  if (switch_mode && port_names.size() < 2) return usage("switch mode needs two or more --port devices");
  if (switch_mode && route_specs.empty()) return usage("switch mode needs --route RANK=PORT for the ranks behind each port");
  std::vector<std::int32_t> routes;
  if (switch_mode) {
    routes.assign(std::size_t{spin::emu::max_rank} + 1, -1);
    for (const auto& spec : route_specs) {
      unsigned long first = 0, last = 0, port = 0;
      char dash = 0, eq = 0;
      int used = 0;
      const bool range = std::sscanf(spec.c_str(), "%lu%c%lu%c%lu%n", &first, &dash, &last, &eq, &port, &used) == 5 &&
                         dash == '-' && eq == '=' && static_cast<std::size_t>(used) == spec.size();
      if (!range) {
        used = 0;
        if (std::sscanf(spec.c_str(), "%lu%c%lu%n", &first, &eq, &port, &used) != 3 || eq != '=' ||
            static_cast<std::size_t>(used) != spec.size())
          return usage("--route " + spec + ": expected RANK=PORT or FIRST-LAST=PORT");
        last = first;
      }
      if (first > last || last > spin::emu::max_rank)
        return usage("--route " + spec + ": ranks must be an increasing range in 0..65535");
      if (port >= port_names.size())
        return usage("--route " + spec + ": port " + std::to_string(port) + " is not one of the " +
                     std::to_string(port_names.size()) + " --port devices (0-based)");
      for (unsigned long r = first; r <= last; ++r) routes[r] = static_cast<std::int32_t>(port);
    }
  }
  if (mode == "cluster" && topology_file.empty()) return usage("cluster mode needs --topology FILE");
  // Options of the other mode are refused, not ignored.
  for (const char* opt : {"--topology", "--capture-dir", "--lcores"})
    if (mode == "nic" && app.count(opt) != 0) return usage(std::string(opt) + " is for cluster mode");
  for (const char* opt : {"--port", "--rank", "--name", "--hpus", "--hpu-cpus"})
    if (mode == "cluster" && app.count(opt) != 0)
      return usage(std::string(opt) + " is for nic mode (in cluster mode the topology file names nodes, ranks and HPUs)");
  if (mode == "cluster" && app.count("--capture") != 0) return usage("--capture is for nic mode; in cluster mode use --capture-dir DIR");
  if (mode == "cluster" && app.count("--replay") != 0) return usage("--replay is for nic mode");
  if (virtual_time && mode != "cluster") return usage("--virtual-time is for cluster mode (--topology FILE)");
  if (app.count("--actors") != 0 && !virtual_time) return usage("--actors is for --virtual-time");
  if (virtual_time) {
#ifndef SPIN_EMU_VIRTUAL_TIME
    return usage("--virtual-time: this spin-emu was built without spin::sim (a build without spinc); use build/collectives/spin-emu");
#endif
    for (const char* opt : {"--capture-dir", "--lcores", "--pool-mbufs", "--mbuf-bytes", "--burst", "--max-frame", "--udp-port"})
      if (app.count(opt) != 0) return usage(std::string(opt) + " is for wall-clock time; --virtual-time models the NICs (docs/virtual-time.md)");
    if (app.count("--nic-memory-mib") != 0)
      return usage("--nic-memory-mib is for wall-clock time; in virtual time the topology file's [nic] memory_bytes sets it");
    if (no_socket) return usage("--virtual-time needs the control socket: its host programs attach through it");
  }
  if (mode == "nic" && port_names.empty())
    return usage("nic mode needs --port DEVICE (for example: spin-emu --vdev=net_memif0,role=server -- --port net_memif0)");

  if (eal.empty()) eal = spin::emu::default_eal_args("spin-emu-" + std::to_string(getpid()));
  if (auto r = spin::emu::eal_init(eal); !r) return die(r.err().message);

  spin::rt::runtime_config rc;
  rc.hpus = hpus;
  rc.nic_memory_bytes = std::uint64_t{nic_mem_mib} << 20;
  rc.udp_port = udp_port;
  spin::emu::port_options po;
  po.max_frame_bytes = max_frame;
  po.mbuf_data_bytes = static_cast<std::uint16_t>(mbuf_bytes);
  po.pool_mbufs = pool;

  std::unique_ptr<spin::emu::nic> nic;
  std::unique_ptr<spin::emu::cluster> cluster;
  std::vector<spin::emu::nic_control*> controls;
  std::vector<bool> aggregates;  // by node: sets up the groups it grants in-band (a switch)
  if (mode == "nic") {
    spin::emu::nic_config nc;
    nc.name = name;
    nc.rank = rank;
    nc.port = po;
    nc.runtime = rc;
    nc.payload_bytes = payload;
    nc.burst = burst;
    nc.capture_path = capture;
    nc.routes = routes;
    for (const auto& pn : port_names) {
      auto id = spin::emu::find_port(pn);
      if (!id) return die(id.err().message);
      nc.ports.push_back(*id);
    }
    auto n = spin::emu::nic::create(nc);
    if (!n) return die(n.err().message);
    nic = std::move(n.value());
    controls.push_back(nic.get());
    aggregates.push_back(switch_mode);
  }
#ifdef SPIN_EMU_VIRTUAL_TIME
  std::unique_ptr<spin::sim::cluster> vt;
  std::unique_ptr<spin::sim::remote_hosts> remote;
  if (virtual_time) {
    auto t = spin::emu::load_topology_file(topology_file);
    if (!t) return die(t.err().message);
    spin::sim::options so;
    if (app.count("--payload-bytes") != 0) so.payload_bytes = payload;
    auto c = spin::sim::cluster::create(*t, so);
    if (!c) return die(c.err().message);
    vt = std::move(c.value());
    std::vector<std::uint32_t> hosts;
    for (std::uint32_t i = 0; i < t->nodes.size(); ++i)
      if (t->nodes[i].kind == spin::emu::node_kind::host) hosts.push_back(i);
    if (actors > hosts.size())
      return usage("--actors " + std::to_string(actors) + ": the topology has " + std::to_string(hosts.size()) + " hosts");
    if (actors != 0) hosts.resize(actors);
    auto r = spin::sim::remote_hosts::create(*vt, hosts);
    if (!r) return die(r.err().message);
    remote = std::move(r.value());
    controls = vt->controls();
    aggregates.assign(controls.size(), false);  // no group agents: in-band joins need management datagrams
  }
  if (mode == "cluster" && !virtual_time) {
#else
  if (mode == "cluster") {
#endif
    auto t = spin::emu::load_topology_file(topology_file);
    if (!t) return die(t.err().message);
    spin::emu::cluster_options co;
    if (app.count("--pool-mbufs") != 0) co.port.pool_mbufs = pool;
    co.port.max_frame_bytes = max_frame;
    // The cluster's defaults (4 KiB mbufs and host packets) unless given.
    if (app.count("--mbuf-bytes") != 0) co.port.mbuf_data_bytes = static_cast<std::uint16_t>(mbuf_bytes);
    co.runtime = rc;
    if (app.count("--payload-bytes") != 0) co.payload_bytes = payload;
    co.burst = burst;
    co.capture_dir = capture_dir;
    co.lcores = lcores;
    auto c = spin::emu::cluster::create(*t, co);
    if (!c) return die(c.err().message);
    cluster = std::move(c.value());
    controls = cluster->controls();
    for (const auto& n : t->nodes) aggregates.push_back(n.kind == spin::emu::node_kind::switch_);
  }

  // Every node's group agent: in-band joins, as a member (its ranks ask through it) and as a
  // switch (it answers and sets groups up).
  std::vector<std::unique_ptr<spin::emu::group_agent>> agents;
#ifdef SPIN_EMU_GROUP_AGENTS
  // The fabric's management key: from the environment, so that it shows in no process list.
  auto mgmt_key = spin::host::env_secret("SPIN_MGMT_KEY");
  if (!mgmt_key) return die(mgmt_key.err().message);
  for (std::size_t i = 0; i < controls.size() && !virtual_time; ++i) {
    spin::emu::group_agent_options ao;
    ao.lease_term = std::chrono::milliseconds(group_lease_ms);
    if (*mgmt_key) ao.mgmt_key = **mgmt_key;
    auto a = spin::emu::group_agent::start(*controls[i], aggregates[i] ? spin::coll::switch_group_installer(*controls[i]) : nullptr, ao);
    if (!a) return die(a.err().message);
    agents.push_back(std::move(a.value()));
  }
#endif

  std::unique_ptr<spin::emu::control_server> server;
  if (!no_socket) {
    spin::emu::server_options so;
    so.socket_path = socket_path;
    so.nodes = controls;
    for (auto& a : agents) so.agents.push_back(a.get());
    so.on_stop = [] { stop_flag.store(true); };
#ifdef SPIN_EMU_VIRTUAL_TIME
    if (remote) {
      so.scheduler = remote.get();
      so.max_connections = std::max<std::size_t>(so.max_connections, 4 * controls.size());
    }
#endif
    if (native_packages.empty()) native_packages = switch_mode ? "trusted" : "any";
    if (native_packages == "trusted") {
      so.native = spin::emu::server_options::native_policy::trusted;
#ifdef SPIN_EMU_TRUSTED_ENGINE
      so.trusted_packages.push_back(spin::emu::trusted_coll_engine());
#endif
    }
    auto s = spin::emu::control_server::start(so);
    if (!s) return die("control socket: " + s.err().message);
    server = std::move(s.value());
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (!quiet) {
    std::printf("spin-emu: %s mode%s, %zu node(s)%s%s\n", switch_mode ? "switch" : mode.c_str(),
                virtual_time ? " in virtual time" : "", controls.size(), no_socket ? "" : ", control socket ",
                no_socket ? "" : socket_path.c_str());
    std::fflush(stdout);
  }

  if (!replay.empty()) {
    auto reader = spin::emu::pcap_reader::open(replay);
    if (!reader) return die(reader.err().message);
    spin::emu::frame_view f;
    std::uint64_t fed = 0, skipped = 0;
    while (reader->next(f)) {
      if (f.truncated() || nic->inject(f.bytes) != spin::errc::ok) {
        ++skipped;
        continue;
      }
      ++fed;
    }
    if (auto e = reader->error()) return die("replay: " + e->message + " (" + std::to_string(fed) + " frames were fed before it)");
    if (!quiet) std::printf("spin-emu: replayed %llu frames from %s (%llu skipped: truncated in the capture or too long)\n",
                            static_cast<unsigned long long>(fed), replay.c_str(), static_cast<unsigned long long>(skipped));
  }

  // The main lcore polls; a watcher thread ends the run on --duration and prints progress.
  std::thread watcher([&] {
    const auto start = std::chrono::steady_clock::now();
    auto next_progress = start + std::chrono::seconds(progress_s);
    while (!stop_flag.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto now = std::chrono::steady_clock::now();
      if (duration_s > 0 && now - start >= std::chrono::duration<double>(duration_s)) stop_flag.store(true);
#ifdef SPIN_EMU_VIRTUAL_TIME
      if (progress_s > 0 && now >= next_progress && remote) {
        // Virtual time: which host nodes still have no host program (time stands still until
        // every one has).
        next_progress += std::chrono::seconds(progress_s);
        const auto st = remote->stats();
        std::string waiting;
        for (std::uint32_t n : remote->unbound()) waiting += (waiting.empty() ? "" : ", ") + controls[n]->name();
        std::printf("spin-emu: %.0f s: virtual time: round %llu, %llu host programs so far, %s\n",
                    std::chrono::duration<double>(now - start).count(), static_cast<unsigned long long>(st.rounds + 1),
                    static_cast<unsigned long long>(st.processes),
                    waiting.empty() ? "every host node has its program" : ("waiting for the host programs of " + waiting).c_str());
        std::fflush(stdout);
      }
#endif
      if (progress_s > 0 && now >= next_progress && !virtual_time) {
        next_progress += std::chrono::seconds(progress_s);
        std::uint64_t rx = 0, tx = 0, drops = 0;
        for (auto* c : controls) {
          auto* n = static_cast<spin::emu::nic*>(c);
          const auto s = n->stats();
          for (const auto& p : s.ports) {
            rx += p.rx_packets;
            tx += p.tx_packets;
          }
          for (auto d : s.drops) drops += d;
        }
        std::printf("spin-emu: %.0f s: rx %llu, tx %llu packets, %llu drops\n",
                    std::chrono::duration<double>(now - start).count(), static_cast<unsigned long long>(rx),
                    static_cast<unsigned long long>(tx), static_cast<unsigned long long>(drops));
        std::fflush(stdout);
      }
    }
#ifdef SPIN_EMU_VIRTUAL_TIME
    if (remote) remote->stop();  // the host programs' actors end; run() below returns
#endif
  });
  if (nic && nic->lanes() == 1 && hpu_cpus.empty()) {
    nic->run(stop_flag);
  } else if (nic) {
    // One lcore per HPU: lane 0 (the ports) on this thread, the others on EAL-registered threads.
    std::vector<std::thread> lcores;
    for (std::uint32_t k = 1; k < nic->lanes(); ++k) {
      const int cpu = hpu_cpus.empty() ? -1 : hpu_cpus[k % hpu_cpus.size()];
      auto t = spin::emu::start_lcore([&nic, k] { nic->run_lane(k, stop_flag); }, cpu);
      if (!t) {
        stop_flag.store(true);
        std::fprintf(stderr, "spin-emu: %s\n", t.err().message.c_str());
        break;
      }
      lcores.push_back(std::move(t.value()));
    }
    if (!hpu_cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(hpu_cpus[0], &set);
      if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        std::fprintf(stderr, "spin-emu: cannot pin HPU 0's lcore to CPU %d; it runs unpinned\n", hpu_cpus[0]);
    }
    nic->run_lane(0, stop_flag);
    for (auto& t : lcores) t.join();
  } else if (cluster) {
    cluster->run(stop_flag);
  }
  int exit_status = 0;
#ifdef SPIN_EMU_VIRTUAL_TIME
  // Virtual time: rounds of host programs on one clock, until a stop.
  for (std::uint64_t round = 1; vt; ++round) {
    remote->spawn_round();
    auto r = vt->run();
    if (!r) {
      // Not expected (every host program's wait has a deadline, request_scheduler::max_wait),
      // but if it happens, actors still wait inside requests that reference the server and the
      // cluster: leave without destroying either.
      (void)die("virtual time: " + r.err().message + "; exiting");
      std::fflush(nullptr);
      std::_Exit(1);
    }
    if (stop_flag.load()) break;
    if (!quiet) {
      const auto st = remote->stats();
      std::printf("spin-emu: virtual time: round %llu ended at %.3f us of virtual time (%llu host programs so far)\n",
                  static_cast<unsigned long long>(round), static_cast<double>(vt->now().count()) / 1e6,
                  static_cast<unsigned long long>(st.processes));
      std::fflush(stdout);
    }
  }
#endif
  watcher.join();
  // Host messages still waiting for the (now stopped) poll loop end at once, so that the control
  // server's workers return before it stops.
  if (nic) nic->cancel_sends();
  if (cluster)
    for (std::uint32_t i = 0; i < cluster->node_count(); ++i) cluster->node(i).cancel_sends();
  if (server) server->stop();  // virtual time: run() has returned, so the simulation stands still
  agents.clear();  // after the server (it holds them); leaves they send now are best effort

  std::string text, json;
  if (nic) {
    nic->quiesce(std::chrono::milliseconds(500));
    const auto s = nic->stats();
    text = to_text(s);
    json = to_json(s);
  } else if (cluster) {
    cluster->quiesce(std::chrono::milliseconds(500));
    const auto s = cluster->stats();
    text = spin::emu::to_text(s);
    json = spin::emu::to_json(s);
  }
#ifdef SPIN_EMU_VIRTUAL_TIME
  if (vt) {
    const auto s = vt->stats();
    text = "virtual time (spin::sim; docs/virtual-time.md):\n" + spin::sim::to_text(s);
    json = spin::sim::to_json(s);
  }
#endif
  if (!quiet) std::printf("%s", text.c_str());
  if (!stats_json.empty()) {
    std::ofstream out(stats_json);
    out << json << "\n";
    if (!out) exit_status = die("cannot write " + stats_json);
  }
  // As DPDK's examples do: release the NICs, close every port (PMDs such as af_xdp hold kernel
  // sockets and BPF objects until then) and clean up EAL.
  server.reset();
  nic.reset();
  cluster.reset();
#ifdef SPIN_EMU_VIRTUAL_TIME
  remote.reset();
  vt.reset();
#endif
  std::uint16_t pid = 0;
  RTE_ETH_FOREACH_DEV(pid) (void)rte_eth_dev_close(pid);
  const std::string runtime_dir = rte_eal_get_runtime_dir();
  (void)rte_eal_cleanup();
  (void)::rmdir(runtime_dir.c_str());  // EAL leaves its (empty, with --no-shconf) runtime directory
  return exit_status;
}
