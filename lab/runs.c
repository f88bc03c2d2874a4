/* lab/runs.c: the lab's train, a run beyond one session, for make's ./transformer
 *
 * transformer.c's train learns a toy task in one session. The lab's train is its own command,
 * built from the same pieces (train_load_task, train_build_model, train_next_batch: the loop's
 * lines stand twice, here with the lab's steps among them), and
 * takes these further flags:
 *   --train, --valid  source<TAB>target files (lab/text.c), every 20th line held out without
 *                     --valid; --bpe N: §5.1 subwords (lab/subwords.c), N merges learned
 *   --resume FILE     go on with the run in a checkpoint (lab/checkpoints.c), where it stopped
 *   --keep-last N     also keep the last N saves as CHECKPOINT.stepNNNNNNN (for `average`)
 *   --log, --loss-log a CSV line at each progress line and evaluation (`plot` draws it);
 *                     "step loss lr" of every step
 *   --threads 0       the cores other programs leave free, counted again each second (with
 *                     several ranks on a machine: its share of them)
 *   --force           replace a checkpoint that is there (never without it)
 *   --words, --min-length, --max-length, --train-size, --valid-size (the tasks), --dropout,
 *   --label-smoothing, --positions, --positional (Table 3 row E), --eval-every, --save-every,
 *   --log-every, --eval-size, --show
 * The steps run through transformer.c's TrainingCompute seam, as its own train's do (the CUDA
 * companion plugs in there). Started by mpirun as N ranks, each trains on its share of every
 * batch and the ranks sum their gradients (lab/ranks.c); rank 0 alone prints and writes.
 *
 * BUILD  included by lab/lab.c after lab/ranks.c
 */

#define MAX_TRAIN_OPTIONS 48

// What the lab holds of the run being trained (one per process), beside transformer.c's
// TrainRun: its flags beyond TrainOptions, what a checkpoint keeps of the run, and the logs.
static struct {
    // flags
    const char *train_path, *valid_path;
    int threads, force, save_every, bpe, keep_last;
    const char *positional, *resume, *loss_log, *log_csv, *batch_log;
    Option options[MAX_TRAIN_OPTIONS];   // train's table: transformer.c's flags and these
    int num_options;
    // the run: the §5.1 merges (NULL: whole words), and what its checkpoints keep of it
    Bpe *merges;
    RunState state;
    const char *resumed_from;     // the checkpoint --resume read the run from, or NULL
    char *stored_options;         // --resume: its options text (the text flags point into it)
    long last_saved_step;         // -1: none saved by this run yet
    const char *threads_note;     // how the threads are counted, for the header
    // the step just taken, for the logs: its seconds and tokens, and the held-out exact match
    // % (NaN when not evaluated)
    double seconds, heldout;
    long tokens;
    int evaluated;
    // --log, --loss-log, --batch-log: the files, and the steps since the last CSV line
    FILE *loss_log_file, *log_file, *batch_log_file;
    double csv_loss, csv_seconds;
    long csv_steps, csv_tokens;
    // --keep-last: the steps of the CHECKPOINT.stepN files there are, oldest first
    long *kept_steps;
    // replacing: they are another run's, which --force replaces at this run's first save
    int num_kept, replacing;
} lab_run;

// FNV-1a over every pair's tokens: tells whether two datasets are the same
// (a resumed run checks that its training data has not changed).
static uint64_t dataset_hash(const Dataset *dataset) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < dataset->count; i++) {
        const SentencePair *p = &dataset->pairs[i];
        int header[2] = { p->src_len, p->tgt_len };
        for (int field = 0; field < 2 + p->src_len + p->tgt_len; field++) {
            int x = field < 2 ? header[field]
                  : field < 2 + p->src_len ? dataset->tokens[p->src + field - 2]
                  : dataset->tokens[p->tgt + field - 2 - p->src_len];
            for (int byte = 0; byte < 4; byte++) {
                h ^= (uint8_t)((uint32_t)x >> (8 * byte));
                h *= 0x100000001B3ULL;
            }
        }
    }
    return h;
}

// ---- train's flags ---------------------------------------------------------

// train's flags that transformer.c alone does not have, and today's order of train --help:
// transformer.c's flags with these among them, then the lab's own.
static const char *train_flag_order[] = {
    "--task", "--train", "--valid", "--layers", "--d-model", "--d-ff", "--heads", "--dropout",
    "--label-smoothing", "--steps", "--lr", "--warmup", "--batch-tokens", "--seed", "--checkpoint",
    "--eval-every", "--show", "--threads", "--force",
};

static const char *lab_train_usage =
    "usage: ./transformer train [--task copy|reverse | --train FILE.tsv] [options]\n"
    "Trains a Transformer with Adam and the warm-up schedule of §5.3, label smoothing and\n"
    "dropout (§5.4), on a built-in task or on source<TAB>target lines; evaluates on held-out\n"
    "pairs as it goes and writes checkpoints.";

