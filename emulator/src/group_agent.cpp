// A NIC's group agent: in-band joins (spin/emu/group_agent.hpp).
#include <spin/emu/group_agent.hpp>
#include <spin/emu/groups.hpp>

#include <spin/siphash.hpp>

#include <algorithm>
#include <array>
#include <cstring>

#include <sys/random.h>

namespace spin::emu {

namespace {

using clock = std::chrono::steady_clock;

constexpr std::uint8_t magic = 'G';
constexpr std::uint8_t version = 2;
enum op : std::uint8_t { op_join = 1, op_answer = 2, op_leave = 3, op_keepalive = 4, op_alive = 5, op_give_up = 6 };
constexpr std::size_t header_bytes = 12;
constexpr std::size_t join_fixed_bytes = header_bytes + 4 + 4 + 4 + 8 + 8 + 16 + 4;  // before the members
constexpr std::size_t tag_bytes = 8;  // a sealed datagram's trailer
constexpr std::uint8_t state_error = 255;
constexpr std::size_t max_reason = 1024;
// A member's poll sends its join again only when the last one is unanswered for this long: a
// lost datagram costs one interval, and a member polling fast does not flood the switch with
// copies that could arrive after its group was gone.
constexpr auto join_resend = std::chrono::milliseconds(10);

class writer {
public:
  writer(std::uint8_t o, std::uint32_t group, std::uint32_t me) {
    u8(magic);
    u8(version);
    u8(o);
    u8(0);
    u32(group);
    u32(me);
  }
  void u8(std::uint8_t v) { _b.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) {
    u8(static_cast<std::uint8_t>(v >> 8));
    u8(static_cast<std::uint8_t>(v));
  }
  void u32(std::uint32_t v) {
    u16(static_cast<std::uint16_t>(v >> 16));
    u16(static_cast<std::uint16_t>(v));
  }
  void u64(std::uint64_t v) {
    u32(static_cast<std::uint32_t>(v >> 32));
    u32(static_cast<std::uint32_t>(v));
  }
  void text(const std::string& s) {
    const std::size_t n = std::min(s.size(), max_reason);
    u16(static_cast<std::uint16_t>(n));
    for (std::size_t i = 0; i < n; ++i) u8(static_cast<std::uint8_t>(s[i]));
  }
  std::vector<std::byte>& bytes() { return _b; }

private:
  std::vector<std::byte> _b;
};

// Reads a datagram's body; any read past its end sets `bad` and returns 0.
class reader {
public:
  reader(const std::byte* p, std::size_t n) : _p(p), _n(n) {}
  std::uint8_t u8() {
    if (_i + 1 > _n) return fail_read();
    return static_cast<std::uint8_t>(_p[_i++]);
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>((std::uint16_t{u8()} << 8) | u8()); }
  std::uint32_t u32() { return (std::uint32_t{u16()} << 16) | u16(); }
  std::uint64_t u64() { return (std::uint64_t{u32()} << 32) | u32(); }
  std::string text() {
    const std::uint16_t n = u16();
    if (n > max_reason || _i + n > _n) {
      bad = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(_p + _i), n);
    _i += n;
    return s;
  }
  std::size_t left() const { return _n - _i; }
  bool bad = false;

private:
  std::uint8_t fail_read() {
    bad = true;
    _i = _n;
    return 0;
  }
  const std::byte* _p;
  std::size_t _n, _i = 0;
};

// errc values are 0 and negative: a datagram carries their magnitude.
constexpr std::uint8_t code_of(errc c) { return static_cast<std::uint8_t>(-static_cast<std::int32_t>(c)); }
constexpr std::uint8_t max_code = code_of(errc::fault);

using key16 = std::array<std::uint8_t, 16>;
std::uint64_t mac(const key16& k, const std::byte* p, std::size_t n) { return siphash24(k.data(), reinterpret_cast<const u8*>(p), n); }
// The frame key XOR the key stream of `nonce` (wrapping and unwrapping are the same).
key16 wrap(const key16& mk, std::uint64_t nonce, const key16& in) {
  key16 out = in;
  for (std::uint32_t half = 0; half < 2; ++half) {
    std::uint8_t msg[13 + 8 + 1] = {'s', 'p', 'i', 'n', '-', 'k', 'e', 'y', '-', 'w', 'r', 'a', 'p'};
    for (int i = 0; i < 8; ++i) msg[13 + i] = static_cast<std::uint8_t>(nonce >> (8 * i));
    msg[21] = static_cast<std::uint8_t>(half);
    const std::uint64_t ks = siphash24(mk.data(), msg, sizeof msg);
    for (int i = 0; i < 8; ++i) out[8 * half + static_cast<std::uint32_t>(i)] ^= static_cast<std::uint8_t>(ks >> (8 * i));
  }
  return out;
}

} // namespace

struct group_agent::held {
  std::uint64_t owner = 0;
  host::group_join j;
  std::uint32_t me = 0;
  bool answered = false;
  bool awaiting = false;  // a join was sent and no answer came since
  clock::time_point sent{};
  clock::time_point first{};  // the first ask (answer_timeout runs from here)
  error err;                   // the switch's error, when its answer was one
  host::group_answer answer;  // otherwise
};

std::uint64_t group_agent::member_owner(std::uint32_t rank) noexcept { return (std::uint64_t{1} << 62) | rank; }

result<std::unique_ptr<group_agent>> group_agent::start(nic_control& nic, std::unique_ptr<group_installer> installer,
                                                        group_agent_options o) {
  if (o.lease_term < std::chrono::milliseconds(100) || o.lease_term > std::chrono::hours(1))
    return fail(errc::invalid_argument, "group agent: lease_term out of 100 ms..1 h");
  if (o.tick < std::chrono::milliseconds(1) || o.tick > std::chrono::milliseconds(1000))
    return fail(errc::invalid_argument, "group agent: tick out of 1..1000 ms");
  if (o.answer_timeout < std::chrono::milliseconds(10) || o.answer_timeout > std::chrono::hours(1))
    return fail(errc::invalid_argument, "group agent: answer_timeout out of 10 ms..1 h");
  std::unique_ptr<group_agent> a(new group_agent(nic, std::move(installer), o));
  a->_th = std::thread([p = a.get()] { p->run(); });
  return a;
}

group_agent::group_agent(nic_control& nic, std::unique_ptr<group_installer> installer, group_agent_options o)
    : _nic(nic), _installer(std::move(installer)), _o(o) {}

group_agent::~group_agent() {
  {
    std::lock_guard l(_m);
    _stop = true;
    for (const auto& [k, h] : _held) {
      writer w(op_leave, std::get<1>(k), std::get<2>(k));
      (void)transmit(std::get<0>(k), std::move(w.bytes()));
    }
    _held.clear();
  }
  if (_th.joinable()) _th.join();
  for (std::uint32_t g : _installed) _installer->tear_down(g);
}

group_agent_stats group_agent::stats() const {
  std::lock_guard l(_m);
  return _st;
}

// Seals `d` when this agent has a management key, and sends it.
result<void> group_agent::transmit(std::uint32_t to, std::vector<std::byte> d) {
  if (_o.mgmt_key != key16{}) {
    d[3] = std::byte{1};
    const std::uint64_t t = mac(_o.mgmt_key, d.data(), d.size());
    for (int i = 7; i >= 0; --i) d.push_back(static_cast<std::byte>(t >> (8 * i)));
  }
  return _nic.send_mgmt(to, d);
}

void group_agent::send(std::uint32_t to, std::vector<std::byte> d) {
  // Called with _m held.
  if (transmit(to, std::move(d)).ok())
    _st.datagrams_out++;
  else
    _st.send_errors++;
}

// ---- member side ------------------------------------------------------------------------------

result<host::group_answer> group_agent::join(std::uint64_t owner, std::uint32_t sw, const host::group_join& j, std::uint32_t me) {
  if (sw == _nic.rank()) return fail(errc::invalid_argument, "an in-band join names this NIC (" + _nic.name() + ") as its switch");
  const std::size_t fixed = join_fixed_bytes + tag_bytes;
  const std::size_t room = _nic.max_payload_bytes() > fixed ? (_nic.max_payload_bytes() - fixed) / 4 : 0;
  if (j.members.size() > room)
    return fail(errc::invalid_argument, "an in-band join carries at most " + std::to_string(room) + " members in one packet of " +
                                            _nic.name() + "; this group has " + std::to_string(j.members.size()) +
                                            " (reach the switch's control socket instead)");
  if (j.members.empty() || me >= j.members.size())
    return fail(errc::invalid_argument, "group " + std::to_string(j.group) + ": member index " + std::to_string(me) + " of " +
                                            std::to_string(j.members.size()) + " members");
  if (j.frame_key != key16{} && _o.mgmt_key == key16{})
    return fail(errc::invalid_argument, "group " + std::to_string(j.group) + " authenticates its frames (a job secret), and " + _nic.name() +
                                            " has no management key to send its frame key to the switch in-band (start every "
                                            "spin-emu of the fabric with the same SPIN_MGMT_KEY, or join through the switch's control socket)");
  std::lock_guard l(_m);
  auto& h = _held[{sw, j.group, me}];
  if (h && h->owner != owner)
    return fail(errc::exists, "member " + std::to_string(me) + " of group " + std::to_string(j.group) + " on switch rank " +
                                  std::to_string(sw) + " is joined by another connection of " + _nic.name());
  if (!h || h->j.members != j.members || h->j.slots != j.slots || h->j.proof != j.proof || h->j.frame_key != j.frame_key) {
    h = std::make_unique<held>();
    h->owner = owner;
    h->j = j;
    h->me = me;
  }
  const auto now = clock::now();
  if (h->first == clock::time_point{}) h->first = now;
  if (!h->answered && now - h->first >= _o.answer_timeout)
    return fail(errc::timeout, "switch rank " + std::to_string(sw) + " sent no answer to an in-band join through " + _nic.name() +
                                   " within " + std::to_string(_o.answer_timeout.count()) +
                                   " ms (is its spin-emu running, in switch mode, and linked to this NIC?)");
  // The latest answer: the switch's error or answer, or `wait` until it answered.
  auto latest = [&]() -> result<host::group_answer> {
    if (h->err.code != errc::ok) return h->err;
    if (h->answered) return h->answer;
    host::group_answer a;
    a.state = host::join_state::wait;
    a.reason = "asked the switch (rank " + std::to_string(sw) + ") in-band through " + _nic.name() + "; no answer yet";
    return a;
  };
  if (h->awaiting && now - h->sent < join_resend) return latest();
  writer w(op_join, j.group, me);
  w.u32(j.slots);
  w.u32(j.packet_bytes);
  w.u32(static_cast<std::uint32_t>(_o.lease_term.count()));
  w.u64(j.proof);
  std::uint64_t nonce = 0;
  key16 wrapped{};
  if (j.frame_key != key16{}) {
    if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce))
      return fail(errc::bad_state, "group " + std::to_string(j.group) + ": no random bytes for the key wrap (getrandom failed)");
    wrapped = wrap(_o.mgmt_key, nonce, j.frame_key);
  }
  w.u64(nonce);
  for (std::uint8_t b : wrapped) w.u8(b);
  w.u32(static_cast<std::uint32_t>(j.members.size()));
  for (std::uint32_t m : j.members) w.u32(m);
  if (auto r = transmit(sw, std::move(w.bytes())); !r.ok()) {
    _st.send_errors++;
    return fail(r.err().code, "asking switch rank " + std::to_string(sw) + " in-band: " + r.err().message);
  }
  _st.datagrams_out++;
  h->awaiting = true;
  h->sent = now;
  return latest();
}

