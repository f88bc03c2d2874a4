/* lab/lab.c: ./transformer, transformer.c with its companions and instruments
 *
 * transformer.c is the paper's model and the smallest program that trains it
 * and decodes with it. This file is the program `make` builds as ./transformer,
 * as llm.c's train_gpt2.cu stands beside train_gpt2.c: it includes the whole of
 * transformer.c for the model and uses its functions as they are (batches, the
 * model's checkpoint, the toy tasks, the option tables), plugs the fast path
 * (fast_path.c) into transformer.c's FastPath seam, and has its own commands:
 *
 *   train      transformer.c's, and real text, §5.1 subwords, --resume, logs,
 *              kept checkpoints, the busy machine's threads (lab/runs.c); under
 *              mpirun, data-parallel over MPI (lab/ranks.c)
 *   decode     transformer.c's, for real text and subwords, many sentences
 *              side by side, --alpha, --threads (lab/decode.c)
 *   eval       token accuracy, exact match, loss, perplexity, BLEU on a TSV file (lab/bleu.c)
 *   bleu       corpus BLEU of a file of outputs against a file of references, as sacreBLEU
 *              computes it (lab/bleu.c)
 *   catalogs   English->LANG sentence pairs from the machine's gettext catalogs (lab/catalogs.c)
 *   average    the mean of several checkpoints' weights (§6.1)
 *   attention  SVG heatmaps of every attention head for one sentence
 *   explain    one sentence through the model on one HTML page: subwords, input, every
 *              layer's attention, each decoding step, the output (lab/explain.c)
 *   pe         SVG picture of the positional-encoding matrix (§3.5)
 *   plot       SVG training curves from the CSV of train --log
 *   bpe        §5.1 byte-pair encoding: the merges learned, text cut into subwords
 *   params     parameter counts of a configuration (Table 3)
 *   table3     the paper's Table 3 for checkpoints of model variations (make table3)
 *   bench      training-step and decoding speed (make bench: beside PyTorch)
 *
 * Its checkpoints are transformer.c's model followed by the run that trained it
 * (lab/checkpoints.c). lab/NOTES.md says which file owns what.
 *
 * BUILD  make                 ./transformer (this file; OpenMP on, make OPENMP=0 for none; MPI
 *                             where mpicc is found, -DTRANSFORMER_MPI, make MPI=0 for none)
 *        cc -O2 -fopenmp lab/lab.c -lm -o transformer      by hand (make adds -march=native
 *                                                          and more)
 * READ   transformer.c first; the sections here are independent of each other.
 */
#ifdef TRANSFORMER_NO_MAIN
#define TRANSFORMER_LAB_NO_MAIN   // a program that includes this file has its own main
#else
#define TRANSFORMER_NO_MAIN       // transformer.c's main is transformer_main; the lab's is below
#endif
#include "../transformer.c"
#include <sys/resource.h>    // getrusage: bench's peak memory
#include "fast_path.c"       // the products many times faster (transformer.c's FastPath seam)

// The kind of positions (§3.5, or Table 3's row E) by name, as --positional
// takes it and messages print it; -1 for a name that is neither.
static const char *positional_name(int positional) {
    return positional == POSITIONAL_LEARNED ? "learned" : "sinusoid";
}

static int positional_from_name(const char *name) {
    return strcmp(name, "learned") == 0 ? POSITIONAL_LEARNED
           : strcmp(name, "sinusoid") == 0 ? POSITIONAL_SINUSOID : -1;
}

// The OpenMP threads of the parallel loops: --threads N of the lab's commands (0 leaves
// OpenMP's default, OMP_NUM_THREADS or every core).
static void set_threads(int threads) {
#ifdef _OPENMP
    if (threads > 0)
        omp_set_num_threads(threads);
#else
    (void)threads;
#endif
}

static int thread_count(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// "1:23:45" or "2:05", in text (32 bytes): the time of long work.
static char *duration(char *text, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(text, 32, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(text, 32, "%ld:%02ld", s / 60, s % 60);
    return text;
}

#include "text.c"            // real text: Unicode's white space, UTF-8, tokens, TSV files
#include "subwords.c"        // §5.1 byte-pair encoding
#include "checkpoints.c"     // transformer.c's model, then the run; version 3 read too
#include "decode.c"          // many sentences side by side; evaluation; decode
#include "bleu.c"            // BLEU, eval, and BLEU of files as sacreBLEU computes it (13a,
                             // smoothing, signature)
#include "ranks.c"           // mpirun -np N ./transformer train: the ranks' data-parallel step
#include "runs.c"            // train: --train, --resume, --keep-last, --log, --threads 0, ...
#include "catalogs.c"        // sentence pairs from the machine's gettext catalogs (make translate)


// Pictures as SVG files. Each writer returns 0 on success; on failure it
// prints one line (file and reason) to stderr and returns 1.

// One matrix of a heatmap: values[i * row_stride + j], i < rows, j < cols.
// Labels may be NULL: the rows or columns are then numbered from 0.
typedef struct {
    const real *values;
    int rows, cols, row_stride;
    const char *const *row_labels;
    const char *const *col_labels;
    const char *title;              // above the panel, or NULL
} SvgHeatmap;

// The colour scale is blue-white-red when vmin < 0 < vmax, else white to blue.
int svg_write_heatmap(const char *path, const real *values, int rows, int cols,
                      const char *const *row_labels, const char *const *col_labels,
                      const char *title, double vmin, double vmax);
int svg_write_heatmap_grid(const char *path, const char *title, const char *subtitle,
                           const SvgHeatmap *panels, int n_panels, int n_columns,
                           double vmin, double vmax, const char *scale_label);
// §3.5: the (max_len, d_model) positional-encoding matrix, scale -1..1.
int svg_write_positional_encoding(const char *path, int max_len, int d_model);

// Every head of every layer, for sentence `sentence` of the batch of the last
// transformer_forward. target_tokens: y_1..y_n without <s> and </s>, the
// decoder having read <s> y_1..y_n.
typedef enum { ATTENTION_ENCODER = 0, ATTENTION_DECODER = 1, ATTENTION_CROSS = 2 } AttentionKind;
int svg_write_attention(const char *path, const Transformer *model, AttentionKind kind,
                        int sentence, const char *const *source_tokens, int source_len,
                        const char *const *target_tokens, int target_len);

// The training log (CSV: step,loss,lr,tokens_per_s,heldout; optional header
// line; heldout may be empty) drawn as curves of loss, held-out score and
// learning rate over the steps.
int svg_write_loss_curve(const char *svg_path, const char *csv_path, const char *title);

// ---- checkpoint averaging (§6.1) ---------------------------------------------
// "For the base models, we used a single model obtained by averaging the last 5
// checkpoints, which were written at 10-minute intervals. For the big models,
// we averaged the last 20 checkpoints." Every parameter of the result is the
// mean of that parameter over the n checkpoints, summed in double and rounded
// once. The checkpoints must have the same sizes and the same vocabulary,
// token for token (the same config; dropout and label smoothing too, so that
// the result describes one run). Everything else, Adam's moments and step,
// the generators, the data position and the run options, is taken from the
// LAST checkpoint named: the result is that checkpoint with averaged weights,
// so it decodes like any other and `train --resume` goes on from its step.

// Writes the first field in which config b differs from a ("d_ff 48, not
// 64") into text; returns 0 when they are the same config.
static int config_difference(char *text, size_t n, const TransformerConfig *b,
                             const TransformerConfig *a) {
    const int ints[7][2] = { { b->n_layers, a->n_layers }, { b->d_model, a->d_model },
                             { b->d_ff, a->d_ff }, { b->n_heads, a->n_heads },
                             { b->vocab_size, a->vocab_size }, { b->max_len, a->max_len },
                             { b->positional, a->positional } };
    const char *int_names[7] = { "N", "d_model", "d_ff", "h", "vocabulary size", "max_len",
                                 "positions" };
    for (int i = 0; i < 7; i++) {
        if (ints[i][0] == ints[i][1])
            continue;
        if (i == 6)
            snprintf(text, n, "positions %s, not %s", positional_name(b->positional),
                     positional_name(a->positional));
        else
            snprintf(text, n, "%s %d, not %d", int_names[i], ints[i][0], ints[i][1]);
        return 1;
    }
    const float floats[3][2] = { { b->dropout, a->dropout },
                                 { b->label_smoothing, a->label_smoothing },
                                 { b->layer_norm_eps, a->layer_norm_eps } };
    const char *float_names[3] = { "P_drop", "eps_ls", "layer_norm_eps" };
    for (int i = 0; i < 3; i++)
        if (floats[i][0] != floats[i][1]) {
            snprintf(text, n, "%s %g, not %g", float_names[i], (double)floats[i][0],
                     (double)floats[i][1]);
            return 1;
        }
    return 0;
}


static int same_merges(const Bpe *a, const Bpe *b) {
    int na = a ? a->num_merges : 0, nb = b ? b->num_merges : 0;
    if (na != nb)
        return 0;
    for (int r = 0; r < na; r++)
        if (strcmp(a->left[r], b->left[r]) != 0 || strcmp(a->right[r], b->right[r]) != 0)
            return 0;
    return 1;
}

static const char *checkpoint_average(const char *out_path, const char *const *paths, int n) {
    if (n < 1)
        return errorf("no checkpoints to average; expected one or more files");
    LabCheckpoint c;
    LabCheckpoint last;
    double *sum = NULL;
    const char *error = NULL;
    int have_last = 0;
    for (int i = 0; i < n && !error; i++) {
        if ((error = lab_checkpoint_load(paths[i], &c)))
            break;
        if (i == 0) {
            sum = checked_calloc(c.model.num_parameters, sizeof(double), "checkpoint average");
        } else {
            char difference[96];
            if (config_difference(difference, sizeof difference, &c.model.config,
                                  &last.model.config))
                error = errorf("%s: %s as in %s; expected the same config", paths[i], difference,
                               paths[0]);
            for (int t = 0; t < c.vocab.size && !error; t++)
                if (strcmp(c.vocab.words[t], last.vocab.words[t]) != 0)
                    error = errorf("%s: vocabulary token %d is '%s' but '%s' in %s; expected the "
                                   "same vocabulary",
                                   paths[i], t, c.vocab.words[t], last.vocab.words[t], paths[0]);
            if (!error && !same_merges(c.merges, last.merges))
                error = errorf("%s: its §5.1 merges differ from %s's; expected the same merges",
                               paths[i], paths[0]);
            lab_checkpoint_free(&last);
            have_last = 0;
        }
        if (!error)
            for (size_t e = 0; e < c.model.num_parameters; e++)
                sum[e] += (double)c.model.params_memory[e];
        // keep this one (for the next comparison, and the last as the result's template)
        last = c;
        have_last = 1;
    }
    if (!error) {
        for (size_t e = 0; e < last.model.num_parameters; e++)
            last.model.params_memory[e] = (real)(sum[e] / n);
        error = lab_checkpoint_save(out_path, &last.model, &last.vocab, last.merges, &last.run);
    }
    if (have_last)
        lab_checkpoint_free(&last);
    free(sum);
    return error;
}

// ============================================================================
// Pictures: SVG
// Heatmaps of the attention probabilities of every head and of the positional
// encoding, and the training curves of the log `train --log` writes, as SVG
// files any browser shows. Only fprintf: an SVG file is XML text with a <rect>
// per heatmap cell, <text> for labels and a <polyline> per curve. Sizes are in
// CSS pixels; the layout estimates text widths from the font size.
// Every writer returns 0 on success; on failure it prints ONE line to stderr,
// naming the file and the reason, and returns 1.
// ============================================================================

#define SVG_FONT 13           // tick and axis labels
#define SVG_PANEL_FONT 14     // the title of one panel
#define SVG_TITLE_FONT 18     // the title of the picture
#define SVG_CHAR_WIDTH 0.62   // a sans-serif glyph is about this many font sizes wide
#define SVG_MARGIN 20
#define SVG_MAX_CELLS 2000000 // heatmap cells in one picture (about 150 MB of SVG)
#define SVG_CELL_TOOLTIPS 20000 // up to this many cells, each gets a <title> a browser shows on
                                // hover


// Writes text escaped for XML: the five special characters become entities
// (so the token <s> shows as <s>, not as a tag), control characters and
// bytes that are not UTF-8 (which would make the browser reject the whole file) become '?'.
static void svg_escaped(FILE *f, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        int n = utf8_sequence_length(s);
        if (n == 0 || (n == 1 && *s < 0x20 && *s != '\t')) {
            fputc('?', f);
            s++;
            continue;
        }
        if (n > 1) {
            fwrite(s, 1, (size_t)n, f);
            s += n;
            continue;
        }
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            fputc(*s, f);
        }
        s++;
    }
}

// Characters (not bytes) in a UTF-8 string: the basis of the width estimates.
static int utf8_length(const char *text) {
    int n = 0;
    for (const unsigned char *s = (const unsigned char *)text; *s; s++) n += (*s & 0xC0) != 0x80;
    return n;
}

static double svg_text_width(const char *text, int font_size) {
    return utf8_length(text) * SVG_CHAR_WIDTH * font_size;
}

// <text> at (x, y) (the baseline), anchor "start", "middle" or "end", turned
// by `rotate` degrees about (x, y).
static void svg_text(FILE *f, double x, double y, int font_size, const char *anchor, double rotate,
                     const char *weight, const char *text) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\"", x, y,
            font_size, anchor);
    if (weight)
        fprintf(f, " font-weight=\"%s\"", weight);
    if (rotate != 0)
        fprintf(f, " transform=\"rotate(%g %.1f %.1f)\"", rotate, x, y);
    fputc('>', f);
    svg_escaped(f, text);
    fputs("</text>\n", f);
}