static void lab_train_options(TrainRun *run) {
    TrainOptions *o = &run->opt;
    lab_run.positional = "sinusoid";
    lab_run.last_saved_step = -1;
    progress_always = 0;
    Option base[16];
    int num_base = train_option_table(base, o);   // transformer.c's flags
    Option moved[] = {
        TEXT_OPTION("--train", &lab_run.train_path,
                    "training data: a file of source<TAB>target lines"),
        TEXT_OPTION("--valid", &lab_run.valid_path, "held-out data, same format (default: every "
                    "20th line of --train)"),
        NUMBER_OPTION("--dropout", &o->dropout, 0, 0.99, 0, "P_drop (§5.4)"),
        NUMBER_OPTION("--label-smoothing", &o->label_smoothing, 0, 0.99, 0, "eps_ls (§5.4)"),
        INT_OPTION("--eval-every", &o->eval_every, 0, INT_MAX, "held-out evaluation every N steps "
                   "(0: only at the end)"),
        INT_OPTION("--show", &o->show, 0, INT_MAX, "held-out examples to print at the end"),
        INT_OPTION("--threads", &lab_run.threads, 0, 1024, "OpenMP threads (0: the cores free of "
                   "other programs, counted again each second)"),
        FLAG_OPTION("--force", &lab_run.force, "write the checkpoint even where a file is "
                    "already there: it is replaced, with its CHECKPOINT.stepNNNNNNN files "
                    "(without --force a new run stops there)"),
    };
    Option list[] = {
        INT_OPTION("--bpe", &lab_run.bpe, 1, 1000000,
                   "§5.1 byte-pair encoding: learn N merges from both sides of "
                   "--train and train on subwords (without it: whole words)"),
        INT_OPTION("--words", &o->words, 1, 100000, "task: the words are the numbers 0..N-1"),
        INT_OPTION("--min-length", &o->min_length, 1, TRANSFORMER_MAX_LEN - 1,
                   "task: shortest sequence"),
        INT_OPTION("--max-length", &o->max_length, 1, TRANSFORMER_MAX_LEN - 1,
                   "task: longest sequence"),
        INT_OPTION("--train-size", &o->train_size, 1, 10000000, "task: training pairs"),
        INT_OPTION("--valid-size", &o->valid_size, 1, 100000,
                   "task: held-out pairs, none of them seen in training"),
        INT_OPTION("--positions", &o->positions, 0, TRANSFORMER_MAX_LEN,
                   "maximum sentence length the model takes; 0: the longest in the data + 50"),
        TEXT_OPTION("--positional", &lab_run.positional,
                    "positions: sinusoid (§3.5) or learned (a trained table, Table 3 row E)"),
        TEXT_OPTION("--resume", &lab_run.resume,
                    "go on with the run in this checkpoint (--steps may be raised)"),
        TEXT_OPTION("--loss-log", &lab_run.loss_log,
                    "append 'step loss lr' of every step to this file"),
        TEXT_OPTION("--batch-log", &lab_run.batch_log,
                    "append every step's batch to this file: int32 step, B, S, T, then src, "
                    "src_len, tgt_in, tgt_out, tgt_len (dev/pytorch_translate.py trains on them)"),
        TEXT_OPTION("--log", &lab_run.log_csv,
                    "append CSV lines step,loss,lr,tokens_per_s,heldout at each progress line "
                    "and evaluation (heldout: exact match %; ./transformer plot draws it)"),
        INT_OPTION("--keep-last", &lab_run.keep_last, 0, 1000, "also keep the last N saves as "
                   "CHECKPOINT.stepNNNNNNN files, for ./transformer average (0: none)"),
        INT_OPTION("--save-every", &lab_run.save_every, 0, INT_MAX,
                   "checkpoint every N steps (0: at each evaluation)"),
        INT_OPTION("--log-every", &o->log_every, 0, INT_MAX,
                   "progress line every N steps (0: none)"),
        INT_OPTION("--eval-size", &o->eval_size, 0, INT_MAX,
                   "held-out pairs to decode at each evaluation (default 500; 0: all)"),
        FLAG_OPTION("--progress", &progress_always,
                    "progress lines of long work (--bpe's counting and learning, "
                    "cutting the data) also when standard error is not a terminal"),
    };
    int num_moved = (int)(sizeof moved / sizeof *moved);
    int num_list = (int)(sizeof list / sizeof *list);
    int num_order = (int)(sizeof train_flag_order / sizeof *train_flag_order);

    // transformer.c's flags and the moved ones in train_flag_order; then any flag of
    // transformer.c's that the order does not name; then the lab's own.
    Option *table = lab_run.options;
    int n = 0;
    for (int i = 0; i < num_order; i++) {
        Option *found = find_option(base, num_base, train_flag_order[i]);
        if (!found)
            found = find_option(moved, num_moved, train_flag_order[i]);
        if (found) {
            table[n] = *found;
            n++;
        }
    }
    for (int i = 0; i < num_base; i++) {
        if (!find_option(table, n, base[i].name)) {
            table[n] = base[i];
            n++;
        }
    }
    memcpy(table + n, list, sizeof list);
    n += num_list;
    lab_run.num_options = n;
    find_option(table, n, "--task")->help =
        "built-in task, copy or reverse (used when there is no --train)";
    find_option(table, n, "--checkpoint")->help =
        "checkpoint file (default runs/TASK.ckpt or runs/FILE.ckpt)";
}

// A new run's pairs against its model's max_len, which --positions may make too short for them.
static const char *lab_check_lengths(const TrainRun *run) {
    const char *valid_name = lab_run.valid_path ? lab_run.valid_path : run->data_name;
    const char *error = dataset_check_lengths(&run->train, run->data_name,
                                              run->model.config.max_len);
    if (!error)
        error = dataset_check_lengths(&run->valid, valid_name, run->model.config.max_len);
    return error;
}

// A run's data: the TSV files of --train and --valid (lab/text.c), or the task (transformer.c's).
static const char *lab_load_data(TrainRun *run, int grow) {
    if (lab_run.train_path) {
        return lab_load_tsv(run, lab_run.merges, lab_run.train_path, lab_run.valid_path, grow);
    }
    return train_load_task(run);
}

// The checkpoint's path: --checkpoint, or runs/NAME.ckpt, NAME the task's or the --train file's
// (without its directory and its extension).
static const char *lab_checkpoint_path(TrainRun *run) {
    const TrainOptions *o = &run->opt;
    if (o->checkpoint) {
        size_t length = strlen(o->checkpoint);
        size_t most = sizeof run->checkpoint_path - 6;   // room for ".tmp" and a ".stepN"
        if (length == 0 || length > most) {   // (the message shows a long path's start)
            return errorf("--checkpoint '%.40s%s': expected a file's path of 1 to %zu bytes",
                          o->checkpoint, length > 40 ? "..." : "", most);
        }
        snprintf(run->checkpoint_path, sizeof run->checkpoint_path, "%s", o->checkpoint);
        return NULL;
    }
    const char *name = lab_run.train_path ? lab_run.train_path : o->task;
    const char *slash = strrchr(name, '/');
    if (slash)
        name = slash + 1;
    const char *dot = strrchr(name, '.');
    int length = dot && dot != name ? (int)(dot - name) : (int)strlen(name);
    if (length > 200)
        length = 200;
    // (rank 0 alone writes checkpoints: the other ranks make no directory on their machines)
    if (run_ranks.rank == 0 && mkdir("runs", 0777) != 0 && errno != EEXIST)
        return errorf("runs/: cannot create: %s", strerror(errno));
    snprintf(run->checkpoint_path, sizeof run->checkpoint_path, "runs/%.*s.ckpt", length, name);
    return NULL;
}