result<void> group_agent::give_up(std::uint64_t owner, std::uint32_t sw, const host::group_decision& d) {
  if (d.granted) return fail(errc::invalid_argument, "an in-band group is set up by its switch: a member can only refuse it");
  std::lock_guard l(_m);
  bool found = false;
  for (const auto& [k, h] : _held)
    if (std::get<0>(k) == sw && std::get<1>(k) == d.group && h->owner == owner) {
      writer w(op_give_up, d.group, std::get<2>(k));
      w.text(d.reason);
      send(sw, w.bytes());
      found = true;
    }
  if (!found) return fail(errc::not_found, "group " + std::to_string(d.group) + ": this connection has no in-band join of it");
  return {};
}

void group_agent::leave(std::uint64_t owner, std::uint32_t sw, std::uint32_t group, std::uint32_t me) {
  std::lock_guard l(_m);
  auto it = _held.find({sw, group, me});
  if (it == _held.end() || it->second->owner != owner) return;
  writer w(op_leave, group, me);
  send(sw, w.bytes());
  _held.erase(it);
}

void group_agent::release(std::uint64_t owner) {
  std::lock_guard l(_m);
  for (auto it = _held.begin(); it != _held.end();) {
    if (it->second->owner != owner) {
      ++it;
      continue;
    }
    writer w(op_leave, std::get<1>(it->first), std::get<2>(it->first));
    send(std::get<0>(it->first), w.bytes());
    it = _held.erase(it);
  }
}

