/* lab/checkpoints.c: a checkpoint of make's ./transformer: transformer.c's model, then its run
 *
 * One file holds what `train --resume` needs to go on exactly where a run stopped, and stays
 * one file, renamed into place at once (a checkpoint is never half written):
 *   the model, as transformer.c writes and reads it (transformer.c, "checkpoints": its header,
 *   vocabulary, parameters and checksum), whose header says where it ends; then
 *   the run, written and read here: RunHeader as it lies in memory; the run's flags as text
 *   (one argument a line, which --resume reads back); the §5.1 merges of a model trained on
 *   subwords (lab/subwords.c's section); Adam's moments m and v; an FNV-1a checksum of the
 *   run's bytes.
 * dev/FORMATS.md lays both out byte by byte. A checkpoint that transformer.c alone wrote has no
 * run: it decodes, evaluates and averages here, and does not resume. A checkpoint of format
 * version 3, which ./transformer wrote until 2026-12-06 (model and run under one header), is
 * read here as it was (v3_read, below): it decodes, evaluates, averages and resumes, and its next
 * save is a version-4 checkpoint.
 *
 * BUILD  included by lab/lab.c after lab/subwords.c
 */

// The run that trained a model, as a checkpoint keeps it (Adam's moments and step, and the
// dropout generator, are the model's: Transformer).
typedef struct {
    int saved;                // 0: the checkpoint holds no run (transformer.c alone wrote it)
    uint64_t epoch_rng;       // the data-order generator's state when the epoch was drawn
    uint64_t epoch;           // epochs begun (the first is 1)
    uint64_t epoch_batches;   // batches of the current epoch trained on
    uint64_t data_hash;       // the training pairs' hash (dataset_hash), which --resume checks
    char *options;            // the run's flags as text, "--name\nvalue\n" each ("" for none)
} RunState;

// A checkpoint as the lab reads it.
typedef struct {
    Transformer model;
    Vocabulary vocab;
    Bpe *merges;              // §5.1, or NULL: whole words
    RunState run;
} LabCheckpoint;

typedef struct {
    char magic[4];            // "TRUN"
    uint32_t version;         // 1
    uint64_t real_bytes;      // of Adam's moments: 4 (float) or 8 (double)
    uint64_t adam_step;
    uint64_t dropout_rng;     // the model's dropout generator
    uint64_t epoch_rng;       // RunState's four numbers
    uint64_t epoch;
    uint64_t epoch_batches;
    uint64_t data_hash;
    uint64_t options_bytes;
    uint64_t merges_bytes;
    uint64_t run_bytes;       // the run's bytes, this header to its checksum
} RunHeader;

_Static_assert(sizeof(RunHeader) == 88, "the run header's fields, one after another");

static void lab_checkpoint_free(LabCheckpoint *c) {
    transformer_free(&c->model);
    vocab_free(&c->vocab);
    bpe_free_merges(c->merges);
    free(c->run.options);
    memset(c, 0, sizeof *c);
}

// n numbers written as `bytes`-byte floats or doubles, into x
static void reals_from_bytes(real *x, const unsigned char *raw, size_t n, int bytes) {
    for (size_t i = 0; i < n; i++) {
        float single;
        double value;
        memcpy(bytes == 4 ? (void *)&single : (void *)&value, raw + i * bytes, bytes);
        x[i] = bytes == 4 ? (real)single : (real)value;
    }
}

// ---- writing --------------------------------------------------------------------

// The run, after the model: its header, options, merges, Adam's moments and checksum. Returns 0
// when every write succeeded.
static int write_run(FILE *f, const Transformer *model, const Bpe *merges, const RunState *run) {
    const char *options = run->options ? run->options : "";
    size_t merges_bytes = 0;
    unsigned char *merges_section = bpe_merges_section(merges, &merges_bytes);
    size_t moments = model->num_parameters * sizeof(real);
    RunHeader h = { "TRUN", 1, sizeof(real), (uint64_t)model->adam_step,
                    model->dropout_rng.state, run->epoch_rng, run->epoch, run->epoch_batches,
                    run->data_hash, strlen(options), merges_bytes, 0 };
    h.run_bytes = sizeof h + h.options_bytes + merges_bytes + 2 * moments + 8;
    uint64_t hash = fnv1a(FNV_OFFSET, &h, sizeof h);
    hash = fnv1a(hash, options, h.options_bytes);
    hash = fnv1a(hash, merges_section, merges_bytes);
    hash = fnv1a(fnv1a(hash, model->adam_m, moments), model->adam_v, moments);
    int failed = fwrite(&h, sizeof h, 1, f) != 1;
    failed = failed || fwrite(options, 1, h.options_bytes, f) != h.options_bytes;
    if (merges_bytes > 0)   // (a run of whole words has none: no section, not even a NULL one)
        failed = failed || fwrite(merges_section, 1, merges_bytes, f) != merges_bytes;
    failed = failed || fwrite(model->adam_m, 1, moments, f) != moments;
    failed = failed || fwrite(model->adam_v, 1, moments, f) != moments;
    failed = failed || fwrite(&hash, 8, 1, f) != 1;
    free(merges_section);
    return failed;
}