// What a new run's checkpoint may replace: never a trained model unasked. Only the checkpoint
// being resumed, or --force, replaces a file; never a directory or a device; and PATH.tmp must
// be writable, all before any training.
static const char *lab_check_output(TrainRun *run) {
    struct stat there, resumed;
    int exists = stat(run->checkpoint_path, &there) == 0;
    int same = exists && lab_run.resumed_from && stat(lab_run.resumed_from, &resumed) == 0 &&
               there.st_dev == resumed.st_dev && there.st_ino == resumed.st_ino;
    // (the save refuses it too, but only after the training)
    if (exists && !S_ISREG(there.st_mode))
        return errorf("%s: not a regular file; expected a checkpoint's path", run->checkpoint_path);
    if (exists && !same && !lab_run.force)
        return errorf("%s is already there (another run's checkpoint?); expected --resume %s to "
                      "go on with it, --force to replace it, or another --checkpoint",
                      run->checkpoint_path, run->checkpoint_path);
    char tmp[sizeof run->checkpoint_path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", run->checkpoint_path);   // also what a killed save left
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return errorf("%s: cannot write the checkpoint there: %s", tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    if (!same)
        lab_run.last_saved_step = -1;
    return NULL;
}

// ---- --resume ---------------------------------------------------------------

// train's flags that are not stored in checkpoints: they belong to one session
static const char *session_flags[] = { "--checkpoint", "--eval-every", "--show", "--threads",
                                       "--force", "--resume", "--loss-log", "--log", "--keep-last",
                                       "--save-every", "--log-every", "--eval-size", "--batch-log",
                                       "--progress" };

static int stored_flag(const Option *o) {
    for (size_t i = 0; i < sizeof session_flags / sizeof *session_flags; i++)
        if (strcmp(o->name, session_flags[i]) == 0)
            return 0;
    return 1;
}

// The flags that define the run (data, model, schedule) as text, one
// argument per line, for the checkpoint: --resume reads them back with the same table.
static char *format_run_options(const Option *options, int n) {
    size_t capacity = 256, used = 0;
    char *text = checked_calloc(capacity, 1, "run options");
    for (const Option *o = options; o < options + n; o++) {
        char value[4200];
        if (!stored_flag(o) || (o->kind == OPTION_INT && *(int *)o->value < o->min))
            continue;   // (below min: off)
        if (o->kind == OPTION_INT)
            snprintf(value, sizeof value, "%d", *(int *)o->value);
        else if (o->kind == OPTION_NUMBER)
            snprintf(value, sizeof value, "%.17g", *(double *)o->value);
        else if (*(const char **)o->value)
            snprintf(value, sizeof value, "%s", *(const char **)o->value);
        else
            continue;
        size_t need = strlen(o->name) + strlen(value) + 3;
        if (used + need >= capacity)
            text = checked_realloc(text, capacity = 2 * (used + need), 1, "run options");
        used += (size_t)sprintf(text + used, "%s\n%s\n", o->name, value);
    }
    return text;
}

typedef union {
    int number;
    double real_number;
    const char *text;
} OptionValue;

static OptionValue option_value(const Option *o) {
    OptionValue v;
    if (o->kind == OPTION_INT || o->kind == OPTION_FLAG)
        v.number = *(int *)o->value;
    else if (o->kind == OPTION_NUMBER)
        v.real_number = *(double *)o->value;
    else
        v.text = *(const char **)o->value;
    return v;
}

static void set_option_value(const Option *o, OptionValue v) {
    if (o->kind == OPTION_INT || o->kind == OPTION_FLAG)
        *(int *)o->value = v.number;
    else if (o->kind == OPTION_NUMBER)
        *(double *)o->value = v.real_number;
    else
        *(const char **)o->value = v.text;
}

// A checkpoint's generator states and epoch counts, which only --resume reads: each in the range
// training reaches, where every epoch begun and every batch of it is a step.
static const char *training_state_error(const char *path, const Transformer *model,
                                        const RunState *state) {
    u64 steps = (u64)model->adam_step;
    if (model->dropout_rng.state == 0)
        return errorf("%s: header: dropout generator state 0; expected non-zero", path);
    if (state->epoch > steps)
        return errorf("%s: header: epoch %llu after %llu steps; expected at most one epoch begun "
                      "per step", path, (u64)state->epoch, steps);
    if (state->epoch_batches > steps)
        return errorf("%s: header: %llu batches of the current epoch done after %llu steps; "
                      "expected at most one batch per step", path, (u64)state->epoch_batches,
                      steps);
    if (state->epoch == 0 && state->epoch_batches != 0)
        return errorf("%s: header: epoch 0 with batches of it done (%llu); expected none before "
                      "the first epoch", path, (u64)state->epoch_batches);
    if (state->epoch_rng == 0)
        return errorf("%s: header: data-order generator state 0; expected non-zero", path);
    return NULL;
}

// The run's options come from the checkpoint; the command line may add only
// --steps (to train longer), the data files' paths (moved data is accepted
// when its pairs hash as the checkpoint's did) and session flags.
static const char *lab_resume(TrainRun *run) {
    const char *error;
    const char *path = lab_run.resume;
    int n = lab_run.num_options;
    int seen[MAX_TRAIN_OPTIONS];
    OptionValue given[MAX_TRAIN_OPTIONS];
    for (int i = 0; i < n; i++) {
        const Option *o = &lab_run.options[i];
        if (o->seen && stored_flag(o) && strcmp(o->name, "--steps") != 0 &&
            strcmp(o->name, "--train") != 0 && strcmp(o->name, "--valid") != 0)
            return errorf("%s cannot change on --resume: the checkpoint fixes the run's data, "
                          "model and schedule; expected only --steps and session flags", o->name);
        seen[i] = o->seen;
        given[i] = option_value(o);
    }
    LabCheckpoint c;
    if ((error = lab_checkpoint_load(path, &c)))
        return error;
    run->model = c.model;
    run->vocab = c.vocab;
    lab_run.merges = c.merges;
    lab_run.state = c.run;
    lab_run.stored_options = c.run.options;
    lab_run.state.options = NULL;
    if (!lab_run.state.saved || !lab_run.stored_options[0])
        return errorf("%s: the checkpoint holds no run options (transformer.c alone wrote it); "
                      "expected one that ./transformer train wrote", path);
    if ((error = training_state_error(path, &run->model, &lab_run.state)))
        return error;
    // the stored options, one argument per line, read with the same table; then the
    // command line's again
    char *args[2 * MAX_TRAIN_OPTIONS + 1];
    int argc = 1;
    args[0] = "train";
    for (char *p = lab_run.stored_options; *p && argc < 2 * MAX_TRAIN_OPTIONS + 1;) {
        args[argc] = p;
        argc++;
        char *end = strchr(p, '\n');
        if (!end)
            break;
        *end = '\0';
        p = end + 1;
    }
    if (parse_options("train", lab_train_usage, lab_run.options, n, argc, args, NULL, NULL) != 0)
        return errorf("%s: the run options stored in the checkpoint are not readable", path);
    for (int i = 0; i < n; i++) {
        lab_run.options[i].seen = seen[i];
        if (seen[i])
            set_option_value(&lab_run.options[i], given[i]);
    }
    if (!find_option(lab_run.options, n, "--checkpoint")->seen)
        run->opt.checkpoint = path;   // keep writing where the run was
    // the data files as the run named them: relative to where it started, or moved since?
    const char *files[2] = { lab_run.train_path, lab_run.valid_path };
    const char *flags[2] = { "--train", "--valid" };
    for (int i = 0; i < 2; i++) {
        if (files[i] && !find_option(lab_run.options, n, flags[i])->seen &&
            access(files[i], R_OK) != 0)
            return errorf("%s: cannot open: %s; it is the run's %s as it was given when the run "
                          "began: if the file moved, or that path was relative to another "
                          "directory, give it again with %s PATH",
                          files[i], strerror(errno), flags[i], flags[i]);
    }
    const TrainOptions *o = &run->opt;
    if (!lab_run.train_path && run->vocab.size != NUM_SPECIAL_TOKENS + o->words)
        return errorf("the checkpoint's vocabulary has %d tokens; the %s task with --words %d "
                      "has %d", run->vocab.size, o->task, o->words,
                      NUM_SPECIAL_TOKENS + o->words);
    if (!lab_run.train_path) {
        // a task makes its vocabulary as it makes its pairs: the checkpoint's, token for token
        Vocabulary stored = run->vocab;
        memset(&run->vocab, 0, sizeof run->vocab);
        error = lab_load_data(run, 0);
        for (int id = 0; !error && id < stored.size; id++) {
            if (strcmp(stored.words[id], run->vocab.words[id]) != 0)
                error = errorf("%s: vocabulary token %d is '%s'; the %s task's is '%s'", path, id,
                               stored.words[id], o->task, run->vocab.words[id]);
        }
        vocab_free(&stored);
    } else {
        error = lab_load_data(run, 0);
    }
    if (error)
        return error;
    if (dataset_hash(&run->train) != lab_run.state.data_hash)
        return errorf("%s: not the training data of the checkpoint (its sentence pairs differ); "
                      "expected the same data to resume (--train may give its new path)",
                      run->data_name);
    error = dataset_check_lengths(&run->valid,
                                  lab_run.valid_path ? lab_run.valid_path : run->data_name,
                                  run->model.config.max_len);
    if (error)
        return error;
    // the data order: redraw the current epoch from the generator state it was drawn with
    run->data_rng.state = lab_run.state.epoch_rng;
    run->epoch = (long)lab_run.state.epoch;
    run->epoch_batches = (int)lab_run.state.epoch_batches;
    if (lab_run.state.epoch > 0) {
        epoch_plan_make(&run->plan, &run->train, run->opt.batch_tokens, &run->data_rng);
        if (lab_run.state.epoch_batches > (uint64_t)run->plan.num_spans)
            return errorf("%s: %llu batches done in an epoch of %d; the checkpoint does not fit "
                          "the data", path, (u64)lab_run.state.epoch_batches,
                          run->plan.num_spans);
    }
    lab_run.last_saved_step = run->model.adam_step;
    lab_run.resumed_from = path;
    return NULL;
}

// --bpe N (§5.1): the merges, learned from the training pairs (both sides),
// and the vocabulary of every symbol they know (vocab_add_subwords).
static const char *lab_learn_merges(TrainRun *run) {
    int learned = 0;
    double start = wall_seconds();
    vocab_init(&run->vocab);
    const char *error = bpe_learn_for_training(&run->vocab, &lab_run.merges, lab_run.train_path,
                                               lab_run.valid_path ? 0 : 20, lab_run.bpe,
                                               &learned);
    if (error)
        return error;
    printf("bpe    %d merges learned from %s in %.2f s (§5.1), %d subwords\n", learned,
           lab_run.train_path, wall_seconds() - start, run->vocab.size - NUM_SPECIAL_TOKENS);
    if (learned < lab_run.bpe)
        printf("bpe    stopped after %d of the %d merges asked for: no pair of symbols occurs "
               "twice any more\n", learned, lab_run.bpe);
    fflush(stdout);
    // progress lines as train reads the file again, cutting each word
    bpe_cutting_begin(bpe_words_read);
    return NULL;
}

// ---- --keep-last ------------------------------------------------------------

static void kept_checkpoint_path(char *out, size_t n, const TrainRun *run, long step) {
    snprintf(out, n, "%s.step%07ld", run->checkpoint_path, step);
}

// --keep-last across sessions: finds the CHECKPOINT.stepNNNNNNN files of steps
// 1..last, oldest first, and removes the .tmp files of saves that were killed.
// The headers used here have no directory listing, so every step's name is
// tried (about a microsecond each: a second for a million steps).
static void kept_steps_find(const TrainRun *run, long last) {
    char path[sizeof run->checkpoint_path + 40];
    lab_run.num_kept = 0;
    for (long step = 1; step <= last; step++) {
        kept_checkpoint_path(path, sizeof path, run, step);
        if (access(path, F_OK) == 0) {
            lab_run.kept_steps = checked_realloc(lab_run.kept_steps, (size_t)lab_run.num_kept + 1,
                                                 sizeof(long), "kept checkpoints");
            lab_run.kept_steps[lab_run.num_kept++] = step;
        }
        strcat(path, ".tmp");
        if (access(path, F_OK) == 0)
            remove(path);
    }
}

// Removes the oldest kept step files until at most `keep` are left.
static void kept_steps_trim(const TrainRun *run, int keep) {
    char path[sizeof run->checkpoint_path + 32];
    int drop = lab_run.num_kept > keep ? lab_run.num_kept - keep : 0;
    for (int i = 0; i < drop; i++) {
        kept_checkpoint_path(path, sizeof path, run, lab_run.kept_steps[i]);
        remove(path);
    }
    if (drop == 0)
        return;   // (kept_steps may be NULL: none were ever found)
    lab_run.num_kept -= drop;
    memmove(lab_run.kept_steps, lab_run.kept_steps + drop, (size_t)lab_run.num_kept * sizeof(long));
}


// Without --force, no CHECKPOINT.stepN file is replaced: one that a step this
// run will keep (--keep-last) would write is already there, left by a run whose
// checkpoint has gone, say. NULL, or the error naming it.
static const char *kept_steps_unused(const TrainRun *run) {
    const TrainOptions *o = &run->opt;
    // as lab_train_loop saves
    int every = lab_run.save_every ? lab_run.save_every : o->eval_every;
    char path[sizeof run->checkpoint_path + 32];
    if (lab_run.keep_last == 0)
        return NULL;   // no step files written
    for (long step = run->model.adam_step + 1; step <= o->steps; step++) {
        if (!(every && step % every == 0) && step != o->steps)
            continue;   // not a step that saves
        kept_checkpoint_path(path, sizeof path, run, step);
        if (access(path, F_OK) == 0)
            return errorf("%s is already there (another run's?); expected --force to replace it, "
                          "or another --checkpoint", path);
    }
    return NULL;
}

// The checkpoint at the run's path when this run began: the resumed one (or
// none), or another run's, which --force replaces with its step files (but
// the one this run resumed from, if it is one of them). They go when this run
// has saved its first checkpoint (lab_keep_last), so that a run that fails
// before then leaves the other run whole.
static const char *lab_kept_steps_begin(const TrainRun *run) {
    struct stat there, resumed, kept;
    int exists = stat(run->checkpoint_path, &there) == 0;
    int found = lab_run.resumed_from && stat(lab_run.resumed_from, &resumed) == 0;
    int same = exists && found && there.st_dev == resumed.st_dev && there.st_ino == resumed.st_ino;
    if (exists && !same) {   // --force: the replaced run's CHECKPOINT.stepN files, to go with it
        kept_steps_find(run, checkpoint_step(run->checkpoint_path));
        lab_run.replacing = 1;
        char path[sizeof run->checkpoint_path + 40];
        // except one this run resumed from (a rollback)
        for (int i = 0; found && i < lab_run.num_kept; i++) {
            kept_checkpoint_path(path, sizeof path, run, lab_run.kept_steps[i]);
            if (stat(path, &kept) == 0 && kept.st_dev == resumed.st_dev &&
                kept.st_ino == resumed.st_ino) {
                memmove(lab_run.kept_steps + i, lab_run.kept_steps + i + 1,
                        (size_t)(lab_run.num_kept - i - 1) * sizeof(long));
                lab_run.num_kept--;
                break;
            }
        }
    } else if (lab_run.resumed_from && lab_run.keep_last > 0)
        kept_steps_find(run, run->model.adam_step);
    else if (lab_run.resumed_from) {   // a save killed while writing its step file
                                    // left CHECKPOINT.stepN.tmp
        char step_tmp[sizeof run->checkpoint_path + 40];
        kept_checkpoint_path(step_tmp, sizeof step_tmp, run, run->model.adam_step);
        strcat(step_tmp, ".tmp");
        if (access(step_tmp, F_OK) == 0)
            remove(step_tmp);
    }
    return lab_run.replacing || lab_run.force ? NULL : kept_steps_unused(run);
}

// After a save, with --keep-last N: CHECKPOINT.stepNNNNNNN too, and the oldest
// such files removed once there are more than N (those of earlier sessions
// included: lab_kept_steps_begin found them on --resume).
static const char *lab_keep_last(const TrainRun *run) {
    char path[sizeof run->checkpoint_path + 32];
    long step = run->model.adam_step;
    if (lab_run.replacing) {   // this run's checkpoint replaced the other's
        kept_steps_trim(run, 0);
        lab_run.replacing = 0;
    }
    if (lab_run.keep_last == 0 ||
        (lab_run.num_kept > 0 && lab_run.kept_steps[lab_run.num_kept - 1] == step))
        return NULL;   // none kept, or saved already
    kept_checkpoint_path(path, sizeof path, run, step);
    const char *error = lab_checkpoint_save(path, &run->model, &run->vocab, lab_run.merges,
                                            &lab_run.state);
    if (error)
        return error;
    lab_run.kept_steps = checked_realloc(lab_run.kept_steps, (size_t)lab_run.num_kept + 1,
                                         sizeof(long), "kept checkpoints");
    lab_run.kept_steps[lab_run.num_kept++] = step;
    kept_steps_trim(run, lab_run.keep_last);
    return NULL;
}

// ---- --log, --loss-log ------------------------------------------------------

// Opened to append (--resume goes on in the same files)
static const char *lab_open_logs(void) {
    if (lab_run.loss_log && !(lab_run.loss_log_file = fopen(lab_run.loss_log, "a")))
        return errorf("%s: cannot write: %s", lab_run.loss_log, strerror(errno));
    if (lab_run.batch_log && !(lab_run.batch_log_file = fopen(lab_run.batch_log, "ab")))
        return errorf("%s: cannot write: %s", lab_run.batch_log, strerror(errno));
    if (lab_run.log_csv) {
        if (!(lab_run.log_file = fopen(lab_run.log_csv, "a")))
            return errorf("%s: cannot write: %s", lab_run.log_csv, strerror(errno));
        // the column names once, at the top of a new file
        if (fseek(lab_run.log_file, 0, SEEK_END) == 0 && ftell(lab_run.log_file) == 0)
            fprintf(lab_run.log_file, "step,loss,lr,tokens_per_s,heldout_exact_match\n");
    }
    return NULL;
}

// --batch-log: the step's batch as int32 numbers, in the machine's byte order: step, B, S, T,
// then src (B, S), src_len (B), tgt_in (B, T), tgt_out (B, T), tgt_len (B) (dev/FORMATS.md)
static void lab_log_batch(FILE *f, long step, const Batch *batch) {
    int32_t header[4] = { (int32_t)step, batch->B, batch->S, batch->T };
    fwrite(header, sizeof header[0], 4, f);
    const int *arrays[5] = { batch->src, batch->src_len, batch->tgt_in, batch->tgt_out,
                             batch->tgt_len };
    size_t counts[5] = { (size_t)batch->B * batch->S, (size_t)batch->B, (size_t)batch->B * batch->T,
                         (size_t)batch->B * batch->T, (size_t)batch->B };
    for (int a = 0; a < 5; a++)
        for (size_t i = 0; i < counts[a]; i++) {
            int32_t value = arrays[a][i];
            fwrite(&value, sizeof value, 1, f);
        }
}

// After each step: its loss to --loss-log; to --log, at each progress line
// and evaluation, the mean training loss of the steps since the last line and
// tokens/s over the same steps' time (evaluations left out)
static void lab_log_step(const TrainRun *run) {
    long step = run->model.adam_step;
    int log_every = run->opt.log_every;
    int digits = sizeof(real) == 4 ? 9 : 17;   // (the loss exactly: a float's 9, a double's 17)
    if (lab_run.loss_log_file)
        fprintf(lab_run.loss_log_file, "%ld %.*g %.9g\n", step, digits, (double)run->loss, run->lr);
    if (lab_run.batch_log_file)
        lab_log_batch(lab_run.batch_log_file, step, &run->batch.batch);
    lab_run.csv_loss += run->loss;
    lab_run.csv_steps++;
    lab_run.csv_tokens += lab_run.tokens;
    lab_run.csv_seconds += lab_run.seconds;
    if (!lab_run.log_file || !((log_every && step % log_every == 0) || lab_run.evaluated))
        return;
    fprintf(lab_run.log_file, "%ld,%.6g,%.6g,%.0f,", step, lab_run.csv_loss / lab_run.csv_steps,
            run->lr, lab_run.csv_tokens / (lab_run.csv_seconds + 1e-9));
    if (isfinite(lab_run.heldout))
        fprintf(lab_run.log_file, "%.2f", lab_run.heldout);
    fprintf(lab_run.log_file, "\n");
    fflush(lab_run.log_file);
    lab_run.csv_loss = 0;
    lab_run.csv_steps = 0;
    lab_run.csv_tokens = 0;
    lab_run.csv_seconds = 0;
}

// ---- threads on a busy machine ----------------------------------------------
// Each parallel loop ends at a barrier, so a step goes at the pace of its
// slowest thread. When another program keeps a core busy, the thread sharing
// that core waits for a time slice at each of a step's hundreds of barriers,
// and the others wait for it: on 2 cores beside `yes`, two threads made a toy
// step 8.4 times slower than idle, one thread 1.9 times (dev/PERFORMANCE.md,
// "A busy machine"). So with --threads 0, training uses the cores that other
// programs leave free: all of them on an idle machine, fewer while something
// else runs, measured again every second between steps. The numbers are the
// same for any thread count, so a switch changes no result.

// CPU seconds spent so far: by all the machine's cores (Linux's /proc/stat,
// its first line's user, nice, system, irq and softirq ticks) and by this
// program's threads (and, in a data-parallel run, the other ranks on this machine: the run's own
// time, not the others'); and how many cores /proc/stat counts ("cpuN" lines).
typedef struct {
    double machine, own, wall;
    int cpus;
} CpuTimes;

// One line of /proc/stat into busy ticks and the count of cores
static void proc_stat_line(const char *line, double *busy_ticks, int *cpus) {
    double user, nice, system, idle, iowait, irq, softirq;
    if (strncmp(line, "cpu ", 4) == 0 &&
        sscanf(line + 4, "%lf %lf %lf %lf %lf %lf %lf", &user, &nice, &system, &idle, &iowait,
               &irq, &softirq) == 7)
        *busy_ticks = user + nice + system + irq + softirq;
    else if (strncmp(line, "cpu", 3) == 0 && isdigit((unsigned char)line[3]))
        (*cpus)++;
}

// 0 where /proc/stat cannot be read (another system)
static int cpu_times(CpuTimes *now) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[4096];
    double busy_ticks = -1;
    now->cpus = 0;
    while (fgets(line, sizeof line, f))
        proc_stat_line(line, &busy_ticks, &now->cpus);
    fclose(f);
    struct timespec own;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &own);
    now->machine = busy_ticks / (double)sysconf(_SC_CLK_TCK);
    now->own = (double)own.tv_sec + 1e-9 * (double)own.tv_nsec + ranks_peers_cpu_seconds();
    now->wall = wall_seconds();
    return busy_ticks >= 0;
}