static FILE *svg_open(const char *path, double width, double height) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "error: %scannot write %s: %s\n", error_context, path, strerror(errno));
        return NULL;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\">\n"
               "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
            width, height, width, height, width, height);
    return f;
}

// Ends the file; returns 0, or 1 after an error message if any write failed.
static int svg_close(FILE *f, const char *path) {
    fputs("</svg>\n", f);
    int failed = ferror(f);
    if (fclose(f) != 0)
        failed = 1;
    if (failed)
        fprintf(stderr, "error: %swriting %s failed: %s\n", error_context, path, strerror(errno));
    return failed ? 1 : 0;
}

// ---- colour scales ---------------------------------------------------------
// Colour stops from ColorBrewer (Brewer & Harrower): "Blues" from white for
// values from 0 (attention probabilities), "RdBu" reversed, blue-white-red,
// for values of both signs (the positional encoding). Linear in between.
static const unsigned char colours_sequential[][3] = {
    {255, 255, 255}, {198, 219, 239}, {107, 174, 214}, {33, 113, 181}, {8, 48, 107},
};
static const unsigned char colours_diverging[][3] = {
    {5, 48, 97}, {33, 102, 172}, {146, 197, 222}, {247, 247, 247}, {244, 165, 130}, {178, 24, 43},
    {103, 0, 31},
};

typedef struct {
    const unsigned char (*stops)[3];
    int n;
} ColourScale;

// Diverging when the range holds both signs, else sequential.
static ColourScale colour_scale_for(double vmin, double vmax) {
    if (vmin < 0 && vmax > 0)
        return (ColourScale){ colours_diverging, 7 };
    return (ColourScale){ colours_sequential, 5 };
}

// "#rrggbb" for t in [0, 1] (clamped); NaN gets grey.
static void colour_at(char out[8], ColourScale scale, double t) {
    if (t != t) {
        snprintf(out, 8, "#999999");
        return;
    }
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double x = t * (scale.n - 1);
    int i = (int)x;
    if (i >= scale.n - 1)
        i = scale.n - 2;
    double w = x - i;
    int rgb[3];
    for (int channel = 0; channel < 3; channel++)
        rgb[channel] = (int)lround((1 - w) * scale.stops[i][channel]
                                   + w * scale.stops[i + 1][channel]);
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

// The colour bar: a gradient with the same stops as colour_at, so the bar
// shows exactly the colours of the cells; labels at min, middle and max.
static void svg_colour_legend(FILE *f, double x, double y, double height, double vmin, double vmax,
                              const char *label) {
    ColourScale scale = colour_scale_for(vmin, vmax);
    const char *id = scale.n == 7 ? "colour-scale-diverging"
                                  : "colour-scale-sequential"; // unique in a page
    fprintf(f, "<defs><linearGradient id=\"%s\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n", id);
    for (int i = 0; i < scale.n; i++) {
        char colour[8];
        colour_at(colour, scale, (double)i / (scale.n - 1));
        fprintf(f, "<stop offset=\"%.4f\" stop-color=\"%s\"/>\n", (double)i / (scale.n - 1),
                colour);
    }
    fprintf(f, "</linearGradient></defs>\n");
    if (label)
        svg_text(f, x, y - 10, SVG_FONT, "start", 0, "bold", label);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"%.1f\" fill=\"url(#%s)\" "
               "stroke=\"#444\" stroke-width=\"0.8\"/>\n", x, y, height, id);
    for (int tick = 0; tick <= 2; tick++) {
        double value = vmax - tick * (vmax - vmin) / 2, ty = y + tick * height / 2;
        char text[32];
        snprintf(text, sizeof text, "%.3g", value);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n",
                x + 18, ty, x + 23, ty);
        svg_text(f, x + 26, ty + SVG_FONT * 0.35, SVG_FONT, "start", 0, NULL, text);
    }
}

// ---- heatmaps ----------------------------------------------------------------

// The label of row or column i: the caller's, or the number i.
static const char *heatmap_label(const char *const *labels, int i, char buffer[16]) {
    if (labels)
        return labels[i] ? labels[i] : "";
    snprintf(buffer, 16, "%d", i);
    return buffer;
}

// With cells smaller than a line of text, only every step-th label is drawn,
// the step one of 1, 2, 5, 10, 20, 50, ...
static int label_step(double cell) {
    double needed = SVG_FONT + 2;
    for (int step = 1;; step *= 10) {
        if (step * cell >= needed)
            return step;
        if (2 * step * cell >= needed)
            return 2 * step;
        if (5 * step * cell >= needed)
            return 5 * step;
    }
}

// Where the parts of one panel go, relative to its top-left corner.
typedef struct {
    double cell_width, cell_height; // of one matrix cell
    double title_height, row_label_width, col_label_height, width, height;
    int row_step, col_step;         // every row_step-th row is labelled
} PanelLayout;

static double longest_label(const char *const *labels, int n, int step) {
    double widest = 0;
    char buffer[16];
    for (int i = 0; i < n; i += step) {
        double w = svg_text_width(heatmap_label(labels, i, buffer), SVG_FONT);
        if (w > widest)
            widest = w;
    }
    return widest;
}

static PanelLayout heatmap_panel_layout(const SvgHeatmap *p, double cell_width,
                                        double cell_height) {
    PanelLayout l;
    l.cell_width = cell_width;
    l.cell_height = cell_height;
    l.row_step = label_step(cell_height);
    l.col_step = label_step(cell_width);
    l.title_height = p->title ? SVG_PANEL_FONT + 8 : 0;
    l.row_label_width = longest_label(p->row_labels, p->rows, l.row_step) + 8;
    l.col_label_height = longest_label(p->col_labels, p->cols, l.col_step) + 8;
    double title_width = p->title ? svg_text_width(p->title, SVG_PANEL_FONT) : 0;
    l.width = l.row_label_width + p->cols * cell_width;
    if (title_width > l.width)
        l.width = title_width;
    l.height = l.title_height + l.col_label_height + p->rows * cell_height;
    return l;
}

// One panel with its top-left corner at (x, y): title, column labels above
// the matrix reading upwards, row labels on the left, one <rect> per cell.
static void svg_heatmap_panel(FILE *f, const SvgHeatmap *p, PanelLayout l, double x, double y,
                              double vmin, double vmax, int tooltips) {
    ColourScale scale = colour_scale_for(vmin, vmax);
    double left = x + l.row_label_width, top = y + l.title_height + l.col_label_height;
    char buffer[16], colour[8];
    if (p->title)
        svg_text(f, x, y + SVG_PANEL_FONT, SVG_PANEL_FONT, "start", 0, "bold", p->title);
    for (int j = 0; j < p->cols; j += l.col_step) {
        double cx = left + (j + 0.5) * l.cell_width + SVG_FONT * 0.35;
        svg_text(f, cx, top - 5, SVG_FONT, "start", -90, NULL,
                 heatmap_label(p->col_labels, j, buffer));
    }
    for (int i = 0; i < p->rows; i += l.row_step) {
        double cy = top + (i + 0.5) * l.cell_height + SVG_FONT * 0.35;
        svg_text(f, left - 5, cy, SVG_FONT, "end", 0, NULL,
                 heatmap_label(p->row_labels, i, buffer));
    }
    fputs("<g shape-rendering=\"crispEdges\">\n", f); // no hairline seams between cells
    for (int i = 0; i < p->rows; i++) {
        for (int j = 0; j < p->cols; j++) {
            double v = p->values[(size_t)i * p->row_stride + j];
            colour_at(colour, scale, (v - vmin) / (vmax - vmin));
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"",
                    left + j * l.cell_width, top + i * l.cell_height, l.cell_width, l.cell_height,
                    colour);
            if (tooltips) {
                char row_buffer[16];
                fputs("><title>", f);
                svg_escaped(f, heatmap_label(p->row_labels, i, row_buffer));
                fputs(" | ", f);
                svg_escaped(f, heatmap_label(p->col_labels, j, buffer));
                fprintf(f, ": %.4g</title></rect>\n", v);
            } else {
                fputs("/>\n", f);
            }
        }
    }
    fputs("</g>\n", f);
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" "
               "stroke=\"#444\" stroke-width=\"0.8\"/>\n",
            left, top, p->cols * l.cell_width, p->rows * l.cell_height);
}

// Several heatmaps on one colour scale, n_columns to a row, with one legend.
// The SVG holds: a white background <rect>; per panel one <rect> per cell and
// one frame <rect>; one <rect> for the colour bar.
int svg_write_heatmap_grid(const char *path, const char *title, const char *subtitle,
                           const SvgHeatmap *panels, int n_panels, int n_columns,
                           double vmin, double vmax, const char *scale_label) {
    if (n_panels < 1 || n_columns < 1 || !(vmin < vmax) || !isfinite(vmin) || !isfinite(vmax)) {
        fprintf(stderr, "error: %s%s: heatmap grid of %d panels in %d columns, scale %g..%g: "
                        "expected at least one panel and column and a finite scale with min < "
                        "max\n", error_context, path, n_panels, n_columns, vmin, vmax);
        return 1;
    }
    size_t total_cells = 0;
    int most_rows = 1, most_cols = 1;
    for (int i = 0; i < n_panels; i++) {
        const SvgHeatmap *p = &panels[i];
        if (!p->values || p->rows < 1 || p->cols < 1 || p->row_stride < p->cols) {
            fprintf(stderr, "error: %s%s: panel %d is %d x %d with row stride %d: expected a "
                            "matrix of at least 1 x 1 with stride >= columns\n",
                    error_context, path, i, p->rows, p->cols, p->row_stride);
            return 1;
        }
        total_cells += (size_t)p->rows * p->cols;
        if (p->rows > most_rows)
            most_rows = p->rows;
        if (p->cols > most_cols)
            most_cols = p->cols;
    }
    if (total_cells > SVG_MAX_CELLS) {
        fprintf(stderr, "error: %s%s: %zu heatmap cells, more than the %d one picture may hold\n",
                error_context, path, total_cells, SVG_MAX_CELLS);
        return 1;
    }
    // One cell size for all panels: a single heatmap gets ~640 px, a grid ~220
    // px a panel. With text labels (tokens) cells are square and at least a
    // line high, so that every token is written; numbered rows and columns
    // (the positional encoding) get cells of their own width and height, as
    // small as a pixel, and only every step-th number.
    int text_labels = 0;
    for (int i = 0; i < n_panels; i++) text_labels |= panels[i].row_labels || panels[i].col_labels;
    double target = n_panels == 1 ? 640 : n_columns >= 4 ? 220 : 300;
    double cell_width, cell_height;
    if (text_labels) {
        cell_width = floor(target / (most_rows > most_cols ? most_rows : most_cols));
        cell_width = cell_height = fmin(fmax(cell_width, SVG_FONT + 3), 32);
    } else {
        cell_width = fmin(fmax(floor(target / most_cols), 1), 32);
        cell_height = fmin(fmax(floor(0.6 * target / most_rows), 1), 32);
    }
    // slots as large as the largest panel, laid out row by row
    double slot_width = 0, slot_height = 0, gap = 28;
    for (int i = 0; i < n_panels; i++) {
        PanelLayout l = heatmap_panel_layout(&panels[i], cell_width, cell_height);
        slot_width = fmax(slot_width, l.width);
        slot_height = fmax(slot_height, l.height);
    }
    if (n_columns > n_panels)
        n_columns = n_panels;
    int n_rows = (n_panels + n_columns - 1) / n_columns;
    double header = SVG_MARGIN + (title ? SVG_TITLE_FONT + 10 : 0)
                    + (subtitle ? SVG_FONT + 10 : 0) + 8;
    double grid_width = n_columns * slot_width + (n_columns - 1) * gap;
    double grid_height = n_rows * slot_height + (n_rows - 1) * gap;
    double legend_height = fmin(fmax(grid_height * 0.6, 120), 320), legend_width = 110;
    double scale_label_width = scale_label ? svg_text_width(scale_label, SVG_FONT) : 0;
    if (scale_label_width + 10 > legend_width)
        legend_width = scale_label_width + 10;
    double width = SVG_MARGIN + grid_width + 30 + legend_width + SVG_MARGIN;
    double height = header + fmax(grid_height, legend_height + 30) + SVG_MARGIN;
    if (title)
        width = fmax(width, 2 * SVG_MARGIN + svg_text_width(title, SVG_TITLE_FONT));
    if (subtitle)
        width = fmax(width, 2 * SVG_MARGIN + svg_text_width(subtitle, SVG_FONT));
    FILE *f = svg_open(path, width, height);
    if (!f)
        return 1;
    double y = SVG_MARGIN;
    if (title) {
        y += SVG_TITLE_FONT;
        svg_text(f, SVG_MARGIN, y, SVG_TITLE_FONT, "start", 0, "bold", title);
        y += 10;
    }
    if (subtitle) {
        y += SVG_FONT;
        svg_text(f, SVG_MARGIN, y, SVG_FONT, "start", 0, NULL, subtitle);
    }
    int tooltips = total_cells <= SVG_CELL_TOOLTIPS;
    for (int i = 0; i < n_panels; i++) {
        double px = SVG_MARGIN + (i % n_columns) * (slot_width + gap);
        double py = header + (i / n_columns) * (slot_height + gap);
        PanelLayout l = heatmap_panel_layout(&panels[i], cell_width, cell_height);
        svg_heatmap_panel(f, &panels[i], l, px, py, vmin, vmax, tooltips);
    }
    svg_colour_legend(f, SVG_MARGIN + grid_width + 30, header + 24, legend_height, vmin, vmax,
                      scale_label);
    return svg_close(f, path);
}

