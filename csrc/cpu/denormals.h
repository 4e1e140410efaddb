// Flushing subnormal floats to zero on every thread that runs ATen's CPU ops: the calling thread and
// the intra-op pool (at::parallel_for, which MKL and oneDNN share through OpenMP).  The flag (x86
// MXCSR FTZ/DAZ) belongs to each thread, and torch.set_flush_denormal sets only the caller's.
#pragma once

#include <vector>

namespace sopfast {

// Whether each intra-op thread flushes now: [at::get_num_threads()], entry i for the pool's thread i
// (0: the calling thread).
std::vector<bool> intra_op_threads_flushing();

// Sets the flag of the pool's thread i to states[i] (states[last] for threads beyond the list; one
// entry sets every thread); returns false where the CPU cannot flush (then nothing changes).
bool set_intra_op_threads_flushing(const std::vector<bool>& states);

}  // namespace sopfast
