/* libspin-mpi: a PMPI interposer that runs MPI collectives through spin::coll (docs/mpi.md).
 *
 * Loaded with LD_PRELOAD=libspin-mpi.so (an unmodified, dynamically linked MPI program, mpi4py
 * included) or linked before libmpi. It defines MPI_Allreduce, MPI_Reduce_scatter_block,
 * MPI_Allgather, MPI_Bcast and MPI_Finalize; calls it cannot run on spin::coll go to PMPI_*
 * unchanged. Against spin-emu --virtual-time it also makes the ranks meet in virtual time before
 * every other blocking collective, makes MPI_Wtime the virtual clock and refuses point to point
 * (docs/virtual-time.md, "MPI programs"): for that it wraps MPI_Init, MPI_Init_thread,
 * MPI_Wtime, those collectives and the blocking point-to-point calls, which in wall-clock mode go
 * to PMPI_* unchanged. This header is the interposer's own C interface: its counters.
 *
 * Environment (read once, at MPI_Init):
 *   SPIN_MPI_SOCKET       control socket of the spin-emu process that serves this rank's NIC
 *                         (default /run/spin-emu.sock)
 *   SPIN_MPI_NODE         node index of this rank's NIC in that process (default: the rank's
 *                         local rank on its machine: OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID
 *                         or SLURM_LOCALID; else its MPI_COMM_WORLD rank)
 *   SPIN_MPI_ALGORITHM    automatic (default), edge_ring or host_ring
 *   SPIN_MPI_TIMEOUT_MS   a collective that has not finished after this long fails (10000)
 *   SPIN_MPI_LOG          0: warnings only (default); 1: a summary line per rank at
 *                         MPI_Finalize; 2: also one line per collective call
 */
#ifndef SPIN_MPI_H
#define SPIN_MPI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Collectives the interposer counts, in this order in the arrays below. */
enum spin_mpi_call {
  SPIN_MPI_ALLREDUCE = 0,
  SPIN_MPI_REDUCE_SCATTER_BLOCK = 1,
  SPIN_MPI_ALLGATHER = 2,
  SPIN_MPI_BCAST = 3,
  SPIN_MPI_CALLS = 4
};

/* Why a call went to PMPI, in this order in `fallback` below. */
enum spin_mpi_reason {
  SPIN_MPI_R_DATATYPE = 0,     /* a datatype other than the supported ones (docs/mpi.md) */
  SPIN_MPI_R_OP = 1,           /* an operation other than SUM, MIN, MAX, PROD */
  SPIN_MPI_R_COMMUNICATOR = 2, /* an intercommunicator, or a group of one rank */
  SPIN_MPI_R_ARGUMENTS = 3,    /* count 0, or send and receive signatures that differ */
  SPIN_MPI_R_UNAVAILABLE = 4,  /* no spin communicator: spin-emu unreachable on some rank,
                                  or group ids exhausted */
  SPIN_MPI_REASONS = 5
};

/* Counters of this process since it started. */
struct spin_mpi_counters {
  uint64_t spin[SPIN_MPI_CALLS];                      /* calls that ran on spin::coll */
  uint64_t fallback[SPIN_MPI_CALLS];                  /* calls that went to PMPI */
  uint64_t reasons[SPIN_MPI_REASONS];                 /* fallbacks by reason */
  uint64_t errors;                                    /* spin::coll calls that failed (MPI_ERR_OTHER) */
  uint64_t communicators;                             /* spin communicators created */
  uint64_t switch_communicators;                      /* of those, groups that hold slots on a switch */
  uint64_t switch_calls;                              /* of `spin`, calls that ran through the switch */
};

/* Copies the counters into *out. Any thread. */
void spin_mpi_get_counters(struct spin_mpi_counters* out);

#ifdef __cplusplus
}
#endif

#endif
