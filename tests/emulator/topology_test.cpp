// Topology files: parsing, every error with its place, routes, generators and the TOML round trip.
#include <doctest/doctest.h>

#include <spin/emu/topology.hpp>

#include <string>

using namespace spin::emu;
using namespace std::chrono_literals;

namespace {

const std::string dir = std::string(SPIN_SOURCE_ROOT) + "/tests/emulator/topologies/";

// Parses `text` as "t.toml"; the parse must fail with a message containing every piece.
void check_error(const std::string& text, std::initializer_list<const char*> pieces) {
  const auto r = parse_topology(text, "t.toml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == spin::errc::invalid_argument);
  INFO("message: " << r.err().message);
  for (const char* p : pieces) CHECK(r.err().message.find(p) != std::string::npos);
}

const char* two_hosts = "[[host]]\nname = \"h0\"\n[[host]]\nname = \"h1\"\n";

}  // namespace

TEST_SUITE("unit") {

TEST_CASE("a good file gives hosts first, ports in link order, defaults and per-link values") {
  const auto r = load_topology_file(dir + "good.toml");
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  const topology& t = r.value();
  REQUIRE(t.nodes.size() == 4);
  REQUIRE(t.links.size() == 3);
  CHECK(t.host_count() == 3);
  CHECK(t.nodes[0] == node{node_kind::host, "h0", 0, 1, {0}});
  CHECK(t.nodes[1] == node{node_kind::host, "h1", 7, 4, {1}});
  CHECK(t.nodes[2] == node{node_kind::host, "h2", 2, 1, {2}});
  CHECK(t.nodes[3] == node{node_kind::switch_, "s0", 0, 1, {0, 1, 2}});
  CHECK(t.find("s0") == 3u);
  CHECK_FALSE(t.find("s1").has_value());
  CHECK(t.host_of_rank(7) == 1u);
  CHECK_FALSE(t.host_of_rank(1).has_value());

  link_model d;
  d.rate_gbps = 100;
  d.latency = 1000ns;
  d.seed = 40;  // [defaults] seed + link index 0
  CHECK(t.links[0] == link_spec{0, 3, 0, 0, d});

  link_model m1;
  m1.rate_gbps = 25.5;
  m1.latency = 500ns;
  m1.loss = 0.01;
  m1.duplicate = 0.002;
  m1.reorder = 0.003;
  m1.reorder_delay = 20000ns;
  m1.seed = 7;
  m1.queue_packets = 128;
  m1.on_full = overflow_policy::backpressure;
  CHECK(t.links[1] == link_spec{1, 3, 0, 1, m1});

  link_model d2 = d;
  d2.seed = 42;
  CHECK(t.links[2] == link_spec{3, 2, 2, 0, d2});
  CHECK(validate(t).ok());
}

TEST_CASE("a missing file is not_found with the path and the reason") {
  const auto r = load_topology_file(dir + "no-such-file.toml");
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == spin::errc::not_found);
  CHECK(r.err().message.find("no-such-file.toml: No such file or directory") != std::string::npos);
}

TEST_CASE("a TOML syntax error names file, line and column and toml++'s description") {
  check_error("[[host]]\nname = \"h0\"\nrank = \n", {"t.toml:3:", "TOML syntax error: "});
  check_error("[[host]]\nname = \"h0\n", {"t.toml:2:", "TOML syntax error"});
}

TEST_CASE("an unknown key is rejected at its place with the keys allowed there") {
  check_error(std::string(two_hosts) + "[[link]]\na = \"h0\"\nb = \"h1\"\nrate_gpbs = 10\n",
              {"t.toml:8:1: unknown key 'rate_gpbs' in [[link]] #0", "known keys: a, b, rate_gbps"});
  check_error("[[host]]\nname = \"h0\"\nrnak = 1\n", {"t.toml:3:1: unknown key 'rnak' in [[host]] #0"});
  // The first unknown key in the file, not in name order.
  check_error("[[host]]\nname = \"h0\"\nzz = 1\naa = 2\n", {"t.toml:3:1: unknown key 'zz' in [[host]] #0"});
  check_error(std::string(two_hosts) + "[[hosts]]\nname = \"h2\"\n",
              {"t.toml:5:", "unknown key 'hosts' in the top level", "known keys: defaults, host, switch, link"});
  check_error("[defaults]\nlatency = 5\n[[host]]\nname = \"h0\"\n", {"t.toml:2:1: unknown key 'latency' in [defaults]"});
  check_error("[[switch]]\nname = \"s0\"\nrank = 1\n[[host]]\nname = \"h0\"\n",
              {"t.toml:3:1: unknown key 'rank' in [[switch]] #0", "known keys: name)"});
}

TEST_CASE("a value of the wrong type is rejected with the expected and the actual type") {
  check_error("[[host]]\nname = \"h0\"\nrank = \"1\"\n", {"t.toml:3:8: 'rank' in host 'h0' must be an integer, got a string"});
  check_error("[[host]]\nname = 5\n", {"t.toml:2:8: 'name' in [[host]] #0 must be a string, got an integer"});
  check_error(std::string(two_hosts) + "[[link]]\na = \"h0\"\nb = \"h1\"\nloss = \"high\"\n",
              {"t.toml:8:8: 'loss' in link 'h0' - 'h1' must be a number, got a string"});
  check_error(std::string(two_hosts) + "[[link]]\na = \"h0\"\nb = \"h1\"\nlatency_ns = 1.5\n",
              {"t.toml:8:14: 'latency_ns' in link 'h0' - 'h1' must be an integer, got a float"});
  check_error("[host]\nname = \"h0\"\n", {"t.toml:1:", "'host' must be an array of tables, written [[host]], got a table"});
  check_error("defaults = 3\n[[host]]\nname = \"h0\"\n", {"t.toml:1:", "'defaults' must be a table"});
}

TEST_CASE("a node without a name and a link without a or b are rejected") {
  check_error("[[host]]\nname = \"h0\"\n[[host]]\nrank = 3\n", {"t.toml:3:1: [[host]] #1 has no 'name'"});
  check_error("[[switch]]\n[[host]]\nname = \"h0\"\n", {"t.toml:1:1: [[switch]] #0 has no 'name'"});
  check_error(std::string(two_hosts) + "[[link]]\nb = \"h1\"\n", {"t.toml:5:1: [[link]] #0 has no 'a'"});
  check_error(std::string(two_hosts) + "[[link]]\na = \"h1\"\n", {"t.toml:5:1: [[link]] #0 has no 'b'"});
}

TEST_CASE("an invalid node name is rejected with the name") {
  check_error("[[host]]\nname = \"h 0\"\n", {"t.toml:2:8: invalid host name 'h 0'"});
  check_error("[[host]]\nname = \"\"\n", {"t.toml:2:8: invalid host name ''"});
  check_error("[[host]]\nname = \"h0\"\n[[switch]]\nname = \"s0:1\"\n", {"t.toml:4:8: invalid switch name 's0:1'"});
  check_error("[[host]]\nname = \"abcdefghijklmnopqrstuvwxyz0123456\"\n", {"t.toml:2:8: invalid host name"});
}

TEST_CASE("duplicate names and duplicate ranks are rejected at the second use") {
  check_error("[[host]]\nname = \"h0\"\n[[switch]]\nname = \"h0\"\n",
              {"t.toml:3:1: duplicate node name 'h0' (first used at t.toml:1:1)"});
  check_error("[[host]]\nname = \"h0\"\nrank = 1\n[[host]]\nname = \"h1\"\n[[link]]\na = \"h0\"\nb = \"h1\"\n",
              {"t.toml:4:1: duplicate rank 1: hosts 'h0' and 'h1'"});
}

TEST_CASE("a link to an unknown node and a link from a node to itself are rejected") {
  check_error(std::string(two_hosts) + "[[link]]\na = \"h0\"\nb = \"s9\"\n",
              {"t.toml:7:5: [[link]] #0: b = 's9' is not a [[host]] or [[switch]] name"});
  check_error(std::string(two_hosts) + "[[link]]\na = \"h1\"\nb = \"h1\"\n",
              {"t.toml:5:1: link 'h1' - 'h1': a link from a node to itself"});
}

TEST_CASE("hosts without a path between them and a file without hosts are rejected") {
  check_error(two_hosts, {"t.toml:3:1: hosts 'h0' and 'h1' are not connected (no path between them)"});
  check_error(std::string(two_hosts) + "[[host]]\nname = \"h2\"\n[[switch]]\nname = \"s0\"\n"
                                       "[[link]]\na = \"h0\"\nb = \"s0\"\n[[link]]\na = \"h2\"\nb = \"s0\"\n",
              {"t.toml:3:1: hosts 'h0' and 'h1' are not connected"});
  check_error("[[switch]]\nname = \"s0\"\n", {"t.toml: no hosts: a topology needs at least one [[host]]"});
  check_error("", {"t.toml: no hosts"});
}

TEST_CASE("a value out of range is rejected at its key with validate's reason") {
  const std::string l = std::string(two_hosts) + "[[link]]\na = \"h0\"\nb = \"h1\"\n";
  check_error(l + "loss = 1.5\n", {"t.toml:8:8: link 'h0' - 'h1': loss is a probability and must be in [0, 1), got 1.5"});
  check_error(l + "reorder = -0.5\n", {"t.toml:8:11: link 'h0' - 'h1': reorder is a probability"});
  check_error(l + "rate_gbps = -3\n", {"t.toml:8:13: link 'h0' - 'h1': rate_gbps must be 0 (unlimited) or positive, got -3"});
  check_error(l + "rate_gbps = nan\n", {"t.toml:8:13: link 'h0' - 'h1': rate_gbps must be 0 (unlimited) or positive, got nan"});
  check_error(l + "latency_ns = -5\n", {"t.toml:8:14: link 'h0' - 'h1': latency_ns must be in [0, 1000000000] ns, got -5"});
  check_error(l + "reorder_delay_ns = 2000000000\n", {"t.toml:8:20: link 'h0' - 'h1': reorder_delay_ns must be in"});
  check_error(l + "queue_packets = 0\n", {"t.toml:8:17: link 'h0' - 'h1': queue_packets must be in [1, 1048576], got 0"});
  check_error(l + "on_full = \"wait\"\n", {"t.toml:8:11: link 'h0' - 'h1': on_full must be \"drop\" or \"backpressure\", got 'wait'"});
  check_error("[defaults]\nduplicate = 1\n" + l, {"t.toml:2:13: [defaults]: duplicate is a probability and must be in [0, 1), got 1"});
  check_error("[[host]]\nname = \"h0\"\nhpus = 0\n", {"t.toml:3:8: host 'h0': hpus must be in [1, 64], got 0"});
  check_error("[[host]]\nname = \"h0\"\nhpus = 65\n", {"t.toml:3:8: host 'h0': hpus must be in [1, 64], got 65"});
  check_error("[[host]]\nname = \"h0\"\nrank = 65536\n", {"t.toml:3:8: host 'h0': rank must be in [0, 65535], got 65536"});
  check_error("[[host]]\nname = \"h0\"\nrank = -1\n", {"t.toml:3:8: host 'h0': rank must be in [0, 65535], got -1"});
}

TEST_CASE("a seed given per link is used as is, a default seed plus the link index otherwise") {
  const auto r = parse_topology(std::string(two_hosts) +
                                    "[[link]]\na = \"h0\"\nb = \"h1\"\n[[link]]\na = \"h0\"\nb = \"h1\"\nseed = -1\n"
                                    "[[link]]\na = \"h1\"\nb = \"h0\"\n",
                                "t.toml");
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  CHECK(r->links[0].model.seed == 1);  // link_model's default seed 1 + 0
  CHECK(r->links[1].model.seed == 0xffffffffffffffffull);
  CHECK(r->links[2].model.seed == 3);
  // Parallel links: each is its own port.
  CHECK(r->nodes[0].ports == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(r->links[2].a_port == 2);
  CHECK(r->links[2].b_port == 2);
}

TEST_CASE("star routes every host through the switch and the switch to each host's port") {
  const topology t = star(4, link_model{});
  REQUIRE(validate(t).ok());
  const routing_table rt = routes(t);
  const std::uint32_t s0 = *t.find("s0");
  CHECK(s0 == 4);
  for (std::uint32_t h = 0; h < 4; ++h) {
    CHECK_FALSE(rt.next_port(h, h).has_value());  // own rank: no route
    for (std::uint32_t d = 0; d < 4; ++d)
      if (d != h) {
        CHECK(rt.next_port(h, d) == 0u);
        CHECK(rt.distance(h, d) == 2u);
      }
    CHECK(rt.next_port(s0, h) == h);
    CHECK(rt.distance(s0, h) == 1u);
  }
  CHECK_FALSE(rt.next_port(0, 4).has_value());   // no such rank
  CHECK_FALSE(rt.next_port(9, 0).has_value());   // no such node
  CHECK_FALSE(rt.next_port(0, 70000).has_value());
}

TEST_CASE("ring routes take the shorter direction and break ties by the lowest link index") {
  // Ring of 5: link i joins h_i and h_(i+1 mod 5). Host 0: port 0 = link 0 (to h1), port 1 =
  // link 4 (to h4). Host i>0: port 0 = link i-1 (to h_(i-1)), port 1 = link i (to h_(i+1)).
  const topology t5 = ring(5, link_model{});
  REQUIRE(validate(t5).ok());
  const routing_table r5 = routes(t5);
  CHECK(r5.next_port(0, 1) == 0u);
  CHECK(r5.next_port(0, 2) == 0u);
  CHECK(r5.next_port(0, 3) == 1u);  // 0 -> 4 -> 3
  CHECK(r5.next_port(0, 4) == 1u);
  CHECK(r5.distance(0, 3) == 2u);
  CHECK(r5.next_port(2, 0) == 0u);  // 2 -> 1 -> 0
  CHECK(r5.next_port(2, 4) == 1u);  // 2 -> 3 -> 4
  CHECK(r5.next_port(3, 0) == 1u);  // 3 -> 4 -> 0
  CHECK(r5.next_port(4, 0) == 1u);  // 4 -> 0 over link 4

  // Ring of 4: opposite hosts are 2 hops both ways; the lower link index wins.
  const topology t4 = ring(4, link_model{});
  const routing_table r4 = routes(t4);
  CHECK(r4.next_port(0, 2) == 0u);  // via link 0 (to h1), not link 3 (to h3)
  CHECK(r4.next_port(2, 0) == 0u);  // via link 1 (to h1), not link 2 (to h3)
  CHECK(r4.next_port(1, 3) == 0u);  // via link 0 (to h0), not link 1 (to h2)
  CHECK(r4.next_port(3, 1) == 0u);  // via link 2 (to h2), not link 3 (to h0)
  CHECK(r4.distance(1, 3) == 2u);
}

TEST_CASE("parallel links route over the lowest link index") {
  topology t = pair(link_model{});
  // A second, parallel link added as a file would add it.
  link_spec s = t.links[0];
  s.a_port = 1;
  s.b_port = 1;
  t.links.push_back(s);
  t.nodes[0].ports.push_back(1);
  t.nodes[1].ports.push_back(1);
  REQUIRE(validate(t).ok());
  const routing_table rt = routes(t);
  CHECK(rt.next_port(0, 1) == 0u);
  CHECK(rt.next_port(1, 0) == 0u);
}

TEST_CASE("a two-level tree routes up to the root and down to the leaf") {
  const auto r = load_topology_file(dir + "tree.toml");
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.err().message));
  const topology& t = r.value();
  const std::uint32_t a0 = *t.find("a0"), b1 = *t.find("b1");
  const std::uint32_t root = *t.find("root"), l0 = *t.find("l0"), l1 = *t.find("l1");
  CHECK(a0 == 0);
  CHECK(b1 == 3);
  CHECK(root == 4);
  CHECK(t.nodes[l0].ports == std::vector<std::uint32_t>{0, 2, 3});
  const routing_table rt = routes(t);
  const std::uint32_t rank_a1 = t.nodes[*t.find("a1")].rank;
  const std::uint32_t rank_b1 = t.nodes[b1].rank;
  CHECK(rank_b1 == 3);
  CHECK(rt.next_port(a0, rank_b1) == 0u);
  CHECK(rt.next_port(l0, rank_b1) == 0u);    // up to the root
  CHECK(rt.next_port(root, rank_b1) == 1u);  // down to l1
  CHECK(rt.next_port(l1, rank_b1) == 2u);    // l1's port 2 = link 5 = b1
  CHECK(rt.distance(a0, rank_b1) == 4u);
  CHECK(rt.next_port(l0, rank_a1) == 2u);    // stays below l0
  CHECK(rt.distance(a0, rank_a1) == 2u);
  CHECK(rt.next_port(root, 0) == 0u);
}

