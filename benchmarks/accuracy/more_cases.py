"""Real cases from more third-party sources: karpathy/nanoGPT, karpathy/makemore, karpathy/minGPT (its adder
project), yunjey/pytorch-tutorial, MorvanZhou/PyTorch-Tutorial and Lightning-AI/pytorch-lightning (its GAN
example), each run unchanged (expected silent) and with one-line bugs PyTorch users make.

As everywhere in the corpus, the expected answer (finding kinds, the line to cite) is decided from the bug before
graphwatch runs: the reasoning is in a comment at each case.  README.md says how a corpus gets each repository at
its commit.

Each source's setup writes the data the script reads (nothing can be downloaded) and shortens the run by
replacing whole lines (hyper-parameters, the number of steps, a data set that would be downloaded, a print where
the script prints no loss or prints a number that is a timing), in the bug, its fixed twin and graphwatch's fix
alike, so that ``own_fix.py`` compares losses.  ``run.py`` uses ``MORE`` (with the other real cases) and
``MORE_SETUPS`` (with its setups).
"""

from __future__ import annotations

import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path

from cases import Case, Source

# ------------------------------------------------------------------ sources
NANOGPT = Source("karpathy/nanoGPT", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291", ".", "train.py")
MAKEMORE = Source("karpathy/makemore", "988aa59e4d8fefa526d06f3b453ad116258398d4", ".", "makemore.py")
# minGPT's adder project: its training loop is the library's (mingpt/trainer.py), the script's part a callback
ADDER = Source("karpathy/minGPT", "37baab71b9abea1b76ab957409a1cc2fbfba8a26", ".", "projects/adder/adder.py")
YUNJEY = "yunjey/pytorch-tutorial"
YUNJEY_AT = "0500d3df5a2a8080ccfccbc00aca0eacc21818db"
LANGUAGE_MODEL = Source(YUNJEY, YUNJEY_AT, "tutorials/02-intermediate/language_model", "main.py")
YUNJEY_GAN = Source(YUNJEY, YUNJEY_AT, "tutorials/03-advanced/generative_adversarial_network", "main.py")
YUNJEY_VAE = Source(YUNJEY, YUNJEY_AT, "tutorials/03-advanced/variational_autoencoder", "main.py")
LIGHTNING_GAN = Source("Lightning-AI/pytorch-lightning", "7f0c3436cd3f6ad3753125672024fc415cbcb414",
                       "examples/pytorch/domain_templates", "generative_adversarial_net.py")
MORVAN = "MorvanZhou/PyTorch-Tutorial"
MORVAN_AT = "dbe154a9e56635e51c6b0c2ccea8ae36cfb585a7"
RNN_REGRESSOR = Source(MORVAN, MORVAN_AT, "tutorial-contents", "403_RNN_regressor.py")
MORVAN_GAN = Source(MORVAN, MORVAN_AT, "tutorial-contents", "406_GAN.py")

# (line, its replacement): whole lines of each script, replaced in every program of its cases
SHORTER: dict[str, tuple[tuple[str, str], ...]] = {
    # nanoGPT's log line prints the model's flops utilisation, a timing under another name
    "nanogpt": (
        ('        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")',
         '        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms")'),
    ),
    # torch.utils.tensorboard needs the tensorboard package (not installed): a writer that writes nothing
    "makemore": (
        ("from torch.utils.tensorboard import SummaryWriter",
         "SummaryWriter = type('SummaryWriter', (), {'__init__': lambda self, *a, **k: None, "
         "'add_scalar': lambda self, *a, **k: None, 'flush': lambda self: None})"),
    ),
    "language-model": (
        ("embed_size = 128", "embed_size = 16"),
        ("hidden_size = 1024", "hidden_size = 32"),
        ("num_epochs = 5", "num_epochs = 1"),
        ("num_samples = 1000     # number of words to be sampled", "num_samples = 100"),
        ("seq_length = 30", "seq_length = 10"),
        ("        if step % 100 == 0:", "        if step % 5 == 0:"),
    ),
    "yunjey-gan": (
        ("num_epochs = 200", "num_epochs = 1"),
        ("        if (i+1) % 200 == 0:", "        if (i+1) % 2 == 0:"),
    ),
    "yunjey-vae": (
        ("num_epochs = 15", "num_epochs = 1"),
        ("        if (i+1) % 10 == 0:", "        if (i+1) % 2 == 0:"),
    ),
    # MorvanZhou's scripts plot instead of printing: the plotting call prints the loss (and does not pause)
    "rnn-regressor": (
        ("for step in range(100):", "for step in range(30):"),
        ("    plt.draw(); plt.pause(0.05)", '    print(step, f"{loss.item():.6f}")'),
    ),
    "morvan-gan": (
        ("for step in range(10000):", "for step in range(200):"),
        ("        plt.cla()", '        print(step, f"{G_loss.item():.6f}", f"{D_loss.item():.6f}")'),
        ("        plt.ylim((0, 3));plt.legend(loc='upper right', fontsize=10);plt.draw();plt.pause(0.01)",
         "        plt.close('all')"),
    ),
    # Lightning's GAN: MNIST (a download) replaced by seeded noise, a GPU trainer by a short CPU one without logger
    # or checkpoints, torchvision's grid by the images (torchvision is not installed); the step prints both losses
    "lightning-gan": (
        ('        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})',
         '        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}); '
         'print(f"g_loss {g_loss.item():.6f} d_loss {d_loss.item():.6f}")'),
        ("        grid = torchvision.utils.make_grid(sample_imgs)", "        grid = sample_imgs"),
        ("    dm = MNISTDataModule()",
         "    dm = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(320, 1, 28, 28), "
         "torch.zeros(320)), batch_size=32)"),
        ('    trainer = Trainer(accelerator="gpu", devices=1)',
         '    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, '
         "enable_progress_bar=False, enable_model_summary=False)"),
    ),
}
SCRIPTS = {"nanogpt": NANOGPT.script, "makemore": MAKEMORE.script, "language-model": LANGUAGE_MODEL.script,
           "yunjey-gan": YUNJEY_GAN.script, "yunjey-vae": YUNJEY_VAE.script, "rnn-regressor": RNN_REGRESSOR.script,
           "morvan-gan": MORVAN_GAN.script, "lightning-gan": LIGHTNING_GAN.script}

WORDS = [f"w{i}" for i in range(200)]


def _replace_lines(folder: Path, script: str, pairs: tuple[tuple[str, str], ...]) -> None:
    """Replace each pair's line, which must be in the script exactly once."""
    path = folder / script
    lines = path.read_text().splitlines(keepends=True)
    for old, new in pairs:
        found = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
        if len(found) != 1:
            raise SystemExit(f"{script}: the line to replace is there {len(found)} times, not once: {old!r}")
        lines[found[0]] = new + "\n"
    path.write_text("".join(lines))


def _char_dataset(folder: Path) -> None:
    """nanoGPT's ``data/<dataset>`` for ``--dataset=gw_chars``: a made-up text, char-level, as
    ``data/shakespeare_char/prepare.py`` writes (uint16 ids in ``train.bin`` and ``val.bin``, ``meta.pkl``)."""
    import numpy as np

    rng = random.Random(0)
    words = ("the", "cat", "sat", "on", "a", "mat", "and", "ran", "far", "away")
    text = "\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(400))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    data = folder / "data" / "gw_chars"
    data.mkdir(parents=True, exist_ok=True)
    split = int(len(ids) * 0.9)
    ids[:split].tofile(data / "train.bin")
    ids[split:].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def _ptb_like(folder: Path) -> None:
    """yunjey's language model reads ``data/train.txt`` (Penn Treebank, not in the repository's snapshot)."""
    rng = random.Random(0)
    (folder / "data").mkdir(exist_ok=True)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(300))
    (folder / "data" / "train.txt").write_text(text + "\n")


