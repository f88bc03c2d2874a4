#!/usr/bin/python3
"""PyTorch's nn.Transformer trained as `make translate` trains ours: the same run, side by side.

    /usr/bin/python3 dev/pytorch_translate.py --dir runs/translate/de --steps 2200 [--threads 2]

Issue 48, item 4: the same model learns real text in PyTorch as in transformer.c.
Everything PyTorch needs is read from our run, so that only the implementation differs:

1. The initial weights and the §5.1 subwords: `./transformer train` with the run's flags
   for one step at a learning rate of 1e-30 writes DIR/pytorch_init.ckpt, whose weights
   are our run's initial weights to rounding (the seed draws them before any step) and
   whose vocabulary is the run's (the merges are learned from the same file).
2. The batches: our run writes every step's batch with --batch-log (int32 step, B, S, T,
   src, src_len, tgt_in, tgt_out, tgt_len; lab/runs.c); the script trains on exactly
   those, in that order, and reads our per-step losses from --loss-log.
3. The model is dev/make_reference.py's RefModel (nn.TransformerEncoderLayer /
   DecoderLayer, post-norm, ReLU, the shared embedding x sqrt(d_model), sinusoids, the
   tied output projection) with dropout P_drop on every sub-layer's output and on the
   embedded sums (§5.4) and none inside the FFN (PyTorch's layers drop after the ReLU too;
   the paper and transformer.c do not: --ffn-dropout sets it), label-smoothed cross entropy (F.cross_entropy's label_smoothing, <pad>
   ignored: the loss the reference files pin), Adam (0.9, 0.98, 1e-9) and eq. 3 scaled
   to peak at --lr at step --warmup, as train's --lr says. Dropout draws its own masks.
4. It compares the training loss, the mean of the 50 steps up to 500, 1000, 2000 and the
   last (one step's loss is noisy with dropout), and writes PyTorch's final weights into
   a copy of our final checkpoint (DIR/pytorch.ckpt, its model part's FNV-1a checksum redone), so that
   ./transformer decodes both with the same beam search and bleu scores both: test BLEU,
   13a, greedy and beam 4, each model's last step; then, as make translate measures, beam 4
   over the average of the steps our run kept (PyTorch's weights at those steps are written
   into copies of our checkpoints of those steps, DIR/pytorch.ckpt.stepN, and averaged by
   ./transformer average).

Our run must have been made with --batch-log DIR/batches.bin and --loss-log DIR/loss.txt
(make translate TRANSLATE_EXTRA='--batch-log runs/translate/de/batches.bin --loss-log
runs/translate/de/loss.txt'). Use Debian's python3-torch with /usr/bin/python3, and install
libopenblas0-pthread first: Debian's PyTorch calls the system's libblas.so.3, which without it is
the reference BLAS (a step of make translate's model took 7.5 s of CPU there, 0.65 s with
OpenBLAS, against transformer.c's 0.27 s; dev/RESULTS.md).
"""
import argparse
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as ref   # noqa: E402  (the model)
import export_pytorch as export  # noqa: E402  (the checkpoint reader)

BIN = "./transformer"


def run(args, **kw):
    print("+ " + " ".join(args), flush=True)
    return subprocess.run(args, check=True, **kw)


def read_batches(path, steps):
    """The batches of --batch-log, step by step: (src, src_len, tgt_in, tgt_out, tgt_len) as int64 tensors."""
    data = np.fromfile(path, dtype=np.int32)
    out, pos = [], 0
    while pos < data.size and len(out) < steps:
        step, B, S, T = (int(x) for x in data[pos:pos + 4])
        pos += 4
        if step != len(out) + 1:
            sys.exit(f"error: {path}: step {step} where step {len(out) + 1} was expected")
        parts = []
        for count, shape in ((B * S, (B, S)), (B, (B,)), (B * T, (B, T)), (B * T, (B, T)), (B, (B,))):
            parts.append(torch.from_numpy(data[pos:pos + count].astype(np.int64)).view(shape))
            pos += count
        out.append(tuple(parts))
    if len(out) < steps:
        sys.exit(f"error: {path} holds {len(out)} steps; --steps is {steps}")
    return out


def read_losses(path):
    """--loss-log's lines "step loss lr": the losses and the learning rates by step."""
    losses, rates = {}, {}
    with open(path) as f:
        for line in f:
            step, loss, lr = line.split()
            losses[int(step)] = float(loss)
            rates[int(step)] = float(lr)
    return losses, rates


def flag_value(options, name):
    """A flag's value in the run's options text ("--lr 0.002 --warmup 500 ...")."""
    words = options.split()
    for i, word in enumerate(words[:-1]):
        if word == name:
            return words[i + 1]
    return None