// The cores other programs kept busy between two readings: the machine's
// busy time less this program's, over the time between them.
static double others_busy_cores(const CpuTimes *then, const CpuTimes *now) {
    double others = (now->machine - then->machine) - (now->own - then->own);
    return others > 0 ? others / (now->wall - then->wall) : 0;
}

// Following the free cores during training (--threads 0): a reading at the
// start and a look a second between steps (free_cores_follow).
typedef struct {
    int following;      // 0: --threads N was given, no OpenMP, or /proc cannot tell
    int cores, limit;   // the machine's cores; at most `limit` threads
                        // (OMP_NUM_THREADS, or the cores: its share of them)
    int threads, proposed, changes;
    CpuTimes last;      // the reading the next look measures from
    int sharing;        // the ranks of a data-parallel run allowed the same cores (0 or 1: this
    int share_index;    // program alone), and this one's place among them
} FreeCores;

// Rank share_index's part of `cores` cores shared by `sharing` ranks, at least 1: the first
// cores % sharing ranks get one more
static int cores_share(int cores, int sharing, int share_index) {
    if (sharing <= 1)
        return cores;
    int share = cores / sharing + (share_index < cores % sharing);
    return share > 0 ? share : 1;
}

// The thread count for the cores other programs left free since the last
// reading (this rank's share of them, beside other ranks of the run allowed the
// same cores), between 1 and the limit. A core counts as busy when they used
// more than a quarter of it: beside two of our threads, whose waits spin, `yes`
// gets only about half a core.
static int free_cores_wanted(const FreeCores *follow, double others) {
    int busy = (int)(others + 0.75), free_cores = busy >= follow->cores ? 1 : follow->cores - busy;
    free_cores = cores_share(free_cores, follow->sharing, follow->share_index);
    return free_cores < follow->limit ? free_cores : follow->limit;
}

