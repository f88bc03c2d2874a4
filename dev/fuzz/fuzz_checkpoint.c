// The checkpoint loader (checkpoint_load: header, options, vocabulary,
// merges, parameters, checksum), on any bytes with the checksum made to
// match: the checksum is checked last, and without the fix-up nearly every
// input would fail there. What a loaded checkpoint is then used for runs
// too: a sentence decoded greedily, and a save whose bytes must equal the
// input's when the input is a version-3 file of this build's number size.
#include "fuzz.h"

#define CHECKSUM_BYTES 8   // the file's last 8 bytes: FNV-1a 64 of all before them (dev/FORMATS.md)

static uint32_t little_endian_u32(const uint8_t *b) {
    return b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *bytes = checked_calloc(size + 1, 1, "fuzz input");
    memcpy(bytes, data, size);
    if (size >= CHECKSUM_BYTES) {
        uint64_t hash = FNV_OFFSET;
        for (size_t i = 0; i + CHECKSUM_BYTES < size; i++) hash = (hash ^ bytes[i]) * FNV_PRIME;
        for (int i = 0; i < 8; i++) bytes[size - 8 + i] = (uint8_t)(hash >> (8 * i));
    }
    const char *path = fuzz_file(0, bytes, size, ".ckpt");
    Transformer model;
    Vocabulary vocab;
    TrainingState state;
    char *options = NULL;
    if (!checkpoint_load(path, &model, &vocab, &state, &options)) {
        int in_range = model.adam_step >= 0 &&
                       state.epoch <= (uint64_t)model.adam_step;   // or --resume refuses it
        fuzz_require(in_range || training_state_error(path, &model, &state),
                     "a count out of range that --resume takes");
        char sentence[200];
        snprintf(sentence, sizeof sentence, "%s %s", vocab.words[vocab.size - 1],
                 vocab.words[vocab.size > 5 ? 5 : 4]);
        TextSource from = { "fuzz", MAX_UNKNOWN_WARNINGS, 0, NULL };
        DecodeOptions greedy = { .beam = 1, .alpha = 0.6 };
        decode_sentence(&model, &vocab, sentence, &from, &greedy, NULL);
        if (size >= 12 && little_endian_u32(bytes + 4) == CHECKPOINT_VERSION &&
            little_endian_u32(bytes + 8) == sizeof(real)) {
            const char *saved = fuzz_file(1, NULL, 0, ".ckpt");
            fuzz_require(!checkpoint_save(saved, &model, &vocab, &state, options),
                         "a loaded checkpoint cannot be saved");
            FILE *f = fopen(saved, "rb");
            uint8_t *again = checked_calloc(size + 1, 1, "fuzz input");
            size_t got = fread(again, 1, size + 1, f);
            fclose(f);
            fuzz_require(got == size && memcmp(again, bytes, size) == 0,
                         "a checkpoint saved again differs from its file");
            free(again);
        }
        transformer_free(&model);
        vocab_free(&vocab);
        free(options);
    }
    free(bytes);
    return 0;
}
