// The lab's checkpoint loader (lab_checkpoint_load: transformer.c's model reader, then the
// run part; or a version-3 file), on any bytes with the checksums made to match: each is
// checked after the bytes it covers, and without the fix-up nearly every input would fail
// there. A version-4 input gets the model's checksum where its header's model_bytes puts it
// (when that lies inside the input) and the run's at its last 8 bytes; a version-3 input gets
// one checksum of everything before its last 8 bytes. What a loaded checkpoint is then used
// for runs too, with what its users rely on required:
//   - --resume: counts that training cannot reach are refused by training_state_error;
//     checkpoint_step (which --keep-last reads from the headers alone) gives the run's step;
//   - decode: a sentence decoded greedily (lab_greedy_decode) and with a beam of 2;
//   - a save (lab_checkpoint_save) loads again as the same checkpoint, and saving that gives
//     the same bytes. A version-4 input whose numbers are this build's size (the model's and,
//     when it has one, the run's) comes back byte for byte: every field is written as it was
//     read (the header from the config, the vocabulary's tokens, the parameters and Adam's
//     moments as bits, the options text as its bytes, the §5.1 merges section rebuilt from the
//     same merges in the same order, repeats kept) and both checksums were made to match.
//     Numbers of the other size are converted, and a version-3 file is saved as version 4, so
//     those do not come back as they were;
//   - transformer.c's own checkpoint_load on the same bytes never crashes, reads only version 4,
//     and agrees with the lab on the model where both load (the same config, tokens and
//     parameters); of a version-4 file the lab reads it reads exactly those of whole words.
#include "fuzz.h"

#define CHECKSUM_BYTES 8       // FNV-1a 64 (dev/FORMATS.md)
#define MODEL_BYTES_AT 64      // where CheckpointHeader keeps model_bytes
#define REAL_BYTES_AT 8        // where CheckpointHeader keeps real_bytes
#define RUN_REAL_BYTES_AT 8    // where RunHeader keeps real_bytes

