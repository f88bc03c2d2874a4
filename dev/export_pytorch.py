#!/usr/bin/env python3
"""Carry a transformer.c checkpoint to PyTorch, and prove both compute the same.

    /usr/bin/python3 dev/export_pytorch.py runs/demo.ckpt --out runs/demo.pt

1. Reads the checkpoint (format: dev/FORMATS.md, "Checkpoint format, version 4"), checking its
   magic, version, sizes and FNV-1a checksum. Version 4 is the model part that transformer.c
   writes and reads (header, vocabulary, parameters, checksum); the run part that make's
   ./transformer writes after it (Adam's moments, the merges, the run's flags) is not needed
   here: its flags and Adam step are taken when it checks out (pytorch_translate.py reads
   them), and it is otherwise left be, as transformer.c leaves it. Versions 1, 2 and 3
   (one header for model and run; ./transformer wrote version 3 until 2026-12-06 and still
   reads it) are read here too.
2. Loads the weights into the same PyTorch model dev/make_reference.py builds
   (nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, post-norm, shared
   embedding x sqrt(d_model), sinusoids or the learned position table (Table 3,
   row E; in the state_dict as position_embedding), tied output projection)
   and saves {"config", "vocabulary", "state_dict"} with torch.save to --out.
3. Makes a padded batch of sentences from the checkpoint's own vocabulary,
   computes PyTorch's logits, loss and every gradient for it, and writes them
   as a reference file (dev/FORMATS.md, "Reference files": format version 1, float32, 0 Adam
   steps, the checkpoint's kind of positions) to --reference.
4. Runs `./test_transformer --reference FILE`, which loads the same weights
   into transformer.c and compares logits, loss and every gradient with
   the stated tolerances; the script's exit status is that comparison's.

Use Debian's python3-torch with /usr/bin/python3.
"""
import argparse
import os
import struct
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference as ref  # noqa: E402  (the model and the reference-file writer)

MAGIC = b"TCKP"
RUN_MAGIC = b"TRUN"
VERSIONS = (1, 2, 3, 4)   # 2 adds the merges of byte-pair encoding, 3 the kind of positions, 4 splits the
                          # file into transformer.c's model part and the lab's run part (dev/FORMATS.md)
HEADER_BYTES = {1: 120, 2: 128, 3: 136, 4: 72}   # version 4: the model part's header
MODEL_HEADER = struct.Struct("<4s3I7i3f2Q")       # version 4: CheckpointHeader, 72 bytes
RUN_HEADER = struct.Struct("<4sI10Q")             # version 4: RunHeader, 88 bytes
assert MODEL_HEADER.size == HEADER_BYTES[4] and RUN_HEADER.size == 88
POSITIONAL_NAMES = {0: "sinusoid", 1: "learned"}
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a(data):
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def fail(path, reason):
    sys.exit(f"error: {path}: {reason}")


def parse_checkpoint(data, path):
    """The checkpoint's bytes, checked: a dict of its config, vocabulary (words), options text,
    parameter count P, real_bytes, params_offset (where the parameters start) and checksum_at
    (where the checksum over every byte before it lies: the model part's, in version 4)."""
    if len(data) < 8 + 8:
        fail(path, f"truncated: {len(data)} bytes; expected a checkpoint")
    if data[:4] != MAGIC:
        fail(path, f"not a transformer.c checkpoint: it starts with {data[:4]!r}, expected b'TCKP'")
    (version,) = struct.unpack_from("<I", data, 4)
    if version not in VERSIONS:
        fail(path, f"version {version}, expected 1, 2, 3 or 4")
    header_bytes = HEADER_BYTES[version]
    if len(data) < header_bytes + 8:
        fail(path, f"truncated: {len(data)} bytes, shorter than the {header_bytes}-byte header")
    return (parse_v4 if version == 4 else parse_v1_to_v3)(data, path, version)