void group_agent::on_answer(std::uint32_t from, std::uint32_t group, std::uint32_t me, const std::byte* p, std::size_t n) {
  reader r(p, n);
  const std::uint8_t state = r.u8();
  const std::uint8_t code = r.u8();
  const bool installer = r.u8() != 0;
  (void)r.u8();
  const std::uint32_t words = r.u32();
  if (r.bad || words > r.left() / 4) {
    _st.bad_datagrams++;
    return;
  }
  std::vector<std::uint32_t> lease(words);
  for (auto& w : lease) w = r.u32();
  std::string reason = r.text();
  if (r.bad || (state > static_cast<std::uint8_t>(host::join_state::refused) && state != state_error) ||
      (state == state_error && (code == 0 || code > max_code))) {
    _st.bad_datagrams++;
    return;
  }
  auto it = _held.find({from, group, me});
  if (it == _held.end()) return;  // left meanwhile
  held& h = *it->second;
  h.answered = true;
  h.awaiting = false;
  if (state == state_error) {
    h.err = error{static_cast<errc>(-static_cast<std::int32_t>(code)), "switch rank " + std::to_string(from) + ": " + reason};
    return;
  }
  h.err = error{};
  h.answer.state = static_cast<host::join_state>(state);
  h.answer.installer = installer;
  h.answer.lease = std::move(lease);
  h.answer.reason = std::move(reason);
}