static uint32_t little_endian_u32(const uint8_t *b) {
    return b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t little_endian_u64(const uint8_t *b) {
    return little_endian_u32(b) | (uint64_t)little_endian_u32(b + 4) << 32;
}

// The FNV-1a hash of bytes[from .. to) written little-endian at bytes[to .. to + 8).
static void put_checksum(uint8_t *bytes, size_t from, size_t to) {
    uint64_t hash = fnv1a(FNV_OFFSET, bytes + from, to - from);
    for (int i = 0; i < CHECKSUM_BYTES; i++) bytes[to + i] = (uint8_t)(hash >> (8 * i));
}

static int is_version(const uint8_t *bytes, size_t size, uint32_t version) {
    return size >= 8 && memcmp(bytes, "TCKP", 4) == 0 && little_endian_u32(bytes + 4) == version;
}

// The model's bytes of a version-4 input as its header gives them, or 0 where the header is
// not there or they do not lie inside the input.
static uint64_t model_end(const uint8_t *bytes, size_t size) {
    if (!is_version(bytes, size, 4) || size < sizeof(CheckpointHeader))
        return 0;
    uint64_t end = little_endian_u64(bytes + MODEL_BYTES_AT);
    return end >= sizeof(CheckpointHeader) + CHECKSUM_BYTES && end <= size ? end : 0;
}

static void fix_checksums(uint8_t *bytes, size_t size) {
    if (is_version(bytes, size, 3) && size >= CHECKSUM_BYTES) {
        put_checksum(bytes, 0, size - CHECKSUM_BYTES);
        return;
    }
    uint64_t end = model_end(bytes, size);
    if (end)
        put_checksum(bytes, 0, end - CHECKSUM_BYTES);
    if (end && size - end >= sizeof(RunHeader) + CHECKSUM_BYTES)
        put_checksum(bytes, end, size - CHECKSUM_BYTES);
}

// The file at path, whole, into *bytes; returns its size.
static size_t read_whole(const char *path, uint8_t **bytes) {
    FILE *f = fopen(path, "rb");
    fuzz_require(f != NULL, "a saved checkpoint cannot be opened");
    fuzz_require(fseek(f, 0, SEEK_END) == 0, "a saved checkpoint cannot be read");
    long size = ftell(f);
    fuzz_require(size >= 0 && fseek(f, 0, SEEK_SET) == 0, "a saved checkpoint cannot be read");
    *bytes = checked_calloc((size_t)size + 1, 1, "fuzz saved checkpoint");
    fuzz_require(fread(*bytes, 1, (size_t)size, f) == (size_t)size,
                 "a saved checkpoint cannot be read");
    fclose(f);
    return (size_t)size;
}

static int same_vocabulary(const Vocabulary *a, const Vocabulary *b) {
    int same = a->size == b->size;
    for (int id = 0; same && id < a->size; id++) same = strcmp(a->words[id], b->words[id]) == 0;
    return same;
}

// The same model: config, tokens and parameters, bit for bit.
static int same_model(const Transformer *a, const Vocabulary *va, const Transformer *b,
                      const Vocabulary *vb) {
    return memcmp(&a->config, &b->config, sizeof a->config) == 0 &&
           a->num_parameters == b->num_parameters && same_vocabulary(va, vb) &&
           memcmp(a->params_memory, b->params_memory, a->num_parameters * sizeof(real)) == 0;
}

// The same checkpoint: the model, its Adam state and dropout generator, the merges (the lab's
// same_merges, lab/lab.c) and the run.
static int same_checkpoint(const LabCheckpoint *a, const LabCheckpoint *b) {
    size_t moments = a->model.num_parameters * sizeof(real);
    int same = same_model(&a->model, &a->vocab, &b->model, &b->vocab) &&
               same_merges(a->merges, b->merges) && (a->merges == NULL) == (b->merges == NULL);
    same = same && a->model.adam_step == b->model.adam_step &&
           a->model.dropout_rng.state == b->model.dropout_rng.state;
    same = same && memcmp(a->model.adam_m, b->model.adam_m, moments) == 0 &&
           memcmp(a->model.adam_v, b->model.adam_v, moments) == 0;
    const RunState *r = &a->run;
    const RunState *s = &b->run;
    return same && r->saved == s->saved && r->epoch_rng == s->epoch_rng &&
           r->epoch == s->epoch && r->epoch_batches == s->epoch_batches &&
           r->data_hash == s->data_hash && strcmp(r->options, s->options) == 0;
}

// What --resume relies on: training_state_error refuses counts that training cannot reach
// (every epoch begun and every batch of one is a step), and the headers alone give the step.
static void check_run(const char *path, LabCheckpoint *c) {
    const Transformer *model = &c->model;
    const RunState *run = &c->run;
    fuzz_require(model->adam_step >= 0 && model->adam_step <= MAX_TRAINING_STEPS,
                 "Adam's step out of range after a load");
    fuzz_require(checkpoint_step(path) == (run->saved ? model->adam_step : 0),
                 "checkpoint_step disagrees with the loaded run's step");
    if (!run->saved)
        return;   // (--resume refuses a checkpoint without a run before its counts)
    uint64_t steps = (uint64_t)model->adam_step;
    int reachable = run->epoch <= steps && run->epoch_batches <= steps &&
                    (run->epoch > 0 || run->epoch_batches == 0) &&
                    model->dropout_rng.state != 0 && run->epoch_rng != 0;
    fuzz_require(reachable || training_state_error(path, model, run) != NULL,
                 "counts that training cannot reach, which --resume takes");
}

// A sentence of two of the vocabulary's tokens (the last, and the fifth or sixth: a word or
// subword of its own), decoded greedily and with a beam of 2; the output lines go to stdout.
// With §5.1 merges a word may be more subwords than the model has positions: lab_decode_sentence
// must refuse it with a line (this target found it reading past the positional table once).
static void check_decode(LabCheckpoint *c) {
    const Vocabulary *vocab = &c->vocab;
    char sentence[200];
    snprintf(sentence, sizeof sentence, "%.90s %.90s", vocab->words[vocab->size - 1],
             vocab->words[vocab->size > 5 ? 5 : 4]);
    for (int beam = 1; beam <= 2; beam++) {
        TextSource from = { "fuzz", MAX_UNKNOWN_WARNINGS, 0, NULL };
        DecodeOptions d = { "fuzz", beam, 0.6, 0 };
        char text[200];
        memcpy(text, sentence, sizeof text);
        (void)lab_decode_sentence(c, text, &from, &d, NULL);
    }
}

// The loaded checkpoint saved, loaded again and saved again: the same checkpoint and the same
// bytes; and the input's own bytes where it was written at this build's number size.
static void check_save(LabCheckpoint *c, const uint8_t *bytes, size_t size) {
    const char *saved = fuzz_file(1, NULL, 0, ".ckpt");
    const char *again = fuzz_file(2, NULL, 0, ".ckpt");
    fuzz_require(!lab_checkpoint_save(saved, &c->model, &c->vocab, c->merges, &c->run),
                 "a loaded checkpoint cannot be saved");
    LabCheckpoint back;
    fuzz_require(!lab_checkpoint_load(saved, &back), "a saved checkpoint does not load");
    fuzz_require(same_checkpoint(c, &back), "a saved checkpoint loads as another");
    fuzz_require(!lab_checkpoint_save(again, &back.model, &back.vocab, back.merges, &back.run),
                 "a saved checkpoint cannot be saved again");
    lab_checkpoint_free(&back);
    uint8_t *first = NULL;
    uint8_t *second = NULL;
    size_t first_size = read_whole(saved, &first);
    size_t second_size = read_whole(again, &second);
    fuzz_require(first_size == second_size && memcmp(first, second, first_size) == 0,
                 "a saved checkpoint, loaded and saved again, differs");
    uint64_t end = model_end(bytes, size);
    int own_size = end && little_endian_u32(bytes + REAL_BYTES_AT) == sizeof(real) &&
                   (end == size || little_endian_u64(bytes + end + RUN_REAL_BYTES_AT) ==
                                   sizeof(real));
    fuzz_require(!own_size || (first_size == size && memcmp(first, bytes, size) == 0),
                 "a version-4 checkpoint of this build's numbers saved again differs from its "
                 "file");
    free(first);
    free(second);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *bytes = checked_calloc(size + 1, 1, "fuzz input");
    memcpy(bytes, data, size);
    fix_checksums(bytes, size);
    const char *path = fuzz_file(0, bytes, size, ".ckpt");
    LabCheckpoint c;
    int lab_loaded = lab_checkpoint_load(path, &c) == NULL;
    Transformer model;
    Vocabulary vocab;
    int loaded = checkpoint_load(path, &model, &vocab) == NULL;
    fuzz_require(!loaded || is_version(bytes, size, 4),
                 "transformer.c loads a file that is not version 4");
    if (lab_loaded && is_version(bytes, size, 4))
        fuzz_require(loaded == (c.merges == NULL),
                     "transformer.c and the lab disagree on loading a version-4 model");
    if (loaded && lab_loaded)
        fuzz_require(same_model(&model, &vocab, &c.model, &c.vocab),
                     "transformer.c and the lab load different models from the same file");
    if (loaded) {
        transformer_free(&model);
        vocab_free(&vocab);
    }
    if (lab_loaded) {
        check_run(path, &c);
        check_decode(&c);
        check_save(&c, bytes, size);
        lab_checkpoint_free(&c);
    }
    free(bytes);
    return 0;
}