// One heatmap: values[i*cols + j] for i < rows, j < cols. Labels may be NULL (then numbers).
int svg_write_heatmap(const char *path, const real *values, int rows, int cols,
                      const char *const *row_labels, const char *const *col_labels,
                      const char *title, double vmin, double vmax) {
    SvgHeatmap panel = { values, rows, cols, cols, row_labels, col_labels, NULL };
    return svg_write_heatmap_grid(path, title, NULL, &panel, 1, 1, vmin, vmax, "value");
}

// ---- §3.5 the positional-encoding matrix -------------------------------------

// The (max_len, d_model) matrix of positional_encoding_init: a row per
// position, a column per dimension, on the scale -1..1.
int svg_write_positional_encoding(const char *path, int max_len, int d_model) {
    if (max_len < 1 || d_model < 1 || (double)max_len * d_model > SVG_MAX_CELLS) {
        fprintf(stderr, "error: %s%s: positional encoding of %d positions x %d dimensions: "
                        "expected both >= 1 and at most %d cells\n",
                error_context, path, max_len, d_model, SVG_MAX_CELLS);
        return 1;
    }
    real *pe = checked_calloc((size_t)max_len * d_model, sizeof(real),
                              "positional encoding picture");
    positional_encoding_init(pe, max_len, d_model);
    char title[128];
    snprintf(title, sizeof title,
             "Positional encoding (\xc2\xa7" "3.5), %d positions x %d dimensions",
             max_len, d_model);
    SvgHeatmap panel = { pe, max_len, d_model, d_model, NULL, NULL, NULL };
    int status = svg_write_heatmap_grid(path, title,
        "rows: position pos; columns: dimension i. Even i: sin(pos / 10000^(i/d_model)), "
        "odd i: cos(pos / 10000^((i-1)/d_model))", &panel, 1, 1, -1.0, 1.0, "PE(pos, i)");
    free(pe);
    return status;
}

// ---- attention: every head of every layer, for one sentence -------------------

// After transformer_forward on a batch whose sentence `sentence` is this pair,
// draws one kind of attention for it: a grid with a row per layer and a column
// per head. source_tokens label the source positions (source_len of them, as
// the encoder saw them); target_tokens are the target sentence y_1..y_n
// without <s> and </s>: the decoder read <s> y_1..y_n (n+1 positions) and
// predicted y_1..y_n </s>. Decoder rows (queries) are labelled with the token
// each position PREDICTS, since that is what a reader asks about ("to write
// `zwei`, which source word did it look at?"); decoder self-attention columns
// (keys) with the token each position READ.
int svg_write_attention(const char *path, const Transformer *model, AttentionKind kind,
                        int sentence, const char *const *source_tokens, int source_len,
                        const char *const *target_tokens, int target_len) {
    int L = model->config.n_layers, NH = model->config.n_heads, B = model->B, S = model->S,
        T = model->T;
    int decoder_positions = target_len + 1;
    if (kind < ATTENTION_ENCODER || kind > ATTENTION_CROSS || sentence < 0 || sentence >= B ||
        source_len < 1 || source_len > S || target_len < 0 || decoder_positions > T ||
        (target_len > 0 && !target_tokens)) {
        fprintf(stderr, "error: %s%s: attention kind %d of sentence %d with %d source and %d+1 "
                        "target positions: expected kind 0..2, target tokens, and, from the last "
                        "forward pass, sentence < %d, source 1..%d, target+1 <= %d\n",
                error_context, path, (int)kind, sentence, source_len, target_len, B, S, T);
        return 1;
    }
    const char **read = checked_calloc((size_t)decoder_positions, sizeof *read, "attention labels");
    const char **predicted = checked_calloc((size_t)decoder_positions, sizeof *predicted,
                                            "attention labels");
    for (int t = 0; t < decoder_positions; t++) {
        read[t] = t == 0 ? "<s>" : target_tokens[t - 1];
        predicted[t] = t == target_len ? "</s>" : target_tokens[t];
    }
    SvgHeatmap *panels = checked_calloc((size_t)L * NH, sizeof *panels, "attention panels");
    char *titles = checked_calloc((size_t)L * NH, 40, "attention panel titles");
    for (int l = 0; l < L; l++) {
        for (int head = 0; head < NH; head++) {
            SvgHeatmap *p = &panels[l * NH + head];
            size_t matrix = (size_t)sentence * NH + head;   // index of (b, head) in layer l's
                                                            // (B, NH, ..)
            char *title = titles + (size_t)(l * NH + head) * 40;
            snprintf(title, 40, "layer %d, head %d", l + 1, head + 1);
            if (kind == ATTENTION_ENCODER) {        // enc[l].self_attn.att is (B, NH, S, S)
                *p = (SvgHeatmap){ model->acts.enc[l].self_attn.att + matrix * S * S, source_len,
                                   source_len, S, source_tokens, source_tokens, title };
            } else if (kind == ATTENTION_DECODER) { // dec[l].self_attn.att is (B, NH, T, T)
                *p = (SvgHeatmap){ model->acts.dec[l].self_attn.att + matrix * T * T,
                                   decoder_positions, decoder_positions, T, predicted, read,
                                   title };
            } else {                                // dec[l].cross_attn.att is (B, NH, T, S)
                *p = (SvgHeatmap){ model->acts.dec[l].cross_attn.att + matrix * T * S,
                                   decoder_positions, source_len, S, predicted, source_tokens,
                                   title };
            }
        }
    }
    static const char *titles_of_kind[] = {
        "Encoder self-attention (\xc2\xa7" "3.2.3)",
        "Decoder self-attention, masked (\xc2\xa7" "3.2.3)",
        "Encoder-decoder attention (\xc2\xa7" "3.2.3)",
    };
    static const char *subtitles_of_kind[] = {
        "rows: queries, columns: keys, both the source tokens; "
        "a row per layer, a column per head",
        "rows: the token each position predicts; "
        "columns: the token each key position read",
        "rows: the target token each position predicts; "
        "columns: the source tokens (keys and values)",
    };
    int status = svg_write_heatmap_grid(path, titles_of_kind[kind], subtitles_of_kind[kind], panels,
                                        L * NH, NH, 0.0, 1.0, "probability");
    free(read);
    free(predicted);
    free(panels);
    free(titles);
    return status;
}

// ---- the training log and its curves ------------------------------------------
// `train --log FILE` writes one CSV line per report:
//     step,loss,lr,tokens_per_s,heldout
// step an integer, the others numbers; the held-out score may be left empty on
// lines where it was not measured. An optional first line of column names (any
// line whose first field is not a number) names the axes; blank lines and
// lines starting with '#' are skipped.

#define TRAINING_LOG_FIELDS 5

// What a chart draws: finite values of at most CHART_LIMIT in size (inf and
// nan, which a diverged run writes, break a curve), on axes that span at
// least CHART_SMALLEST and at least 1e-4 of their values' size (so that the
// 6 significant digits of a tick label tell the ticks apart). Within these
// bounds an axis's ends, its tick step and their ratios are normal doubles
// far from overflow: no tick is NaN or infinite, no tick count overflows. A
// log file with a larger value (train writes none: losses, learning rates,
// tokens/s and percentages) is refused, naming the line.
#define CHART_LIMIT 1e300
#define CHART_SMALLEST 1e-300   // the smallest span of an axis, and the lowest value of a log scale

static int chart_drawable(double v) {
    return isfinite(v) && fabs(v) <= CHART_LIMIT;
}

typedef struct {
    int n, capacity;
    double *step, *loss, *lr, *tokens_per_s, *heldout; // heldout is NaN where it was left empty
    char names[TRAINING_LOG_FIELDS][48];               // column names: the header's, else defaults
} TrainingLog;

static void training_log_free(TrainingLog *log) {
    free(log->step);
    free(log->loss);
    free(log->lr);
    free(log->tokens_per_s);
    free(log->heldout);
    memset(log, 0, sizeof *log);
}

// Parses the whole of text (after trimming white space) as a number; 1 on
// success. Out of a double's range, strtod says ERANGE: a number too small
// (4.9e-324) is read as the nearest double, which a chart draws as such; one
// too large (1e999) as DBL_MAX, which the caller refuses as beyond a chart
// (not as infinite, which the log writes as "inf").
static int parse_number(const char *text, double *value) {
    char *end;
    text = skip_white_space(text);
    if (!*text)
        return 0;
    errno = 0;
    *value = strtod(text, &end);
    if (errno == ERANGE && fabs(*value) > 1)
        *value = copysign(DBL_MAX, *value);
    return *skip_white_space(end) == '\0';
}

// Splits a line at commas in place; returns the number of fields (fills at most max).
static int split_commas(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        if (n < max)
            fields[n] = p;
        n++;
        char *comma = strchr(p, ',');
        if (!comma)
            return n;
        *comma = '\0';
        p = comma + 1;
    }
}

// text without white space at either end, cut to size - 1 bytes, into out
static void trim_copy(char *out, size_t size, const char *text) {
    const char *start = skip_white_space(text), *end = start;
    size_t length;
    for (const char *p = start; (p = text_next_token(p, &length)) != NULL; p += length)
        end = p + length;
    size_t n = (size_t)(end - start);
    if (n >= size)
        n = size - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

static int training_log_append(TrainingLog *log, const double v[TRAINING_LOG_FIELDS]) {
    if (log->n == log->capacity) {
        int capacity = log->capacity ? 2 * log->capacity : 256;
        double **columns[TRAINING_LOG_FIELDS] = { &log->step, &log->loss, &log->lr,
                                                  &log->tokens_per_s, &log->heldout };
        for (int field = 0; field < TRAINING_LOG_FIELDS; field++) {
            double *grown = realloc(*columns[field], (size_t)capacity * sizeof(double));
            if (!grown)
                return 0;
            *columns[field] = grown;
        }
        log->capacity = capacity;
    }
    log->step[log->n] = v[0];
    log->loss[log->n] = v[1];
    log->lr[log->n] = v[2];
    log->tokens_per_s[log->n] = v[3];
    log->heldout[log->n] = v[4];
    log->n++;
    return 1;
}

// Reads a training log. Returns 1, or 0 with a one-line message "FILE:LINE:
// what was wrong" in error (and the log empty).
static int training_log_read(TrainingLog *log, const char *path, char *error, size_t error_size) {
    static const char *defaults[TRAINING_LOG_FIELDS] = { "step", "loss", "lr", "tokens/s",
                                                         "held-out score" };
    static const char *expected = "step,loss,lr,tokens_per_s,heldout";
    memset(log, 0, sizeof *log);
    for (int field = 0; field < TRAINING_LOG_FIELDS; field++)
        snprintf(log->names[field], sizeof log->names[field], "%s", defaults[field]);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(error, error_size, "%s: cannot open: %s", path, strerror(errno));
        return 0;
    }
    char *line = NULL;
    size_t line_capacity = 0;
    int line_number = 0, ok = 1, header_allowed = 1;
    while (ok && getline(&line, &line_capacity, f) != -1) {
        line_number++;
        line[strcspn(line, "\r\n")] = '\0';
        const char *first = skip_white_space(line);
        if (*first == '\0' || *first == '#')
            continue;
        char *fields[TRAINING_LOG_FIELDS];
        int n = split_commas(line, fields, TRAINING_LOG_FIELDS);
        if (n != TRAINING_LOG_FIELDS) {
            snprintf(error, error_size, "%s:%d: %d comma-separated fields, expected %d (%s)",
                     path, line_number, n, TRAINING_LOG_FIELDS, expected);
            ok = 0;
            break;
        }
        double v[TRAINING_LOG_FIELDS];
        if (header_allowed && !parse_number(fields[0], &v[0])) { // a header: keep the column names
            for (int field = 0; field < TRAINING_LOG_FIELDS; field++)
                trim_copy(log->names[field], sizeof log->names[field], fields[field]);
            header_allowed = 0;
            continue;
        }
        header_allowed = 0;
        for (int field = 0; field < TRAINING_LOG_FIELDS && ok; field++) {
            char shown[32];
            trim_copy(shown, sizeof shown, fields[field]);
            if (field == TRAINING_LOG_FIELDS - 1 && shown[0] == '\0') { // not measured
                v[field] = NAN;
                continue;
            }
            if (!parse_number(fields[field], &v[field])
                || (field == 0 && (!isfinite(v[0]) || v[0] < 0))) {
                snprintf(error, error_size, "%s:%d: %s '%s' is not a %s", path, line_number,
                         log->names[field], shown, field == 0 ? "step number (>= 0)" : "number");
                ok = 0;
            } else if (isfinite(v[field]) && !chart_drawable(v[field])) {
                snprintf(error, error_size, "%s:%d: %s '%s' is beyond what a chart draws; "
                         "expected a number from -%g to %g (inf and nan are drawn as gaps)",
                         path, line_number, log->names[field], shown, CHART_LIMIT, CHART_LIMIT);
                ok = 0;
            }
        }
        if (ok && !training_log_append(log, v)) {
            snprintf(error, error_size, "%s:%d: out of memory", path, line_number);
            ok = 0;
        }
    }
    if (ok && ferror(f)) {
        snprintf(error, error_size, "%s: read error: %s", path, strerror(errno));
        ok = 0;
    }
    if (ok && log->n == 0) {
        snprintf(error, error_size, "%s: no data lines, expected lines of %s", path, expected);
        ok = 0;
    }
    free(line);
    fclose(f);
    if (!ok)
        training_log_free(log);
    return ok;
}

