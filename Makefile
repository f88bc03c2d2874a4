# transformer.c: build, test, debug
#   make demo          builds ./transformer, trains the copy task, shows it decoding
#   make numbers       trains the English -> German number task (dev/RESULTS.md, "The toy translation task") on subwords
#                      (§5.1 byte-pair encoding, 100 merges), evaluates it on the test split
#                      (greedy, beam 4, BLEU on words and subwords), averages the last 5 checkpoints
#   make translate     English -> German (TO=fr: French) from the machine's gettext catalogs: the pairs
#                      (./transformer catalogs), §5.1 subwords, about 10 minutes of training on 2 cores,
#                      the last 5 saves averaged, beam 4 on the test set, BLEU as sacreBLEU, examples
#   make table3        the paper's Table 3 on the numbers task: the base model (3 seeds) and one
#                      variant per row entry, (A) heads, (C) size, (D) dropout and label smoothing,
#                      (E) learned positions, the same steps and seed; a table and docs/table3.svg
#   make               ./transformer: lab/lab.c, which includes transformer.c and the lab's files (lab/fast_path.c,
#                      lab/text.c, lab/subwords.c, lab/checkpoints.c, lab/decode.c, lab/runs.c, lab/bleu.c,
#                      lab/catalogs.c, lab/explain.c); OpenMP on (make OPENMP=0 for none)
#   make minimal       ./transformer_minimal: transformer.c alone, as the README builds it:
#                      cc -O3 -march=native -fopenmp transformer.c -lm
#   make test          test_transformer.c on transformer.c alone (gradient checks in double, PyTorch parity,
#                      masks, Adam, learning, decoding, tasks, batches, checkpoints, ./transformer_minimal's
#                      command line and its error messages, the gdb walk of make debug); lab/test_lab.c on
#                      the lab (the same model tests through the fast path, the fast path against the
#                      loops, pictures, BLEU, TSV files, §5.1 BPE, ./transformer's command line); cuda/test_cuda.c on the
#                      CUDA companion built for the CPU. Each in double, float and float without OpenMP
#                      (the companion: float, with and without OpenMP); one summed "N passed, M failed"
#   make cuda          ./transformer_cuda: the training steps on a GPU (nvcc, cuBLAS; CUDA_ARCH=sm_80);
#                      warnings are errors, and a kernel that spills registers fails the build
#   make cuda-cpu      ./transformer_cuda_cpu: the same companion built for the CPU (cuda_on_cpu.h)
#   make test-threads  the companion's tests with real threads under ThreadSanitizer
#   make test-cuda     on a GPU: the tests with the companion built by nvcc, compute-sanitizer,
#                      the training steps beside PyTorch on the same GPU (a table), make numbers
#                      (make test-cuda-proofs and test-cuda-bench: its two parts; cuda/gpu_session.sh)
#   make debug         -O0 -g builds for gdb, without OpenMP: transformer_debug (transformer.c alone),
#                      test_transformer_debug (its tests)
#   make sanitize      the tests under AddressSanitizer and UBSan: transformer.c alone (double) and the
#                      lab (double and float), each against its program built the same way, and the
#                      CUDA companion's tests on the emulator (its fibers announce each stack switch)
#   make fuzz          a libFuzzer target per parser of outside input (checkpoints, TSV data and
#                      §5.1 merges, text cut into subwords, BLEU's files, plot's training log, the
#                      PyTorch reference files, message catalogs), clang with AddressSanitizer and UBSan, each run
#                      FUZZ_SECONDS (60) from seeds; findings under runs/fuzz/ (not part of make test)
#   make bench-setup   dev/.venv: a virtual environment with PyTorch 2.x from PyPI, for
#                      make bench (dev/BENCH.md; does nothing when it is already there)
#   make bench         training-step and decoding speed against PyTorch 2.x, eager and
#                      torch.compile, and Debian's PyTorch 1.13 when installed (not part of
#                      make test; dev/BENCH.md): BENCH_CONFIGS, BENCH_DECODE, BENCH_ROUNDS,
#                      BENCH_THREADS, BENCH_COMPILE=0 (no torch.compile runs)
#   make dev-check     each script in dev/ on its smallest case (dev/check.sh; no network, not part
#                      of make test); a script whose Python is not installed is skipped
#   make clean         removes the programs and test binaries built here (not runs/, not dev/.venv)
CC ?= gcc
OPENMP ?= 1
# -ffp-contract=fast lets the compiler fuse a*b + c into one FMA instruction
# (one rounding instead of two): twice the multiply-adds per cycle in the
# matrix products. Safe here: every result stays deterministic for a given
# binary and thread count, and the tests hold (dev/PERFORMANCE.md, "Floating point").
CFLAGS ?= -O3 -march=native -ffp-contract=fast -fno-math-errno
WARNINGS = -std=c11 -Wall -Wextra
ifeq ($(OPENMP),1)
OMPFLAGS = -fopenmp
endif
LDLIBS = -lm
SOURCES = transformer.c transformer.h lab/lab.c lab/fast_path.c lab/text.c lab/subwords.c lab/checkpoints.c \
          lab/decode.c lab/runs.c lab/bleu.c lab/catalogs.c lab/ranks.c lab/ranks.h \
          lab/explain.c

# ---- MPI: mpirun -np N ./transformer train, data-parallel (lab/ranks.c; README) ----
# With MPI=1, the default where an mpicc is on the PATH (Open MPI's, or MPICH's), the lab's
# programs and tests are compiled with -DTRANSFORMER_MPI and MPI's include flags and linked with
# its libraries (as mpicc would, with $(CC)); MPI starts only when a launcher started the program.
# make MPI=0, or a machine without mpicc, builds them without it; transformer.c alone, make
# debug, make sanitize, make fuzz and make test-threads never use it (MPI's own allocations and
# threads are not ours to check). After changing MPI, make clean first: make does not track flags.
MPI ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(MPI),1)
MPI_SHOW := $(shell mpicc --showme 2>/dev/null || mpicc -show 2>/dev/null)
MPI_CFLAGS = -DTRANSFORMER_MPI $(filter -I% -pthread,$(MPI_SHOW))
MPI_LIBS = $(filter -L% -l% -Wl% -pthread,$(MPI_SHOW))
endif
# the CUDA companion; the float test builds include it, built for the CPU
COMPANION = cuda/transformer_cuda.cu cuda/fused_attention.cu cuda/bf16_casts.h cuda/transposed_weights.h \
            cuda/epilogues.h cuda/cuda_on_cpu.h cuda/cuda_on_cpu_threads.h

