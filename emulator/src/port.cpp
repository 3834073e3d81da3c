#include <spin/emu/port.hpp>

#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace spin::emu {

namespace {
std::string dpdk_err(int rc) { return rte_strerror(rc < 0 ? -rc : rc); }
}  // namespace

result<std::uint16_t> find_port(const std::string& device_name) {
  std::uint16_t id = 0;
  if (rte_eth_dev_get_port_by_name(device_name.c_str(), &id) != 0)
    return fail(errc::not_found, "no DPDK port named \"" + device_name + "\" (pass it to EAL with --vdev or bind the NIC)");
  return id;
}

result<std::uint16_t> port_from_rings(const std::string& name, rte_ring* rx, rte_ring* tx) {
  if (rx == nullptr || tx == nullptr) return fail(errc::invalid_argument, "port_from_rings: null ring");
  rte_ring* rxr[1] = {rx};
  rte_ring* txr[1] = {tx};
  const int id = rte_eth_from_rings(name.c_str(), rxr, 1, txr, 1, static_cast<unsigned>(SOCKET_ID_ANY));
  if (id < 0) return fail(errc::no_memory, "cannot create ring port \"" + name + "\": " + dpdk_err(rte_errno));
  return static_cast<std::uint16_t>(id);
}

result<std::unique_ptr<port>> port::open(std::uint16_t port_id, const port_options& o, const std::string& name) {
  if (!rte_eth_dev_is_valid_port(port_id)) return fail(errc::not_found, "port " + std::to_string(port_id) + " does not exist");
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(port_id, &info); rc != 0)
    return fail(errc::invalid_argument, "port " + name + ": cannot read device info: " + dpdk_err(rc));
  const std::string drv = info.driver_name != nullptr ? info.driver_name : "?";
  if (o.max_frame_bytes < 64 || o.mbuf_data_bytes < 128 || o.pool_mbufs < 64 || o.rx_desc == 0 || o.tx_desc == 0)
    return fail(errc::invalid_argument, "port " + name + ": max frame >= 64 B, mbuf data room >= 128 B, pool >= 64 mbufs and non-zero descriptor counts are required");
  if (o.max_frame_bytes > info.max_rx_pktlen)
    return fail(errc::invalid_argument, "port " + name + " (" + drv + ") receives frames of at most " +
                                            std::to_string(info.max_rx_pktlen) + " bytes; asked for " +
                                            std::to_string(o.max_frame_bytes));
  const bool scatter = o.max_frame_bytes > o.mbuf_data_bytes;
  if (scatter && (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER) == 0)
    return fail(errc::invalid_argument,
                "port " + name + " (" + drv + ") cannot scatter received frames over several mbufs, so frames of " +
                    std::to_string(o.max_frame_bytes) + " bytes do not fit " + std::to_string(o.mbuf_data_bytes) +
                    "-byte mbufs: lower the maximum frame size or raise the mbuf size to at least the frame size");

  std::unique_ptr<port> p(new port());
  p->_id = port_id;
  p->_name = name;
  p->_opts = o;
  p->_tx_multi_seg = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;

  static std::atomic<unsigned> pool_seq{0};
  const std::string pool_name = "spin_p" + std::to_string(port_id) + "_" + std::to_string(pool_seq.fetch_add(1));
  p->_pool = rte_pktmbuf_pool_create(pool_name.c_str(), o.pool_mbufs, o.pool_cache.value_or(o.pool_mbufs >= 1024 ? 256 : 0), 0,
                                     static_cast<std::uint16_t>(o.mbuf_data_bytes + RTE_PKTMBUF_HEADROOM),
                                     rte_eth_dev_socket_id(port_id));
  if (p->_pool == nullptr)
    return fail(errc::no_memory, "port " + name + ": cannot create a pool of " + std::to_string(o.pool_mbufs) + " mbufs of " +
                                     std::to_string(o.mbuf_data_bytes) + " bytes: " + dpdk_err(rte_errno) +
                                     " (raise EAL's -m or lower the pool size)");

  rte_eth_conf conf{};
  // ethdev turns the MTU back into a frame size with the device's own overhead (Ethernet header
  // and CRC, or what max_rx_pktlen - max_mtu says) and checks it against max_rx_pktlen.
  std::uint32_t overhead = RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
  if (info.max_mtu != UINT16_MAX && info.max_rx_pktlen > info.max_mtu) overhead = info.max_rx_pktlen - info.max_mtu;
  const std::uint32_t frame = std::min(o.max_frame_bytes + RTE_ETHER_CRC_LEN, info.max_rx_pktlen);
  conf.rxmode.mtu = static_cast<std::uint16_t>(std::min<std::uint32_t>(frame > overhead ? frame - overhead : RTE_ETHER_MIN_MTU, info.max_mtu));
  if (conf.rxmode.mtu < info.min_mtu) conf.rxmode.mtu = info.min_mtu;
  if (scatter) conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;
  if (p->_tx_multi_seg) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  if (int rc = rte_eth_dev_configure(port_id, 1, 1, &conf); rc != 0)
    return fail(errc::invalid_argument, "port " + name + " (" + drv + "): configure failed: " + dpdk_err(rc));
  std::uint16_t rxd = o.rx_desc, txd = o.tx_desc;
  if (int rc = rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &rxd, &txd); rc != 0)
    return fail(errc::invalid_argument, "port " + name + ": descriptor counts refused: " + dpdk_err(rc));
  rte_eth_rxconf rxconf = info.default_rxconf;
  rxconf.offloads = conf.rxmode.offloads;
  if (int rc = rte_eth_rx_queue_setup(port_id, 0, rxd, rte_eth_dev_socket_id(port_id), &rxconf, p->_pool); rc != 0)
    return fail(errc::invalid_argument, "port " + name + ": RX queue set-up failed: " + dpdk_err(rc));
  rte_eth_txconf txconf = info.default_txconf;
  txconf.offloads = conf.txmode.offloads;
  if (int rc = rte_eth_tx_queue_setup(port_id, 0, txd, rte_eth_dev_socket_id(port_id), &txconf); rc != 0)
    return fail(errc::invalid_argument, "port " + name + ": TX queue set-up failed: " + dpdk_err(rc));
  if (int rc = rte_eth_dev_start(port_id); rc != 0)
    return fail(errc::invalid_argument, "port " + name + ": start failed: " + dpdk_err(rc));
  p->_started = true;
  if (o.promiscuous) (void)rte_eth_promiscuous_enable(port_id);  // not every PMD has it; frames are filtered by the NIC anyway
  return p;
}

port::~port() {
  if (_started) (void)rte_eth_dev_stop(_id);
  if (_pool != nullptr) rte_mempool_free(_pool);
}

port_hw_stats port::hw_stats() const noexcept {
  rte_eth_stats s{};
  port_hw_stats out;
  if (rte_eth_stats_get(_id, &s) != 0) return out;
  out.ipackets = s.ipackets;
  out.ibytes = s.ibytes;
  out.opackets = s.opackets;
  out.obytes = s.obytes;
  out.imissed = s.imissed;
  out.rx_nombuf = s.rx_nombuf;
  out.ierrors = s.ierrors;
  out.oerrors = s.oerrors;
  return out;
}

}  // namespace spin::emu