// A look's verdict: the count changes when two looks in a row want the same;
// it drops at once, and grows by one thread a change, so that two runs that
// follow the cores settle on a share each instead of swinging between one
// thread and all. Returns 1 when it changed the count.
static int free_cores_decide(FreeCores *follow, int wanted) {
    int agreed = wanted == follow->proposed;
    follow->proposed = wanted;
    if (!agreed || wanted == follow->threads)
        return 0;
    follow->threads = wanted > follow->threads ? follow->threads + 1 : wanted;
    set_threads(follow->threads);
    return 1;
}

static void free_cores_start(FreeCores *follow, int threads_option) {
    *follow = (FreeCores){ .following = 0 };
#ifdef _OPENMP
    if (threads_option != 0)
        return;   // --threads N: N threads, whatever else runs
    follow->cores = omp_get_num_procs();
    follow->sharing = run_ranks.sharing;
    follow->share_index = run_ranks.share_index;
    int share = cores_share(follow->cores, follow->sharing, follow->share_index);
    follow->limit = omp_get_max_threads() < share ? omp_get_max_threads() : share;
    set_threads(follow->limit);   // (ranks that share the cores: a share each, followed or not)
    CpuTimes then;
    // a container whose /proc/stat counts more cores than this program may use cannot tell
    if (follow->limit < 2 || !cpu_times(&then) || then.cpus > follow->cores)
        return;
    nanosleep(&(struct timespec){ 0, 50000000 }, NULL);   // 50 ms of the others alone
    if (!cpu_times(&follow->last))
        return;
    follow->following = 1;
    follow->threads = follow->proposed =
        free_cores_wanted(follow, others_busy_cores(&then, &follow->last));
    set_threads(follow->threads);
#else
    (void)threads_option;
#endif
}

