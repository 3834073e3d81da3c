// libspin-mpi in virtual time (spin-emu --virtual-time; docs/virtual-time.md, "MPI programs"):
// what interpose.cpp (collectives, set-up) and p2p.cpp (point to point) share. Internal.
#pragma once

#include <spin/host/host.hpp>

#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace spin::mpi_detail {

/// This rank as a host program of the simulation: attached from MPI_Init on (interpose.cpp's
/// start_virtual_time) when every rank's spin-emu runs in virtual time.
struct virtual_time {
  bool on = false;
  std::mutex mu;                                   // one request at a time per process
  std::unique_ptr<host::client> cl;                // attached: this process's actor
  std::uint32_t node = 0;
  std::vector<std::uint32_t> world_nodes;          // node of each MPI_COMM_WORLD rank
};
extern virtual_time vt;

/// This process's rank in MPI_COMM_WORLD; -1 before MPI_Init.
int world_rank();
/// The nodes of comm's members (both groups of an intercommunicator), sorted.
std::vector<std::uint32_t> member_nodes(MPI_Comm comm);
/// Before a blocking MPI collective over `comm` (named `call`): its members meet in virtual
/// time. MPI_SUCCESS, or the error the communicator's handler got.
int vt_sync(MPI_Comm comm, const char* call);
/// A call virtual time cannot run: a line on stderr that says why, MPI_ERR_OTHER through the
/// communicator's handler.
int vt_refuse(MPI_Comm comm, const char* call, const char* why = nullptr);

// ---- point to point (p2p.cpp) ----
/// After virtual time started: keep buffered sends moving while this rank waits in spin-emu.
void p2p_start();
/// After a wrapped call created `newcomm` (MPI_COMM_NULL: none) collectively: its members agree
/// on its context id (the match bits of its messages). Wall-clock time: nothing.
void p2p_comm_created(MPI_Comm newcomm);
/// Before PMPI_Finalize: completes the buffered sends.
void p2p_finalize();

} // namespace spin::mpi_detail