TEST_CASE("generated topologies and a parsed file survive to_toml and parse back equal") {
  link_model m;
  m.rate_gbps = 12.345678901234567;
  m.latency = 1234ns;
  m.loss = 1e-7;
  m.duplicate = 0.25;
  m.reorder = 0.1;
  m.reorder_delay = 55555ns;
  m.seed = 0xfffffffffffffffeull;  // wraps: link 2 gets seed 0
  m.queue_packets = 77;
  m.on_full = overflow_policy::backpressure;
  for (const topology& t : {star(5, m), ring(3, m), pair(m), star(1, link_model{})}) {
    REQUIRE(validate(t).ok());
    const std::string text = to_toml(t);
    const auto back = parse_topology(text, "generated.toml");
    REQUIRE_MESSAGE(back.ok(), (back.ok() ? std::string() : back.err().message), "\n", text);
    CHECK(back.value() == t);
  }
  CHECK(star(5, m).links[2].model.seed == 0);
  const auto good = load_topology_file(dir + "good.toml");
  REQUIRE(good.ok());
  const auto back = parse_topology(to_toml(good.value()), "good-again.toml");
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? std::string() : back.err().message));
  CHECK(back.value() == good.value());
}

TEST_CASE("validate rejects topologies built in code with inconsistent ports, no hosts or no path") {
  CHECK(validate(star(0, link_model{})).err().message == "no hosts: a topology needs at least one [[host]]");
  topology bad_ports = star(2, link_model{});
  bad_ports.links[1].b_port = 0;
  CHECK(validate(bad_ports).err().message == "link 1 ('h1' - 's0'): a_port/b_port do not match the nodes' port lists");
  topology apart = pair(link_model{});
  apart.links.clear();
  apart.nodes[0].ports.clear();
  apart.nodes[1].ports.clear();
  CHECK(validate(apart).err().message == "hosts 'h0' and 'h1' are not connected (no path between them)");
  topology bad_model = pair(link_model{});
  bad_model.links[0].model.loss = 2;
  CHECK(validate(bad_model).err().message ==
        "link 0 ('h0' - 'h1'): loss is a probability and must be in [0, 1), got 2");
  topology dup = ring(3, link_model{});
  dup.nodes[2].rank = 0;
  CHECK(validate(dup).err().message == "duplicate rank 0: hosts 'h0' and 'h2'");
}

}  // TEST_SUITE
