/* dsc public API: communicators and collectives between ranks.
 *
 * A communicator connects `world` ranks; each rank holds its own dsc_comm
 * (rank, world size, backend name, timeout) and its own context for
 * diagnostics. Two backends:
 * - "inproc": N ranks as N threads of one process (tests, simulation):
 *   dsc_comm_inproc_run.
 * - "mpi": one rank per process over MPI_COMM_WORLD (Open MPI):
 *   dsc_comm_mpi_new. Only when dsc was built with MPI (dsc_comm_have_mpi).
 *
 * Every collective is started asynchronously (..._start returns a request)
 * and completed with dsc_comm_wait; the plain names are blocking wrappers.
 * All ranks must start the same collectives in the same order with the same
 * kind, dtype, count, op, root and tag; a rank's collectives are numbered
 * 0, 1, 2, ... in the order it starts them (the "#n" in messages). The tag is
 * the caller's label (the training step): it appears in every message as
 * "(step TAG)" and the in-process backend checks it matches across ranks.
 * Buffers of a started collective belong to it until its wait returns.
 *
 * Failures never hang: a collective that does not complete within the
 * communicator's timeout fails on every waiting rank with "rank 1: all_reduce
 * #7 (step 3) timed out after 2.0 s waiting for rank 3"; a rank that aborts
 * or (in-process) returns an error or returns while others still wait makes
 * the others fail promptly with a message naming it; in-process, mismatched
 * collectives are reported. After any failure the communicator is broken:
 * every later start or wait fails at once with the first failure's text.
 *
 * Determinism (in-process): a sum is accumulated in rank order,
 * ((x0 + x1) + x2) + ..., in the dtype's own arithmetic, independently of
 * thread timing, so the result equals that sequential sum bit for bit and two
 * runs are bitwise identical. mean = that sum / world. */
#ifndef DSC_COMM_H
#define DSC_COMM_H

#include "dsc/core.h"
#include "dsc/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_comm dsc_comm;
typedef struct dsc_comm_request dsc_comm_request;

typedef enum { DSC_COMM_SUM, DSC_COMM_MEAN } dsc_comm_op;

/* Seconds a wait may block (counted from the wait call) before the collective
 * fails, unless
 * DSC_COMM_TIMEOUT (seconds, > 0) is set when the communicator is created. */
#define DSC_COMM_DEFAULT_TIMEOUT 300.0

int dsc_comm_rank(const dsc_comm *c);
int dsc_comm_world(const dsc_comm *c);
/* The ranks that share this rank's node (MPI: its shared-memory group, from
 * MPI_Comm_split_type; in-process: all of them): this rank's index among
 * them and their count. A GPU rank takes device local_rank % devices. */
int dsc_comm_local_rank(const dsc_comm *c);
int dsc_comm_local_world(const dsc_comm *c);
const char *dsc_comm_backend(const dsc_comm *c); /* "inproc" or "mpi" */
/* The context this rank's diagnostics go to. */
dsc_context *dsc_comm_context(const dsc_comm *c);
double dsc_comm_timeout(const dsc_comm *c);
/* seconds > 0 (and finite); applies to waits that start afterwards.
 * DSC_ERR_USER otherwise. */
dsc_status dsc_comm_set_timeout(dsc_comm *c, double seconds);
/* True once a collective failed or a rank aborted or left: every later
 * collective fails at once. */
bool dsc_comm_broken(const dsc_comm *c);

/* Reductions: dtype f32, f64, i32 or i64 (mean: f32, f64). Other
 * collectives move any dtype. send == recv (in place) is allowed.
 * Counts are elements; count 0 is allowed. */

/* recv[i] = op over ranks of send[i], i < count. */
dsc_status dsc_comm_all_reduce_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                     dsc_comm_request **req);
/* send holds count elements (count must divide by world); rank r receives
 * chunk r (count / world elements) of the reduction into recv. */