// The model and its run to path, as transformer.c's checkpoint_save writes a model: to
// PATH.tmp, flushed to the disk, then renamed over path (never a directory or a device).
static const char *lab_checkpoint_save(const char *path, const Transformer *model,
                                       const Vocabulary *vocab, const Bpe *merges,
                                       const RunState *run) {
    char tmp[4200];
    struct stat there;
    if (stat(path, &there) == 0 && !S_ISREG(there.st_mode))
        return errorf("%s: not a regular file; expected a checkpoint's path", path);
    snprintf(tmp, sizeof tmp, "%.4100s.tmp", path);
    errno = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return errorf("%s: cannot write: %s; %s was left as it was", tmp, strerror(errno), path);
    int failed = checkpoint_write_model(f, model, vocab, merges != NULL);
    if (run->saved || merges)   // (a model that transformer.c alone wrote has no run)
        failed = failed || write_run(f, model, merges, run);
    failed = failed || fflush(f) || fsync(fileno(f));
    failed = fclose(f) || failed || rename(tmp, path);
    if (!failed)
        return NULL;
    remove(tmp);
    return errorf("%s: writing the checkpoint failed: %s; %s was left as it was", tmp,
                  strerror(errno ? errno : EIO), path);
}

// ---- reading --------------------------------------------------------------------

// The run after the model, from f (the model's end) to the end of a file of `size` bytes: each
// size against the file, Adam's step, the options' text, the merges, the moments, the checksum.
static const char *read_run(FILE *f, uint64_t size, LabCheckpoint *c, int subwords,
                            const char *path) {
    RunHeader h;
    memset(&h, 0, sizeof h);
    uint64_t start = (uint64_t)ftell(f);
    uint64_t left = size - start;
    int failed = fread(&h, sizeof h, 1, f) != 1;
    if (failed || memcmp(h.magic, "TRUN", 4) != 0 || h.version != 1) {
        return errorf("%s: %llu bytes after the model; expected a run (magic 'TRUN', version 1)",
                      path, (u64)left);
    }
    uint64_t moments = (uint64_t)c->model.num_parameters * h.real_bytes;
    int sizes_fit = h.options_bytes <= left && h.merges_bytes <= left && moments <= left;
    uint64_t expected = sizes_fit ? sizeof h + h.options_bytes + h.merges_bytes + 2 * moments + 8
                                  : 0;
    if (h.run_bytes > left) {
        return errorf("%s: truncated: %llu bytes after the model, but its run's header describes "
                      "%llu", path, (u64)left, (u64)h.run_bytes);
    }
    if ((h.real_bytes != 4 && h.real_bytes != 8) || h.run_bytes != left || expected != left) {
        return errorf("%s: the run after the model takes %llu bytes, its header says %llu and its "
                      "sizes give %llu (%llu-byte numbers); the sizes disagree", path, (u64)left,
                      (u64)h.run_bytes, (u64)expected, (u64)h.real_bytes);
    }
    if (h.adam_step > MAX_TRAINING_STEPS) {
        return errorf("%s: header: Adam step %llu; expected 0 to %d (the most --steps allows)",
                      path, (u64)h.adam_step, MAX_TRAINING_STEPS);
    }
    if ((h.merges_bytes > 0) != subwords) {
        return errorf("%s: %llu bytes of §5.1 merges after a model whose tokens are %s; expected "
                      "merges exactly with subwords", path, (u64)h.merges_bytes,
                      subwords ? "subwords" : "whole words");
    }
    c->model.adam_step = (long)h.adam_step;
    c->model.dropout_rng.state = h.dropout_rng;
    c->run.saved = 1;
    c->run.epoch_rng = h.epoch_rng;
    c->run.epoch = h.epoch;
    c->run.epoch_batches = h.epoch_batches;
    c->run.data_hash = h.data_hash;

    unsigned char *rest = checked_calloc(left - sizeof h, 1, "checkpoint run");
    failed = fread(rest, left - sizeof h, 1, f) != 1;
    uint64_t hash = fnv1a(FNV_OFFSET, &h, sizeof h);
    hash = fnv1a(hash, rest, left - sizeof h - 8);
    uint64_t checksum;
    memcpy(&checksum, rest + left - sizeof h - 8, 8);
    free(c->run.options);   // (lab_checkpoint_load's empty text, which this replaces)
    c->run.options = checked_calloc(h.options_bytes + 1, 1, "checkpoint options");
    memcpy(c->run.options, rest, h.options_bytes);
    const unsigned char *moment = rest + h.options_bytes + h.merges_bytes;
    reals_from_bytes(c->model.adam_m, moment, c->model.num_parameters, (int)h.real_bytes);
    reals_from_bytes(c->model.adam_v, moment + moments, c->model.num_parameters,
                     (int)h.real_bytes);
    const char *error = NULL;
    if (failed)
        error = errorf("%s: read error: %s", path, strerror(errno ? errno : EIO));
    else if (checksum != hash)
        error = errorf("%s: checksum mismatch in the run after the model: the file is damaged",
                       path);
    else if (strlen(c->run.options) != h.options_bytes)
        error = errorf("%s: the run's options hold a zero byte; expected text", path);
    else if (h.merges_bytes > 0)
        error = bpe_read_merges_section(&c->merges, rest + h.options_bytes, h.merges_bytes, path);
    free(rest);
    return error;
}