static int free_cores_follow(FreeCores *follow) {
    CpuTimes now;
    if (!follow->following || wall_seconds() < follow->last.wall + 1 || !cpu_times(&now))
        return 0;
    double others = others_busy_cores(&follow->last, &now);
    follow->last = now;
    if (!free_cores_decide(follow, free_cores_wanted(follow, others)))
        return 0;
    if (++follow->changes <= 3)
        printf("note: %d thread%s now: other programs kept %.1f of %d cores busy%s\n",
               follow->threads, follow->threads == 1 ? "" : "s", others, follow->cores,
               follow->changes == 3 ? " (further changes are not noted)" : "");
    return 1;
}

// ---- train: the lab's loop ----------------------------------------------------

static FreeCores lab_free_cores;

// A new run: the flags checked, §5.1's merges learned (--bpe), the data read (--train) or made
// (a task), a model of the sizes asked for.
static const char *lab_start(TrainRun *run) {
    const TrainOptions *o = &run->opt;
    const char *error = NULL;
    run->opt.positional = positional_from_name(lab_run.positional);
    if (run->opt.positional < 0)
        return errorf("--positional '%s' is not a kind of positions; expected sinusoid or "
                      "learned", lab_run.positional);
    if (lab_run.bpe > 0 && !lab_run.train_path)
        return errorf("--bpe goes with --train FILE; the built-in tasks use whole words");
    if (!lab_run.train_path && o->min_length > o->max_length)
        return errorf("--min-length %d is above --max-length %d; expected min <= max",
                      o->min_length, o->max_length);
    if (!lab_run.train_path && lab_run.valid_path)
        return errorf("--valid goes with --train FILE; a task makes its own held-out pairs");
    if (lab_run.bpe > 0 && (error = lab_learn_merges(run)))
        return error;
    if (lab_run.train_path && find_option(lab_run.options, lab_run.num_options, "--task")->seen)
        return errorf("--task and --train both given; expected one of them");
    if ((error = lab_load_data(run, 1)))
        return error;
    if ((error = train_build_model(run)))
        return error;
    return lab_check_lengths(run);
}

// Before the first step: the run's flags as text and its data's hash (what its checkpoints
// keep), every rank's against rank 0's, the kept checkpoints and the logs (rank 0's), and
// the threads.
static const char *lab_begin(TrainRun *run) {
    const char *error = NULL;
    lab_run.state.options = format_run_options(lab_run.options, lab_run.num_options);
    lab_run.state.saved = 1;
    if (!lab_run.resumed_from)   // (lab_resume checked the data against the checkpoint's hash)
        lab_run.state.data_hash = dataset_hash(&run->train);
    if ((error = ranks_check_same(run, lab_run.state.options, lab_run.state.data_hash)))
        return error;
    if (run_ranks.rank == 0 && !(error = lab_kept_steps_begin(run)))
        error = lab_open_logs();
    int first_failed = ranks_first_failed(error != NULL);   // (rank 0's files: it reports)
    if (first_failed >= 0)
        return first_failed == run_ranks.rank ? error : ranks_reported_elsewhere;
    free_cores_start(&lab_free_cores, lab_run.threads);
    lab_run.threads_note = lab_free_cores.following
                         ? " (the cores free of other programs, counted again each second)"
                         : "";
    return NULL;
}