# the test binaries `make test` runs, in this order: transformer.c alone (its command-line tests run
# ./transformer_minimal), the lab (./transformer), the CUDA companion built for the CPU
TESTS = test_transformer_f64 test_transformer test_transformer_serial test_lab_f64 test_lab test_lab_serial \
        test_cuda test_cuda_serial

.PHONY: all test test-binaries demo numbers translate table3 debug minimal sanitize fuzz bench bench-setup clean cuda cuda-cpu test-cuda

all: transformer

# the program with every command: lab/lab.c includes transformer.c and the other files of $(SOURCES)
transformer: $(SOURCES)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -o $@ lab/lab.c $(LDLIBS) $(MPI_LIBS)

# transformer.c alone, the smallest complete program (train, decode), built as the README says:
# -O3 -march=native -fopenmp (the plain loops on every core, their dot products in vector lanes).
# make test runs it, so that the one file keeps building and training by itself.
MINIMAL_FLAGS ?= -O3 -march=native -fopenmp
minimal: transformer_minimal
transformer_minimal: transformer.c transformer.h
	$(CC) $(MINIMAL_FLAGS) $(WARNINGS) -o $@ transformer.c $(LDLIBS)

# transformer.c alone, with its tests (test_transformer.c): in float, as users run it; in double, with
# the finite-difference gradient checks; in float without OpenMP (as `cc transformer.c` builds it):
# the code must pass each way. Their command-line tests run ./transformer_minimal.
TRANSFORMER_TEST = test_transformer.c transformer.c transformer.h
test_transformer: $(TRANSFORMER_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) -o $@ test_transformer.c $(LDLIBS)
test_transformer_f64: $(TRANSFORMER_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) -DTRANSFORMER_DOUBLE -o $@ test_transformer.c $(LDLIBS)
test_transformer_serial: $(TRANSFORMER_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) -o $@ test_transformer.c $(LDLIBS)

# the lab and the fast path (lab/test_lab.c, which runs test_transformer.c's model tests again through
# the fast path): in double, in float, and without OpenMP. Their command-line tests run ./transformer.
LAB_TEST = lab/test_lab.c lab/test_ranks.c $(TRANSFORMER_TEST) $(SOURCES)
test_lab_f64: $(LAB_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -DTRANSFORMER_DOUBLE -o $@ lab/test_lab.c $(LDLIBS) $(MPI_LIBS)
test_lab: $(LAB_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -o $@ lab/test_lab.c $(LDLIBS) $(MPI_LIBS)
test_lab_serial: $(LAB_TEST)
	$(CC) $(CFLAGS) $(WARNINGS) $(MPI_CFLAGS) -o $@ lab/test_lab.c $(LDLIBS) $(MPI_LIBS)

# the CUDA companion built for the CPU (cuda/cuda_on_cpu.h) against transformer.c, with and without OpenMP
test_cuda: cuda/test_cuda.c test_transformer.c $(SOURCES) $(COMPANION)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -o $@ cuda/test_cuda.c $(LDLIBS) $(MPI_LIBS)
test_cuda_serial: cuda/test_cuda.c test_transformer.c $(SOURCES) $(COMPANION)
	$(CC) $(CFLAGS) $(WARNINGS) $(MPI_CFLAGS) -o $@ cuda/test_cuda.c $(LDLIBS) $(MPI_LIBS)

# Runs every test binary, then sums their "N passed, M failed" lines into one.
# A binary that crashes before its summary counts as one failure. The tests
# also run the programs themselves, as a user would (bad input, resume):
# transformer.c's tests ./transformer_minimal, the others ./transformer; and
# test_transformer_serial walks ./transformer_debug in gdb (once: skipped
# where gdb is absent). Their threads wait at OpenMP's barriers asleep
# (OMP_WAIT_POLICY=passive), not spinning: the models are tiny, and on a
# machine busy with other programs a spinning thread burns its core waiting
# for one that is not running (test_lab took 33 s of CPU time instead of 16,
# and one table3 command 17 s instead of 0.2). TEST_OMP_WAIT= leaves libgomp's
# default.
TEST_OMP_WAIT ?= passive
# The binaries are built first, one compiler per core (TEST_JOBS) unless make
# was given its own -j: one after another they took 2.5 minutes on 2 cores,
# more than the tests themselves (dev/PERFORMANCE.md, "make test's own time").
TEST_JOBS ?= $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
test:
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(TEST_JOBS)) test-binaries
	@passed=0; failed=0; status=0; \
	for t in $(TESTS); do \
	  echo "== ./$$t"; \
	  case $$t in test_transformer*) bin=./transformer_minimal;; *) bin=./transformer;; esac; \
	  case $$t in test_transformer_serial) debug=./transformer_debug;; *) debug=;; esac; \
	  TRANSFORMER_BIN=$$bin TRANSFORMER_MINIMAL_BIN=./transformer_minimal TRANSFORMER_DEBUG_BIN=$$debug \
	    OMP_WAIT_POLICY=$(TEST_OMP_WAIT) ./$$t > .test_output.log 2>&1; code=$$?; \
	  cat .test_output.log; \
	  [ $$code -eq 0 ] || status=1; \
	  counts=$$(sed -n 's/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$$/\1 \2/p' .test_output.log | tail -n 1); \
	  if [ -z "$$counts" ]; then failed=$$((failed + 1)); echo "FAIL ./$$t ended without its summary (exit $$code)"; \
	  else set -- $$counts; passed=$$((passed + $$1)); failed=$$((failed + $$2)); fi; \
	done; \
	rm -f .test_output.log; \
	echo "$$passed passed, $$failed failed"; \
	exit $$status
test-binaries: $(TESTS) transformer transformer_minimal transformer_debug
	@:

# The README's main job: train the copy task with the defaults (9-11 s on 2
# idle cores, dev/RESULTS.md; about 30 s on 2 cores busy with other work),
# print held-out examples and the exact-match rate, then decode a sentence
# with beam search from the checkpoint. The demo is made to be run
# again: it keeps its own file, runs/demo.ckpt, and replaces it (--force);
# train refuses to replace any other checkpoint unasked.
demo: transformer
	mkdir -p runs
	./transformer train --task copy --checkpoint runs/demo.ckpt --force
	./transformer decode --checkpoint runs/demo.ckpt --beam 4 "3 1 4 1 5 9 2 6"