static const char *v3_read(FILE *f, uint64_t size, LabCheckpoint *c, const char *path);

// A checkpoint of ours (version 4, with or without its run; or version 3) into c. On an error
// nothing is left allocated.
static const char *lab_checkpoint_load(const char *path, LabCheckpoint *c) {
    struct stat st;
    unsigned char start[8] = { 0 };
    memset(&st, 0, sizeof st);
    memset(c, 0, sizeof *c);
    c->run.options = checked_calloc(1, 1, "checkpoint options");
    FILE *f = fopen(path, "rb");
    if (!f) {
        lab_checkpoint_free(c);
        return errorf("%s: cannot open: %s", path, strerror(errno));
    }
    const char *error = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        error = errorf("%s: not a regular file", path);
    int version_3 = fread(start, 1, 8, f) == 8 && memcmp(start, "TCKP\3\0\0\0", 8) == 0;
    rewind(f);
    int subwords = 0;
    uint64_t size = (uint64_t)st.st_size;
    if (!error && version_3)
        error = v3_read(f, size, c, path);
    if (!error && !version_3)
        error = checkpoint_read_model(f, size, &c->model, &c->vocab, &subwords, path);
    if (!error && !version_3 && (uint64_t)ftell(f) < size)
        error = read_run(f, size, c, subwords, path);
    else if (!error && !version_3 && subwords)
        error = errorf("%s: its tokens are §5.1 subwords, but it holds no merges", path);
    fclose(f);
    if (error)
        lab_checkpoint_free(c);
    return error;
}

// ---- version 3 --------------------------------------------------------------------
// Until 2026-12-06 a checkpoint was one header for the model and the run (136 bytes, each field
// little-endian at its place), then the run's options, the vocabulary (each token a u32 length
// and its bytes), the merges, the parameters, Adam's m and v, and an FNV-1a checksum of every
// byte before it (dev/FORMATS.md, "Checkpoint format, version 3"). Read with every check it
// had.

// The next `bytes` bytes of a version-3 header, little-endian
static uint64_t v3_number(const unsigned char **p, int bytes) {
    uint64_t x = 0;
    for (int i = bytes - 1; i >= 0; i--) x = x << 8 | (*p)[i];
    *p += bytes;
    return x;
}

