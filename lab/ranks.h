/* lab/ranks.h: the ranks of a data-parallel `train` (lab/ranks.c), for the CUDA companion
 *
 * The lab's train starts them (MPI, when mpirun launched the program); the companion, which
 * nvcc compiles apart from the lab, asks here which rank it is, which GPU to take, and shares
 * NCCL's id and each step's target-token count through them.
 */
#ifndef LAB_RANKS_H
#define LAB_RANKS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
// 1 while this process is one of the ranks a launcher started (mpirun), else 0
int lab_ranks_launched(void);
int lab_rank(void);          // 0 .. lab_rank_count() - 1 (0 alone)
int lab_rank_count(void);    // the ranks (1 alone)
int lab_local_rank(void);    // its place among the ranks on this machine: the GPU it takes
void lab_ranks_broadcast(void *bytes, size_t count);   // rank 0's bytes, to every rank
long lab_ranks_sum(long value);                        // every rank's value, summed
// The state of the generator this rank draws a step's dropout keys from, the run's generator
// being at run_state: the run's own for rank 0 (and alone)
uint64_t lab_rank_dropout_state(uint64_t run_state);
#ifdef __cplusplus
}
#endif

#endif // LAB_RANKS_H