# dev/RESULTS.md, "The toy translation task": 2 layers, d_model 64, 2000 steps (64 s on one core of a 2-core Xeon,
# 110 s with the four evaluations, 2026-11-28); THREADS=1 is faster than two threads on a machine busy with other jobs.
THREADS ?= 0
NUMBERS = --train tiny_data/numbers_train.tsv --valid tiny_data/numbers_dev.tsv --bpe 100 --layers 2 --d-model 64 \
          --d-ff 256 --heads 4 --lr 0.003 --warmup 400 --steps 2000 --batch-tokens 1200 --seed 1
NUMBERS_BIN ?= ./transformer
numbers: transformer
	mkdir -p runs && rm -f runs/numbers.csv runs/numbers.ckpt.step*
	$(NUMBERS_BIN) train $(NUMBERS) --eval-every 250 --log-every 50 --save-every 100 --keep-last 5 \
	    --log runs/numbers.csv --checkpoint runs/numbers.ckpt --force --threads $(THREADS)
	$(NUMBERS_BIN) eval --checkpoint runs/numbers.ckpt --data tiny_data/numbers_test.tsv --bleu --threads $(THREADS)
	$(NUMBERS_BIN) eval --checkpoint runs/numbers.ckpt --data tiny_data/numbers_test.tsv --bleu --beam 4 --threads $(THREADS)
	./transformer average --out runs/numbers_avg5.ckpt --force runs/numbers.ckpt.step*
	./transformer eval --checkpoint runs/numbers_avg5.ckpt --data tiny_data/numbers_test.tsv --bleu --threads $(THREADS)
	./transformer eval --checkpoint runs/numbers_avg5.ckpt --data tiny_data/numbers_test.tsv --bleu --beam 4 --threads $(THREADS)

# ---- real language: English -> German from the machine's message catalogs (README, dev/RESULTS.md) ----
# ./transformer catalogs extracts the pairs of the installed programs' .mo files (lab/catalogs.c; fewer
# than 2000 found: it stops there, with one line), train learns the shared §5.1 subwords and trains a
# model sized for about 10 minutes on 2 cores, keeping the last 5 saves; average takes their mean
# (§6.1), decode translates the test set with beam 4 and alpha 0.6, and bleu scores it as sacreBLEU
# does (13a, exp; then tokenize none). Then ten test sentences, the cross-attention pictures of one
# (every head of every layer, the last decoder layer's among them) and the training curve; last,
# explain's page of that sentence (lab/explain.c: every number of its decoding, beam 4, one HTML file).
# make translate TO=fr: English -> French. Decoding runs on one thread: a sentence's 4 beams are too
# few rows for two threads to gain, and beside a busy program they lose many times over.
TO ?= de
TRANSLATE_DIR = runs/translate/$(TO)
TRANSLATE = --bpe 3000 --layers 2 --d-model 256 --d-ff 1024 --heads 4 --lr 0.002 --warmup 500 --steps 2200 \
            --batch-tokens 3000 --seed 1
TRANSLATE_EXTRA ?=
translate: transformer
	@mkdir -p $(TRANSLATE_DIR) && date +%s > $(TRANSLATE_DIR)/started
	./transformer catalogs --to $(TO) --out $(TRANSLATE_DIR) --force --min-pairs 2000
	rm -f $(TRANSLATE_DIR)/model.ckpt $(TRANSLATE_DIR)/model.ckpt.step* $(TRANSLATE_DIR)/train.csv \
	    $(TRANSLATE_DIR)/batches.bin $(TRANSLATE_DIR)/loss.txt
	./transformer train --train $(TRANSLATE_DIR)/train.tsv --valid $(TRANSLATE_DIR)/dev.tsv $(TRANSLATE) \
	    --eval-every 0 --eval-size 100 --show 3 --log-every 100 --save-every 100 --keep-last 5 \
	    --log $(TRANSLATE_DIR)/train.csv --checkpoint $(TRANSLATE_DIR)/model.ckpt --force --threads $(THREADS) \
	    $(TRANSLATE_EXTRA)
	./transformer average --out $(TRANSLATE_DIR)/average.ckpt --force $(TRANSLATE_DIR)/model.ckpt.step*
	cut -f1 $(TRANSLATE_DIR)/test.tsv > $(TRANSLATE_DIR)/test.source
	cut -f2 $(TRANSLATE_DIR)/test.tsv > $(TRANSLATE_DIR)/test.reference
	@date +%s.%N > $(TRANSLATE_DIR)/decode_started
	./transformer decode --checkpoint $(TRANSLATE_DIR)/average.ckpt --beam 4 --alpha 0.6 \
	    --threads 1 < $(TRANSLATE_DIR)/test.source > $(TRANSLATE_DIR)/test.output
	@awk -v now=$$(date +%s.%N) -v from=$$(cat $(TRANSLATE_DIR)/decode_started) -v n=$$(wc -l < $(TRANSLATE_DIR)/test.output) \
	    'BEGIN { printf "decode: %d test sentences, beam 4, one thread: %.2f s\n", n, now - from }'
	./transformer bleu $(TRANSLATE_DIR)/test.output $(TRANSLATE_DIR)/test.reference
	./transformer bleu $(TRANSLATE_DIR)/test.output $(TRANSLATE_DIR)/test.reference --tokenize none
	@echo "ten test sentences, the first of 5 words or more that begin with a capital (beam 4, the average):"
	@paste $(TRANSLATE_DIR)/test.tsv $(TRANSLATE_DIR)/test.output | awk -F '\t' '$$1 ~ /^[A-Z][a-z]/ && \
	    split($$1, words, " ") >= 5' | head -n 10 | \
	    awk -F '\t' '{ printf "  source     %s\n  reference  %s\n  ours       %s\n\n", $$1, $$2, $$3 }'
	./transformer attention --checkpoint $(TRANSLATE_DIR)/average.ckpt --out-dir $(TRANSLATE_DIR)/attention \
	    "$$(awk '/^[A-Z][a-z]/ && NF >= 6 && NF <= 10' $(TRANSLATE_DIR)/test.source | head -n 1)"
	./transformer plot --log $(TRANSLATE_DIR)/train.csv --out $(TRANSLATE_DIR)/training.svg \
	    --title "English -> $(TO), message catalogs"
	./transformer explain --checkpoint $(TRANSLATE_DIR)/average.ckpt --beam 4 --alpha 0.6 --threads 1 \
	    --out $(TRANSLATE_DIR)/explain.html \
	    "$$(awk '/^[A-Z][a-z]/ && NF >= 6 && NF <= 10' $(TRANSLATE_DIR)/test.source | head -n 1)"
	@echo "make translate: $$(( $$(date +%s) - $$(cat $(TRANSLATE_DIR)/started) )) s from the catalogs to here;" \
	    "pictures in $(TRANSLATE_DIR)/attention/cross_attention.svg and $(TRANSLATE_DIR)/training.svg;" \
	    "one sentence, every number, in $(TRANSLATE_DIR)/explain.html (open it in a browser)"

