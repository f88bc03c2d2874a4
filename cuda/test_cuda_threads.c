/* test_cuda_threads.c: the CUDA companion's tests with real threads, for ThreadSanitizer
 * (make test-threads)
 *
 * test_cuda.c's companion tests, with cuda_on_cpu.h built with
 * -DCUDA_ON_CPU_THREADS: every thread of a block is a POSIX thread and all of
 * a block's run at once, so ThreadSanitizer reports any data race between
 * them (a missing barrier, a racy +=). Every kernel runs, in fewer steps than
 * in make test (a reference file with learned positions, six training steps
 * against transformer.c); the tests that inject faults or draw thread orders
 * need make test's fibers and are left out here.
 *   ./test_cuda_threads           the tests: ThreadSanitizer must report nothing
 *   ./test_cuda_threads --racy    three training steps with the racy kernel of
 *                                 test_cuda.c (racy_embedding_backward_kernel):
 *                                 ThreadSanitizer must report a data race
 */
#ifndef CUDA_ON_CPU_THREADS
#error "build with -DCUDA_ON_CPU_THREADS (make test-threads)"
#endif
#define TEST_CUDA_LIBRARY
#include "test_cuda.c"

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--racy") == 0) {
        cpu_test_faults.launch_replaced = "embedding_backward_kernel";
        cpu_test_faults.replacement = racy_embedding_backward_kernel_cpu_thread;
        free(companion_state_after(1));
        return 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--racy]\n", argv[0]);
        return 2;
    }
    // Every kernel, in few steps: each thread of a block is a thread of its own
    // here, and ThreadSanitizer makes each a hundred times slower
    companion_logits = transformer_cuda_logits;   // the reference file's logits are the companion's
    test_cublas_model();
    test_emulator_launch_checks();
    set_threads(1);
    test_companion_reference_file("tiny_data/ref_learned_positions.ref");
    CompanionRun r = companion_training_run(POSITIONAL_LEARNED);
    check(r.loss < COMPANION_TOL_LOSS && r.grad < COMPANION_TOL_GRADS &&
          r.update < COMPANION_TOL_UPDATES && r.same_state,
          "companion with threads: %d training steps with learned positions, ragged batches and "
          "dropout, as transformer.c's (losses %.1e, gradients %.1e, updates %.1e)",
          COMPANION_STEPS, r.loss, r.grad, r.update);
    // --tf32's transpose (a tile in shared memory, a barrier) and, with
    // --no-epilogues, the kernels the epilogues replace
    transformer_cuda_tf32(1);
    transformer_cuda_epilogues(0);
    CompanionRun kernels = companion_training_run(POSITIONAL_SINUSOID);
    transformer_cuda_epilogues(1);
    transformer_cuda_tf32(0);
    check(kernels.loss < COMPANION_TOL_LOSS && kernels.grad < COMPANION_TOL_GRADS &&
          kernels.update < COMPANION_TOL_UPDATES,
          "companion with threads, --tf32 --no-epilogues: %d training steps "
          "(transpose_weights_kernel, bias_relu_forward_kernel, relu_bias_backward_kernel) as "
          "transformer.c's (losses %.1e, gradients %.1e, updates %.1e)",
          COMPANION_STEPS, kernels.loss, kernels.grad, kernels.update);
    test_companion_counts();
    test_companion_fused_attention();   // its shared memory and barriers with the block's threads
                                        // at once
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
