// Installing and removing a group's aggregation engine on a switch (switch_engine.hpp).
#include "switch_engine.hpp"

#include <spin/coll/engine.hpp>

#include "cmd_key.hpp"
#include "engine_ec.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

namespace spin::coll::detail {

namespace pr = proto;
using clock = std::chrono::steady_clock;

result<void> install_switch_engine(nic_handle& nic, switch_engine& pl, std::uint32_t wire_id, std::uint32_t slots,
                                   std::uint32_t slot_bytes, const pr::switch_setup& setup, const std::vector<std::uint32_t>& members,
                                   const std::vector<std::uint32_t>& leaves, const engine_package& pkg,
                                   const std::array<std::uint8_t, 16>& frame_key) {
  const std::string& sname = nic.name();
  const std::uint32_t inputs = std::max<std::uint32_t>(setup.nranks, setup.nleaves);
  const std::uint64_t stride = engine_detail::slot_stride_bytes(inputs, slot_bytes);
  auto mem = nic.alloc(4096 + 128 + sizeof(pr::switch_setup) + 2 * pr::max_ranks * 4);
  if (!mem.ok()) return fail(mem.err().code, "registering the set-up memory on " + sname + ": " + mem.err().message);
  pl.mem = std::move(mem.value());
  std::byte* base = pl.mem->bytes.data();
  rt::ec_config cfg;
  configure_engine_ec(cfg, wire_id, 64);
  cfg.name = "coll." + std::to_string(wire_id >> 4) + (setup.role == pr::switch_leaf ? ".leaf" : ".switch");
  cfg.handler_mem_bytes = engine_detail::slots_offset() + std::uint64_t{slots} * 2 * stride;
  cfg.window = rt::host_window{pl.mem->region, 0, pl.mem->bytes.size()};
  cfg.frame_key = frame_key;
  auto ec = nic.install(pkg, cfg);
  if (!ec.ok()) return fail(ec.err().code, "installing the aggregation engine on " + sname + ": " + ec.err().message);
  pl.ec = ec.value();
  pl.ec_ok = true;
  // The window: the command key at 0, the command at 64, the set-up and its tables at 128.
  auto key = cmd_key::random();
  if (!key.ok()) return key.err();
  key.value().write(base);
  std::memcpy(base + 128, &setup, sizeof(setup));
  std::memcpy(base + 128 + sizeof(setup), members.data(), members.size() * sizeof(std::uint32_t));
  if (!leaves.empty())
    std::memcpy(base + 128 + sizeof(setup) + members.size() * sizeof(std::uint32_t), leaves.data(),
                leaves.size() * sizeof(std::uint32_t));
  pr::cmd cmd{};
  cmd.type = pr::cmd_switch_setup;
  cmd.desc_off = 128;
  key.value().sign(cmd);
  std::memcpy(base + 64, &cmd, sizeof(cmd));
  host::message msg;
  msg.dest_rank = nic.rank();
  msg.match_bits = pr::match_bits(wire_id, pr::k_cmd);
  msg.message_id = 1;
  msg.region = pl.mem->region;
  msg.offset_bytes = 64;
  msg.len_bytes = sizeof(cmd);
  const auto deadline = nic.now() + std::chrono::seconds(10);
  for (;;) {  // a full transmit queue queued nothing of this one-packet message: try again
    auto r = nic.send(msg);
    if (r.ok()) break;
    if (r.err().code != errc::timeout || nic.now() >= deadline) return r;
  }
  std::array<rt::host_event, 4> evs;
  for (auto now = nic.now(); now < deadline; now = nic.now()) {
    const std::size_t got = nic.wait_events(pl.ec, evs, deadline - now);
    for (std::size_t i = 0; i < got; ++i) {
      if (evs[i].type == rt::host_event::kind::error)
        return fail(errc::fault, "the aggregation engine on " + sname + " failed at set-up");
      if (pr::event_type_of(evs[i].value) == pr::ev_setup)
        return pr::event_detail_of(evs[i].value) == 0
                   ? result<void>()
                   : result<void>(fail(errc::invalid_argument, "the aggregation engine on " + sname + " refused its set-up"));
    }
  }
  return fail(errc::timeout, "the aggregation engine on " + sname + " did not confirm its set-up");
}

void remove_switch_engine(nic_handle& nic, switch_engine& e) {
  if (e.ec_ok) (void)nic.uninstall(e.ec);
  e.ec_ok = false;
  e.mem.reset();
}

} // namespace spin::coll::detail