def config_dict(L, C, F_, H, V, max_len, positional, dropout, label_smoothing, ln_eps, subwords, adam_step):
    return dict(n_layers=L, d_model=C, d_ff=F_, n_heads=H, vocab_size=V, max_len=max_len,
                positional=POSITIONAL_NAMES[positional], dropout=dropout, label_smoothing=label_smoothing,
                layer_norm_eps=ln_eps, subwords=bool(subwords), adam_step=adam_step)


def parse_v4(data, path, version):
    """Version 4: the model part (transformer.c: CheckpointHeader, the vocabulary as lines, the
    parameters, the checksum), then, where make's ./transformer wrote one, the run part."""
    (_magic, _version, real_bytes, subwords, L, C, F_, H, V, max_len, positional, dropout, label_smoothing,
     ln_eps, vocab_bytes, model_bytes) = MODEL_HEADER.unpack_from(data, 0)
    if real_bytes not in (4, 8) or subwords not in (0, 1):
        fail(path, f"header: {real_bytes}-byte numbers, subwords {subwords}; expected 4 or 8, and 0 or 1")
    if positional not in POSITIONAL_NAMES or min(L, C, F_, H, V, max_len) < 1 or C % H:
        fail(path, f"header: a config this script does not take: {L} layers, d_model {C}, d_ff {F_}, "
                   f"{H} heads, vocabulary {V}, max_len {max_len}, positional {positional}")
    P = ref.n_params(L, C, F_, V, max_len if positional == 1 else 0)
    expected = HEADER_BYTES[4] + vocab_bytes + P * real_bytes + 8
    if model_bytes != expected:
        fail(path, f"header: a model of {model_bytes} bytes, but its sizes give {expected}")
    if len(data) < model_bytes:
        fail(path, f"truncated: {len(data)} bytes, but its header describes {model_bytes}")
    (stored_sum,) = struct.unpack_from("<Q", data, model_bytes - 8)
    if fnv1a(data[:model_bytes - 8]) != stored_sum:
        fail(path, "checksum mismatch: the file is damaged")
    text = data[HEADER_BYTES[4]:HEADER_BYTES[4] + vocab_bytes]
    if not text.endswith(b"\n"):
        fail(path, f"the vocabulary's {vocab_bytes} bytes do not end a token (a line end)")
    words = text[:-1].decode("utf-8").split("\n")
    if len(words) != V or "" in words:
        fail(path, f"the vocabulary's {vocab_bytes} bytes hold {len(words)} lines, "
                   f"{words.count('')} of them empty; expected {V} tokens")
    options, adam_step = "", None
    if len(data) > model_bytes:
        run = parse_run(data, model_bytes, P, subwords)
        if run is None:
            print(f"warning: {path}: the {len(data) - model_bytes} bytes after the model are not a run part "
                  f"that checks out; the model is read, its run left be", file=sys.stderr)
        else:
            options, adam_step = run
    config = config_dict(L, C, F_, H, V, max_len, positional, dropout, label_smoothing, ln_eps, subwords,
                         adam_step)
    return dict(config=config, words=words, options=options, P=P, real_bytes=real_bytes,
                params_offset=HEADER_BYTES[4] + vocab_bytes, checksum_at=model_bytes - 8)


def parse_run(data, start, P, subwords):
    """The run part after the model, from start to the file's end: (options text, Adam step), or None
    where its magic, version, sizes (adding up to the file's end), merges (there exactly with subwords)
    or checksum disagree."""
    left = len(data) - start
    if left < RUN_HEADER.size + 8:
        return None
    (magic, version, real_bytes, adam_step, _dropout_rng, _epoch_rng, _epoch, _epoch_batches, _data_hash,
     options_bytes, merges_bytes, run_bytes) = RUN_HEADER.unpack_from(data, start)
    if magic != RUN_MAGIC or version != 1 or real_bytes not in (4, 8):
        return None
    if run_bytes != left or RUN_HEADER.size + options_bytes + merges_bytes + 2 * P * real_bytes + 8 != left:
        return None
    if (merges_bytes > 0) != bool(subwords):
        return None
    (stored_sum,) = struct.unpack_from("<Q", data, len(data) - 8)
    if fnv1a(data[start:-8]) != stored_sum:
        return None
    at = start + RUN_HEADER.size
    return data[at:at + options_bytes].decode("utf-8", "replace"), adam_step