# ---- Table 3 on a laptop (dev/RESULTS.md, "Table 3 on a laptop") ----
# Every run is the base model of make numbers with a shorter budget (the base
# has not learned the task yet: differences show) and one change, named
# table3_RUN; the runs train TABLE3_JOBS at a time, one thread each (results do
# not depend on the thread count), then ./transformer table3 scores them all.
TABLE3_DIR = runs/table3
TABLE3_JOBS ?= 2
TABLE3_TRAIN = --train tiny_data/numbers_train.tsv --valid tiny_data/numbers_dev.tsv --bpe 100 --layers 2 \
               --d-model 64 --d-ff 256 --heads 4 --dropout 0.1 --label-smoothing 0.1 --lr 0.003 --warmup 100 \
               --steps 200 --batch-tokens 1200 --seed 1
TABLE3_RUNS = base seed2 seed3 A_h1 A_h2 A_h8 A_h16 C_N1 C_N4 C_d32 C_d128 C_ff128 C_ff1024 \
              D_drop0 D_drop2 D_ls0 D_ls2 E_learned
table3_seed2 = --seed 2
table3_seed3 = --seed 3
table3_A_h1 = --heads 1
table3_A_h2 = --heads 2
table3_A_h8 = --heads 8
table3_A_h16 = --heads 16
table3_C_N1 = --layers 1
table3_C_N4 = --layers 4
table3_C_d32 = --d-model 32
table3_C_d128 = --d-model 128
table3_C_ff128 = --d-ff 128
table3_C_ff1024 = --d-ff 1024
table3_D_drop0 = --dropout 0
table3_D_drop2 = --dropout 0.2
table3_D_ls0 = --label-smoothing 0
table3_D_ls2 = --label-smoothing 0.2
table3_E_learned = --positional learned
TABLE3_CHECKPOINTS = $(TABLE3_RUNS:%=$(TABLE3_DIR)/%.ckpt)
table3: transformer
	@mkdir -p $(TABLE3_DIR) docs && rm -f $(TABLE3_CHECKPOINTS) && start=$$(date +%s) && \
	$(MAKE) --no-print-directory -j$(TABLE3_JOBS) $(TABLE3_CHECKPOINTS) && \
	./transformer table3 --dev tiny_data/numbers_dev.tsv --test tiny_data/numbers_test.tsv \
	    --svg docs/table3.svg --title "Table 3 on the numbers task" $(TABLE3_CHECKPOINTS) && \
	echo "make table3: $$(( $$(date +%s) - start )) s in all"
$(TABLE3_DIR)/%.ckpt:
	./transformer train $(TABLE3_TRAIN) $(table3_$*) --eval-every 0 --eval-size 50 --log-every 0 --show 0 \
	    --threads 1 --force --checkpoint $@ > $(TABLE3_DIR)/$*.log