dsc_status dsc_comm_reduce_scatter_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                         dsc_dtype dt, dsc_comm_op op, int64_t tag,
                                         dsc_comm_request **req);
/* Each rank sends count elements; recv (world * count) holds rank r's at
 * offset r * count. */
dsc_status dsc_comm_all_gather_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, int64_t tag, dsc_comm_request **req);
/* buf on rank root is copied into buf on every rank. */
dsc_status dsc_comm_broadcast_start(dsc_comm *c, void *buf, int64_t count, dsc_dtype dt, int root,
                                    int64_t tag, dsc_comm_request **req);
dsc_status dsc_comm_barrier_start(dsc_comm *c, int64_t tag, dsc_comm_request **req);
/* send holds world chunks of count elements, chunk j for rank j; recv
 * (world * count) receives rank i's chunk for this rank at offset i * count.
 * send == recv (in place) is allowed. */
dsc_status dsc_comm_all_to_all_start(dsc_comm *c, const void *send, void *recv, int64_t count,
                                     dsc_dtype dt, int64_t tag, dsc_comm_request **req);
/* Counts differ per peer: this rank sends send_counts[j] elements from
 * send + send_displs[j] to rank j and receives recv_counts[i] elements from
 * rank i at recv + recv_displs[i] (elements, not bytes; world entries each,
 * copied at the start). What rank i sends rank j must be what j expects from
 * i: in-process a mismatch fails the collective naming both ranks; MPI cannot
 * tell. The recv ranges must not overlap; send != recv. */
dsc_status dsc_comm_all_to_all_v_start(dsc_comm *c, const void *send, const int64_t *send_counts,
                                       const int64_t *send_displs, void *recv,
                                       const int64_t *recv_counts, const int64_t *recv_displs,
                                       dsc_dtype dt, int64_t tag, dsc_comm_request **req);

/* Completes and frees the request (also when it fails). Requests may be
 * waited in any order; each exactly once. On failure the error is on this
 * rank's context and the communicator is broken. */
dsc_status dsc_comm_wait(dsc_comm_request *req);

/* Blocking forms: start + wait. */
dsc_status dsc_comm_all_reduce(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, dsc_comm_op op, int64_t tag);
dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const void *send, void *recv, int64_t count,
                                   dsc_dtype dt, dsc_comm_op op, int64_t tag);
dsc_status dsc_comm_all_gather(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, int64_t tag);
dsc_status dsc_comm_broadcast(dsc_comm *c, void *buf, int64_t count, dsc_dtype dt, int root,
                              int64_t tag);
dsc_status dsc_comm_barrier(dsc_comm *c, int64_t tag);
dsc_status dsc_comm_all_to_all(dsc_comm *c, const void *send, void *recv, int64_t count,
                               dsc_dtype dt, int64_t tag);
dsc_status dsc_comm_all_to_all_v(dsc_comm *c, const void *send, const int64_t *send_counts,
                                 const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                 const int64_t *recv_displs, dsc_dtype dt, int64_t tag);

/* ---- groups ----
 * dsc_comm_split is a collective of c (every rank calls it, in its place
 * among c's collectives): the ranks that pass the same color >= 0 form one
 * new communicator, ranked by key (ties by their rank in c), as
 * MPI_Comm_split; a negative color joins none (*out = NULL). name (1 to 23
 * of [A-Za-z0-9_-+.]) labels the group: its collectives read "rank 5 (ep
 * rank 1): ep all_to_all #2 (step 3) ...", naming ranks as the job's world
 * numbers them. A group numbers its own collectives, takes c's timeout, and
 * shares the job's fate: a failure or abort in any communicator of an
 * in-process job breaks every one of them (MPI: dsc_comm_abort ends the
 * job). Groups of groups are allowed. Every group is freed with
 * dsc_comm_free (in-process too) before its rank's function returns. */