def parse_v1_to_v3(data, path, version):
    """Versions 1 to 3: one header for the model and the run, the run's options, the vocabulary (a u32
    length and the bytes of each token), the merges (2 and 3), the parameters, Adam's m and v, and one
    checksum of every byte before it."""
    header_bytes = HEADER_BYTES[version]
    (real_bytes,) = struct.unpack_from("<I", data, 8)
    if real_bytes not in (4, 8):
        fail(path, f"{real_bytes} bytes per number, expected 4 or 8")
    L, C, F_, H, V, max_len = struct.unpack_from("<6I", data, 12)
    dropout, label_smoothing, ln_eps = struct.unpack_from("<3f", data, 36)
    (num_params, adam_step, _dropout_rng, _epoch_rng, _epoch, _epoch_batches, _data_hash,
     vocab_bytes, options_bytes) = struct.unpack_from("<9Q", data, 48)
    (merges_bytes,) = struct.unpack_from("<Q", data, 120) if version >= 2 else (0,)
    (positional,) = struct.unpack_from("<Q", data, 128) if version >= 3 else (0,)
    if positional not in POSITIONAL_NAMES:
        fail(path, f"header: positional kind {positional}, expected 0 (sinusoid) or 1 (learned)")
    P = ref.n_params(L, C, F_, V, max_len if positional == 1 else 0)
    if num_params != P:
        fail(path, f"header says {num_params} parameters, but its sizes give {P}")
    expected = header_bytes + options_bytes + vocab_bytes + merges_bytes + 3 * P * real_bytes + 8
    if len(data) != expected:
        fail(path, f"{len(data)} bytes, but its header implies {expected}")
    (stored_sum,) = struct.unpack_from("<Q", data, len(data) - 8)
    if fnv1a(data[:-8]) != stored_sum:
        fail(path, "checksum mismatch: the file is damaged")
    pos = header_bytes
    options = data[pos:pos + options_bytes].decode("utf-8", "replace")
    pos += options_bytes
    words = []
    end = pos + vocab_bytes
    while pos < end:
        (n,) = struct.unpack_from("<I", data, pos)
        words.append(data[pos + 4:pos + 4 + n].decode("utf-8"))
        pos += 4 + n
    if len(words) != V:
        fail(path, f"{len(words)} vocabulary words, expected {V}")
    pos += merges_bytes  # the merges (subwords): the tokens are the vocabulary's either way
    config = config_dict(L, C, F_, H, V, max_len, positional, dropout, label_smoothing, ln_eps,
                         merges_bytes > 0, adam_step)
    return dict(config=config, words=words, options=options, P=P, real_bytes=real_bytes,
                params_offset=pos, checksum_at=len(data) - 8)


