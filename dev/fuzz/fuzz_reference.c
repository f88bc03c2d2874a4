// The reader of PyTorch reference files in test_transformer.c
// (reference_read), and the check of the batch it holds (batch_check), which
// the comparison runs before any forward pass.
#include "fuzz.h"                   // the program: transformer.c and its lab
#define TEST_TRANSFORMER_LIBRARY    // test_transformer.c without its main, after the program (as
                                    // lab/test_lab.c)
#include "test_transformer.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size, ".ref");
    Reference r;
    if (reference_read(&r, path)) {
        Batch batch = { r.B, r.S, r.T, r.src, r.src_len, r.tgt_in, r.tgt_out, r.tgt_len };
        (void)batch_check(&batch, &r.config);
    }
    reference_free(&r);
    return 0;
}