def _mingpt_beside(folder: Path) -> None:
    """The adder imports ``mingpt`` (installed with ``pip install -e .`` in the repository's instructions): a copy
    of the package beside the script, where the script's folder (its ``sys.path[0]``) finds it."""
    shutil.copytree(folder / "mingpt", folder / "projects" / "adder" / "mingpt")


def _setup(key: str, data: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        if data is not None:
            data(folder)
        _replace_lines(folder, SCRIPTS[key], SHORTER[key])

    return setup


MORE_SETUPS: dict[str, Callable[[Path], None]] = {
    "nanogpt": _setup("nanogpt", _char_dataset),
    "makemore": _setup("makemore"),
    "language-model": _setup("language-model", _ptb_like),
    "yunjey-gan": _setup("yunjey-gan"),
    "yunjey-vae": _setup("yunjey-vae"),
    "rnn-regressor": _setup("rnn-regressor"),
    "morvan-gan": _setup("morvan-gan"),
    "mingpt-adder": _mingpt_beside,
    "lightning-gan": _setup("lightning-gan"),
}

# ------------------------------------------------------------------ nanoGPT
# a one-layer GPT on CPU, 11 iterations of 2 micro-batches (gradient accumulation), evaluated at 0, 5 and 10
NANOGPT_ARGS = ("--dataset=gw_chars", "--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=1",
                "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=2",
                "--max_iters=10", "--eval_interval=5", "--eval_iters=2", "--warmup_iters=2", "--lr_decay_iters=10",
                "--out_dir=out")
NANOGPT_BACKWARD = "        scaler.scale(loss).backward()"
NANOGPT_LOSSF = "        lossf = loss.item() * gradient_accumulation_steps"
NANOGPT_CASES = [
    Case("nanoGPT (2 micro-batches a step)", NANOGPT, args=NANOGPT_ARGS, setup="nanogpt"),
    # The only zero_grad of the loop runs right after the step: without it every step adds its 2 micro-batches'
    # gradients onto all earlier steps' and scaler.step(optimizer) steps on them (the accumulation itself is meant).
    Case(
        "nanoGPT, optimizer.zero_grad() removed",
        NANOGPT, args=NANOGPT_ARGS, setup="nanogpt",
        mutation=(("    optimizer.zero_grad(set_to_none=True)", "    pass"),),
        expect=("missing-zero-grad",),
        cite="scaler.step(optimizer)",
    ),
    # retain_graph=True on the only backward of each micro-batch's graph: nothing backwards through it again
    Case(
        "nanoGPT, retain_graph=True on the backward",
        NANOGPT, args=NANOGPT_ARGS, setup="nanogpt",
        mutation=((NANOGPT_BACKWARD, "        scaler.scale(loss).backward(retain_graph=True)"),),
        expect=("retained-graph",),
        cite="scaler.scale(loss).backward(retain_graph=True)",
    ),
    # estimate_loss() without @torch.no_grad() and its losses kept as tensors: `losses[k] = loss` writes each
    # evaluation's graph into the tensor `losses`, whose mean the loop keeps in `best_val_loss` (and `losses`)
    # over the next eval_interval training steps. The bug's line is where the graph goes into the holder.
    Case(
        "nanoGPT, estimate_loss() without no_grad and its losses kept as tensors",
        NANOGPT, args=NANOGPT_ARGS, setup="nanogpt",
        mutation=(
            ("@torch.no_grad()", ""),
            ("            losses[k] = loss.item()", "            losses[k] = loss"),
        ),
        expect=("graph-kept-alive",),
        cite="losses[k] = loss",
    ),
    # lossf = loss * k (a tensor) holds the last micro-batch's graph, already freed by its backward, until the
    # next iteration rebinds it, as `loss` itself does: one graph, nothing grows. A correct program.
    Case(
        "nanoGPT, lossf kept as a tensor (the last loss only)",
        NANOGPT, args=NANOGPT_ARGS, setup="nanogpt",
        mutation=((NANOGPT_LOSSF, "        lossf = loss * gradient_accumulation_steps"),),
    ),
]

# ------------------------------------------------------------------ makemore
MAKEMORE_ARGS = ("--type", "transformer", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--n-embd2", "16",
                 "--batch-size", "8", "--max-steps", "40", "--num-workers", "0", "--work-dir", "out")
MAKEMORE_CASES = [
    Case("makemore (transformer)", MAKEMORE, args=MAKEMORE_ARGS, setup="makemore"),
    # model.zero_grad() is the loop's only reset: each optimizer.step() then adds onto every earlier step's gradients
    Case(
        "makemore, model.zero_grad() removed",
        MAKEMORE, args=MAKEMORE_ARGS, setup="makemore",
        mutation=(("        model.zero_grad(set_to_none=True)", ""),),
        expect=("missing-zero-grad",),
        cite="optimizer.step()",
    ),
    Case(
        "makemore, retain_graph=True on the backward",
        MAKEMORE, args=MAKEMORE_ARGS, setup="makemore",
        mutation=(("        loss.backward()", "        loss.backward(retain_graph=True)"),),
        expect=("retained-graph",),
        cite="loss.backward(retain_graph=True)",
    ),
    # the loss curve kept as tensors (makemore's lectures keep `lossi` of `.item()`s): every step's graph stays
    Case(
        "makemore, each loss appended to a list",
        MAKEMORE, args=MAKEMORE_ARGS, setup="makemore",
        mutation=(
            ("        optimizer.step()", "        optimizer.step(); lossi.append(loss)"),
            ("    best_loss = None", "    best_loss = None; lossi = []"),
        ),
        expect=("graph-kept-alive",),
        cite="optimizer.step(); lossi.append(loss)",
    ),
]

# ------------------------------------------------------------------ yunjey/pytorch-tutorial
LM_DETACH = "        states = detach(states)"
LM_FORWARD = "outputs, states = model(inputs, states)"
GAN_D_BACKWARD = "        d_loss.backward()"
YUNJEY_ENV = {"GW_FAKE_LEN": "600"}  # 6 batches of 100 stand-in MNIST images
VAE_ENV = {"GW_FAKE_LEN": "1280"}  # 10 batches of 128
VAE_BCE = "        reconst_loss = F.binary_cross_entropy(x_reconst, x, size_average=False)"
YUNJEY_CASES = [
    Case("yunjey language model (LSTM, states detached)", LANGUAGE_MODEL, setup="language-model"),
    # the LSTM's states carried into the next step without detach(): the second step's backward runs into the
    # first step's graph, freed by its backward (torch's error)
    Case(
        "yunjey language model, states not detached",
        LANGUAGE_MODEL, setup="language-model",
        mutation=((LM_DETACH, "        pass"),),
        expect=("backward-through-freed-graph", "graph-carried-across-steps"),
        cite=LM_FORWARD,
    ),
    # ... and retain_graph=True added to silence that error: the graph then grows across the epoch, and Adam's
    # step has changed the LSTM weights the first step's graph saved (torch's in-place error on the second step)
    Case(
        "yunjey language model, states not detached + retain_graph",
        LANGUAGE_MODEL, setup="language-model",
        mutation=(
            (LM_DETACH, "        pass"),
            ("        loss.backward()", "        loss.backward(retain_graph=True)"),
        ),
        expect=("graph-carried-across-steps", "modified-in-place"),
        cite=LM_FORWARD,
    ),
    # D's fake images are not detached, but reset_grad() zeroes G's gradients before G's step: a correct GAN
    Case("yunjey GAN (reset_grad before each backward)", YUNJEY_GAN, env=YUNJEY_ENV, setup="yunjey-gan"),
    # G's step makes a new fake: no later backward uses D's graph (nor G's part of it) that retain_graph keeps
    Case(
        "yunjey GAN, retain_graph=True on D's backward",
        YUNJEY_GAN, env=YUNJEY_ENV, setup="yunjey-gan",
        mutation=((GAN_D_BACKWARD, "        d_loss.backward(retain_graph=True)"),),
        expect=("retained-graph",),
        cite="d_loss.backward(retain_graph=True)",
    ),
    Case("yunjey VAE", YUNJEY_VAE, env=VAE_ENV, setup="yunjey-vae"),
    # the reconstruction clamped in place to keep BCE away from log(0): sigmoid saved its output for its backward,
    # and clamp_ changes that output (torch's in-place error at the first backward)
    Case(
        "yunjey VAE, reconstruction clamped in place before BCE",
        YUNJEY_VAE, env=VAE_ENV, setup="yunjey-vae",
        mutation=((VAE_BCE, "        reconst_loss = F.binary_cross_entropy(x_reconst.clamp_(1e-6, 1 - 1e-6), x, "
                            "size_average=False)"),),
        expect=("modified-in-place",),
        cite="reconst_loss = F.binary_cross_entropy(x_reconst.clamp_(1e-6, 1 - 1e-6), x, size_average=False)",
    ),
    # the epoch's loss summed as a tensor: `total_loss` holds every step's graph (a chain of additions)
    Case(
        "yunjey VAE, total_loss += loss",
        YUNJEY_VAE, env=VAE_ENV, setup="yunjey-vae",
        mutation=(
            ("        optimizer.step()", "        optimizer.step(); total_loss += loss"),
            ("# Start training", "total_loss = 0"),
        ),
        expect=("graph-kept-alive",),
        cite="optimizer.step(); total_loss += loss",
    ),
]

# ------------------------------------------------------------------ MorvanZhou/PyTorch-Tutorial
RNN_REPACK = "    h_state = h_state.data        # repack the hidden state, break the connection from last iteration"
RNN_FORWARD = "prediction, h_state = rnn(x, h_state)"
RNN_BACKWARD = "    loss.backward()                         # backpropagation, compute gradients"
# as published, D's backward retains its graph ("reusing computational graph"), but D's loss uses
# G_paintings.detach(): no later backward uses that graph (the tutorial's older versions had G's step after D's)
GAN_RETAIN = "    D_loss.backward(retain_graph=True)      # reusing computational graph"
GAN_NO_RETAIN = "    D_loss.backward()      # reusing computational graph"
GAN_DETACHED = "    prob_artist1 = D(G_paintings.detach())  # D try to reduce this prob"
MORVAN_ENV = {"MPLBACKEND": "Agg"}
MORVAN_CASES = [
    Case("MorvanZhou RNN regressor (h_state.data)", RNN_REGRESSOR, env=MORVAN_ENV, setup="rnn-regressor"),
    # the line the tutorial marks "!! next step is important !!" removed: step 1's backward reaches step 0's freed graph
    Case(
        "MorvanZhou RNN regressor, hidden state not repacked",
        RNN_REGRESSOR, env=MORVAN_ENV, setup="rnn-regressor",
        mutation=((RNN_REPACK, ""),),
        expect=("backward-through-freed-graph", "graph-carried-across-steps"),
        cite=RNN_FORWARD,
    ),
    # ... and retain_graph=True to silence the error: Adam has changed the RNN's weights the old graph saved
    Case(
        "MorvanZhou RNN regressor, not repacked + retain_graph",
        RNN_REGRESSOR, env=MORVAN_ENV, setup="rnn-regressor",
        mutation=((RNN_REPACK, ""), (RNN_BACKWARD, "    loss.backward(retain_graph=True)")),
        expect=("graph-carried-across-steps", "modified-in-place"),
        cite=RNN_FORWARD,
    ),
    # the script as published: a bug in the wild, its known fix retain_graph dropped
    Case(
        "MorvanZhou GAN as published (retain_graph=True no backward needs)",
        MORVAN_GAN, env=MORVAN_ENV, setup="morvan-gan",
        fix=((GAN_RETAIN, GAN_NO_RETAIN),),
        expect=("retained-graph",),
        cite="D_loss.backward(retain_graph=True)",
    ),
    Case(
        "MorvanZhou GAN, retain_graph dropped",
        MORVAN_GAN, env=MORVAN_ENV, setup="morvan-gan",
        mutation=((GAN_RETAIN, GAN_NO_RETAIN),),
    ),
    # (the bugs below are made on the script with retain_graph dropped, their known fix)
    # D's loss on the fake not detached: G's step ran first and its backward freed G's graph, which D's backward
    # reaches through G_paintings. The line is D's (68), not G's own `prob_artist1 = D(G_paintings)` (61).
    Case(
        "MorvanZhou GAN, G_paintings not detached for D",
        MORVAN_GAN, env=MORVAN_ENV, setup="morvan-gan",
        mutation=((GAN_RETAIN, GAN_NO_RETAIN), (GAN_DETACHED, "    prob_artist1 = D(G_paintings)")),
        fix=((GAN_RETAIN, GAN_NO_RETAIN),),
        expect=("backward-through-freed-graph",),
        cite="prob_artist1 = D(G_paintings)", cite_line=68,
    ),
    # opt_D.zero_grad() removed: D's step adds its gradients (and those G's backward put into D) onto all earlier ones
    Case(
        "MorvanZhou GAN, opt_D.zero_grad() removed",
        MORVAN_GAN, env=MORVAN_ENV, setup="morvan-gan",
        mutation=((GAN_RETAIN, GAN_NO_RETAIN), ("    opt_D.zero_grad()", "")),
        fix=((GAN_RETAIN, GAN_NO_RETAIN),),
        expect=("missing-zero-grad",),
        cite="opt_D.step()",
    ),
]

# ------------------------------------------------------------------ minGPT
# one-digit additions (100 problems: both splits are evaluated, greedily, after the first iteration), 30 iterations
ADDER_ARGS = ("--data.ndigit=1", "--trainer.max_iters=30", "--trainer.batch_size=16", "--trainer.num_workers=0",
              "--trainer.device=cpu", "--system.work_dir=out")
ADDER_GLOBAL = "        global top_score"
ADDER_TOP = "    top_score = 0"
ADDER_CASES = [
    Case("minGPT adder (Trainer with a batch-end callback)", ADDER, args=ADDER_ARGS, setup="mingpt-adder"),
    # the callback records the loss curve as tensors: trainer.loss holds each iteration's graph, kept in the list
    Case(
        "minGPT adder, the callback appends trainer.loss to a list",
        ADDER, args=ADDER_ARGS, setup="mingpt-adder",
        mutation=(
            (ADDER_GLOBAL, "        global top_score; loss_curve.append(trainer.loss)"),
            (ADDER_TOP, "    top_score = 0; loss_curve = []"),
        ),
        expect=("graph-kept-alive",),
        cite="global top_score; loss_curve.append(trainer.loss)",
    ),
    # a smoothed loss kept as a tensor: each iteration's graph chained onto the last one's, all kept
    Case(
        "minGPT adder, the callback keeps a running average of trainer.loss",
        ADDER, args=ADDER_ARGS, setup="mingpt-adder",
        mutation=(
            (ADDER_GLOBAL, "        global top_score, smooth_loss; smooth_loss = 0.9 * smooth_loss + 0.1 * trainer.loss"),
            (ADDER_TOP, "    top_score = 0; smooth_loss = 0.0"),
        ),
        expect=("graph-kept-alive",),
        cite="global top_score, smooth_loss; smooth_loss = 0.9 * smooth_loss + 0.1 * trainer.loss",
    ),
]

# ------------------------------------------------------------------ Lightning's GAN (manual optimization)
LIT_D_BACKWARD = "        self.manual_backward(d_loss)"
LIGHTNING_CASES = [
    Case("Lightning GAN (two optimizers, toggle_optimizer)", LIGHTNING_GAN, setup="lightning-gan"),
    # D's fake made without .detach(): self(z) runs G again inside toggle_optimizer(opt_d), which has set
    # requires_grad=False on G's parameters: G records no graph, D's backward stops at D. Nothing changes.
    Case(
        "Lightning GAN, D's fake not detached (G frozen by toggle_optimizer)",
        LIGHTNING_GAN, setup="lightning-gan",
        mutation=((
            "        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)",
            "        fake_loss = self.adversarial_loss(self.discriminator(self(z)), fake)",
        ),),
    ),
    # no later backward uses D's graph (G's step of the next batch makes its own)
    Case(
        "Lightning GAN, retain_graph=True on D's manual_backward",
        LIGHTNING_GAN, setup="lightning-gan",
        mutation=((LIT_D_BACKWARD, "        self.manual_backward(d_loss, retain_graph=True)"),),
        expect=("retained-graph",),
        cite="self.manual_backward(d_loss, retain_graph=True)",
    ),
    # opt_d.zero_grad() removed: D's step adds onto every earlier batch's gradients
    Case(
        "Lightning GAN, opt_d.zero_grad() removed",
        LIGHTNING_GAN, setup="lightning-gan",
        mutation=(("        opt_d.zero_grad()", ""),),
        expect=("missing-zero-grad",),
        cite="opt_d.step()",
    ),
]

MORE: list[Case] = [*NANOGPT_CASES, *MAKEMORE_CASES, *ADDER_CASES, *LIGHTNING_CASES, *YUNJEY_CASES, *MORVAN_CASES]
