// spinctl: command-line front end of spin-emu's control socket (spin/emu/control.hpp).
//
//   spinctl [--socket PATH] nodes
//   spinctl [--socket PATH] stats [--json [--pretty]]
//   spinctl [--socket PATH] install NODE PACKAGE [--name N] [--match-bits X] [--ignore-mask Y] [--budget-ns N]
//   spinctl [--socket PATH] uninstall NODE EC
//   spinctl [--socket PATH] stop
//
// NODE is a node's name or index (as `nodes` prints them). The socket defaults to
// $SPIN_EMU_SOCKET, else /run/spin-emu.sock. ECs installed by spinctl persist after it exits.
// Exit status 0 on success, 1 with the server's error on stderr otherwise.
#include <spin/host/host.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

int report(const spin::error& e) {
  std::cerr << "spinctl: " << spin::errc_name(e.code) << ": " << e.message << "\n";
  return 1;
}

// Resolves a node given by name or index.
spin::result<std::uint32_t> resolve_node(spin::host::client& c, const std::string& node) {
  auto nodes = c.nodes();
  if (!nodes) return nodes.err();
  for (const auto& n : *nodes)
    if (n.name == node || std::to_string(n.node) == node) return n.node;
  std::string known;
  for (const auto& n : *nodes) known += (known.empty() ? "" : ", ") + n.name + " (" + std::to_string(n.node) + ")";
  return spin::fail(spin::errc::not_found, "no node '" + node + "'; nodes: " + known);
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"spinctl: control a running spin-emu through its control socket"};
  app.require_subcommand(1);
  const char* env = std::getenv("SPIN_EMU_SOCKET");
  std::string socket = env != nullptr && *env != '\0' ? env : "/run/spin-emu.sock";
  app.add_option("--socket", socket, "control socket path (default: $SPIN_EMU_SOCKET or /run/spin-emu.sock)");

  auto* nodes_cmd = app.add_subcommand("nodes", "list the emulated NICs (index, name, rank)");

  bool as_json = false, pretty = false;
  auto* stats_cmd = app.add_subcommand("stats", "print every NIC's statistics as tables (as spin-emu does at exit)");
  stats_cmd->add_flag("--json", as_json, "print them as one JSON array of {node, name, rank, stats} instead");
  stats_cmd->add_flag("--pretty", pretty, "indent the JSON")->needs("--json");

  std::string node, package, name;
  std::uint64_t match_bits = 0, ignore_mask = 0, budget_ns = 0;
  auto* install_cmd = app.add_subcommand("install", "install an EC from a handler package (persists after spinctl exits)");
  install_cmd->add_option("NODE", node, "node name or index")->required();
  install_cmd->add_option("PACKAGE", package, "handler package (.spkg)")->required()->check(CLI::ExistingFile);
  install_cmd->add_option("--name", name, "EC name (default: the package file name)");
  install_cmd->add_option("--match-bits", match_bits, "match bits (decimal or 0x hex)");
  install_cmd->add_option("--ignore-mask", ignore_mask, "match bits to ignore (decimal or 0x hex)");
  install_cmd->add_option("--budget-ns", budget_ns, "handler time budget in ns (default: the runtime's)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{3'600'000'000'000}));

  std::uint32_t ec_id = 0;
  auto* uninstall_cmd = app.add_subcommand("uninstall", "uninstall an EC");
  uninstall_cmd->add_option("NODE", node, "node name or index")->required();
  uninstall_cmd->add_option("EC", ec_id, "EC id (as install printed it)")->required();

  auto* stop_cmd = app.add_subcommand("stop", "stop spin-emu");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // command-line errors: 2 (--help: 0)
  }

  auto c = spin::host::client::connect(socket);
  if (!c) return report(c.err());

  if (nodes_cmd->parsed()) {
    auto nodes = c->nodes();
    if (!nodes) return report(nodes.err());
    for (const auto& n : *nodes) std::cout << n.node << " " << n.name << " rank " << n.rank << "\n";
    return 0;
  }
  if (stats_cmd->parsed()) {
    auto s = c->stats();
    if (!s) return report(s.err());
    if (!as_json) {
      for (const auto& n : *s) std::cout << spin::host::to_text(n.stats);
    } else if (pretty) {
      std::cout << nlohmann::json::parse(spin::host::to_json(*s)).dump(2) << "\n";
    } else {
      std::cout << spin::host::to_json(*s) << "\n";
    }
    return 0;
  }
  if (install_cmd->parsed()) {
    auto n = resolve_node(*c, node);
    if (!n) return report(n.err());
    spin::host::install_options o;
    o.package = package;
    if (name.empty()) {
      name = package.substr(package.find_last_of('/') + 1);
      if (name.size() > 64) name.resize(64);
    }
    o.name = name;
    o.match.bits = match_bits;
    o.match.ignore_mask = ignore_mask;
    if (budget_ns != 0) o.limits.handler_budget = std::chrono::nanoseconds(budget_ns);
    o.life = spin::host::lifetime::persist;
    auto e = c->install(*n, o);
    if (!e) return report(e.err());
    std::cout << e->id << "\n";
    return 0;
  }
  if (uninstall_cmd->parsed()) {
    auto n = resolve_node(*c, node);
    if (!n) return report(n.err());
    auto r = c->uninstall(spin::host::ec{*n, ec_id});
    if (!r) return report(r.err());
    return 0;
  }
  if (stop_cmd->parsed()) {
    auto r = c->stop_emulator();
    if (!r) return report(r.err());
    return 0;
  }
  return 1;
}
