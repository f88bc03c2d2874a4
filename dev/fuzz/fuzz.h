// dev/fuzz: libFuzzer targets for transformer.c's parsers of input from
// outside (make fuzz, dev/fuzz/run.sh). Each target includes the program
// (lab/lab.c: transformer.c and its lab; the reference target includes
// test_transformer.c after it) so that it calls the parser itself, static
// functions and all, on the fuzzer's bytes; AddressSanitizer and UBSan
// report what goes wrong inside, and fuzz_require what a parser's caller
// relies on (an invariant that fails aborts, and libFuzzer keeps the input
// as a crash-* file).
#ifndef FUZZ_H
#define FUZZ_H

#define TRANSFORMER_NO_MAIN
#include "lab/lab.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Once, before the first input: the fast path in transformer.c's FastPath seam, as make's
// ./transformer has it (transformer_lab_main does the same before its command), so that a
// decoding runs the key/value cache and the packed products that the program runs.
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fast_path_use(1);
    return 0;
}

#define fuzz_require(condition, what)                                       \
    do {                                                                    \
        if (!(condition)) {                                                 \
            fprintf(stderr, "fuzz: %s:%d: %s\n", __FILE__, __LINE__, what); \
            abort();                                                        \
        }                                                                   \
    } while (0)

// The bytes as a file at a path of this process's own (slot: one of 4, for
// targets that need two files); the parsers read files.
static inline const char *fuzz_file(int slot, const uint8_t *data, size_t size,
                                    const char *suffix) {
    static char paths[4][256];
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(paths[slot], sizeof paths[slot], "%s/transformer_fuzz_%ld_%d%s", dir, (long)getpid(),
             slot, suffix);
    FILE *f = fopen(paths[slot], "wb");
    fuzz_require(f != NULL, "cannot write the input's file");
    if (size)
        fuzz_require(fwrite(data, 1, size, f) == size, "cannot write the input's file");
    fclose(f);
    return paths[slot];
}

// The bytes up to the first zero byte, as a string (the programs read text
// without zero bytes: a line holding one is refused before any parsing).
// Both helpers are inline: a target that uses only one is not warned about the other.
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    size_t n = 0;
    while (n < size && data[n])
        n++;
    char *text = checked_calloc(n + 1, 1, "fuzz text");
    memcpy(text, data, n);
    return text;
}

#endif
