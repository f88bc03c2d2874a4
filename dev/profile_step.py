#!/usr/bin/python3
"""Where a training step's time goes, function by function (dev/PERFORMANCE.md).

perf can say which instructions are hot, but not which layer called the
matrix product it samples. This script builds a copy of ./transformer's
sources (transformer.c and the lab, lab/lab.c, whose fast path,
lab/fast_path.c, does the products) in which each of the functions below
(transformer.c's) is renamed NAME_impl and replaced by a wrapper that adds
the wall time of the call to a counter, and every product (the fast path's
matmul) also adds its time and size to a table keyed by its shape. It then
runs warm-up and timed training steps of a bench config (the same model and
batch as `./transformer bench`, lab/lab.c's bench_presets and bench_batch)
and prints the milliseconds per step of each function, and each product
shape's time and GFLOP/s.

Calls nest (linear_backward contains two products and the bias gradient;
add_norm_forward contains dropout_mask), so the rows do not add up to the
step. The timers cost a little; the step is a few per cent slower than
`./transformer bench`. Nothing here is used by the build or the tests.

    python3 dev/profile_step.py [--config toy] [--steps 20] [--threads 2] [--cc gcc] [--source FILE]

Plain Python 3 and a C compiler with OpenMP; no third-party packages.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TIMED = ["linear_forward", "linear_backward", "attention_forward", "attention_backward",
         "add_norm_forward", "residual_layernorm_backward", "dropout_mask", "cross_entropy_forward",
         "cross_entropy_backward", "zero", "relu_forward", "relu_backward", "embedding_forward",
         "embedding_backward", "dropout_forward", "dropout_backward", "adam_update",
         "transformer_zero_grad"]

PRELUDE = r"""
#include <time.h>
static double profile_seconds[64];
static double profile_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
typedef struct { int rows, cols, depth, form, calls; double seconds; } ProfileProduct;
static ProfileProduct profile_products[256];
static int profile_product_count, profile_on;
"""

MAIN = r"""
#define TRANSFORMER_NO_MAIN
#include "lab/lab.c"
#include <omp.h>