// An axis: the range lo..hi of values, drawn linearly or on a log10 scale.
typedef struct {
    double lo, hi;
    int log_scale;
} ChartAxis;

// 1, 2 or 5 times a power of ten, giving about `count` intervals over range.
static double nice_step(double range, int count) {
    double raw = range / count, magnitude = pow(10, floor(log10(raw))), r = raw / magnitude;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * magnitude;
}

// The axis for the drawable values of v (chart_drawable): a log scale when
// asked for, all values are at least CHART_SMALLEST and they span more than
// a factor 20; else linear, at least as wide as the bounds above CHART_LIMIT
// ask, widened to whole multiples of a nice step.
static ChartAxis chart_axis(const double *v, int n, int allow_log) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (chart_drawable(v[i])) {
            lo = fmin(lo, v[i]);
            hi = fmax(hi, v[i]);
        }
    if (!(lo <= hi))
        return (ChartAxis){ 0, 1, 0 }; // nothing to draw
    if (allow_log && lo >= CHART_SMALLEST && hi / lo > 20)
        return (ChartAxis){ pow(10, floor(log10(lo))), pow(10, ceil(log10(hi))), 1 };
    if (hi == lo) {
        double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= pad;
        hi += pad;
    }
    double least = fmax(1e-4 * fmax(fabs(lo), fabs(hi)), CHART_SMALLEST);
    if (hi - lo < least) {
        double middle = lo / 2 + hi / 2;
        lo = middle - least / 2;
        hi = middle + least / 2;
    }
    double step = nice_step(hi - lo, 5);
    return (ChartAxis){ floor(lo / step) * step, ceil(hi / step) * step, 0 };
}

// The pixel position of v on an axis drawn from pixel p0 (at lo) to p1 (at hi).
static double chart_position(ChartAxis a, double v, double p0, double p1) {
    double t = a.log_scale ? (log10(v) - log10(a.lo)) / (log10(a.hi) - log10(a.lo))
                           : (v - a.lo) / (a.hi - a.lo);
    return p0 + t * (p1 - p0);
}

// Tick values: multiples of a nice step, or powers of ten (with 2x and 5x
// when there are few decades; every stride-th power when there are more
// than 10). Returns how many were written.
static int chart_ticks(ChartAxis a, double *ticks, int max) {
    int n = 0;
    if (a.log_scale) {
        int decades = (int)lround(log10(a.hi) - log10(a.lo)),
            stride = decades > 10 ? (decades + 9) / 10 : 1;
        for (double p = a.lo; p <= a.hi * 1.0001 && n < max; p *= pow(10, stride)) {
            ticks[n++] = p;
            if (decades <= 3 && p < a.hi * 0.999) {
                if (n < max)
                    ticks[n++] = 2 * p;
                if (n < max)
                    ticks[n++] = 5 * p;
            }
        }
        return n;
    }
    double step = nice_step(a.hi - a.lo, 5);
    for (long t = (long)ceil(a.lo / step - 1e-9); t * step <= a.hi + step * 1e-9 && n < max; t++)
        ticks[n++] = t * step;
    return n;
}

// One chart: a frame, grid lines and ticks on both axes, axis names, and the
// curve ys over xs (see below for `sparse`).
static void svg_chart_panel(FILE *f, double x, double y, double w, double h,
                            const double *xs, const double *ys, int n, ChartAxis ax, ChartAxis ay,
                            const char *title, const char *x_name, const char *y_name,
                            const char *colour, int sparse) {
    double ticks[40];
    char text[32];
    svg_text(f, x, y - 10, SVG_PANEL_FONT, "start", 0, "bold", title);
    int nt = chart_ticks(ay, ticks, 40);
    for (int t = 0; t < nt; t++) {
        double py = chart_position(ay, ticks[t], y + h, y);
        snprintf(text, sizeof text, "%.6g", ticks[t]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                x, py, x + w, py);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n",
                x - 5, py, x, py);
        svg_text(f, x - 8, py + SVG_FONT * 0.35, SVG_FONT, "end", 0, NULL, text);
    }
    nt = chart_ticks(ax, ticks, 40);
    for (int t = 0; t < nt; t++) {
        double px = chart_position(ax, ticks[t], x, x + w);
        snprintf(text, sizeof text, "%.6g", ticks[t]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                px, y, px, y + h);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n",
                px, y + h, px, y + h + 5);
        svg_text(f, px, y + h + 8 + SVG_FONT, SVG_FONT, "middle", 0, NULL, text);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"#444\"/>\n", x, y, w, h);
    svg_text(f, x + w / 2, y + h + 14 + 2 * SVG_FONT, SVG_FONT, "middle", 0, NULL, x_name);
    svg_text(f, x - 62, y + h / 2, SVG_FONT, "middle", -90, NULL, y_name);
    // The curve: a dense series (loss, learning rate) breaks where a value is
    // not drawable (NaN, or <= 0 on a log scale); a sparse one (held-out
    // scores, measured now and then) joins the points it has and marks them.
    int open = 0;
    for (int i = 0; i < n; i++) {
        int drawable = chart_drawable(xs[i]) && chart_drawable(ys[i])
                       && (!ay.log_scale || ys[i] > 0);
        if (!drawable) {
            if (open && !sparse) {
                fputs("\"/>\n", f);
                open = 0;
            }
            continue;
        }
        if (!open)
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" points=\"",
                    colour);
        fprintf(f, "%s%.1f,%.1f", open ? " " : "", chart_position(ax, xs[i], x, x + w),
                chart_position(ay, ys[i], y + h, y));
        open = 1;
    }
    if (open)
        fputs("\"/>\n", f);
    for (int i = 0; sparse && i < n; i++)
        if (chart_drawable(xs[i]) && chart_drawable(ys[i]) && (!ay.log_scale || ys[i] > 0))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    chart_position(ax, xs[i], x, x + w), chart_position(ay, ys[i], y + h, y),
                    colour);
}

// An axis label for a column name of the log: train --log's names read as
// words; others with their underscores as spaces.
static void axis_label(char *out, size_t size, const char *column) {
    static const char *known[][2] = { { "heldout_exact_match", "held-out exact match (%)" },
                                      { "heldout", "held-out score" },
                                      { "tokens_per_s", "tokens/s" },
                                      { "lr", "learning rate" } };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(column, known[i][0]) == 0) {
            snprintf(out, size, "%s", known[i][1]);
            return;
        }
    snprintf(out, size, "%s", column);
    for (char *p = out; *p; p++)
        if (*p == '_')
            *p = ' ';
}

// The curves of a training log: the loss (log scale when it falls by more
// than a factor 20), the held-out score where the log has one, and the
// learning rate of eq. 3, one above the other over the same step axis.
int svg_write_loss_curve(const char *svg_path, const char *csv_path, const char *title) {
    TrainingLog log;
    char error[512];
    if (!training_log_read(&log, csv_path, error, sizeof error)) {
        fprintf(stderr, "error: %s%s\n", error_context, error);
        return 1;
    }
    int heldout_points = 0;
    double tokens_mean = 0; // a running mean: a sum of values up to CHART_LIMIT could overflow
    int tokens_count = 0;
    for (int i = 0; i < log.n; i++) {
        heldout_points += isfinite(log.heldout[i]) != 0;
        if (isfinite(log.tokens_per_s[i]))
            tokens_mean += (log.tokens_per_s[i] - tokens_mean) / ++tokens_count;
    }
    int n_panels = heldout_points > 0 ? 3 : 2;
    double left = SVG_MARGIN + 80, plot_width = 720, plot_height = 210, panel_gap = 96;
    double top = SVG_MARGIN + SVG_TITLE_FONT + 10 + SVG_FONT + 10 + 30;
    double width = left + plot_width + 30,
           height = top + n_panels * plot_height + (n_panels - 1) * panel_gap + 60;
    FILE *f = svg_open(svg_path, width, height);
    if (!f) {
        training_log_free(&log);
        return 1;
    }
    char subtitle[256];
    snprintf(subtitle, sizeof subtitle, "%s: %d lines, %s %.6g..%.6g, last %s %.4g, mean %s %.0f",
             csv_path, log.n, log.names[0], log.step[0], log.step[log.n - 1], log.names[1],
             log.loss[log.n - 1], log.names[3], tokens_count ? tokens_mean : NAN);
    svg_text(f, SVG_MARGIN, SVG_MARGIN + SVG_TITLE_FONT, SVG_TITLE_FONT, "start", 0, "bold",
             title ? title : "Training");
    svg_text(f, SVG_MARGIN, SVG_MARGIN + SVG_TITLE_FONT + 10 + SVG_FONT, SVG_FONT, "start", 0, NULL,
             subtitle);
    ChartAxis ax = chart_axis(log.step, log.n, 0);
    const double *series[3] = { log.loss, log.heldout, log.lr };
    char names[3][64], x_name[64];
    axis_label(names[0], sizeof names[0], log.names[1]);
    axis_label(names[1], sizeof names[1], log.names[4]);
    axis_label(names[2], sizeof names[2], log.names[2]);
    axis_label(x_name, sizeof x_name, log.names[0]);
    const char *colours[3] = { "#1f5fa8", "#c0392b", "#2e7d32" };
    double y = top;
    for (int panel = 0; panel < 3; panel++) {
        if (panel == 1 && heldout_points == 0)
            continue;
        static const char *panel_titles[3] = { "training loss", "held-out score",
                                               "learning rate (eq. 3)" };
        char panel_title[96];
        snprintf(panel_title, sizeof panel_title, "%s", panel_titles[panel]);
        ChartAxis ay = chart_axis(series[panel], log.n, panel == 0);
        if (ay.log_scale)
            strncat(panel_title, " (log scale)", sizeof panel_title - strlen(panel_title) - 1);
        svg_chart_panel(f, left, y, plot_width, plot_height, log.step, series[panel], log.n, ax, ay,
                        panel_title, x_name, names[panel], colours[panel], panel == 1);
        y += plot_height + panel_gap;
    }
    training_log_free(&log);
    return svg_close(f, svg_path);
}

// ---- Table 3: one bar per model variant ---------------------------------------
// Horizontal bars, one score per run (make table3 draws dev perplexity), from
// `origin` (perplexity 1: every reference token certain), coloured by the row
// of the paper's table the run belongs to; a grey band behind them marks the
// spread of the base model over its seeds, the yardstick for every difference.

typedef struct {
    char label[96];
    char group[16];
    double value;
} ChartBar;

static int svg_write_bar_chart(const char *path, const char *title, const char *subtitle,
                               const char *axis_name, const ChartBar *bars, int n, double origin,
                               double band_lo, double band_hi) {
    if (n < 1 || n > 1000) {
        fprintf(stderr, "error: %s%s: a bar chart of %d bars; expected 1 to 1000\n", error_context,
                path, n);
        return 1;
    }
    double *values = checked_calloc((size_t)n + 3, sizeof(double), "bar chart");
    for (int i = 0; i < n; i++) values[i] = bars[i].value;
    values[n] = origin;
    values[n + 1] = band_lo;
    values[n + 2] = band_hi;
    ChartAxis ax = chart_axis(values, n + 3, 0);
    free(values);
    double label_width = 0;
    for (int i = 0; i < n; i++)
        label_width = fmax(label_width, svg_text_width(bars[i].label, SVG_FONT));
    double bar_height = 18, gap = 6, left = SVG_MARGIN + label_width + 12, plot_width = 560;
    double top = SVG_MARGIN + SVG_TITLE_FONT + 10 + SVG_FONT + 20,
           plot_height = n * (bar_height + gap) + gap;
    FILE *f = svg_open(path, left + plot_width + 80, top + plot_height + 60);
    if (!f)
        return 1;
    svg_text(f, SVG_MARGIN, SVG_MARGIN + SVG_TITLE_FONT, SVG_TITLE_FONT, "start", 0, "bold", title);
    svg_text(f, SVG_MARGIN, SVG_MARGIN + SVG_TITLE_FONT + 10 + SVG_FONT, SVG_FONT, "start", 0, NULL,
             subtitle);
    double x0 = chart_position(ax, origin, left, left + plot_width);
    if (chart_drawable(band_lo) && chart_drawable(band_hi) && band_lo <= band_hi) {
        double a = chart_position(ax, band_lo, left, left + plot_width),
               b = chart_position(ax, band_hi, left, left + plot_width);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"#e4e4e4\"/>\n", a, top, fmax(b - a, 1.0), plot_height);
    }
    double ticks[16];
    int n_ticks = chart_ticks(ax, ticks, 16);
    for (int t = 0; t < n_ticks; t++) {
        double px = chart_position(ax, ticks[t], left, left + plot_width);
        char text[32];
        snprintf(text, sizeof text, "%g", ticks[t]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ccc\"/>\n",
                px, top, px, top + plot_height + 5);
        svg_text(f, px, top + plot_height + 8 + SVG_FONT, SVG_FONT, "middle", 0, NULL, text);
    }
    svg_text(f, left + plot_width / 2, top + plot_height + 14 + 2 * SVG_FONT, SVG_FONT, "middle", 0,
             NULL, axis_name);
    static const char *palette[] = { "#7f7f7f", "#1f5fa8", "#c0392b", "#2e7d32", "#8e44ad",
                                     "#d35400", "#16a085" };
    const char *groups[7] = { NULL };
    for (int i = 0; i < n; i++) {
        int g = 0;
        while (g < 6 && groups[g] && strcmp(groups[g], bars[i].group) != 0)
            g++;
        if (!groups[g])
            groups[g] = bars[i].group;
        double y = top + gap + i * (bar_height + gap);
        svg_text(f, left - 8, y + bar_height - 4, SVG_FONT, "end", 0, NULL, bars[i].label);
        char value[32];
        if (!chart_drawable(bars[i].value)) {
            svg_text(f, x0 + 4, y + bar_height - 4, SVG_FONT, "start", 0, NULL, "n/a");
            continue;
        }
        double x1 = chart_position(ax, bars[i].value, left, left + plot_width);
        fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"%s\"/>\n", x0, y, fmax(x1 - x0, 0.5), bar_height, palette[g]);
        snprintf(value, sizeof value, "%.3f", bars[i].value);
        svg_text(f, x1 + 4, y + bar_height - 4, SVG_FONT, "start", 0, NULL, value);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n",
            x0, top, x0, top + plot_height);
    return svg_close(f, path);
}