static void lab_print_header(const TrainRun *run) {
    const TrainOptions *o = &run->opt;
    const TransformerConfig *config = &run->model.config;
    int threads = thread_count();
    printf("data   %s: %d training pairs, %d held-out, vocabulary %d\n", run->data_name,
           run->train.count, run->valid.count, run->vocab.size);
    printf("model  N=%d d_model=%d d_ff=%d h=%d max_len=%d, %s positions: %zu parameters\n",
           config->n_layers, config->d_model, config->d_ff, config->n_heads, config->max_len,
           positional_name(config->positional), run->model.num_parameters);
    printf("train  %d steps, peak lr %g at step %d (§5.3), batches <= %d tokens, P_drop %g, "
           "eps_ls %g, seed %d, %d thread%s%s\n", o->steps, o->lr, o->warmup, o->batch_tokens,
           (double)config->dropout, (double)config->label_smoothing, o->seed, threads,
           threads == 1 ? "" : "s", lab_run.threads_note);
    if (transformer_training != &transformer_cpu_training)
        printf("steps  by %s; evaluation and decoding on the host\n", transformer_training->name);
    ranks_print_header(o->batch_tokens);
    if (lab_run.resumed_from)
        printf("resume %s at step %ld\n", lab_run.resumed_from, run->model.adam_step);
    printf("checkpoints to %s\n", run->checkpoint_path);
    fflush(stdout);
}

// The held-out loss, token accuracy and exact match of greedy decoding (with §5.1 subwords:
// exact match on words); at the end, examples. Returns the exact match in %, or NAN when there
// are no held-out pairs.
static double lab_train_evaluate(TrainRun *run, int final) {
    long step = run->model.adam_step;
    if (run->valid.count == 0) {
        printf("eval   step %ld | no held-out pairs (fewer than 20 lines and no --valid)\n", step);
        return NAN;
    }
    Evaluation e;
    HeldOutLoss losses;
    lab_evaluate(&e, &losses, &run->model, &run->valid, run->opt.eval_size, run->opt.batch_tokens,
                 1, 0.6);
    if (lab_run.merges)
        evaluation_words(&e, NULL, &run->valid, &run->vocab, lab_run.merges);
    double exact = 100.0 * e.exact / e.sentences;
    double accuracy = 100.0 * e.correct / (e.compared ? e.compared : 1);
    printf("eval   step %ld | held-out loss %.4f | token accuracy %.1f%% | exact match %.1f%% "
           "(%d/%d)", step, losses.loss, accuracy, exact, e.exact, e.sentences);
    if (e.sentences < run->valid.count) {   // at most 500 by default: minutes, not hours, on WMT
        printf(" | the first %d of %d held-out pairs (--eval-size 0: all)", e.sentences,
               run->valid.count);
    }
    printf("\n");
    if (final && run->opt.show > 0) {
        printf("held-out examples, greedy decoding:\n");
        print_examples(&e, &run->valid, &run->vocab, lab_run.merges, run->opt.show);
        const char *what = lab_run.train_path ? "pairs" : "sequences never seen in training";
        printf("exact match on %d held-out %s: %.1f%% (%d/%d)\n", e.sentences, what, exact, e.exact,
               e.sentences);
    }
    fflush(stdout);
    evaluation_free(&e);
    return exact;
}

// The checkpoint, with the run, unless training diverged: a good checkpoint is never replaced
// by a bad one.
static const char *lab_train_save(TrainRun *run) {
    const char *nonfinite = nonfinite_parameter(&run->model);
    if (nonfinite) {
        return errorf("step %ld: %s holds a value that is not finite (training diverged); %s was "
                      "not overwritten", run->model.adam_step, nonfinite, run->checkpoint_path);
    }
    lab_run.state.epoch = (uint64_t)run->epoch;
    lab_run.state.epoch_batches = (uint64_t)run->epoch_batches;
    const char *error = lab_checkpoint_save(run->checkpoint_path, &run->model, &run->vocab,
                                            lab_run.merges, &lab_run.state);
    if (!error)
        lab_run.last_saved_step = run->model.adam_step;
    return error;
}

// The error of a loss that is NaN or infinite: training stops, and the last checkpoint stays.
static const char *lab_diverged_error(const TrainRun *run, long step) {
    char saved[4300] = "no checkpoint was written";
    if (lab_run.last_saved_step >= 0) {
        snprintf(saved, sizeof saved, "the last good checkpoint, %s (step %ld), is left as it was",
                 run->checkpoint_path, lab_run.last_saved_step);
    }
    return errorf("step %ld: the loss is %s; training stopped (try a lower --lr); %s", step,
                  isnan(run->loss) ? "NaN" : "infinite", saved);
}

// A line of progress, the time left from the steps since first_step (a resumed run's rate is
// its own):
//   step   400/1500 | loss 0.8978 | lr 1.06e-03 |   15.6k tok/s | elapsed 0:14 | left 0:38
static void lab_print_progress(const TrainRun *run, long first_step, double start,
                               double tokens_per_s) {
    long step = run->model.adam_step;
    double elapsed = wall_seconds() - start;
    double left = elapsed / (step - first_step) * (run->opt.steps - step);
    char elapsed_text[32];
    char left_text[32];
    printf("step %5ld/%d | loss %.4f | lr %.2e | %6.1fk tok/s | elapsed %s | left %s\n", step,
           run->opt.steps, (double)run->loss, run->lr, tokens_per_s / 1000,
           duration(elapsed_text, elapsed), duration(left_text, left));
    fflush(stdout);
}

// The run's last line about the ranks: each one's target tokens, measured where it trained (a
// rank that trained on the whole batch would show it), against the batches'
static void ranks_print_tokens(long share_targets, long batch_targets) {
    if (!run_ranks.started)
        return;
    long *all = checked_calloc((size_t)run_ranks.size, sizeof(long), "ranks");
    ranks_gather_counts(share_targets, all);
    printf("ranks  target tokens trained on, by rank:");
    for (int r = 0; r < run_ranks.size; r++) printf(" %ld", all[r]);
    printf(" (the batches held %ld)\n", batch_targets);
    free(all);
}

static long target_tokens(const Batch *batch) {
    long n = 0;
    for (int b = 0; b < batch->B; b++) n += batch->tgt_len[b];
    return n;
}