int main(int argc, char **argv) {
    const BenchPreset *p = NULL;
    for (int i = 0; argc == 3 && i < NUM_BENCH_PRESETS; i++)
        if (strcmp(bench_presets[i].name, argv[1]) == 0) p = &bench_presets[i];
    if (!p) { fprintf(stderr, "usage: profile CONFIG STEPS (CONFIG: tiny, toy or base)\n"); return 1; }
    const char *config_name = argv[1];
    int steps = atoi(argv[2]);
    fast_path_use(1);   // as ./transformer: the products on the fast path
    TransformerConfig c = transformer_default_config();
    c.n_layers = p->layers; c.d_model = p->d_model; c.d_ff = p->d_ff; c.n_heads = p->heads;
    c.vocab_size = p->vocab; c.dropout = 0.1f; c.label_smoothing = 0.1f; c.max_len = p->S > p->T ? p->S : p->T;
    Transformer model;
    const char *error = transformer_build(&model, &c, 1);
    if (error) { fprintf(stderr, "error: profile: %s\n", error); return 1; }
    int *tokens = checked_calloc((size_t)p->B * (p->S + 2 * p->T + 2), sizeof(int), "batch");
    Batch batch = bench_batch(tokens, p->B, p->S, p->T, c.vocab_size);
    double step_seconds = 0;
    for (int step = 1; step <= 3 + steps; step++) {
        profile_on = step > 3;
        double start = profile_now();
        model.training = 1;
        transformer_train_step(&model, &batch, 4000, 1.0);   // as ./transformer bench
        if (profile_on) step_seconds += profile_now() - start;
    }
    printf("config %s, %d threads: %.2f ms per step (the mean of %d timed steps)\n",
           config_name, omp_get_max_threads(), step_seconds / steps * 1e3, steps);
    printf("\n%-28s %10s\n", "function", "ms/step");
    for (int i = 0; i < PROFILE_NAMES; i++)
        printf("%-28s %10.3f\n", profile_names[i], profile_seconds[i] / steps * 1e3);
    printf("\nmatrix products (forms: 0 = x W^T, 1 = dy W, 2 = dy^T x; attention's per-head products not included)\n");
    printf("%-24s %5s %10s %9s\n", "rows x cols x depth", "form", "ms/step", "GFLOP/s");
    double total = 0, flops = 0;
    for (int i = 0; i < profile_product_count; i++) {
        ProfileProduct *q = &profile_products[i];
        double f = 2.0 * q->rows * q->cols * q->depth * q->calls;
        char shape[64];
        snprintf(shape, sizeof shape, "%d x %d x %d", q->rows, q->cols, q->depth);
        printf("%-24s %5d %10.3f %9.1f\n", shape, q->form, q->seconds / steps * 1e3, f / q->seconds * 1e-9);
        total += q->seconds; flops += f;
    }
    printf("%-24s %5s %10.3f %9.1f\n", "all products", "", total / steps * 1e3, flops / total * 1e-9);
    transformer_free(&model);
    free(tokens);
    return 0;
}
"""


def instrument_model(source):
    """transformer.c with timing wrappers around TIMED."""
    source = source.replace('#include "transformer.h"', '#include "transformer.h"\n' + PRELUDE, 1)
    for index, name in enumerate(TIMED):
        match = re.search(r"\n((?:static )?(void|double|real) )" + name + r"\(([^)]*)\) \{", source)
        if not match:
            sys.exit(f"error: profile_step.py: no definition of {name} in transformer.c")
        prefix, result, params = match.group(1), match.group(2), match.group(3)
        header = f"{prefix}{name}_impl({params}) {{"
        source = source[:match.start()] + "\n" + header + source[match.end():]
        end = source.index("\n}\n", match.start()) + 3
        args = ", ".join(p.strip().split()[-1].lstrip("*") for p in re.sub(r"\s+", " ", params).split(","))
        keep = "" if result == "void" else f"{result} r = "
        give = "" if result == "void" else " return r;"
        wrapper = (f"{prefix}{name}({params}) {{ double t0 = profile_now(); {keep}{name}_impl({args}); "
                   f"if (profile_on) profile_seconds[{index}] += profile_now() - t0;{give} }}\n")
        source = source[:end] + wrapper + source[end:]
    names = ", ".join(f'"{n}"' for n in TIMED)
    return source + f"\n#define PROFILE_NAMES {len(TIMED)}\nstatic const char *profile_names[] = {{ {names} }};\n"


def instrument_products(source):
    """lab/fast_path.c with a timing wrapper around matmul that records each product's shape."""
    old = "static void matmul(MatrixProduct p) {"
    if old not in source:
        sys.exit("error: profile_step.py: no matmul(MatrixProduct p) in lab/fast_path.c")
    source = source.replace(old, r"""static void matmul_impl(MatrixProduct p);
static void matmul(MatrixProduct p) {
    double t0 = profile_now();
    matmul_impl(p);
    if (!profile_on) return;
    double seconds = profile_now() - t0;
    int form = p.a.col_stride != 1 ? 2 : p.b.col_stride != 1 ? 0 : 1, i;
    for (i = 0; i < profile_product_count; i++) {
        ProfileProduct *q = &profile_products[i];
        if (q->rows == p.out_rows && q->cols == p.out_cols && q->depth == p.depth && q->form == form) break;
    }
    if (i == profile_product_count && i < 256)
        profile_products[profile_product_count++] = (ProfileProduct){ p.out_rows, p.out_cols, p.depth, form, 0, 0 };
    if (i < 256) { profile_products[i].calls++; profile_products[i].seconds += seconds; }
}
static void matmul_impl(MatrixProduct p) {""", 1)
    return source


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="toy", help="tiny, toy or base")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cc", default="gcc")
    p.add_argument("--source", default=os.path.join(HERE, "..", "transformer.c"),
                   help="the transformer.c to profile (a variant, say); transformer.h and the lab (lab/*.c) "
                        "are taken from beside it")
    a = p.parse_args(argv)
    root = os.path.dirname(os.path.abspath(a.source))
    with open(a.source) as f:
        model = instrument_model(f.read())
    with tempfile.TemporaryDirectory() as tmp:
        # the copy keeps the layout: transformer.c and transformer.h, lab/ beside them
        shutil.copytree(os.path.join(root, "lab"), os.path.join(tmp, "lab"))
        shutil.copy(os.path.join(root, "transformer.h"), tmp)
        with open(os.path.join(tmp, "transformer.c"), "w") as f:
            f.write(model)
        fast_path = os.path.join(tmp, "lab", "fast_path.c")
        with open(fast_path) as f:
            products = instrument_products(f.read())
        with open(fast_path, "w") as f:
            f.write(products)
        c_file, binary = os.path.join(tmp, "profile.c"), os.path.join(tmp, "profile")
        with open(c_file, "w") as f:
            f.write(MAIN)
        subprocess.run([a.cc, "-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-std=c11",
                        "-fopenmp", "-o", binary, c_file, "-lm"], check=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        return subprocess.run([binary, a.config, str(a.steps)], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