// The tokens as the model sees them, separated by spaces (subwords with their </w>).
static void print_subwords(FILE *f, const Vocabulary *vocab, const int *ids, int n) {
    for (int i = 0; i < n; i++) fprintf(f, "%s%s", i ? " " : "", vocab->words[ids[i]]);
}

// ---- average ----------------------------------------------------------------------

static int command_average(int argc, char **argv) {
    const char *out = NULL;
    int force = 0;
    Option options[] = {
        TEXT_OPTION("--out", &out, "the averaged checkpoint to write (required)"),
        FLAG_OPTION("--force", &force,
                    "replace a file already at --out (without it, average stops there)"),
    };
    const char *usage =
        "usage: ./transformer average --out OUT.ckpt [--force] A.ckpt B.ckpt ...\n"
        "Averages the parameters of checkpoints of the same config and vocabulary (§6.1: the "
        "paper\n"
        "averaged the last 5 or 20 checkpoints; train --keep-last N keeps them). Adam's moments\n"
        "and step, the data position and the run options come from the last file named.";
    char **paths = checked_calloc(argc, sizeof(char *), "arguments");
    int n = 0;
    int status = parse_options("average", usage, options, 2, argc, argv, paths, &n);
    if (status) {
        free(paths);
        return status == 2 ? 0 : 1;
    }
    // never a checkpoint replaced unasked (nor, even with --force, a directory or a device:
    // checkpoint_save)
    const char *error = !out ? "--out FILE is required (the averaged checkpoint to write)"
                      : n == 0 ? "no checkpoints given; expected --out OUT.ckpt A.ckpt B.ckpt ..."
                      : !force && access(out, F_OK) == 0
                          ? errorf("--out %s is already there; expected --force to replace it, or "
                                   "another --out", out)
                      : checkpoint_average(out, (const char *const *)paths, n);
    if (error)
        fprintf(stderr, "error: average: %s\n", error);
    else
        printf("averaged %d checkpoint%s into %s\n", n, n == 1 ? "" : "s", out);
    free(paths);
    return error ? 1 : 0;
}

// ---- attention ----------------------------------------------------------------------

// Decodes one sentence greedily, runs the (source, output) pair through
// transformer_forward in evaluation mode, and writes the attention
// probabilities of every head of every layer as three SVG files.
static const char *attention_pictures(Transformer *model, const Vocabulary *vocab,
                                      const Bpe *merges, const int *src, int src_len,
                                      const char *dir) {
    int limit = transformer_decode_limit(model, src_len), out_len;
    int *out = checked_calloc(limit, sizeof(int), "decoded sentence");
    lab_greedy_decode(model, out, &out_len, limit, src, &src_len, 1, src_len);
    if (out_len + 1 > model->config.max_len) {
        free(out);
        return errorf("the output has %d tokens; with </s> that is more than the model's maximum "
                      "length %d", out_len, model->config.max_len);
    }
    int T = out_len + 1, tgt_len = T;
    int *tgt_in = checked_calloc(T, sizeof(int), "attention batch"),
        *tgt_out = checked_calloc(T, sizeof(int), "attention batch");
    tgt_in[0] = TOKEN_BOS;
    for (int t = 0; t < out_len; t++) {
        tgt_in[t + 1] = out[t];
        tgt_out[t] = out[t];
    }
    tgt_out[out_len] = TOKEN_EOS;
    Batch batch = { 1, src_len, T, (int *)src, &src_len, tgt_in, tgt_out, &tgt_len };
    model->training = 0;
    transformer_forward(model, &batch);
    const char **source_words = checked_calloc(src_len, sizeof(char *), "labels");
    const char **target_words = checked_calloc(T, sizeof(char *), "labels");
    for (int i = 0; i < src_len; i++) source_words[i] = vocab->words[src[i]];
    for (int t = 0; t < out_len; t++) target_words[t] = vocab->words[out[t]];
    static const char *names[3] = { "encoder_self_attention.svg", "decoder_self_attention.svg",
                                    "cross_attention.svg" };
    const char *error = NULL;
    printf("output: ");
    print_text(stdout, vocab, merges, out, out_len);
    if (merges) {
        printf("\nsource subwords: ");
        print_subwords(stdout, vocab, src, src_len - 1);
        printf("\noutput subwords: ");
        print_subwords(stdout, vocab, out, out_len);
    }
    printf("\n");
    for (int kind = 0; kind < 3 && !error; kind++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[kind]);
        if (svg_write_attention(path, model, (AttentionKind)kind, 0, source_words, src_len,
                                target_words, out_len))
            error = errorf("%s: the picture was not written (the line above says why)", path);
        else
            printf("wrote %s\n", path);
    }
    free(out);
    free(tgt_in);
    free(tgt_out);
    free(source_words);
    free(target_words);
    return error;
}

static int command_attention(int argc, char **argv) {
    const char *checkpoint = NULL, *dir = NULL;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, "the trained model (required)"),
        TEXT_OPTION("--out-dir", &dir,
                    "directory for the three SVG files (required; made if missing)"),
    };
    const char *usage =
        "usage: ./transformer attention --checkpoint FILE --out-dir DIR \"source sentence\"\n"
        "Decodes the sentence greedily, then draws the attention probabilities of every head of\n"
        "every layer for the (source, output) pair: DIR/encoder_self_attention.svg,\n"
        "DIR/decoder_self_attention.svg and DIR/cross_attention.svg, tokens on the axes.";
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int n = 0;
    int status = parse_options("attention", usage, options, 2, argc, argv, sentences, &n);
    if (status) {
        free(sentences);
        return status == 2 ? 0 : 1;
    }
    const char *error = !checkpoint ? "--checkpoint FILE is required (a model written by "
                                      "./transformer train)"
                      : !dir ? "--out-dir DIR is required (where the SVG files go)"
                      : !*dir ? "--out-dir '': expected a directory's path"
                      : n != 1 ? "expected exactly one source sentence (in quotes), after the flags"
                      : NULL;
    LabCheckpoint c;
    memset(&c, 0, sizeof c);
    if (!error)
        error = lab_checkpoint_load(checkpoint, &c);
    // the folder only once the model is there: a failed command leaves nothing behind
    if (!error && mkdir(dir, 0777) != 0 && errno != EEXIST)
        error = errorf("%s: cannot create: %s", dir, strerror(errno));
    struct stat dir_status;
    if (!error && (stat(dir, &dir_status) != 0 || !S_ISDIR(dir_status.st_mode)))
        error = errorf("--out-dir %s: not a directory; expected a directory's path (made if "
                       "missing)", dir);
    if (!error) {
        TextSource from = { "the sentence", 0, 0, NULL };
        int *ids = NULL;
        size_t capacity = 0;
        int len = text_tokenize(sentences[0], &c.vocab, c.merges, 0, &ids, &capacity, &from);
        if (len < 0)
            error = reserved_token_error(&from);
        else if (len == 0)
            error = "the sentence is empty; expected tokens separated by white space";
        else if (len > c.model.config.max_len - 1)
            error = errorf("the sentence has %d tokens; the model's maximum length %d allows %d "
                           "(one position is </s>)",
                           len, c.model.config.max_len, c.model.config.max_len - 1);
        if (!error) {
            ids = checked_realloc(ids, (size_t)len + 1, sizeof(int), "token ids");
            ids[len++] = TOKEN_EOS; // as in training (batch_fill)
            error = attention_pictures(&c.model, &c.vocab, c.merges, ids, len, dir);
        }
        free(ids);
    }
    lab_checkpoint_free(&c);
    if (error)
        fprintf(stderr, "error: attention: %s\n", error);
    free(sentences);
    return error ? 1 : 0;
}

// ---- bpe ---------------------------------------------------------------------------------

// One sentence cut into subwords with vocab's merges, printed on one line; or
// the error of a reserved token's text in it.
static const char *print_sentence_subwords(Vocabulary *vocab, Bpe *bpe, char *text,
                                           TextSource *from) {
    int *ids = NULL;
    size_t capacity = 0;
    int n = text_tokenize(text, vocab, bpe, 1, &ids, &capacity, from);
    if (n >= 0) {
        print_subwords(stdout, vocab, ids, n);
        printf("\n");
    }
    free(ids);
    return n < 0 ? reserved_token_error(from) : NULL;
}

static int command_bpe(int argc, char **argv) {
    const char *data = NULL, *checkpoint = NULL;
    int merges = 0;
    Option options[] = {
        TEXT_OPTION("--data", &data, "source<TAB>target lines to learn merges from (both sides)"),
        INT_OPTION("--merges", &merges, 1, 1000000, "how many merges to learn from --data"),
        TEXT_OPTION("--checkpoint", &checkpoint, "a model trained with --bpe: use its merges"),
        FLAG_OPTION("--progress", &progress_always,
                    "progress lines (reading, learning) also when standard "
                    "error is not a terminal"),
    };
    const char *usage =
        "usage: ./transformer bpe --data FILE.tsv --merges N ['SENTENCE' ...]\n"
        "       ./transformer bpe --checkpoint FILE ['SENTENCE' ...]\n"
        "§5.1 byte-pair encoding, to look at: learns N merges from both sides of every line of "
        "FILE.tsv\n"
        "and prints them in order (rank, the pair, its count), then cuts each SENTENCE into "
        "subwords;\n"
        "or cuts each SENTENCE, or else each line of standard input, with a checkpoint's merges.\n"
        "A subword ending in </w> ends a word. (train --bpe N learns from the training lines "
        "only.)";
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int num_sentences = 0;
    int status = parse_options("bpe", usage, options, (int)(sizeof options / sizeof *options), argc,
                               argv, sentences, &num_sentences);
    if (status) {
        free(sentences);
        return status == 2 ? 0 : 1;
    }
    const char *error = !data == !checkpoint ? "expected either --data FILE.tsv --merges N or "
                                               "--checkpoint FILE"
                      : data && merges == 0 ? "--merges N is required with --data (how many "
                                              "merges to learn)"
                      : checkpoint && merges ? "--merges goes with --data; a checkpoint has its "
                                               "merges"
                      : NULL;
    LabCheckpoint c;   // the checkpoint's, or a vocabulary and the merges learned from --data
    memset(&c, 0, sizeof c);
    if (!error && data) {
        vocab_init(&c.vocab);
        int learned = 0;
        double start = wall_seconds();
        if (!(error = bpe_learn_from_tsv(&c.merges, data, 0, merges, &learned))) {
            printf("# %d merges learned from %s in %.3f s", learned, data, wall_seconds() - start);
            if (learned < merges)
                printf(" (of %d asked for: no pair of symbols occurs twice any more)", merges);
            printf("\n# rank  left right  (count)\n");
            for (int r = 0; r < c.merges->num_merges; r++)
                printf("%6d  %s %s  (%ld)\n", r + 1, c.merges->left[r], c.merges->right[r],
                       c.merges->frequency[r]);
        }
    } else if (!error) {
        error = lab_checkpoint_load(checkpoint, &c);
        if (!error && !c.merges)
            error = errorf("%s: the model has no merges (trained on whole words, without --bpe)",
                           checkpoint);
    }
    TextSource from = { "the sentence", 0, 0, NULL };
    for (int i = 0; i < num_sentences && !error; i++) {
        snprintf(from.where, sizeof from.where, "argument %d", i + 1);
        if (!(error = text_error(sentences[i], 1, from.where)))
            error = print_sentence_subwords(&c.vocab, c.merges, sentences[i], &from);
    }
    if (!error && checkpoint && num_sentences == 0) {
        char *line = NULL;
        size_t capacity = 0;
        int line_no, got;
        for (line_no = 1; !error && (got = read_text_line(stdin, &line, &capacity, line_no)) != 0;
             line_no++) {
            snprintf(from.where, sizeof from.where, "stdin:%d", line_no);
            if (!(error = text_error(line, got, from.where)))
                error = print_sentence_subwords(&c.vocab, c.merges, line, &from);
        }
        // a read that failed (stdin a directory, say) is not the end of the input
        if (!error && ferror(stdin))
            error = errorf("stdin: read error after %d lines: %s", line_no - 1, strerror(errno));
        free(line);
    }
    if (error)
        fprintf(stderr, "error: bpe: %s\n", error);
    lab_checkpoint_free(&c);
    free(sentences);
    return error ? 1 : 0;
}