dsc_status dsc_comm_split(dsc_comm *c, int color, int key, const char *name, dsc_comm **out);
/* "world" for a communicator that is not a group. */
const char *dsc_comm_name(const dsc_comm *c);
/* The job's world rank of this communicator's rank (-1 when out of range). */
int dsc_comm_world_rank(const dsc_comm *c, int rank);

/* ---- meshes ----
 * The communicators of a mesh (dsc/mesh.h): one group per axis, named by it,
 * holding the ranks that differ from this one only along that axis.
 * dsc_mesh_new is a collective of world (its size must be the shape's
 * product; DSC_ERR_USER naming both otherwise); it makes the groups in the
 * shape's axis order and attaches the mesh to world, so that an executor or
 * the interpreter given world finds the group a collective op names
 * (dsc_comm_group). One mesh per communicator at a time. dsc_mesh_free frees
 * the groups and detaches it (before world goes). */
typedef struct dsc_mesh dsc_mesh;
dsc_status dsc_mesh_new(dsc_comm *world, const dsc_mesh_shape *shape, dsc_mesh **out);
/* The group of axis name ("dp", "ep", "sp", "tp"); NULL when the mesh has no
 * such axis. */
dsc_comm *dsc_mesh_group(const dsc_mesh *m, const char *axis);
const dsc_mesh_shape *dsc_mesh_shape_of(const dsc_mesh *m);
/* The communicator a collective op's group names: "world" (or "") is c
 * itself; an axis is that group of c's mesh; NULL when c has no mesh with
 * that axis. */
dsc_comm *dsc_comm_group(dsc_comm *c, const char *name);
void dsc_mesh_free(dsc_mesh *m);

/* Gives up on the whole job. In-process: marks this rank dead ("rank 2
 * aborted: reason"); every other rank's pending and later collectives fail
 * promptly; this rank's function should then return an error. MPI: writes
 * "dsc: rank R: aborting: reason" to stderr and calls MPI_Abort, which ends
 * every process of the job (MPI cannot cancel a collective). */
void dsc_comm_abort(dsc_comm *c, const char *reason);

/* ---- in-process backend ----
 * Runs fn on `world` threads (1 <= world <= 1024), rank r with its own
 * communicator and its own context (default allocator), and waits for all.
 * A rank whose fn returns an error counts as aborted (others fail promptly);
 * a rank whose fn returns while another still waits on a collective it never
 * joined makes that collective fail naming it. Returns DSC_OK when every rank
 * returned DSC_OK; otherwise the status of the first rank (in time) that
 * failed, with its diagnostics copied into ctx and a note naming any other
 * failed ranks. */
typedef dsc_status (*dsc_comm_rank_fn)(dsc_comm *comm, void *user_data);
dsc_status dsc_comm_inproc_run(dsc_context *ctx, int world, dsc_comm_rank_fn fn, void *user_data);

/* ---- MPI backend ----
 * A communicator over (a duplicate of) MPI_COMM_WORLD. Initialises MPI
 * (MPI_THREAD_SERIALIZED) when the caller has not; then dsc_comm_free
 * finalises it. Collectives use MPI's nonblocking ones and poll MPI_Test
 * until the timeout; errors come back as diagnostics (MPI_ERRORS_RETURN).
 * The MPI backend cannot detect mismatched collectives. DSC_ERR_USER when
 * dsc was built without MPI. */
bool dsc_comm_have_mpi(void);
dsc_status dsc_comm_mpi_new(dsc_context *ctx, dsc_comm **out);
/* Frees a group (dsc_comm_split) or an MPI communicator and any requests never waited. A broken MPI
 * communicator is not finalised (that could hang on a dead peer): the process
 * should exit non-zero, which makes mpirun end the job. In-process
 * communicators belong to dsc_comm_inproc_run and must not be freed. */
void dsc_comm_free(dsc_comm *c);

#ifdef __cplusplus
}
#endif
#endif