// ---- switch side ------------------------------------------------------------------------------

void group_agent::answer(std::uint32_t to, std::uint32_t group, std::uint32_t me, const result<host::group_answer>& a) {
  writer w(op_answer, group, me);
  if (!a.ok()) {
    w.u8(state_error);
    w.u8(code_of(a.err().code));
    w.u8(0);
    w.u8(0);
    w.u32(0);
    w.text(a.err().message);
  } else {
    w.u8(static_cast<std::uint8_t>(a.value().state));
    w.u8(0);
    w.u8(a.value().installer ? 1 : 0);
    w.u8(0);
    w.u32(static_cast<std::uint32_t>(a.value().lease.size()));
    for (std::uint32_t v : a.value().lease) w.u32(v);
    w.text(a.value().reason);
  }
  send(to, w.bytes());
}

void group_agent::on_join(std::uint32_t from, std::uint32_t group, std::uint32_t me, const std::byte* p, std::size_t n) {
  reader r(p, n);
  host::group_join j;
  j.group = group;
  j.slots = r.u32();
  j.packet_bytes = r.u32();
  const std::uint32_t term_ms = r.u32();
  j.proof = r.u64();
  const std::uint64_t nonce = r.u64();
  key16 wrapped{};
  for (auto& b : wrapped) b = r.u8();
  const std::uint32_t count = r.u32();
  if (r.bad || count != r.left() / 4 || r.left() % 4 != 0) {
    _st.bad_datagrams++;
    return;
  }
  j.members.resize(count);
  for (auto& m : j.members) m = r.u32();
  // Only a sealed datagram (this agent has the management key) carries a wrapped key.
  if (wrapped != key16{} || nonce != 0) j.frame_key = wrap(_o.mgmt_key, nonce, wrapped);
  group_registry& reg = _nic.groups();
  const std::uint64_t owner = member_owner(from);
  const auto term = std::chrono::milliseconds(std::clamp<std::uint32_t>(term_ms, 100, 3600 * 1000));
  if (!reg.renew(owner)) (void)reg.lease(owner, term);
  const host::slot_pool pool = reg.pool().value().pool;
  auto refuse = [&](std::string why) {
    host::group_answer a;
    a.state = host::join_state::refused;
    a.reason = std::move(why);
    answer(from, group, me, a);
  };
  if (me >= j.members.size() || j.members[me] != from) {
    answer(from, group, me,
           fail(errc::invalid_argument, "rank " + std::to_string(from) + " asked to join group " + std::to_string(group) + " as member " +
                                            std::to_string(me) + (me < j.members.size() ? " (rank " + std::to_string(j.members[me]) + ")" : "") +
                                            "; a NIC joins only as itself"));
    return;
  }
  if (!_installer) return refuse(_nic.name() + " (rank " + std::to_string(_nic.rank()) + ") does not aggregate: its spin-emu sets up no switch engines");
  if (j.packet_bytes > pool.slot_bytes)
    return refuse("packets of " + std::to_string(j.packet_bytes) + " bytes do not fit the slots of " + std::to_string(pool.slot_bytes) +
                  " bytes on " + _nic.name());
  auto a = reg.join(owner, j, me);
  if (a.ok() && a.value().state == host::join_state::install) {
    auto lease = _installer->set_up(j, pool.slot_bytes);
    host::group_decision d;
    d.group = group;
    if (lease.ok()) {
      _installed.insert(group);
      _st.groups_set_up++;
      d.granted = true;
      d.lease = lease.value();
    } else {
      d.reason = "setting the group up on " + _nic.name() + ": " + lease.err().message;
    }
    if (auto dr = reg.decide(owner, d); !dr.ok()) a = dr.err();
    else a = reg.join(owner, j, me);
  }
  answer(from, group, me, a);
}