// ---- pe, plot ---------------------------------------------------------------------------

static int command_pe(int argc, char **argv) {
    const char *out = NULL;
    int max_len = 100, d_model = 512;
    Option options[] = {
        TEXT_OPTION("--out", &out, "the SVG file to write (required)"),
        INT_OPTION("--max-len", &max_len, 1, TRANSFORMER_MAX_LEN, "positions (rows)"),
        INT_OPTION("--d-model", &d_model, 2, TRANSFORMER_MAX_WIDTH, "dimensions (columns)"),
    };
    const char *usage =
        "usage: ./transformer pe --out FILE.svg [--max-len 100] [--d-model 512]\n"
        "Draws the sinusoidal positional-encoding matrix of §3.5 (a row per position).";
    int status = parse_options("pe", usage, options, 3, argc, argv, NULL, NULL);
    if (status)
        return status == 2 ? 0 : 1;
    if (!out) {
        fprintf(stderr, "error: pe: --out FILE.svg is required\n");
        return 1;
    }
    if (svg_write_positional_encoding(out, max_len, d_model))
        return 1; // it printed the line
    printf("wrote %s\n", out);
    return 0;
}

static int command_plot(int argc, char **argv) {
    const char *out = NULL, *log = NULL, *title = "Training";
    Option options[] = {
        TEXT_OPTION("--log", &log, "the CSV that train --log wrote (required)"),
        TEXT_OPTION("--out", &out, "the SVG file to write (required)"),
        TEXT_OPTION("--title", &title, "the picture's title"),
    };
    const char *usage =
        "usage: ./transformer plot --log FILE.csv --out FILE.svg [--title TEXT]\n"
        "Draws the training loss, the held-out score and the learning rate over the steps.";
    int status = parse_options("plot", usage, options, 3, argc, argv, NULL, NULL);
    if (status)
        return status == 2 ? 0 : 1;
    if (!log || !out) {
        fprintf(stderr, "error: plot: %s is required\n",
                !log ? "--log FILE.csv" : "--out FILE.svg");
        return 1;
    }
    if (svg_write_loss_curve(out, log, title))
        return 1; // it printed the line
    printf("wrote %s\n", out);
    return 0;
}

// ---- params -------------------------------------------------------------------------

// Parameters of a config, per component; sums parameter_sizes, so the total
// is the model's num_parameters by construction.
typedef struct {
    const char *name;
    int tensors[6];
    int count;
} ParameterGroup;

static const ParameterGroup parameter_groups[] = {
    { "embedding, shared by source, target and pre-softmax (§3.4)", { 0 }, 1 },
    { "encoder self-attention: W^Q W^K W^V W^O and biases", { 2, 3, 4, 5 }, 4 },
    { "encoder feed-forward: W_1 W_2 and biases", { 8, 9, 10, 11 }, 4 },
    { "encoder layer norms: gain and bias, 2 per layer", { 6, 7, 12, 13 }, 4 },
    { "decoder masked self-attention", { 14, 15, 16, 17 }, 4 },
    { "decoder encoder-decoder attention", { 20, 21, 22, 23 }, 4 },
    { "decoder feed-forward", { 26, 27, 28, 29 }, 4 },
    { "decoder layer norms, 3 per layer", { 18, 19, 24, 25, 30, 31 }, 6 },
    { "positions: sinusoids none, learned max_len x C (row E)", { 1 }, 1 },
};
#define NUM_PARAMETER_GROUPS ((int)(sizeof parameter_groups / sizeof *parameter_groups))

static size_t parameter_group_count(const size_t sizes[NUM_PARAMETER_TENSORS], int group) {
    size_t total = 0;
    for (int i = 0; i < parameter_groups[group].count; i++)
        total += sizes[parameter_groups[group].tensors[i]];
    return total;
}

static void format_count(char *text, size_t n, size_t count) { // 65012345 -> "65,012,345"
    char digits[32];
    int length = snprintf(digits, sizeof digits, "%zu", count), j = 0;
    for (int i = 0; i < length && (size_t)j + 2 < n; i++) {
        if (i > 0 && (length - i) % 3 == 0)
            text[j++] = ',';
        text[j++] = digits[i];
    }
    text[j] = '\0';
}

static int command_params(int argc, char **argv) {
    TransformerConfig config = transformer_default_config();
    const char *preset = NULL;
    int layers = config.n_layers, d_model = config.d_model, d_ff = config.d_ff,
        heads = config.n_heads, vocab = NUM_SPECIAL_TOKENS + 10;
    int max_len = config.max_len;
    const char *positional = "sinusoid";
    Option options[] = {
        TEXT_OPTION("--preset", &preset, "base or big: Table 3's sizes, vocabulary 37000"),
        INT_OPTION("--layers", &layers, 1, TRANSFORMER_MAX_LAYERS, "N"),
        INT_OPTION("--d-model", &d_model, 1, TRANSFORMER_MAX_WIDTH, "d_model"),
        INT_OPTION("--d-ff", &d_ff, 1, TRANSFORMER_MAX_WIDTH, "d_ff"),
        INT_OPTION("--heads", &heads, 1, TRANSFORMER_MAX_WIDTH, "h"),
        INT_OPTION("--vocab", &vocab, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB,
                   "shared vocabulary size, special tokens included"),
        TEXT_OPTION("--positional", &positional, "sinusoid or learned (Table 3, row E)"),
        INT_OPTION("--max-len", &max_len, 2, TRANSFORMER_MAX_LEN,
                   "rows of a learned position table"),
    };
    const char *usage =
        "usage: ./transformer params [--preset base|big] [--layers N --d-model N --d-ff N "
        "--heads N --vocab N]\n"
        "                            [--positional learned --max-len N]\n"
        "Counts the parameters of a model, per component and in total (flags override the preset).";
    int n = (int)(sizeof options / sizeof *options);
    int status = parse_options("params", usage, options, n, argc, argv, NULL, NULL);
    if (status)
        return status == 2 ? 0 : 1;
    const char *paper = NULL;
    if (preset) {
        // Table 3: base N=6 d_model=512 d_ff=2048 h=8 (65M); big N=6 d_model=1024 d_ff=4096 h=16
        // (213M).
        // §5.1: a shared source-target vocabulary of about 37000 tokens (BPE, English-German).
        int big = strcmp(preset, "big") == 0;
        if (!big && strcmp(preset, "base") != 0) {
            fprintf(stderr, "error: params: --preset '%s' is not a preset; expected base or big\n",
                    preset);
            return 1;
        }
        int values[5] = { 6, big ? 1024 : 512, big ? 4096 : 2048, big ? 16 : 8, 37000 };
        int *targets[5] = { &layers, &d_model, &d_ff, &heads, &vocab };
        for (int i = 0; i < 5; i++)
            if (!options[i + 1].seen)
                *targets[i] = values[i];
        paper = big ? "213M" : "65M";
    }
    config.n_layers = layers;
    config.d_model = d_model;
    config.d_ff = d_ff;
    config.n_heads = heads;
    config.vocab_size = vocab;
    config.max_len = max_len;
    if ((config.positional = positional_from_name(positional)) < 0) {
        fprintf(stderr, "error: params: --positional '%s' is not a kind of positions; expected "
                        "sinusoid or learned\n", positional);
        return 1;
    }
    const char *error = transformer_config_check(&config);
    if (error) {
        fprintf(stderr, "error: params: %s\n", error);
        return 1;
    }
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, &config);
    printf("model: N=%d d_model=%d d_ff=%d h=%d (d_k = d_v = %d) vocabulary %d, %s positions",
           layers, d_model, d_ff, heads, d_model / heads, vocab,
           positional_name(config.positional));
    if (config.positional == POSITIONAL_LEARNED)
        printf(" (max_len %d)", max_len);
    printf("\n");
    char count[40];
    size_t total = 0;
    for (int g = 0; g < NUM_PARAMETER_GROUPS; g++) {
        size_t group_count = parameter_group_count(sizes, g);
        total += group_count;
        format_count(count, sizeof count, group_count);
        printf("  %-58s %15s\n", parameter_groups[g].name, count);
    }
    format_count(count, sizeof count, total);
    printf("  %-58s %15s  (%.1fM)\n", "total", count, total / 1e6);
    if (paper)
        printf("paper, Table 3: %s\n", paper);
    return 0;
}

// ---- table3 ------------------------------------------------------------------------
// Table 3 of the paper changes one thing at a time in the base model and
// reports dev perplexity and BLEU: (A) the heads at fixed computation, (C)
// the model's size, (D) dropout and label smoothing, (E) learned positions.
// make table3 trains such variants on the numbers task (the Makefile names
// them); this command evaluates their checkpoints, the base model first, and
// names every other run by what differs from the base.

typedef struct {
    const char *path;
    TransformerConfig config;
    int seed;
    long steps;
    size_t parameters;
    uint64_t dev_hash;   // dataset_hash of dev as this run's vocabulary cuts it into tokens
    uint64_t data_hash;  // of its training pairs (RunState)
    char *options;       // its run options, as stored in the checkpoint
    double perplexity;   // dev: exp(mean -log p(reference token)), per token of the model (a
                         // subword with merges)
    double bleu;         // dev: corpus BLEU over the model's tokens
    double exact;        // test: exact match in %, on words
    char row[16];        // "base", "(A)", "(C)", "(D)", "(E)", or several: "(A,C)"
    char label[64];      // "seed 2", "h=1", "d_model=32", "learned positions", ...
} Table3Run;

// The value of a run option ("--seed") in a checkpoint's stored options, or NULL.
static const char *stored_option(const char *options, const char *name, char *value, size_t n) {
    size_t length = strlen(name);
    for (const char *p = options; p && *p; ) {
        const char *end = strchr(p, '\n');
        if (!end)
            return NULL;
        const char *next = end + 1, *value_end = strchr(next, '\n');
        if ((size_t)(end - p) == length && strncmp(p, name, length) == 0 && value_end) {
            snprintf(value, n, "%.*s", (int)(value_end - next), next);
            return value;
        }
        p = value_end ? value_end + 1 : NULL;
    }
    return NULL;
}

// The run options that may differ within one table: the model's sizes,
// regularisation and positions (the variants) and the seed. Every other one
// (data, merges, schedule) must be the base's, or the rows would not compare.
static int table3_may_differ(const char *name) {
    static const char *flags[] = { "--seed", "--layers", "--d-model", "--d-ff", "--heads",
                                   "--dropout", "--label-smoothing", "--positional" };
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (strcmp(name, flags[i]) == 0)
            return 1;
    return 0;
}

// The first run option, other than those, that `options` gives differently
// from (or that is missing in) `other`: its name goes to name; 0 if none.
static int table3_other_option(const char *options, const char *other, char *name, size_t n) {
    for (const char *p = options; p && *p; ) {
        const char *end = strchr(p, '\n');
        if (!end)
            break;
        snprintf(name, n, "%.*s", (int)(end - p), p);
        const char *value = end + 1, *value_end = strchr(value, '\n');
        if (!value_end)
            break;
        char theirs[4200];
        if (!table3_may_differ(name) && (!stored_option(other, name, theirs, sizeof theirs) ||
                                         strlen(theirs) != (size_t)(value_end - value) ||
                                         strncmp(theirs, value, (size_t)(value_end - value)) != 0))
            return 1;
        p = value_end + 1;
    }
    return 0;
}

// Fills r->row and r->label from what differs between r's config and the base's.
static void table3_name_variant(Table3Run *r, const Table3Run *base) {
    const TransformerConfig *config = &r->config, *b = &base->config;
    char letters[8] = "", label[64] = "";
    #define VARIANT(differs, letter, ...)                                                   \
        do {                                                                                \
            if (differs) {                                                                  \
                if (!strchr(letters, letter)) {                                             \
                    size_t k = strlen(letters);                                             \
                    letters[k] = letter;                                                    \
                    letters[k + 1] = '\0';                                                  \
                }                                                                           \
                snprintf(label + strlen(label), sizeof label - strlen(label), __VA_ARGS__); \
            }                                                                               \
        } while (0)
    VARIANT(config->n_heads != b->n_heads, 'A', "%sh=%d", label[0] ? " " : "", config->n_heads);
    VARIANT(config->n_layers != b->n_layers, 'C', "%sN=%d", label[0] ? " " : "", config->n_layers);
    VARIANT(config->d_model != b->d_model, 'C', "%sd_model=%d", label[0] ? " " : "",
            config->d_model);
    VARIANT(config->d_ff != b->d_ff, 'C', "%sd_ff=%d", label[0] ? " " : "", config->d_ff);
    VARIANT(config->dropout != b->dropout, 'D', "%sP_drop=%g", label[0] ? " " : "",
            (double)config->dropout);
    VARIANT(config->label_smoothing != b->label_smoothing, 'D', "%seps_ls=%g", label[0] ? " " : "",
            (double)config->label_smoothing);
    VARIANT(config->positional != b->positional, 'E', "%s%s positions", label[0] ? " " : "",
            positional_name(config->positional));
    #undef VARIANT
    if (!letters[0]) {
        snprintf(r->row, sizeof r->row, "base");
        snprintf(r->label, sizeof r->label, "seed %d", r->seed);
        return;
    }
    if (r->seed != base->seed)
        snprintf(label + strlen(label), sizeof label - strlen(label), " seed %d", r->seed);
    size_t k = 0;
    r->row[k++] = '(';
    for (int i = 0; letters[i] && k + 3 < sizeof r->row; i++) {
        if (i)
            r->row[k++] = ',';
        r->row[k++] = letters[i];
    }
    r->row[k++] = ')';
    r->row[k] = '\0';
    snprintf(r->label, sizeof r->label, "%s", label);
}