# ---- the CUDA companion (cuda/transformer_cuda.cu; README, cuda/NOTES.md) ----
# transformer.c with its lab is compiled as C by $(CC) and linked beside the companion's
# object; nvcc compiles the .cu as CUDA C++ with every warning an error, and
# ptxas reports each kernel's registers: a spill fails the build, and so does a
# kernel whose largest block (its __launch_bounds__, else 1024 threads) would
# need more registers than a block may have (cuda/check_registers.awk, which
# reads the bounds from the PTX that nvcc -keep leaves in $(NVCC_KEEP)).
NVCC ?= nvcc
CUDA_ARCH ?= sm_80
NVCC_ARCH ?= -arch=$(CUDA_ARCH)
NVCCFLAGS ?= -O3 $(NVCC_ARCH)
NVCC_CHECKED = $(NVCC) $(NVCCFLAGS) -Werror all-warnings -Xcompiler -Wall,-Wextra -Xptxas -v
NVCC_LINK = $(NVCC) $(NVCCFLAGS) $(if $(OMPFLAGS),-Xcompiler $(OMPFLAGS)) -lcublas -lcublasLt -lm
NVCC_KEEP = .nvcc_keep
# mpirun -np N ./transformer_cuda train: the gradients summed by NCCL (cuda/transformer_cuda.cu,
# -DTRANSFORMER_NCCL), its id shared over MPI, where nccl.h is found beside nvcc (or in
# /usr/include) and MPI=1; else the companion trains as one rank only (NCCL=0). The host
# object and the link take MPI's flags and libraries as the lab's programs do.
NVCC_HOME := $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
NCCL ?= $(if $(and $(filter 1,$(MPI)),$(wildcard $(NVCC_HOME)/include/nccl.h /usr/include/nccl.h)),1,0)
ifeq ($(NCCL),1)
NCCL_FLAGS = -DTRANSFORMER_NCCL
NCCL_LIBS = -lnccl
endif
NVCC_MPI_LIBS = $(NCCL_LIBS) $(filter -L% -l%,$(MPI_LIBS))
# $(call cuda_compile,OUTPUT.o,EXTRA FLAGS): cuda/transformer_cuda.cu compiled and its registers
# checked (its own kept files and log, so that make -j can build both objects at once)
define cuda_compile
	rm -rf $(NVCC_KEEP)/$(1) && mkdir -p $(NVCC_KEEP)/$(1)
	$(NVCC_CHECKED) $(2) $(NCCL_FLAGS) -keep -keep-dir $(NVCC_KEEP)/$(1) -c -o $(1) cuda/transformer_cuda.cu \
	  2> $(NVCC_KEEP)/$(1).ptxas.log || { cat $(NVCC_KEEP)/$(1).ptxas.log; exit 1; }
	@if grep -E '[1-9][0-9]* bytes spill (stores|loads)' $(NVCC_KEEP)/$(1).ptxas.log; then \
	  echo "make cuda: a kernel spills registers (above); expected 0 bytes"; exit 1; fi
	@awk -f cuda/check_registers.awk $(NVCC_KEEP)/$(1)/*.ptx $(NVCC_KEEP)/$(1).ptxas.log
	@echo "make cuda: $$(grep -c 'bytes spill stores' $(NVCC_KEEP)/$(1).ptxas.log) kernels, no register spills (ptxas -v)"
	@rm -rf $(NVCC_KEEP)/$(1) $(NVCC_KEEP)/$(1).ptxas.log
endef
# make cuda also links the GPU tests' binary: a symbol it cannot find (as
# transformer_cuda_sgemm without extern "C" once was) fails here, not on a lent GPU
cuda: transformer_cuda test_transformer_cuda
transformer_cuda: $(COMPANION) $(SOURCES) cuda/check_registers.awk
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -DTRANSFORMER_NO_MAIN -c -o transformer_host.o lab/lab.c
	$(call cuda_compile,transformer_cuda.o,)
	$(NVCC_LINK) -o $@ transformer_cuda.o transformer_host.o $(NVCC_MPI_LIBS)

# the companion built for the CPU (cuda_on_cpu.h): ./transformer_cuda_cpu bench --config base --count
# prints what one training step launches, copies and holds, without computing it
cuda-cpu: transformer_cuda_cpu
transformer_cuda_cpu: $(COMPANION) $(SOURCES)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -DCUDA_ON_CPU -DTRANSFORMER_NO_MAIN -o $@ -x c cuda/transformer_cuda.cu \
	    -x none lab/lab.c $(LDLIBS) $(MPI_LIBS)

# the float tests with the companion built by nvcc instead of for the CPU
test_transformer_cuda: cuda/test_cuda.c test_transformer.c $(COMPANION) $(SOURCES) cuda/check_registers.awk
	$(call cuda_compile,transformer_cuda_test.o,-DTRANSFORMER_CUDA_NO_MAIN)
	$(CC) $(CFLAGS) $(WARNINGS) $(OMPFLAGS) $(MPI_CFLAGS) -DCOMPANION_ON_GPU -c -o test_transformer_cuda.o cuda/test_cuda.c
	$(NVCC_LINK) -o $@ test_transformer_cuda.o transformer_cuda_test.o $(NVCC_MPI_LIBS)

# make test-threads (not part of make test): the companion's tests with each block's threads as
# POSIX threads running at once (cuda_on_cpu.h built with -DCUDA_ON_CPU_THREADS, test_cuda_threads.c),
# under ThreadSanitizer, which must report no data race; then three steps with a racy += put in
# (test_transformer.c's racy_embedding_backward_kernel), which it must report. Without OpenMP:
# ThreadSanitizer does not see libgomp's own synchronisation. About 15 minutes on 2 cores (2026-11-28).
.PHONY: test-threads clean-companion
TSAN = -O1 -g -fno-omit-frame-pointer -fsanitize=thread
test_cuda_threads: cuda/test_cuda_threads.c cuda/test_cuda.c test_transformer.c $(COMPANION) $(SOURCES)
	$(CC) $(TSAN) $(WARNINGS) -DCUDA_ON_CPU_THREADS -pthread -o $@ cuda/test_cuda_threads.c $(LDLIBS)
test-threads: test_cuda_threads transformer
	TRANSFORMER_BIN=./transformer ./test_cuda_threads
	@if ./test_cuda_threads --racy > .tsan_racy.log 2>&1 || ! grep -q 'ThreadSanitizer: data race' .tsan_racy.log; then \
	  cat .tsan_racy.log; echo "test-threads: ThreadSanitizer did not report the racy +="; exit 1; fi
	@echo "test-threads: ThreadSanitizer reports the racy += of racy_embedding_backward_kernel:"; \
	  grep -m 2 -A 2 'WARNING: ThreadSanitizer: data race' .tsan_racy.log; rm -f .tsan_racy.log

# make test-cuda, on a GPU machine (not part of make test), offline, in two parts that each fit
# one command of a short lease (cuda/gpu_session.sh runs them so), then make numbers:
#   make test-cuda-proofs (about 5 minutes):
#   - everything built for this GPU (nvidia-smi's compute capability; where it cannot tell, one
#     binary for sm_80 and sm_90), the tests with the companion built by nvcc: the reference
#     files, the training runs against transformer.c, train and --resume;
#   - two 40-step training runs that must write the same checkpoint, bit for bit, a third
#     without CUDA graphs (--no-graph) and a fourth on one stream (--one-stream) that must write it
#     too; the same with --bf16 (its products on both streams, and on one); --fused-attention with
#     and without graphs, and on one stream; the copy task trained whole in fp32 and with --bf16
#     (their last evaluations);
#   - with NCCL and mpirun: mpirun -np 1 (the NCCL path, one rank) must write the one-process
#     run's checkpoint, bit for bit; on two GPUs or more, two -np 2 runs the same checkpoint;
#   - compute-sanitizer's memcheck, racecheck, initcheck and synccheck on a short training run
#     (its third step replays the graph captured at its second);
#   make test-cuda-bench: dev/bench_gpu.py: ./transformer_cuda beside PyTorch at its best on the
#     same GPU (fused Adam and SDPA, eager, a captured whole step, torch.compile's modes), fp32,
#     TF32 and bf16 (ours --bf16, PyTorch's autocast), the base model at the paper's batch (base-25k) first, cuBLAS's SGEMM as the
#     yardstick, tables with the GPU's name and the date, kept in runs/gpu_table.md (each run's
#     JSON in GPU_BENCH_LOG as it ends); PyTorch from dev/.venv when its torch sees the GPU,
#     else from the first python3 on the PATH whose does, else the tables have ours alone and say why;
#   make test-cuda: both, then make numbers trained on the GPU.
# GPU_BENCH: dev/bench_gpu.py's options, sized for a 15-minute lease (after --budget seconds no run
# starts; each may take --timeout): the goals' configs and PyTorch's likely fastest columns. With
# time to spare: --configs base-25k,tiny,toy,big-25k --rounds 3 (all five columns, TF32 everywhere).
# GPU_BENCH_LOG: each run's JSON, a line as it ends (what a cut run leaves).
GPU_BENCH ?= --configs base-25k,tiny,toy --tf32-configs base-25k --bf16-configs base-25k \
             --columns eager,graph,compile \
             --columns-for tiny=eager,graph,reduce-overhead --columns-for toy=eager,graph,reduce-overhead \
             --rounds 1 --budget 330 --timeout 140
GPU_BENCH_LOG ?= runs/gpu_runs.jsonl
GPU_CAPABILITY = $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
GPU_NVCC_ARCH = $(if $(GPU_CAPABILITY),-arch=sm_$(GPU_CAPABILITY),-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
TORCH_PYTHON = $(shell for p in $(BENCH_VENV)/bin/python $$(which -a python3 2>/dev/null); do \
                 if $$p -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then \
                   echo $$p; break; fi; done)
SANITIZED_RUN = train --task copy --steps 3 --eval-every 0 --show 0 --log-every 0 --force --checkpoint runs/sanitized.ckpt
RERUN = train --task copy --steps 40 --eval-every 0 --show 0 --log-every 0 --force
# the copy task as README trains it, in fp32 and with --bf16: the last evaluation of each (exact match)
COPY_RUN = train --task copy --show 0 --log-every 0 --force
.PHONY: test-cuda-proofs test-cuda-bench
test-cuda-proofs: transformer
	mkdir -p runs
	nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader; date -u
	$(MAKE) --no-print-directory -B NVCC_ARCH="$(GPU_NVCC_ARCH)" transformer_cuda test_transformer_cuda
	TRANSFORMER_BIN=./transformer ./test_transformer_cuda
	./transformer_cuda $(RERUN) --checkpoint runs/rerun_a.ckpt && \
	  ./transformer_cuda $(RERUN) --checkpoint runs/rerun_b.ckpt && \
	  cmp runs/rerun_a.ckpt runs/rerun_b.ckpt && echo "test-cuda: two runs wrote the same checkpoint, bit for bit"
	./transformer_cuda $(RERUN) --no-graph --checkpoint runs/rerun_eager.ckpt && \
	  cmp runs/rerun_a.ckpt runs/rerun_eager.ckpt && \
	  echo "test-cuda: a run without CUDA graphs wrote the same checkpoint as with them, bit for bit"
	./transformer_cuda $(RERUN) --one-stream --checkpoint runs/rerun_one_stream.ckpt && \
	  cmp runs/rerun_a.ckpt runs/rerun_one_stream.ckpt && \
	  echo "test-cuda: a run on one stream (--one-stream) wrote the same checkpoint as on two, bit for bit"
	./transformer_cuda $(RERUN) --fused-attention --checkpoint runs/rerun_fused_a.ckpt && \
	  ./transformer_cuda $(RERUN) --fused-attention --no-graph --checkpoint runs/rerun_fused_b.ckpt && \
	  ./transformer_cuda $(RERUN) --fused-attention --one-stream --checkpoint runs/rerun_fused_one.ckpt && \
	  cmp runs/rerun_fused_a.ckpt runs/rerun_fused_b.ckpt && \
	  cmp runs/rerun_fused_a.ckpt runs/rerun_fused_one.ckpt && \
	  echo "test-cuda: three runs with --fused-attention (graphs, none, one stream) wrote the same checkpoint"
	./transformer_cuda $(RERUN) --bf16 --checkpoint runs/rerun_bf16_a.ckpt && \
	  ./transformer_cuda $(RERUN) --bf16 --checkpoint runs/rerun_bf16_b.ckpt && \
	  ./transformer_cuda $(RERUN) --bf16 --no-graph --checkpoint runs/rerun_bf16_eager.ckpt && \
	  ./transformer_cuda $(RERUN) --bf16 --one-stream --checkpoint runs/rerun_bf16_one.ckpt && \
	  cmp runs/rerun_bf16_a.ckpt runs/rerun_bf16_b.ckpt && cmp runs/rerun_bf16_a.ckpt runs/rerun_bf16_eager.ckpt && \
	  cmp runs/rerun_bf16_a.ckpt runs/rerun_bf16_one.ckpt && \
	  echo "test-cuda: four runs with --bf16 (two, no graphs, one stream) wrote the same checkpoint, bit for bit"
	./transformer_cuda $(RERUN) --tf32 --checkpoint runs/rerun_tf32_a.ckpt && \
	  ./transformer_cuda $(RERUN) --tf32 --checkpoint runs/rerun_tf32_b.ckpt && \
	  ./transformer_cuda $(RERUN) --tf32 --weights-as-stored --checkpoint runs/rerun_tf32_stored_a.ckpt && \
	  ./transformer_cuda $(RERUN) --tf32 --weights-as-stored --checkpoint runs/rerun_tf32_stored_b.ckpt && \
	  cmp runs/rerun_tf32_a.ckpt runs/rerun_tf32_b.ckpt && \
	  cmp runs/rerun_tf32_stored_a.ckpt runs/rerun_tf32_stored_b.ckpt && \
	  echo "test-cuda: two runs with --tf32 wrote the same checkpoint, and two with --tf32 --weights-as-stored"
	./transformer_cuda $(RERUN) --no-epilogues --checkpoint runs/rerun_kernels_a.ckpt && \
	  ./transformer_cuda $(RERUN) --no-epilogues --checkpoint runs/rerun_kernels_b.ckpt && \
	  cmp runs/rerun_kernels_a.ckpt runs/rerun_kernels_b.ckpt && \
	  echo "test-cuda: two runs with --no-epilogues wrote the same checkpoint, bit for bit"
	@if [ "$(NCCL)" = 1 ] && command -v mpirun >/dev/null; then \
	  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; \
	  mpirun -q -np 1 ./transformer_cuda $(RERUN) --checkpoint runs/rerun_nccl1.ckpt && \
	  cmp runs/rerun_a.ckpt runs/rerun_nccl1.ckpt && \
	  echo "test-cuda: mpirun -np 1 over NCCL wrote the one-process checkpoint, bit for bit" || exit 1; \
	  if [ "$$(nvidia-smi -L | wc -l)" -ge 2 ]; then \
	    mpirun -q -np 2 ./transformer_cuda $(RERUN) --checkpoint runs/rerun_nccl2a.ckpt && \
	    mpirun -q -np 2 ./transformer_cuda $(RERUN) --checkpoint runs/rerun_nccl2b.ckpt && \
	    cmp runs/rerun_nccl2a.ckpt runs/rerun_nccl2b.ckpt && \
	    echo "test-cuda: two mpirun -np 2 runs over NCCL wrote the same checkpoint, bit for bit" || exit 1; \
	  else echo "test-cuda: one GPU: mpirun -np 2 over NCCL needs two (skipped)"; fi; \
	else echo "test-cuda: no NCCL build (make cuda NCCL=1) or no mpirun: the NCCL runs skipped"; fi
	./transformer_cuda $(COPY_RUN) --checkpoint runs/copy_fp32.ckpt && \
	  ./transformer_cuda $(COPY_RUN) --bf16 --checkpoint runs/copy_bf16.ckpt
	@if command -v compute-sanitizer >/dev/null; then \
	  for tool in memcheck racecheck initcheck synccheck; do \
	    compute-sanitizer --tool $$tool --error-exitcode 1 ./transformer_cuda $(SANITIZED_RUN) || exit 1; done; \
	  for tool in memcheck racecheck; do \
	    compute-sanitizer --tool $$tool --error-exitcode 1 ./transformer_cuda $(SANITIZED_RUN) --fused-attention \
	      --d-model 128 --heads 2 || exit 1; done; \
	  for tool in memcheck initcheck; do \
	    compute-sanitizer --tool $$tool --error-exitcode 1 ./transformer_cuda $(SANITIZED_RUN) --bf16 || exit 1; done; \
	  for tool in memcheck racecheck; do \
	    compute-sanitizer --tool $$tool --error-exitcode 1 ./transformer_cuda $(SANITIZED_RUN) --tf32 || exit 1; done; \
	else echo "test-cuda: compute-sanitizer is not on the PATH; skipped its checks"; fi
test-cuda-bench: transformer
	mkdir -p runs
	@if [ ! -x ./transformer_cuda ]; then $(MAKE) --no-print-directory NVCC_ARCH="$(GPU_NVCC_ARCH)" transformer_cuda; fi
	python3 dev/bench_gpu.py --binary ./transformer_cuda --python "$(TORCH_PYTHON)" --log $(GPU_BENCH_LOG) \
	    $(GPU_BENCH) > runs/gpu_table.md; status=$$?; cat runs/gpu_table.md; exit $$status
test-cuda: test-cuda-proofs test-cuda-bench
	$(MAKE) --no-print-directory numbers NUMBERS_BIN=./transformer_cuda

clean: clean-companion
clean-companion:
	rm -rf test_cuda_threads .tsan_racy.log $(NVCC_KEEP)

# No OpenMP here: with it, each parallel loop's body would be a separate
# function run by libgomp, and gdb's `next` would step over the whole loop.
debug: transformer_debug test_transformer_debug
transformer_debug: transformer.c transformer.h
	$(CC) -O0 -g $(WARNINGS) -o $@ transformer.c $(LDLIBS)
test_transformer_debug: $(TRANSFORMER_TEST)
	$(CC) -O0 -g $(WARNINGS) -o $@ test_transformer.c $(LDLIBS)

# float-cast-overflow: gcc's undefined does not include it (clang's does): a
# NaN or an infinity converted to an integer, as a chart's ticks once were
SANITIZE = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
# transformer.c alone in double (Part I's loops, its program against ./transformer_minimal_asan), the lab
# in double and in float (the fast path, the lab against ./transformer_asan)
sanitize: $(LAB_TEST)
	$(CC) $(SANITIZE) $(WARNINGS) -o transformer_minimal_asan transformer.c $(LDLIBS)
	$(CC) $(SANITIZE) $(WARNINGS) -o transformer_asan lab/lab.c $(LDLIBS)
	$(CC) $(SANITIZE) $(WARNINGS) -DTRANSFORMER_DOUBLE -o test_transformer_asan_f64 test_transformer.c $(LDLIBS)
	$(CC) $(SANITIZE) $(WARNINGS) -DTRANSFORMER_DOUBLE -o test_lab_asan_f64 lab/test_lab.c $(LDLIBS)
	$(CC) $(SANITIZE) $(WARNINGS) -o test_lab_asan lab/test_lab.c $(LDLIBS)
	$(CC) $(SANITIZE) $(WARNINGS) -o test_cuda_asan cuda/test_cuda.c $(LDLIBS)
	TRANSFORMER_BIN=./transformer_minimal_asan ./test_transformer_asan_f64
	TRANSFORMER_BIN=./transformer_asan TRANSFORMER_MINIMAL_BIN=./transformer_minimal_asan ./test_lab_asan_f64
	TRANSFORMER_BIN=./transformer_asan TRANSFORMER_MINIMAL_BIN=./transformer_minimal_asan ./test_lab_asan
	./test_cuda_asan

# ---- fuzzing (dev/fuzz/) ----
# Each target (dev/fuzz/fuzz_TARGET.c) includes the program and feeds the
# fuzzer's bytes to one parser; dev/fuzz/run.sh makes the seeds, runs each for
# FUZZ_SECONDS and prints a summary; an input that fails is kept as
# runs/fuzz/TARGET/crash-* (and make fuzz fails). clang 14's libFuzzer may need
# apt-get install libclang-rt-14-dev.
FUZZ_TARGETS = checkpoint tsv_bpe bpe_apply bleu training_log reference catalogs
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined,float-cast-overflow \
             -fno-sanitize-recover=all
fuzz: transformer $(FUZZ_TARGETS:%=runs/fuzz/fuzz_%)
	FUZZ_SECONDS=$(FUZZ_SECONDS) dev/fuzz/run.sh $(FUZZ_TARGETS)
runs/fuzz/fuzz_%: dev/fuzz/fuzz_%.c dev/fuzz/fuzz.h test_transformer.c $(SOURCES) $(COMPANION)
	@mkdir -p runs/fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) $(WARNINGS) -I. -o $@ $< $(LDLIBS)

# dev/.venv: PyTorch 2.x from PyPI for make bench (dev/BENCH.md). PyPI's x86_64 Linux
# wheel is built with CUDA and cannot be imported without the nvidia-* libraries it
# links, so this is the default install, several GB; the CPU-only wheels are not on
# PyPI. Its CPU side (MKL, oneDNN) is what the benchmark uses. BENCH_PYTHON makes the
# environment, BENCH_TORCH is what pip installs (with NumPy, which torch.compile warns without).
BENCH_VENV = dev/.venv
BENCH_PYTHON ?= python3
BENCH_TORCH ?= torch==2.15.0
bench-setup:
	@if $(BENCH_VENV)/bin/python -c "import torch" 2>/dev/null; then \
	  echo "bench-setup: $(BENCH_VENV) already has PyTorch $$($(BENCH_VENV)/bin/python -c 'import torch; print(torch.__version__)'); nothing to do"; \
	else \
	  set -e; start=$$(date +%s); \
	  echo "bench-setup: creating the virtual environment $(BENCH_VENV) with $$($(BENCH_PYTHON) --version)"; \
	  $(BENCH_PYTHON) -m venv $(BENCH_VENV); \
	  echo "bench-setup: pip install $(BENCH_TORCH) into $(BENCH_VENV) (PyPI's wheel with its CUDA libraries: several GB)"; \
	  $(BENCH_VENV)/bin/python -m pip install --no-cache-dir --upgrade pip; \
	  $(BENCH_VENV)/bin/python -m pip install --no-cache-dir "$(BENCH_TORCH)" numpy; \
	  echo "bench-setup: checking that PyTorch imports and that torch.compile runs on the CPU (compiles a small function)"; \
	  $(BENCH_VENV)/bin/python dev/bench_pytorch.py --check-setup; \
	  echo "bench-setup: done in $$(( $$(date +%s) - start )) s; $(BENCH_VENV) takes $$(du -sh $(BENCH_VENV) | cut -f1)"; \
	fi

# transformer.c and PyTorch (dev/bench_pytorch.py) alternately, the same model
# and batch, then tables with the ratios PyTorch time / transformer.c time:
# PyTorch 2.x from $(BENCH_VENV) (make bench-setup), eager and torch.compile, and
# Debian's PyTorch 1.13 (/usr/bin/python3 with python3-torch) when it is installed.
BENCH_CONFIGS ?= tiny,toy,base
BENCH_DECODE ?= tiny,toy,base
BENCH_ROUNDS ?= 3
BENCH_THREADS ?= 2
BENCH_COMPILE ?= 1
bench: transformer
	/usr/bin/python3 dev/bench_compare.py --binary ./transformer --configs $(BENCH_CONFIGS) \
	    --decode-configs "$(BENCH_DECODE)" --rounds $(BENCH_ROUNDS) --threads $(BENCH_THREADS) \
	    --python $(BENCH_VENV)/bin/python --cc $(CC) $(if $(filter 0,$(BENCH_COMPILE)),--no-compile)

# ---- CTranslate2 (README, "Serve it"; dev/PERFORMANCE.md, "Decoding against CTranslate2") ----
# make ctranslate2-setup: dev/.venv-ct2, CTranslate2 4.8.5 (pinned) and NumPy from PyPI (no PyTorch;
# does nothing when it imports). make ctranslate2-check: dev/export_ctranslate2.py writes the
# make translate model as a CTranslate2 directory ($(TRANSLATE_DIR)/ctranslate2) and compares
# CTranslate2's greedy fp32 outputs of the test sentences with ./transformer decode's, token for
# token (exit 1 unless all are equal). make bench-decode: dev/bench_decode.py, ours against
# CTranslate2 fp32 and int8, greedy and beam 4, 1 and 2 threads, the make translate model and
# base-size random weights (BENCH_DECODE_FLAGS: e.g. --runs 3 --skip-base). Not part of make test.
.PHONY: ctranslate2-setup ctranslate2-check bench-decode
CT2_VENV = dev/.venv-ct2
CT2_PIN ?= ctranslate2==4.8.5
BENCH_DECODE_FLAGS ?=
ctranslate2-setup:
	@if $(CT2_VENV)/bin/python -c "import ctranslate2, numpy" 2>/dev/null; then \
	  echo "ctranslate2-setup: $(CT2_VENV) has CTranslate2 $$($(CT2_VENV)/bin/python -c 'import ctranslate2; print(ctranslate2.__version__)'); nothing to do"; \
	else \
	  set -e; \
	  $(BENCH_PYTHON) -m venv $(CT2_VENV); \
	  $(CT2_VENV)/bin/python -m pip install --no-cache-dir "$(CT2_PIN)" numpy; \
	fi
ctranslate2-check: transformer ctranslate2-setup
	$(CT2_VENV)/bin/python dev/export_ctranslate2.py $(TRANSLATE_DIR)/average.ckpt --out $(TRANSLATE_DIR)/ctranslate2 \
	    --check $(TRANSLATE_DIR)/test.source
bench-decode: transformer ctranslate2-setup
	/usr/bin/python3 dev/bench_decode.py --binary ./transformer --ct2-python $(CT2_VENV)/bin/python \
	    --checkpoint $(TRANSLATE_DIR)/average.ckpt --source $(TRANSLATE_DIR)/test.source $(BENCH_DECODE_FLAGS)

# make dev-check (not part of make test; no network): each script in dev/ on its smallest case, as
# its docstring runs it (dev/check.sh: seconds each, a line per script; about 3 minutes on 2 busy
# cores); a script whose Python is not installed (PyTorch 2.x in $(BENCH_VENV), Debian's
# python3-torch at /usr/bin/python3) is skipped with a line saying so. Fails if any script fails.
.PHONY: dev-check
dev-check: transformer test_transformer test_transformer_f64
	DEV_VENV=$(BENCH_VENV) dev/check.sh

clean:
	rm -f transformer transformer_minimal transformer_debug transformer_asan transformer_minimal_asan test_transformer \
	      test_transformer_f64 test_transformer_serial test_transformer_debug test_transformer_asan_f64 \
	      test_lab_asan test_lab_asan_f64 test_cuda_asan .test_output.log \
	      transformer_cuda transformer_cuda_cpu test_transformer_cuda test_cuda test_cuda_serial test_lab test_lab_f64 test_lab_serial *.o .ptxas.log