static float v3_float(const unsigned char **p) {
    uint32_t bits = (uint32_t)v3_number(p, 4);
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

// The version-3 header's fields, after the magic and the version, in the file's order.
typedef struct {
    uint64_t real_bytes;
    TransformerConfig config;
    uint64_t num_parameters, adam_step, dropout_rng;
    uint64_t epoch_rng, epoch, epoch_batches, data_hash;
    uint64_t vocab_bytes, options_bytes, merges_bytes, positional;
} V3Header;

static void v3_header_fields(V3Header *h, const unsigned char *p) {
    TransformerConfig *config = &h->config;
    h->real_bytes = v3_number(&p, 4);
    config->n_layers = (int32_t)v3_number(&p, 4);
    config->d_model = (int32_t)v3_number(&p, 4);
    config->d_ff = (int32_t)v3_number(&p, 4);
    config->n_heads = (int32_t)v3_number(&p, 4);
    config->vocab_size = (int32_t)v3_number(&p, 4);
    config->max_len = (int32_t)v3_number(&p, 4);
    config->dropout = v3_float(&p);
    config->label_smoothing = v3_float(&p);
    config->layer_norm_eps = v3_float(&p);
    uint64_t *rest[11] = {
        &h->num_parameters, &h->adam_step, &h->dropout_rng, &h->epoch_rng, &h->epoch,
        &h->epoch_batches, &h->data_hash, &h->vocab_bytes, &h->options_bytes, &h->merges_bytes,
        &h->positional,
    };
    for (int i = 0; i < 11; i++) *rest[i] = v3_number(&p, 8);
}

// The header of a version-3 file of `size` bytes: the numbers' size, the config, the parameter
// count against the config, each section's size, and the file's size.
static const char *v3_check_header(V3Header *h, uint64_t size, const char *path) {
    if (h->real_bytes != 4 && h->real_bytes != 8) {
        return errorf("%s: header: %llu-byte numbers; expected 4 (float) or 8 (double)", path,
                      (u64)h->real_bytes);
    }
    if (h->positional != POSITIONAL_SINUSOID && h->positional != POSITIONAL_LEARNED) {
        return errorf("%s: header: positional kind %llu; expected %d (sinusoid) or %d (learned)",
                      path, (u64)h->positional, POSITIONAL_SINUSOID, POSITIONAL_LEARNED);
    }
    h->config.positional = (int)h->positional;
    const char *error = transformer_config_check(&h->config);
    if (error)
        return errorf("%s: header: %s", path, error);
    size_t sizes[NUM_PARAMETER_TENSORS];
    uint64_t P = parameter_sizes(sizes, &h->config);
    if (h->num_parameters != P) {
        return errorf("%s: header: %llu parameters, but its sizes give %llu", path,
                      (u64)h->num_parameters, (u64)P);
    }
    uint64_t sections[3] = { h->vocab_bytes, h->options_bytes, h->merges_bytes };
    uint64_t least[3] = { 5 * (uint64_t)h->config.vocab_size, 0, h->merges_bytes ? 14 : 0 };
    const char *names[3] = { "vocabulary", "options", "merges" };
    for (int i = 0; i < 3; i++) {
        if (sections[i] > size || sections[i] < least[i]) {
            return errorf("%s: header: a %s section of %llu bytes; expected from %llu bytes up to "
                          "the file's %llu", path, names[i], (u64)sections[i], (u64)least[i],
                          (u64)size);
        }
    }
    if (h->adam_step > MAX_TRAINING_STEPS) {
        return errorf("%s: header: Adam step %llu; expected 0 to %d (the most --steps allows)",
                      path, (u64)h->adam_step, MAX_TRAINING_STEPS);
    }
    uint64_t expected = 136 + h->options_bytes + h->vocab_bytes + h->merges_bytes
                      + 3 * P * h->real_bytes + 8;
    if (size != expected) {
        return errorf("%s: %s: %llu bytes, but its header describes %llu", path,
                      size < expected ? "truncated" : "the sizes disagree", (u64)size,
                      (u64)expected);
    }
    return NULL;
}

// The vocabulary section of version 3: for each id a u32 length and the token's bytes; the
// special tokens first, then tokens without spaces, each once.
static const char *v3_vocabulary(Vocabulary *vocab, const unsigned char *p, uint64_t bytes,
                                 int V, const char *path) {
    uint64_t used = 0;
    for (int i = 0; i < V; i++) {
        const unsigned char *length = p + used;
        uint32_t n = used + 4 <= bytes ? (uint32_t)v3_number(&length, 4) : 0;
        used += 4 + (uint64_t)n;
        if (n == 0 || used > bytes) {
            return errorf("%s: vocabulary token %d has length %u; the vocabulary section "
                          "disagrees with its size in the header (%llu bytes)", path, i, n,
                          (u64)bytes);
        }
        const char *word = (const char *)p + used - n;
        int known = vocab_find(vocab, word, n);
        int ok = memchr(word, 0, n) == NULL && (i < NUM_SPECIAL_TOKENS ? known == i : known < 0);
        for (uint32_t j = 0; j < n && ok; j++) ok = !isspace((unsigned char)word[j]);
        if (!ok) {
            return errorf("%s: vocabulary token %d is %s; expected %s", path, i,
                          known >= 0 && i >= NUM_SPECIAL_TOKENS ? "a repeat" : "not valid",
                          i < NUM_SPECIAL_TOKENS ? special_tokens[i]
                                                 : "a new token without spaces");
        }
        vocab_add(vocab, word, n);
    }
    if (used == bytes)
        return NULL;
    return errorf("%s: the vocabulary takes %llu bytes, but its header says %llu", path,
                  (u64)used, (u64)bytes);
}

// A version-3 checkpoint of `size` bytes at f into c: the header, then the file read whole, its
// checksum checked before its sections are read.
static const char *v3_read(FILE *f, uint64_t size, LabCheckpoint *c, const char *path) {
    unsigned char header[136];
    V3Header h;
    vocab_init(&c->vocab);
    if (size < 136 + 8 || fread(header, 136, 1, f) != 1) {
        return errorf("%s: truncated: %llu bytes; the header and checksum alone take %d", path,
                      (u64)size, 136 + 8);
    }
    v3_header_fields(&h, header + 8);
    const char *error = v3_check_header(&h, size, path);
    if (error)
        return error;
    size_t body_bytes = size - 136;
    unsigned char *body = checked_calloc(body_bytes, 1, "checkpoint");
    if (fread(body, body_bytes, 1, f) != 1)
        error = errorf("%s: read error: %s", path, strerror(errno ? errno : EIO));
    const unsigned char *checksum_at = body + body_bytes - 8;
    uint64_t checksum = v3_number(&checksum_at, 8);
    if (!error && checksum != fnv1a(fnv1a(FNV_OFFSET, header, 136), body, body_bytes - 8))
        error = errorf("%s: checksum mismatch: the file is damaged", path);
    const unsigned char *section = body;
    if (!error) {
        free(c->run.options);
        c->run.options = checked_calloc(h.options_bytes + 1, 1, "checkpoint options");
        memcpy(c->run.options, section, h.options_bytes);
        if (strlen(c->run.options) != h.options_bytes)
            error = errorf("%s: the options section holds a zero byte; expected text", path);
    }
    section += h.options_bytes;
    if (!error)
        error = v3_vocabulary(&c->vocab, section, h.vocab_bytes, h.config.vocab_size, path);
    section += h.vocab_bytes;
    if (!error && h.merges_bytes > 0)
        error = bpe_read_merges_section(&c->merges, section, h.merges_bytes, path);
    section += h.merges_bytes;
    if (!error)
        error = transformer_build(&c->model, &h.config, 1);
    if (!error) {
        Transformer *model = &c->model;
        size_t P = model->num_parameters;
        reals_from_bytes(model->params_memory, section, P, (int)h.real_bytes);
        reals_from_bytes(model->adam_m, section + P * h.real_bytes, P, (int)h.real_bytes);
        reals_from_bytes(model->adam_v, section + 2 * P * h.real_bytes, P, (int)h.real_bytes);
        model->adam_step = (long)h.adam_step;
        model->dropout_rng.state = h.dropout_rng;
        RunState run = { 1, h.epoch_rng, h.epoch, h.epoch_batches, h.data_hash, c->run.options };
        c->run = run;
        const char *nonfinite = nonfinite_parameter(model);
        if (nonfinite)
            error = errorf("%s: %s holds a number that is not finite", path, nonfinite);
    }
    free(body);
    return error;
}

// The Adam step of the checkpoint at path, from its headers alone (its run's, or version 3's);
// 0 where it is not a checkpoint of ours, or holds no run.
static long checkpoint_step(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    CheckpointHeader h;
    RunHeader run;
    unsigned char v3[64];
    memset(&h, 0, sizeof h);
    memset(&run, 0, sizeof run);
    long step = 0;
    int version_3 = fread(v3, 1, 64, f) == 64 && memcmp(v3, "TCKP\3\0\0\0", 8) == 0;
    if (version_3) {
        const unsigned char *adam_step = v3 + 56;   // after the config and the parameter count
        step = (long)v3_number(&adam_step, 8);
    }
    rewind(f);
    if (!version_3 && fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, "TCKP", 4) == 0 &&
        fseek(f, (long)h.model_bytes, SEEK_SET) == 0 && fread(&run, sizeof run, 1, f) == 1 &&
        memcmp(run.magic, "TRUN", 4) == 0)
        step = (long)run.adam_step;
    fclose(f);
    return step >= 0 && step <= MAX_TRAINING_STEPS ? step : 0;
}
