"""The accuracy corpus: real third-party training scripts (run unchanged and with one-line bugs) and
small reproductions of publicly reported cases (``repros/``, ours).

Third-party code is never in this repository: each real case names the repository, commit and folder
it comes from, and ``run.py --corpus DIR`` expects ``DIR/<owner>+<name>/<folder>`` checked out at that
commit (``git -C DIR clone https://github.com/<owner>/<name> <owner>+<name>`` then ``git checkout``).

The expected answer of each case is what a PyTorch user would call the bug, decided before running
graphwatch: the finding kinds, and the line the finding must cite (by its text in the mutated script).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphwatch.analysis import FINDING_KINDS

# The kinds that say something is wrong (missing-zero-grad included): a clean program has none of them.
PROBLEM_KINDS = FINDING_KINDS


@dataclass(frozen=True)
class Source:
    """Where a real script lives: ``folder`` of ``repo`` at ``commit``; ``script`` runs inside it."""

    repo: str
    commit: str
    folder: str
    script: str


@dataclass(frozen=True)
class Case:
    """One program and the answer expected of graphwatch."""

    name: str
    source: Source | None  # None: the repro ``script`` in repros/
    script: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # (exact line text, its replacement) pairs: the bug (one line; a second line only where users add
    # retain_graph=True to silence the error the first one raises)
    mutation: tuple[tuple[str, str], ...] = ()
    # a real script's known-good fix as (line, replacement) pairs where it is not the unchanged script (the
    # script has the bug as published; a bug made on top of such a fix); () for the unchanged script
    fix: tuple[tuple[str, str], ...] = ()
    expect: tuple[str, ...] = ()  # finding kinds that name the bug; () for a correct program
    cite: str | None = None  # text of the line a finding must cite (stripped); None: any line
    cite_line: int | None = None  # that line's number, where the text occurs more than once in the script
    setup: str | None = None  # name of a data-making step in run.py

    @property
    def clean(self) -> bool:
        return not self.expect


EXAMPLES = "pytorch/examples"
EXAMPLES_AT = "77f55b912142e11fcfdf5b530231fb9c52f181e8"
GAN = "eriklindernoren/PyTorch-GAN"
GAN_AT = "36d3c77e5ff20ebe0aeefd322326a134a279b93e"

WLM = Source(EXAMPLES, EXAMPLES_AT, "word_language_model", "main.py")
WLM_ARGS = ("--epochs", "1", "--emsize", "16", "--nhid", "16", "--bptt", "10", "--batch_size", "8", "--save", "m.pt")
WLM_DATA = "data/wikitext-2"
WLM_LOG5 = (*WLM_ARGS, "--log-interval", "5")
WLM_LOG = "            cur_loss = total_loss / args.log_interval"
WLM_EVAL = "            total_loss += len(data) * criterion(output, targets)"
TSP = Source(EXAMPLES, EXAMPLES_AT, "time_sequence_prediction", "train.py")
TSP_ENV = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "MPLBACKEND": "Agg"}  # the script predates torch 2.6
WGAN = Source(GAN, GAN_AT, "implementations/wgan_gp", "wgan_gp.py")
GAN_PLAIN = Source(GAN, GAN_AT, "implementations/gan", "gan.py")
GAN_ARGS = ("--n_epochs", "1", "--batch_size", "16", "--latent_dim", "8")
GAN_ENV = {"GW_FAKE_LEN": "192"}
REPACKAGE = "            hidden = repackage_hidden(hidden)"
DCGAN = Source(EXAMPLES, EXAMPLES_AT, "dcgan", "main.py")
DCGAN_ARGS = ("--dataset", "fake", "--workers", "0", "--batchSize", "8", "--nz", "8", "--ngf", "8", "--ndf", "8",
              "--niter", "1", "--manualSeed", "1", "--outf", "out")
DCGAN_ENV = {"GW_FAKE_LEN": "48"}
# the neural style tutorial; pytorch/tutorials is too large to clone for one file: see README.md
STYLE = Source("pytorch/tutorials", "8bcd0ac63dff35599649fc78711b6c155717823f", "advanced_source",
               "neural_style_tutorial.py")
STYLE_TARGET = "        self.target = gram_matrix(target_feature).detach()"
STYLE_FEATURE = "            target_feature = model(style_img).detach()"

REAL: list[Case] = [
    Case("word-language-model", WLM, args=WLM_ARGS, setup="wikitext"),
    Case("word-language-model --use-optimizer", WLM, args=(*WLM_ARGS, "--use-optimizer"), setup="wikitext"),
    Case(
        "word-language-model, hidden not repackaged",
        WLM, args=WLM_ARGS, setup="wikitext",
        mutation=((REPACKAGE, "            pass"),),
        expect=("backward-through-freed-graph", "graph-carried-across-steps"),
        cite="output, hidden = model(data, hidden)",
    ),
    Case(
        "word-language-model, not repackaged + retain_graph",
        WLM, args=WLM_ARGS, setup="wikitext",
        mutation=(
            (REPACKAGE, "            pass"),
            ("        loss.backward()", "        loss.backward(retain_graph=True)"),
        ),
        expect=("graph-carried-across-steps",),
        cite="output, hidden = model(data, hidden)",
    ),
    Case(
        "word-language-model, total_loss += loss",
        WLM, args=WLM_ARGS, setup="wikitext",
        mutation=(("        total_loss += loss.item()", "        total_loss += loss"),),
        expect=("graph-kept-alive",),
        cite="total_loss += loss",
    ),
    # The logging branch first runs at batch 5, on a step the default level sees light (steps 3-63): a graph
    # kept from there is found from a light step (issue 25). A second backward there is a training event in
    # the source, so the loop's step ends only after it: batches 0-5 are step 0, seen in full detail.
    Case("word-language-model, logging every 5 batches", WLM, args=WLM_LOG5, setup="wikitext"),
    Case(
        "word-language-model, each logged loss kept (from batch 5, a light step)",
        WLM, args=WLM_LOG5, setup="wikitext",
        mutation=(
            (WLM_LOG, f"{WLM_LOG}; logged_losses.append(loss)"),
            ("    start_time = time.time()", "    start_time = time.time(); logged_losses = []"),
        ),
        expect=("graph-kept-alive",),
        cite="cur_loss = total_loss / args.log_interval; logged_losses.append(loss)",
    ),
    Case(
        "word-language-model, a second backward at each log line (first at batch 5)",
        WLM, args=WLM_LOG5, setup="wikitext",
        mutation=((WLM_LOG, f"{WLM_LOG}; loss.backward()"),),
        expect=("backward-through-freed-graph",),
        cite="cur_loss = total_loss / args.log_interval; loss.backward()",
    ),
    # Evaluation without no_grad whose loss stays a tensor: evaluate() returns a graph the epoch loop keeps
    # (`best_val_loss = val_loss`); epoch 1's evaluation runs on a step the default level sees light. The bug
    # is the evaluation's accumulation (as `total_loss += loss` is); its known fix, the unchanged script.
    *(
        Case(
            f"word-language-model{flag}, evaluation without no_grad and its loss kept as a tensor",
            WLM, args=("--epochs", "2", *WLM_ARGS[2:], *flag.split()), setup="wikitext",
            mutation=(
                ("    with torch.no_grad():", "    if True:"),
                (f"{WLM_EVAL}.item()", WLM_EVAL),
            ),
            expect=("graph-kept-alive",),
            cite=WLM_EVAL.strip(),
        )
        # steps ended by a freeing backward, or by optimizer.step() (AdamW at a rate it trains with: at the
        # script's default of 20 its perplexity reaches 1e20, where float32 and float64 sums print apart)
        for flag in ("", " --use-optimizer --lr 0.002")
    ),
    Case("time-sequence-prediction (LBFGS closure)", TSP, args=("--steps", "3"), env=TSP_ENV, setup="sine"),
    Case(
        "time-sequence-prediction, loss = optimizer.step(closure)",
        TSP, args=("--steps", "3"), env=TSP_ENV, setup="sine",
        mutation=(("        optimizer.step(closure)", "        loss = optimizer.step(closure)"),),
    ),
    Case("wgan-gp (n_critic = 5)", WGAN, args=GAN_ARGS, env=GAN_ENV),
    Case(
        "wgan-gp, g_loss appended to a list",
        WGAN, args=GAN_ARGS, env=GAN_ENV,
        mutation=(
            ("            g_loss.backward()", "            g_loss.backward(); batches_done_losses.append(g_loss)"),
            ("batches_done = 0", "batches_done = 0; batches_done_losses = []"),
        ),
        expect=("graph-kept-alive",),
        cite="g_loss.backward(); batches_done_losses.append(g_loss)",
    ),
    Case("dcgan", DCGAN, args=DCGAN_ARGS, env=DCGAN_ENV),
    Case(
        "dcgan, fake not detached for D",
        DCGAN, args=DCGAN_ARGS, env=DCGAN_ENV,
        mutation=(("        output = netD(fake.detach())", "        output = netD(fake)"),),
        expect=("backward-through-freed-graph",),  # D's backward freed netG's graph; G's step fails on it
        cite="output = netD(fake)", cite_line=243,  # the discriminator's line, not the generator's (255)
    ),
    Case("neural style tutorial", STYLE, setup="style_images"),
    Case(  # the feature it is made from is already detached at this commit: no graph, nothing to find
        "neural style, StyleLoss target not detached",
        STYLE, setup="style_images",
        mutation=((STYLE_TARGET, "        self.target = gram_matrix(target_feature)"),),
    ),
    Case(
        "neural style, StyleLoss target and its feature not detached",
        STYLE, setup="style_images",
        mutation=(
            (STYLE_TARGET, "        self.target = gram_matrix(target_feature)"),
            (STYLE_FEATURE, "            target_feature = model(style_img)"),
        ),
        # the second closure of LBFGS's first step backwards into the target's freed graph, made before the loop
        expect=("backward-through-freed-graph", "graph-carried-across-steps"),
        cite="self.target = gram_matrix(target_feature)",
    ),
    Case("gan (two optimizers)", GAN_PLAIN, args=GAN_ARGS, env=GAN_ENV),
    Case(
        "gan, fake not detached for D",
        GAN_PLAIN, args=GAN_ARGS, env=GAN_ENV,
        mutation=((
            "        fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)",
            "        fake_loss = adversarial_loss(discriminator(gen_imgs), fake)",
        ),),
        expect=("backward-through-freed-graph",),  # G's backward freed the generator's graph first
        cite="fake_loss = adversarial_loss(discriminator(gen_imgs), fake)",
    ),
]