// The training loop (§5), as transformer.c's train_loop with the lab's steps among its own: the
// thread count before each step, the logs after it, the kept checkpoints after a save; with
// several ranks (lab/ranks.c), this rank's share of each batch, and rank 0 alone evaluating and
// saving.
static const char *lab_train_loop(TrainRun *run) {
    TrainOptions *o = &run->opt;
    Transformer *model = &run->model;
    // eq. 3 peaks at step = warmup with d_model^-0.5 warmup^-0.5: this factor makes the peak --lr.
    double factor = o->lr * sqrt((double)model->config.d_model * o->warmup);
    int save_every = lab_run.save_every ? lab_run.save_every : o->eval_every;
    const char *error = lab_begin(run);
    if (error)
        return error;
    lab_print_header(run);
    int writer = run_ranks.rank == 0;   // (rank 0: it evaluates, saves and writes the logs)
    if (model->adam_step >= o->steps) {
        printf("the checkpoint is at step %ld and --steps is %d: nothing to train\n",
               model->adam_step, o->steps);
        if (writer)
            lab_train_evaluate(run, 1);
    }

    // transformer_train_step, the ranks' data-parallel step, or the CUDA companion's
    const TrainingCompute *compute = ranks_training(transformer_training);
    compute->begin(model);
    double start = wall_seconds();
    double last_time = start;
    long first_step = model->adam_step;
    long tokens = 0, share_targets = 0, batch_targets = 0;
    BatchBuffer share = { { 0, 0, 0, NULL, NULL, NULL, NULL, NULL }, 0 };
    while (!error && model->adam_step < o->steps) {
        free_cores_follow(&lab_free_cores);
        if (run->epoch == 0 || run->epoch_batches == run->plan.num_spans)
            lab_run.state.epoch_rng = run->data_rng.state;   // a new epoch's plan, drawn from it
        train_next_batch(run);   // (every rank draws the same batch)
        const Batch *batch = rank_batch(run, &share);
        share_targets += target_tokens(batch);
        batch_targets += target_tokens(&run->batch.batch);
        long step = model->adam_step + 1;
        double step_start = wall_seconds();
        model->training = 1;
        run->loss = compute->train_step(model, batch, o->warmup, factor);
        run->lr = transformer_learning_rate(step, model->config.d_model, o->warmup, factor);
        lab_run.seconds = wall_seconds() - step_start;
        lab_run.tokens = run->batch.tokens;
        if (!isfinite(run->loss)) {   // (the batch's loss: every rank stops here, rank 0 says so)
            error = writer ? lab_diverged_error(run, step) : ranks_reported_elsewhere;
            break;
        }
        tokens += run->batch.tokens;
        int last = step == o->steps;
        if (o->log_every && (step % o->log_every == 0 || last)) {
            double now = wall_seconds();
            lab_print_progress(run, first_step, start, tokens / (now - last_time + 1e-9));
            last_time = now;
            tokens = 0;
        }

        // The evaluation and the checkpoint read the model on the host. tokens/s in the progress
        // lines counts the time of the training steps only.
        lab_run.evaluated = writer && ((o->eval_every && step % o->eval_every == 0) || last);
        int saving = writer && ((save_every && step % save_every == 0) || last);
        if (lab_run.evaluated || saving)
            compute->to_host(model);
        double eval_start = wall_seconds();
        lab_run.heldout = lab_run.evaluated ? lab_train_evaluate(run, last) : NAN;
        last_time += wall_seconds() - eval_start;
        lab_log_step(run);
        if (saving)
            error = lab_train_save(run);
        if (saving && !error)
            error = lab_keep_last(run);
        if (error)   // (rank 0's files: with several ranks, it ends them all)
            ranks_stop_every_rank(error);
    }
    batch_buffer_free(&share);
    if (!error && model->adam_step > first_step) {
        double seconds = wall_seconds() - start;
        char elapsed[32];
        printf("trained steps %ld..%ld in %s (%.1f s); checkpoint %s\n", first_step + 1,
               model->adam_step, duration(elapsed, seconds), seconds, run->checkpoint_path);
        ranks_print_tokens(share_targets, batch_targets);
    }
    return error;
}

// After the run, or its error: the logs closed (one that could not be written is an error
// too), and the run's memory given back.
static const char *lab_end(const char *error) {
    // (in a buffer of its own: errorf's holds the run's error, if it failed, which train
    // reports first)
    static char log_error[600];
    FILE *logs[3] = { lab_run.loss_log_file, lab_run.log_file, lab_run.batch_log_file };
    const char *names[3] = { lab_run.loss_log, lab_run.log_csv, lab_run.batch_log };
    for (int i = 0; i < 3; i++) {
        errno = 0;   // (a reason given is this close's own, never an older error's)
        if (logs[i] && (ferror(logs[i]) | fclose(logs[i])) && !error) {
            snprintf(log_error, sizeof log_error, "%.400s: writing the log failed: %s",
                     names[i], errno ? strerror(errno) : "an earlier write failed");
            error = log_error;
        }
    }
    free(lab_run.kept_steps);
    free(lab_run.stored_options);
    free(lab_run.state.options);
    bpe_free_merges(lab_run.merges);
    memset(&lab_run, 0, sizeof lab_run);
    return error;
}

// The start's verdict, the same on every rank: the first rank that failed reports (the
// messages it held back, and its error), the others exit 1 in silence. Returns the error this
// rank has after it (ranks_reported_elsewhere: another rank's), or NULL.
static const char *ranks_agree_on_start(int *status, const char *error) {
    int first_failed = ranks_first_failed(*status == 1 || error != NULL);
    ranks_release_messages(first_failed == run_ranks.rank);
    if (first_failed < 0 || first_failed == run_ranks.rank)
        return error;
    *status = *status == 1 ? 1 : 0;
    return ranks_reported_elsewhere;
}

static int lab_train(int argc, char **argv) {
    TrainRun *run = checked_calloc(1, sizeof(TrainRun), "training run");
    run->opt = train_defaults;
    memset(&lab_run, 0, sizeof lab_run);
    const char *error = ranks_start();   // (MPI, when a launcher started this program)
    int status = error ? 1 : 0;
    if (error)
        fprintf(stderr, "error: train: %s\n", error);
    ranks_hold_output();   // (ranks other than 0)
    lab_train_options(run);
    if (status == 0)
        status = parse_options("train", lab_train_usage, lab_run.options, lab_run.num_options,
                               argc, argv, NULL, NULL);
    if (status == 0) {
        set_threads(lab_run.threads);
        error = lab_run.resume ? lab_resume(run) : lab_start(run);
        if (!error)
            error = lab_checkpoint_path(run);
        if (!error && run_ranks.rank == 0)   // (rank 0 alone writes)
            error = lab_check_output(run);
    }
    if (run_ranks.started)
        error = ranks_agree_on_start(&status, error);
    if (status == 0) {
        if (!error)
            error = lab_train_loop(run);
        error = lab_end(error);
        if (error && error != ranks_reported_elsewhere && run_ranks.rank > 0)
            fprintf(stderr, "error: train: rank %d of %d: %s\n", run_ranks.rank, run_ranks.size,
                    error);
        else if (error && error != ranks_reported_elsewhere)
            fprintf(stderr, "error: train: %s\n", error);
    } else {
        lab_end(NULL);
    }
    ranks_end();
    vocab_free(&run->vocab);
    dataset_free(&run->train);
    dataset_free(&run->valid);
    transformer_free(&run->model);
    free(run->plan.order);
    free(run->plan.spans);
    batch_buffer_free(&run->batch);
    free(run);
    if (status == 2)
        return 0;
    return status != 0 || error != NULL;
}