// Loads one run's checkpoint and scores it: dev perplexity and BLEU, test exact match.
static const char *table3_evaluate(Table3Run *r, const char *dev_path, const char *test_path,
                                   int batch_tokens) {
    LabCheckpoint c;
    Dataset dev, test;
    memset(&dev, 0, sizeof dev);
    memset(&test, 0, sizeof test);
    char seed[32];
    const char *error = lab_checkpoint_load(r->path, &c);
    if (error)
        return error;
    r->options = c.run.options;   // (kept with the run; freed with it)
    c.run.options = NULL;
    r->data_hash = c.run.data_hash;
    r->config = c.model.config;
    r->steps = c.model.adam_step;
    r->parameters = c.model.num_parameters;
    r->seed = stored_option(r->options, "--seed", seed, sizeof seed) ? atoi(seed)
              : 1;  // train's default seed
    if (!(error = dataset_read_tsv(&dev, &c.vocab, c.merges, dev_path, 0)) &&
        !(error = dataset_check_lengths(&dev, dev_path, c.model.config.max_len)) &&
        !(error = dataset_read_tsv(&test, &c.vocab, c.merges, test_path, 0)))
        error = dataset_check_lengths(&test, test_path, c.model.config.max_len);
    if (!error) {
        Evaluation e;
        HeldOutLoss losses;
        r->dev_hash = dataset_hash(&dev);
        lab_evaluate(&e, &losses, &c.model, &dev, 0, batch_tokens, 1, 0);
        r->perplexity = exp(losses.log_loss);
        BleuStats bleu;
        evaluation_bleu(&bleu, &e, &dev);
        r->bleu = bleu_score(&bleu, NULL, NULL);
        evaluation_free(&e);
        lab_evaluate(&e, &losses, &c.model, &test, 0, batch_tokens, 1, 0);
        if (c.merges)
            evaluation_words(&e, NULL, &test, &c.vocab, c.merges);
        r->exact = 100.0 * e.exact / (e.sentences ? e.sentences : 1);
        evaluation_free(&e);
    }
    dataset_free(&dev);
    dataset_free(&test);
    lab_checkpoint_free(&c);
    return error;
}

// The table, laid out as the paper's: the base row in full, and in the other
// rows only what differs from it (and every run's scores).
static void table3_print(FILE *f, const Table3Run *runs, int n) {
    fprintf(f, "%-6s %-20s %2s %7s %5s %3s %4s %6s %6s %-9s %9s %9s %9s %11s\n", "", "", "N",
            "d_model", "d_ff", "h", "d_k", "P_drop", "eps_ls", "positions", "params", "PPL(dev)",
            "BLEU(dev)", "exact(test)");
    const TransformerConfig *b = &runs[0].config;
    for (int i = 0; i < n; i++) {
        const TransformerConfig *config = &runs[i].config;
        int all = i == 0;
        char cells[8][16] = { "" }, params[32];
        #define CELL(k, differs, ...)                                 \
            do {                                                      \
                if (all || (differs))                                 \
                    snprintf(cells[k], sizeof cells[k], __VA_ARGS__); \
            } while (0)
        CELL(0, config->n_layers != b->n_layers, "%d", config->n_layers);
        CELL(1, config->d_model != b->d_model, "%d", config->d_model);
        CELL(2, config->d_ff != b->d_ff, "%d", config->d_ff);
        CELL(3, config->n_heads != b->n_heads, "%d", config->n_heads);
        CELL(4, config->d_model / config->n_heads != b->d_model / b->n_heads, "%d",
             config->d_model / config->n_heads);
        CELL(5, config->dropout != b->dropout, "%g", (double)config->dropout);
        CELL(6, config->label_smoothing != b->label_smoothing, "%g",
             (double)config->label_smoothing);
        CELL(7, config->positional != b->positional, "%s", positional_name(config->positional));
        #undef CELL
        format_count(params, sizeof params, runs[i].parameters);
        int same_row = i > 0 && strcmp(runs[i].row, runs[i - 1].row) == 0;
        fprintf(f, "%-6s %-20s %2s %7s %5s %3s %4s %6s %6s %-9s %9s %9.3f %9.2f %10.1f%%\n",
                same_row ? "" : runs[i].row, runs[i].label, cells[0], cells[1], cells[2], cells[3],
                cells[4], cells[5], cells[6], cells[7], params, runs[i].perplexity, runs[i].bleu,
                runs[i].exact);
    }
}

// The spread of the base model over its seeds: min and max of each score.
typedef struct {
    int seeds;
    double perplexity[2], bleu[2], exact[2];
} Table3Spread;

static Table3Spread table3_spread(const Table3Run *runs, int n) {
    Table3Spread s = { 0, { INFINITY, -INFINITY }, { INFINITY, -INFINITY },
                       { INFINITY, -INFINITY } };
    for (int i = 0; i < n; i++) {
        if (strcmp(runs[i].row, "base") != 0)
            continue;
        s.seeds++;
        double *ranges[3] = { s.perplexity, s.bleu, s.exact },
               values[3] = { runs[i].perplexity, runs[i].bleu, runs[i].exact };
        for (int k = 0; k < 3; k++) {
            ranges[k][0] = fmin(ranges[k][0], values[k]);
            ranges[k][1] = fmax(ranges[k][1], values[k]);
        }
    }
    return s;
}

static int command_table3(int argc, char **argv) {
    const char *dev = NULL, *test = NULL, *svg = NULL, *title = "Table 3 on a laptop";
    int threads = 0, batch_tokens = 2000;
    Option options[] = {
        TEXT_OPTION("--dev", &dev, "held-out pairs for perplexity and BLEU (required)"),
        TEXT_OPTION("--test", &test, "pairs for exact match (required)"),
        TEXT_OPTION("--svg", &svg, "also draw dev perplexity per run into this SVG file"),
        TEXT_OPTION("--title", &title, "the picture's title"),
        INT_OPTION("--batch-tokens", &batch_tokens, 1, 100000000, "tokens decoded side by side"),
        INT_OPTION("--threads", &threads, 0, 1024, "OpenMP threads (0: all cores)"),
    };
    const char *usage =
        "usage: ./transformer table3 --dev FILE.tsv --test FILE.tsv [--svg FILE.svg] BASE.ckpt "
        "VARIANT.ckpt ...\n"
        "The paper's Table 3 for checkpoints trained with the same number of steps (make table3): "
        "the\n"
        "first is the base model; each other is named by what differs from it ((A) heads, (C) "
        "size,\n"
        "(D) dropout and label smoothing, (E) positions; the same config is the base with another "
        "seed).\n"
        "Perplexity and BLEU on --dev (greedy decoding, BLEU over the model's tokens), exact match "
        "on --test.";
    char **paths = checked_calloc(argc, sizeof(char *), "arguments");   // room for every argument
    int n = 0;
    int status = parse_options("table3", usage, options, (int)(sizeof options / sizeof *options),
                               argc, argv, paths, &n);
    if (!status && (!dev || !test)) {
        fprintf(stderr, "error: table3: %s is required\n",
                !dev ? "--dev FILE.tsv" : "--test FILE.tsv");
        status = 1;
    }
    if (!status && n < 1) {
        fprintf(stderr,
                "error: table3: no checkpoints given; expected BASE.ckpt and its variants\n");
        status = 1;
    }
    if (status) {
        free(paths);
        return status == 2 ? 0 : 1;
    }
    set_threads(threads);
    Table3Run *runs = checked_calloc(n, sizeof(Table3Run), "table3 runs");
    const char *error = NULL;
    char option[64];
    double start = wall_seconds();
    for (int i = 0; i < n && !error; i++) {
        runs[i].path = paths[i];
        if ((error = table3_evaluate(&runs[i], dev, test, batch_tokens)))
            break;
        if (runs[i].steps != runs[0].steps)
            error = errorf("%s: trained %ld steps, the base %s %ld; expected the same budget for "
                           "every run", paths[i], runs[i].steps, paths[0], runs[0].steps);
        else if (runs[i].dev_hash != runs[0].dev_hash)
            error = errorf("%s: its vocabulary cuts %s into other tokens than the base %s's; "
                           "expected runs on the same data and merges (perplexities per token "
                           "must count the same tokens)", paths[i], dev, paths[0]);
        else if (runs[i].data_hash != runs[0].data_hash)
            error = errorf("%s: trained on other sentence pairs than the base %s; expected the "
                           "same training data", paths[i], paths[0]);
        else if (table3_other_option(runs[i].options, runs[0].options, option, sizeof option) ||
                 table3_other_option(runs[0].options, runs[i].options, option, sizeof option))
            error = errorf("%s: its %s differs from the base %s's; expected the same data and "
                           "schedule for every run (only the model's sizes, dropout, label "
                           "smoothing, positions and seed may differ)", paths[i], option, paths[0]);
        else
            table3_name_variant(&runs[i], &runs[0]);
    }
    if (error) {
        fprintf(stderr, "error: table3: %s\n", error);
        for (int i = 0; i < n; i++) free(runs[i].options);
        free(runs);
        free(paths);
        return 1;
    }
    printf("Table 3 (the paper's model variations): %d runs of %ld steps each; perplexity and "
           "BLEU on %s, exact match on %s (greedy decoding; evaluated in %.0f s)\n",
           n, runs[0].steps, dev, test, wall_seconds() - start);
    table3_print(stdout, runs, n);
    Table3Spread s = table3_spread(runs, n);
    if (s.seeds > 1)
        printf("base over %d seeds: PPL %.3f to %.3f, BLEU %.2f to %.2f, exact match %.1f%% to "
               "%.1f%%: smaller differences are within the noise\n", s.seeds, s.perplexity[0],
               s.perplexity[1], s.bleu[0], s.bleu[1], s.exact[0], s.exact[1]);
    int failed = 0;
    if (svg) {
        ChartBar *bars = checked_calloc(n, sizeof(ChartBar), "table3 chart");
        for (int i = 0; i < n; i++) {
            snprintf(bars[i].label, sizeof bars[i].label, "%s %s", runs[i].row, runs[i].label);
            snprintf(bars[i].group, sizeof bars[i].group, "%s", runs[i].row);
            bars[i].value = runs[i].perplexity;
        }
        char subtitle[256];
        snprintf(subtitle, sizeof subtitle, "dev perplexity per token after %ld steps (%s); grey: "
                 "the base model over %d seed%s", runs[0].steps, dev, s.seeds,
                 s.seeds == 1 ? "" : "s");
        failed = svg_write_bar_chart(svg, title, subtitle,
                                     "dev perplexity (1: every reference token certain)",
                                     bars, n, 1.0, s.perplexity[0], s.perplexity[1]);
        if (!failed)
            printf("wrote %s\n", svg);
        free(bars);
    }
    for (int i = 0; i < n; i++) free(runs[i].options);
    free(runs);
    free(paths);
    return failed;
}

// ---- bench -----------------------------------------------------------------------
// `./transformer bench` times whole training steps (forward, backward, Adam)
// on a synthetic batch, or with --decode greedy decoding of the batch's
// sources with the key/value cache; dev/bench_pytorch.py times the same in
// PyTorch, and `make bench` runs both and prints the ratio (dev/BENCH.md;
// the record: dev/PERFORMANCE.md).

typedef struct {
    const char *name;
    int layers, d_model, d_ff, heads, vocab, B, S, T;
} BenchPreset;

static const BenchPreset bench_presets[] = {
    //  name     N  d_model d_ff  h  vocab   B   S    T
    { "tiny",    2, 64,    256,  4, 14,    96, 12,  12 },  // ./transformer train's defaults: copy
                                                           // task, 10 words
    { "toy",     2, 128,   512,  4, 1000,  32, 32,  32 },  // a toy task on a laptop
    { "base",    6, 512,   2048, 8, 8000,   8, 64,  64 },  // the paper's base model (Table 3)
};
#define NUM_BENCH_PRESETS ((int)(sizeof bench_presets / sizeof *bench_presets))

// The floating-point operations of one training step, counting the matrix
// products only (2 per multiply-add) and, under the causal mask, only the
// visible query-key pairs. Every sentence has its full length. The backward
// pass of a product Y = X W^T is two products of the same size (dX = dY W,
// dW = dY^T X), and that of attention likewise, so a step is 3 forward passes.
static double training_step_flops(const TransformerConfig *config, int B, int S, int T) {
    double L = config->n_layers, C = config->d_model, F = config->d_ff, V = config->vocab_size;
    double src = (double)B * S, tgt = (double)B * T;
    double encoder = 2 * src * (3 * C * C + C * C + 2 * C * F)   // W_qkv, W^O, W_1, W_2
                   + 4 * src * S * C;                             // Q K^T and P V
    double decoder = 2 * tgt * (3 * C * C + C * C + 2 * C * F)   // self-attention, FFN
                   + 4 * (double)B * T * (T + 1) / 2 * C          // causal Q K^T and P V
                   + 2 * tgt * (2 * C * C) + 2 * src * (2 * C * C) // cross W^Q, W^O; W^K, W^V
                   + 4 * tgt * S * C;                             // cross Q K^T and P V
    double output = 2 * tgt * C * V;                              // logits = y E^T
    return 3 * (L * (encoder + decoder) + output);
}