class Trainee(ref.RefModel):
    """RefModel with dropout: P_drop on each sub-layer's output before the residual sum and on the
    embedded sums, where §5.4 puts it. PyTorch's layers also drop inside the FFN, after the ReLU
    (`layer.dropout`); §5.4 and transformer.c do not, so that one gets ffn_drop (0 unless asked)."""

    def __init__(self, config, p_drop, ffn_drop):
        c = config
        super().__init__(c["n_layers"], c["d_model"], c["d_ff"], c["n_heads"], c["vocab_size"], c["max_len"],
                         c["layer_norm_eps"])
        self.p_drop = p_drop
        for layer in list(self.enc) + list(self.dec):
            for module in layer.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = p_drop
            layer.dropout.p = ffn_drop   # the FFN's internal one: linear2(dropout(relu(linear1(x))))

    def embed(self, tokens):
        return F.dropout(super().embed(tokens), self.p_drop, self.training)


def load_weights(model, params):
    offset = 0
    with torch.no_grad():
        for group in model.ordered_params():
            for p in group:
                n = p.numel()
                p.copy_(params[offset:offset + n].view_as(p))
                offset += n
    assert offset == params.numel()


def write_checkpoint(template, out, model):
    """Our checkpoint `template` with its weights replaced by the model's and its checksum redone: in
    version 4 the model part's (its run part, Adam's moments with it, is left as it was), in version 3
    the file's."""
    data = bytearray(open(template, "rb").read())
    layout = export.parse_checkpoint(bytes(data), template)
    P, real_bytes, start, checksum_at = (layout[k] for k in ("P", "real_bytes", "params_offset", "checksum_at"))
    flat = torch.cat([p.detach().reshape(-1) for group in model.ordered_params() for p in group]).numpy()
    assert flat.size == P
    data[start:start + P * real_bytes] = flat.astype("<f4" if real_bytes == 4 else "<f8").tobytes()
    struct.pack_into("<Q", data, checksum_at, export.fnv1a(bytes(data[:checksum_at])))
    open(out, "wb").write(bytes(data))