void group_agent::sweep_groups() {
  group_registry& reg = _nic.groups();
  for (auto it = _installed.begin(); it != _installed.end();) {
    if (reg.holds(*it)) {
      ++it;
      continue;
    }
    _installer->tear_down(*it);
    _st.groups_removed++;
    it = _installed.erase(it);
  }
}

// ---- both -------------------------------------------------------------------------------------

void group_agent::handle(const mgmt_datagram& d) {
  _st.datagrams_in++;
  reader r(d.bytes.data(), d.bytes.size());
  const std::uint8_t m = r.u8(), v = r.u8(), o = r.u8();
  const std::uint8_t sealed = r.u8();
  const std::uint32_t group = r.u32(), me = r.u32();
  if (r.bad || m != magic || v != version || sealed > 1 || (sealed == 1 && d.bytes.size() < header_bytes + tag_bytes)) {
    _st.bad_datagrams++;
    return;
  }
  std::size_t len = d.bytes.size();
  if ((sealed == 1) != (_o.mgmt_key != key16{})) {
    _st.forged_datagrams++;
    return;
  }
  if (sealed == 1) {
    len -= tag_bytes;
    std::uint64_t t = 0;
    for (std::size_t i = 0; i < tag_bytes; ++i) t = t << 8 | std::to_integer<std::uint64_t>(d.bytes[len + i]);
    if (mac(_o.mgmt_key, d.bytes.data(), len) != t) {
      _st.forged_datagrams++;
      return;
    }
  }
  const std::byte* body = d.bytes.data() + header_bytes;
  const std::size_t n = len - header_bytes;
  group_registry& reg = _nic.groups();
  const std::uint64_t owner = member_owner(d.source_rank);
  switch (o) {
    case op_join: on_join(d.source_rank, group, me, body, n); break;
    case op_answer: on_answer(d.source_rank, group, me, body, n); break;
    case op_leave:
      reg.leave(owner, group, me);
      break;
    case op_give_up: {
      reader rr(body, n);
      std::string why = rr.text();
      if (rr.bad) {
        _st.bad_datagrams++;
        break;
      }
      (void)reg.decide(owner, host::group_decision{group, false, {}, why.empty() ? "the group's first member gave up" : why});
      break;
    }
    case op_keepalive: {
      reader rr(body, n);
      const std::uint32_t term_ms = rr.u32();
      if (rr.bad) {
        _st.bad_datagrams++;
        break;
      }
      (void)term_ms;
      writer w(op_alive, 0, 0);
      w.u8(reg.renew(owner) ? 1 : 0);
      send(d.source_rank, w.bytes());
      break;
    }
    case op_alive: {
      reader rr(body, n);
      const bool known = rr.u8() != 0;
      if (rr.bad) {
        _st.bad_datagrams++;
        break;
      }
      if (known) break;
      // The switch let this NIC's lease lapse (it released our joins): granted joins are gone.
      for (auto& [k, h] : _held)
        if (std::get<0>(k) == d.source_rank && h->answered && h->err.code == errc::ok &&
            h->answer.state == host::join_state::granted) {
          h->answer = {};
          h->answer.state = host::join_state::refused;
          h->answer.reason = "switch rank " + std::to_string(d.source_rank) + " let " + _nic.name() +
                             "'s lease lapse (no keep-alive arrived in time) and released its joins";
          _st.leases_lost++;
        }
      break;
    }
    default: _st.bad_datagrams++;
  }
  sweep_groups();
}

void group_agent::tick(clock::time_point now) {
  // Switch side: member NICs that went silent.
  const auto gone = _nic.groups().expire(now);
  _st.leases_expired += gone.size();
  sweep_groups();
  // Member side: keep-alives to every switch this NIC holds joins on.
  if (now < _next_keepalive) return;
  _next_keepalive = now + _o.lease_term / 4;
  std::set<std::uint32_t> switches;
  for (const auto& [k, h] : _held) switches.insert(std::get<0>(k));
  for (std::uint32_t sw : switches) {
    writer w(op_keepalive, 0, 0);
    w.u32(static_cast<std::uint32_t>(_o.lease_term.count()));
    send(sw, w.bytes());
  }
}

void group_agent::run() {
  std::array<mgmt_datagram, 32> buf;
  for (;;) {
    const std::size_t n = _nic.wait_mgmt(buf, _o.tick);
    std::lock_guard l(_m);
    if (_stop) return;
    for (std::size_t i = 0; i < n; ++i) handle(buf[i]);
    tick(clock::now());
  }
}

} // namespace spin::emu