def read_checkpoint(path):
    """(config, vocabulary, the parameters as a float32 tensor, the run's options text) of the
    checkpoint at path, any version; config["adam_step"] is None where it holds no run."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(path, f"cannot open: {e.strerror}")
    c = parse_checkpoint(data, path)
    import numpy as np
    dtype = "<f4" if c["real_bytes"] == 4 else "<f8"
    params = np.frombuffer(data, dtype=dtype, count=c["P"], offset=c["params_offset"]).astype(np.float32)
    if not np.isfinite(params).all():
        fail(path, "a parameter is not finite")
    c["config"]["checkpoint_version"] = struct.unpack_from("<I", data, 4)[0]
    return c["config"], c["words"], torch.from_numpy(params.copy()), c["options"]


def load_into_pytorch(config, params):
    c = config
    model = ref.RefModel(c["n_layers"], c["d_model"], c["d_ff"], c["n_heads"], c["vocab_size"],
                         c["max_len"], c["layer_norm_eps"], learned=c["positional"] == "learned")
    offset = 0
    with torch.no_grad():
        for group in model.ordered_params():       # tensor-major, layer 0 first
            for p in group:
                n = p.numel()
                p.copy_(params[offset:offset + n].view_as(p))
                offset += n
    assert offset == params.numel()
    model.train()   # dropout is 0 in these layers; train() keeps PyTorch off its fast path
    return model


def write_reference(path, model, config, batch, label_smoothing):
    src, src_len, tgt_in, tgt_out, tgt_len = batch
    B, S = src.shape
    T = tgt_in.shape[1]
    c = config
    # format version 1: computed and stored in float32, as the checkpoint's
    # weights are (no Adam steps, so the parameters appear twice)
    header = ref.MAGIC + struct.pack(
        "<13i4f", 1, c["n_layers"], c["d_model"], c["d_ff"], c["n_heads"],
        c["vocab_size"], c["max_len"], B, S, T, 0, 1, ref.POSITIONAL[c["positional"]], label_smoothing, c["layer_norm_eps"], 1.0, 0.0)
    model.zero_grad(set_to_none=False)
    logits = model(src, src_len, tgt_in, tgt_len)
    loss = ref.loss_fn(logits, tgt_out, label_smoothing)
    loss.backward()
    params = ref.params_bytes(model)
    chunks = [header, ref.i32(src), ref.i32(src_len), ref.i32(tgt_in), ref.i32(tgt_out), ref.i32(tgt_len),
              params, ref.flat_f32([logits]), ref.flat_f32([loss]), ref.grads_bytes(model), params]
    with open(path, "wb") as f:
        f.write(b"".join(chunks))
    return float(loss.detach())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--out", help="torch.save file (default: CHECKPOINT with .pt)")
    ap.add_argument("--reference", help="reference file to write (default: CHECKPOINT with .ref)")
    ap.add_argument("--batch", type=int, default=4, help="sentences in the comparison batch")
    ap.add_argument("--length", type=int, default=10, help="longest sentence of the batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-binary", default="./test_transformer",
                    help="transformer.c's test program, which compares the reference file")
    a = ap.parse_args()
    torch.set_num_threads(1)
    base = os.path.splitext(a.checkpoint)[0]
    out = a.out or base + ".pt"
    reference = a.reference or base + ".ref"

    config, words, params, options = read_checkpoint(a.checkpoint)
    model = load_into_pytorch(config, params)
    torch.save({"config": config, "vocabulary": words, "state_dict": model.state_dict(),
                "transformer_c_options": options}, out)
    run = "no run part" if config["adam_step"] is None else f"Adam step {config['adam_step']}"
    print(f"wrote {out}: {config['n_layers']} layers, d_model {config['d_model']}, "
          f"{config['n_heads']} heads, {config['positional']} positions, vocabulary {config['vocab_size']}"
          f"{' (subwords)' if config['subwords'] else ''}, {params.numel()} parameters "
          f"(checkpoint version {config['checkpoint_version']}, {run})")

    length = max(2, min(a.length, config["max_len"]))
    gen = torch.Generator().manual_seed(a.seed)
    batch = ref.make_batch(gen, max(2, a.batch), length, length, config["vocab_size"])
    loss = write_reference(reference, model, config, batch, config["label_smoothing"])
    print(f"wrote {reference}: PyTorch's logits, loss {loss:.6f} and gradients for "
          f"{max(2, a.batch)} sentences of up to {length} tokens")
    if not os.path.exists(a.test_binary):
        print(f"{a.test_binary} not found: run `make test_transformer`, then "
              f"`{a.test_binary} --reference {reference}`")
        return 1
    result = subprocess.run([a.test_binary, "--reference", reference])
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