def bleu(hyp, reference):
    printed = subprocess.run([BIN, "bleu", hyp, reference], check=True, capture_output=True, text=True).stdout
    return float(printed.split(" = ")[1].split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="runs/translate/de", help="make translate's folder")
    ap.add_argument("--steps", type=int, default=0, help="steps to train (0: all of our run's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=50, help="steps averaged for each loss compared")
    ap.add_argument("--ffn-dropout", type=float, default=0.0,
                    help="dropout after the FFN's ReLU (0: as the paper and transformer.c)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    d = a.dir
    ours = os.path.join(d, "model.ckpt")
    config, words, _params, options = export.read_checkpoint(ours)
    if config["adam_step"] is None:
        sys.exit(f"error: {ours}: it holds no run (its flags, Adam's step): expected a checkpoint of ./transformer train")
    steps = a.steps or config["adam_step"]
    p_drop = float(flag_value(options, "--dropout") or config["dropout"])
    lr = float(flag_value(options, "--lr"))
    warmup = int(flag_value(options, "--warmup"))
    factor = lr * math.sqrt(config["d_model"] * warmup)

    # 1. our initial weights, and the run's subwords
    init = os.path.join(d, "pytorch_init.ckpt")
    init_options = []
    for name in ("--train", "--valid", "--layers", "--d-model", "--d-ff", "--heads", "--dropout",
                 "--label-smoothing", "--warmup", "--batch-tokens", "--seed", "--bpe", "--positions", "--positional"):
        if flag_value(options, name) is not None:
            init_options += [name, flag_value(options, name)]
    init_options += ["--steps", "1", "--lr", "1e-30", "--checkpoint", init]
    run([BIN, "train"] + init_options + ["--eval-every", "0", "--eval-size", "1", "--show", "0", "--force",
                                         "--log-every", "0"],
        stdout=subprocess.DEVNULL)
    init_config, init_words, init_params, _ = export.read_checkpoint(init)
    if init_words != words:
        sys.exit(f"error: {init}: its vocabulary differs from {ours}'s")

    model = Trainee(config, p_drop, a.ffn_dropout)
    load_weights(model, init_params)
    model.train()
    adam = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    batches = read_batches(os.path.join(d, "batches.bin"), steps)
    losses_ours, rates_ours = read_losses(os.path.join(d, "loss.txt"))
    for step in sorted(rates_ours)[:: max(1, len(rates_ours) // 20)]:   # the same schedule as ours
        mine = ref.noam_lr(step, config["d_model"], warmup, factor)
        if abs(mine - rates_ours[step]) > 1e-3 * rates_ours[step] + 1e-12:
            sys.exit(f"error: the learning rate of step {step} is {mine:.6g} here and {rates_ours[step]:.6g} "
                     f"in our loss log: the schedules differ")
    losses = {}
    saved = []   # PyTorch's checkpoints at the steps our run kept
    for old in [f for f in os.listdir(d) if f.startswith("pytorch.ckpt.step")]:
        os.remove(os.path.join(d, old))
    start = time.time()
    for step in range(1, steps + 1):
        src, src_len, tgt_in, tgt_out, tgt_len = batches[step - 1]
        for group in adam.param_groups:
            group["lr"] = ref.noam_lr(step, config["d_model"], warmup, factor)
        logits = model(src, src_len, tgt_in, tgt_len)
        loss = ref.loss_fn(logits, tgt_out, config["label_smoothing"])
        adam.zero_grad()
        loss.backward()
        adam.step()
        losses[step] = loss.item()
        kept = f"{ours}.step{step:07d}"   # our run kept this step (--keep-last): PyTorch's beside it
        if os.path.exists(kept):
            write_checkpoint(kept, os.path.join(d, f"pytorch.ckpt.step{step:07d}"), model)
            saved.append(os.path.join(d, f"pytorch.ckpt.step{step:07d}"))
        if step in (500, 1000, 2000):   # said as it passes, so that a run cut short still tells
            window = range(step - a.window + 1, step + 1)
            print(f"  loss over steps {window[0]}..{step}: PyTorch {sum(losses[s] for s in window) / len(window):.4f}, "
                  f"ours {sum(losses_ours[s] for s in window) / len(window):.4f}", flush=True)
        if step % 100 == 0 or step == steps:
            elapsed = time.time() - start
            print(f"step {step:5d}/{steps} | PyTorch loss {losses[step]:.4f} | ours {losses_ours.get(step, float('nan')):.4f}"
                  f" | elapsed {elapsed / 60:.1f} min | left {elapsed / step * (steps - step) / 60:.1f} min", flush=True)

    # 4. the losses, and BLEU of both models decoded by ./transformer
    print(f"training loss, the mean of {a.window} steps up to each (PyTorch / ours):")
    worst = 0.0
    for at in sorted({s for s in (500, 1000, 2000, steps) if s <= steps}):
        window = range(max(1, at - a.window + 1), at + 1)
        mine = sum(losses[s] for s in window) / len(window)
        theirs = sum(losses_ours[s] for s in window) / len(window)
        difference = abs(mine - theirs) / theirs * 100
        worst = max(worst, difference)
        print(f"  step {at:5d}: {mine:.4f} / {theirs:.4f}  ({difference:.1f}% apart)")
    peer = os.path.join(d, "pytorch.ckpt")
    write_checkpoint(ours if steps == config["adam_step"] else init, peer, model)
    if steps != config["adam_step"]:   # our model of the same step, where the run kept one
        ours = f"{ours}.step{steps:07d}"
        if not os.path.exists(ours):
            print(f"BLEU not compared: our run kept no checkpoint of step {steps} ({ours}); PyTorch's is {peer}")
            return
    source, reference = os.path.join(d, "test.source"), os.path.join(d, "test.reference")
    scores = {}
    for name, checkpoint in (("PyTorch", peer), ("ours", ours)):
        for beam in (1, 4):
            out = os.path.join(d, f"test.{name}.beam{beam}")
            with open(source) as fin, open(out, "w") as fout:
                run([BIN, "decode", "--checkpoint", checkpoint, "--beam", str(beam), "--threads", str(a.threads)],
                    stdin=fin, stdout=fout)
            scores[name, beam] = bleu(out, reference)
    for beam in (1, 4):
        print(f"test BLEU (13a), beam {beam}, the last step: PyTorch {scores['PyTorch', beam]:.2f}, "
              f"ours {scores['ours', beam]:.2f} ({abs(scores['PyTorch', beam] - scores['ours', beam]):.2f} apart)")
    # make translate's own measure: beam 4 over the average of the checkpoints our run kept (§6.1),
    # each side's average of the same steps
    ours_kept = sorted(f for f in os.listdir(d) if f.startswith("model.ckpt.step"))
    if saved and len(saved) == len(ours_kept):
        averages = {"PyTorch": os.path.join(d, "pytorch_average.ckpt"), "ours": os.path.join(d, "ours_average.ckpt")}
        run([BIN, "average", "--out", averages["PyTorch"], "--force"] + sorted(saved), stdout=subprocess.DEVNULL)
        run([BIN, "average", "--out", averages["ours"], "--force"] + [os.path.join(d, f) for f in ours_kept],
            stdout=subprocess.DEVNULL)
        for name, checkpoint in averages.items():
            out = os.path.join(d, f"test.{name}.average.beam4")
            with open(source) as fin, open(out, "w") as fout:
                run([BIN, "decode", "--checkpoint", checkpoint, "--beam", "4", "--threads", str(a.threads)],
                    stdin=fin, stdout=fout)
            scores[name, "average"] = bleu(out, reference)
        apart = abs(scores["PyTorch", "average"] - scores["ours", "average"])
        print(f"test BLEU (13a), beam 4 over the average of steps {ours_kept[0][-7:].lstrip('0')}.."
              f"{ours_kept[-1][-7:].lstrip('0')} (make translate's measure): PyTorch "
              f"{scores['PyTorch', 'average']:.2f}, ours {scores['ours', 'average']:.2f} ({apart:.2f} apart)")
        print(f"largest loss difference {worst:.1f}% (issue 48: within 3%); BLEU within 1.5 on make translate's "
              f"measure: {'yes' if apart <= 1.5 else 'no'}")
    else:
        print(f"largest loss difference {worst:.1f}% (issue 48: within 3%); no averages compared (PyTorch saved "
              f"{len(saved)} of our {len(ours_kept)} kept steps)")


if __name__ == "__main__":
    main()