// The value of a "Name:   1234 kB" line of /proc/self/status, in kB; -1 if unknown.
static long process_status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long value = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            value = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return value;
}

// CPU time used by all threads of the process so far, in seconds.
static double cpu_seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The benchmark's batch: B sentence pairs, every sentence at its full length
// (S source, T target tokens), random words. tokens holds B * (S + 2T + 2) ints.
static Batch bench_batch(int *tokens, int B, int S, int T, int vocab_size) {
    Batch batch = { B, S, T, tokens, tokens + (size_t)B * S, tokens + (size_t)B * S + B,
                    tokens + (size_t)B * (S + T) + B, tokens + (size_t)B * (S + 2 * T) + B };
    Rng rng;
    rng_seed(&rng, 7);
    for (int b = 0; b < B; b++) {
        batch.src_len[b] = S;
        batch.tgt_len[b] = T;
        for (int s = 0; s < S; s++)
            batch.src[b * S + s] = NUM_SPECIAL_TOKENS
                                   + rng_below(&rng, vocab_size - NUM_SPECIAL_TOKENS);
        for (int t = 0; t < T; t++) {
            int word = t == T - 1 ? TOKEN_EOS
                       : NUM_SPECIAL_TOKENS + rng_below(&rng, vocab_size - NUM_SPECIAL_TOKENS);
            batch.tgt_out[b * T + t] = word;
            batch.tgt_in[b * T + t] = t == 0 ? TOKEN_BOS : batch.tgt_out[b * T + t - 1];
        }
    }
    return batch;
}

static int command_bench(int argc, char **argv) {
    const BenchPreset *preset = &bench_presets[1];
    const char *config_name = preset->name;
    int decode = 0, json = 0, steps = 0, warmup = 3, threads = 0;
    int layers = preset->layers, d_model = preset->d_model, d_ff = preset->d_ff,
        heads = preset->heads;
    int vocab = preset->vocab, B = preset->B, S = preset->S, T = preset->T;
    Option options[] = {
        TEXT_OPTION("--config", &config_name,
                    "tiny, toy or base; the flags below override its sizes"),
        INT_OPTION("--layers", &layers, 1, TRANSFORMER_MAX_LAYERS, "N"),
        INT_OPTION("--d-model", &d_model, 1, TRANSFORMER_MAX_WIDTH, "d_model"),
        INT_OPTION("--d-ff", &d_ff, 1, TRANSFORMER_MAX_WIDTH, "d_ff"),
        INT_OPTION("--heads", &heads, 1, TRANSFORMER_MAX_WIDTH, "h"),
        INT_OPTION("--vocab", &vocab, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB,
                   "vocabulary size"),
        INT_OPTION("--batch", &B, 1, 65536, "B, sentences per batch"),
        INT_OPTION("--src-len", &S, 2, TRANSFORMER_MAX_LEN, "S, source tokens per sentence"),
        INT_OPTION("--tgt-len", &T, 2, TRANSFORMER_MAX_LEN, "T, target tokens per sentence"),
        FLAG_OPTION("--decode", &decode,
                    "time greedy decoding of the sources, T tokens each, instead of training"),
        INT_OPTION("--steps", &steps, 0, 100000,
                   "timed steps (0: 20, or 10 when d_model >= 512; decoding: 10, or 3)"),
        INT_OPTION("--warmup", &warmup, 0, 100000, "untimed steps first (decoding: 1)"),
        INT_OPTION("--threads", &threads, 0, 1024, "OpenMP threads (0: all cores)"),
        FLAG_OPTION("--json", &json, "print the results as one JSON line"),
    };
    const char *usage =
        "usage: ./transformer bench [--config tiny|toy|base] [--decode] [--json] [options]\n"
        "Times training steps (forward, backward, Adam; dropout 0.1, label smoothing 0.1) on a\n"
        "synthetic batch of full-length sentences, or with --decode greedy decoding of its\n"
        "sources with the key/value cache, and prints the median time, tokens per second,\n"
        "GFLOP/s and peak memory. make bench runs the same in PyTorch beside it.\n"
        "configs: tiny (N 2, d_model 64, d_ff 256, h 4, vocab 14, 96 x 12 x 12), toy (N 2, "
        "d_model 128,\n"
        "d_ff 512, h 4, vocab 1000, 32 x 32 x 32), base (N 6, d_model 512, d_ff 2048, h 8, "
        "vocab 8000, 8 x 64 x 64)";
    int n = (int)(sizeof options / sizeof *options);
    int status = parse_options("bench", usage, options, n, argc, argv, NULL, NULL);
    if (status)
        return status == 2 ? 0 : 1;
    preset = NULL;
    for (int i = 0; i < NUM_BENCH_PRESETS; i++)
        if (strcmp(config_name, bench_presets[i].name) == 0)
            preset = &bench_presets[i];
    if (!preset) {
        fprintf(stderr, "error: bench: --config '%s' is not a config; expected tiny, toy or base\n",
                config_name);
        return 1;
    }
    int preset_values[8] = { preset->layers, preset->d_model, preset->d_ff, preset->heads,
                             preset->vocab, preset->B, preset->S, preset->T };
    int *sizes[8] = { &layers, &d_model, &d_ff, &heads, &vocab, &B, &S, &T };
    for (int i = 0; i < 8; i++)
        if (!options[i + 1].seen)
            *sizes[i] = preset_values[i];
    set_threads(threads);
    threads = thread_count();
    TransformerConfig config = transformer_default_config();
    config.n_layers = layers;
    config.d_model = d_model;
    config.d_ff = d_ff;
    config.n_heads = heads;
    config.vocab_size = vocab;
    config.dropout = 0.1f;           // §5.4, base model
    config.label_smoothing = 0.1f;
    config.max_len = S > T ? S : T;
    if (steps == 0)
        steps = decode ? (d_model >= 512 ? 3 : 10) : (d_model >= 512 ? 10 : 20);
    for (int i = 0; i < n; i++)
        if (decode && strcmp(options[i].name, "--warmup") == 0 && !options[i].seen)
            warmup = 1;
    const char *error = transformer_config_check(&config);
    if (error) {
        fprintf(stderr, "error: bench: %s\n", error);
        return 1;
    }

    long rss_before_kb = process_status_kb("VmRSS");
    Transformer model;
    transformer_build(&model, &config, 1);
    int *tokens = checked_calloc((size_t)B * (S + 2 * T + 2), sizeof(int), "benchmark batch");
    Batch batch = bench_batch(tokens, B, S, T, vocab);
    int *out = checked_calloc((size_t)B * T, sizeof(int), "benchmark outputs"),
        *out_len = checked_calloc(B, sizeof(int), "benchmark outputs");
    if (decode) {
        // Every sentence should decode all T positions: the </s> row of the
        // shared embedding is set to zero, so the logit of </s> is exactly 0
        // while the random weights spread the others around 0 (their largest is
        // positive). The positions actually decoded are counted all the same.
        memset(model.params.embedding + (size_t)TOKEN_EOS * d_model, 0,
               (size_t)d_model * sizeof(real));
    }
    const TrainingCompute *compute = transformer_training;   // decoding runs on the host
    if (!decode)
        compute->begin(&model);
    double *times = checked_calloc((size_t)steps, sizeof(double), "benchmark times");
    real loss = 0;
    double cpu_start = 0, positions = 0;
    for (int step = 1; step <= warmup + steps; step++) {
        if (step == warmup + 1)
            cpu_start = cpu_seconds_now();
        double start = wall_seconds();
        if (decode) {
            lab_greedy_decode(&model, out, out_len, T, batch.src, batch.src_len, B, S);
        } else {
            model.training = 1;
            loss = compute->train_step(&model, &batch, 4000, 1.0);
        }
        if (step > warmup)
            times[step - warmup - 1] = wall_seconds() - start;
    }
    double cpu_per_step = (cpu_seconds_now() - cpu_start) / steps;
    if (decode) {   // the last run's decoded positions, an ending </s> included
        for (int b = 0; b < B; b++) positions += out_len[b] + (out_len[b] < T);
    } else {
        positions = (double)B * T;
    }
    qsort(times, (size_t)steps, sizeof(double), compare_doubles);
    double median = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    double flops = decode ? 0 : training_step_flops(&config, B, S, T);
    double tokens_per_s = positions / median, gflops = flops / median * 1e-9;
    struct rusage resources;
    getrusage(RUSAGE_SELF, &resources);
    double peak_mb = resources.ru_maxrss / 1024.0;   // Linux reports kB
    double step_mb = rss_before_kb >= 0 ? (resources.ru_maxrss - rss_before_kb) / 1024.0 : -1;
    const char *mode = decode ? "decode" : "train";
    if (json) {
        printf("{\"impl\": \"%s\", \"mode\": \"%s\", \"config\": \"%s\", \"layers\": %d, "
               "\"d_model\": %d, \"d_ff\": %d, \"heads\": %d, \"vocab\": %d, \"dropout\": %g, "
               "\"label_smoothing\": %g, \"batch\": %d, \"src_len\": %d, \"tgt_len\": %d, "
               "\"threads\": %d, \"warmup\": %d, \"steps\": %d, \"median_ms\": %.3f, "
               "\"min_ms\": %.3f, \"cpu_ms\": %.3f, \"tokens\": %.0f, \"tokens_per_s\": %.1f, "
               "\"gflop_per_step\": %.4f, \"gflops\": %.2f, \"peak_mb\": %.1f, "
               "\"step_mb\": %.1f, \"loss\": %.4f}\n",
               decode ? "transformer.c" : compute->name, mode, preset->name, layers, d_model, d_ff,
               heads, vocab, (double)config.dropout, (double)config.label_smoothing, B, S, T,
               threads, warmup, steps, median * 1e3, times[0] * 1e3, cpu_per_step * 1e3,
               positions, tokens_per_s, flops * 1e-9, gflops, peak_mb, step_mb, (double)loss);
    } else {
        printf("config %s: N %d, d_model %d, d_ff %d, h %d, vocab %d, dropout %g, label smoothing "
               "%g, %zu parameters\n", preset->name, layers, d_model, d_ff, heads, vocab,
               (double)config.dropout, (double)config.label_smoothing, model.num_parameters);
        printf("batch %d sentences x %d source x %d target tokens, %d thread%s\n",
               B, S, T, threads, threads == 1 ? "" : "s");
        printf("%s: median %.2f ms per %s (min %.2f, max %.2f; %d after %d warm-up); CPU time %.2f "
               "ms each\n", decode ? "greedy decoding" : "training", median * 1e3,
               decode ? "batch" : "step", times[0] * 1e3, times[steps - 1] * 1e3, steps, warmup,
               cpu_per_step * 1e3);
        if (decode)
            printf("%.0f target tokens/s (%.0f positions decoded per batch)\n", tokens_per_s,
                   positions);
        else
            printf("%.0f target tokens/s, %.1f GFLOP/s (%.3f GFLOP per step)\n", tokens_per_s,
                   gflops, flops * 1e-9);
        printf("peak memory %.1f MB (%.1f MB more than before the model was built)\n", peak_mb,
               step_mb);
    }
    free(times);
    free(tokens);
    free(out);
    free(out_len);
    transformer_free(&model);
    return 0;
}


#include "explain.c"         // explain: one sentence through the model, on one HTML page

// ============================================================================
// main: transformer.c's commands and the lab's
// ============================================================================

// The lab's commands, train and decode first, as transformer.c lists its own
static const Command lab_commands[] = {
    { "train", lab_train,
      "train on a built-in task (--task copy|reverse) or a TSV file (--train)" },
    { "decode", lab_decode,
      "decode sentences with a checkpoint: greedy, or beam search (--beam 4)" },
    { "eval",   command_eval,
      "token accuracy, exact match and (--bleu) BLEU of decoded outputs on a TSV file" },
    { "bleu",   command_bleu,
      "corpus BLEU of a file of outputs against a file of references, as sacreBLEU computes it" },
    { "catalogs", command_catalogs,
      "English->LANG sentence pairs from the machine's message catalogs (.mo)" },
    { "average", command_average,
      "average the weights of checkpoints of one run into a new checkpoint (§6.1)" },
    { "attention", command_attention,
      "SVG heatmaps of every attention head for one sentence and its translation" },
    { "explain", command_explain,
      "one sentence through the model, every number on one HTML page (explain.html)" },
    { "pe",     command_pe,     "SVG picture of the positional-encoding matrix (§3.5)" },
    { "plot",   command_plot,   "SVG training curves from the CSV of train --log" },
    { "bpe",    command_bpe,
      "§5.1 byte-pair encoding: learn and print merges from a TSV file, or cut text into "
      "subwords" },
    { "params", command_params,
      "parameter count of a configuration, per component (--preset base|big)" },
    { "table3", command_table3,
      "the paper's Table 3 for checkpoints of model variations (make table3)" },
    { "bench",  command_bench,
      "time training steps or greedy decoding (--decode); make bench compares with PyTorch" },
};

// ./transformer: the fast path in transformer.c's FastPath seam, then the command; the CUDA
// companion's main, which sets transformer_training first, calls it too.
int transformer_lab_main(int argc, char **argv) {
    fast_path_use(1);
    return run_command(lab_commands, (int)(sizeof lab_commands / sizeof *lab_commands), argc,
                       argv);
}

#ifndef TRANSFORMER_LAB_NO_MAIN
int main(int argc, char **argv) {
    return transformer_lab_main(argc, argv);
}
#endif
