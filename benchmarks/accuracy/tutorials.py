"""PyTorch's NLP-from-scratch tutorials (pytorch/tutorials ``intermediate_source``) as real cases (issue 39).

Their ``train()`` returns ``loss.item()`` (``loss.item() / target_length`` in seq2seq); the one-line bug returns
the loss tensor, which the caller keeps (``current_loss += loss`` as the tutorials add the numbers), so every
step's graph stays alive: one ``graph-kept-alive`` finding, at the ``return``.  Each tutorial also runs
unchanged (expected silent).  pytorch/tutorials is too large to clone: README.md says how a corpus gets the three
files at their commits.

Their data cannot be downloaded: each case's setup writes small seeded data in the tutorial's format
(``data/names/<Language>.txt``, ``data/eng-fra.txt``) and shortens the run (fewer iterations, a smaller
confusion matrix, a narrower seq2seq) by replacing whole lines, in the bug, its fixed twin and graphwatch's fix
alike.  ``run.py`` uses ``TUTORIALS`` (with the other real cases) and ``TUTORIAL_SETUPS`` (with its setups).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from cases import Case, Source

TUTORIALS_REPO = "pytorch/tutorials"
FOLDER = "intermediate_source"
CLASSIFY = Source(TUTORIALS_REPO, "10098032865151e891c6074522207880f0e68fd3", FOLDER,
                  "char_rnn_classification_tutorial.py")
GENERATE = Source(TUTORIALS_REPO, "4ce8b871ef249dfacc1b389108842a0c2c0805b7", FOLDER,
                  "char_rnn_generation_tutorial.py")
TRANSLATE = Source(TUTORIALS_REPO, "05e7ce2c19e72d482475d91d458db210cdacec38", FOLDER,
                   "seq2seq_translation_tutorial.py")

# (line, its shorter replacement): whole lines of each tutorial. Few steps: with the bug every step's graph stays
# alive, and graphwatch's step ends then cost time growing with the graphs kept (about 1 s a step end at 2,000 nodes)
SHORTER: dict[str, tuple[tuple[str, str], ...]] = {
    CLASSIFY.script: (
        ("n_iters = 100000", "n_iters = 40"),
        ("print_every = 5000", "print_every = 10"),
        ("plot_every = 1000", "plot_every = 10"),
        ("n_confusion = 10000", "n_confusion = 20"),
    ),
    GENERATE.script: (
        ("n_iters = 100000", "n_iters = 40"),
        ("print_every = 5000", "print_every = 10"),
        ("plot_every = 500", "plot_every = 10"),
    ),
    TRANSLATE.script: (
        ("hidden_size = 256", "hidden_size = 32"),
        ("trainIters(encoder1, attn_decoder1, 75000, print_every=5000)",
         "trainIters(encoder1, attn_decoder1, 30, print_every=10, plot_every=10)"),
    ),
}

# the languages the tutorials name (classification prints Italian's names, generation samples the other four)
LANGUAGES = {"Chinese": ("ang", "ong", "ui"), "German": ("mann", "berg", "er"), "Italian": ("ini", "etti", "o"),
             "Russian": ("ov", "sky", "in"), "Spanish": ("ez", "ado", "os"), "Irish": ("an", "ey", "agh")}
SYLLABLES = ("ka", "lo", "mi", "ra", "te", "su", "no", "be", "di", "ha", "po", "vi", "ze", "ch")

# (English, French) sentence parts: the English side starts with one of the tutorial's eng_prefixes
SUBJECTS = (("I am", "Je suis"), ("He is", "Il est"), ("She is", "Elle est"), ("You are", "Vous etes"),
            ("We are", "Nous sommes"), ("They are", "Ils sont"))
ADJECTIVES = (("cold", "froid"), ("tall", "grand"), ("small", "petit"), ("happy", "heureux"), ("tired", "fatigue"),
              ("late", "en retard"), ("ready", "pret"), ("busy", "occupe"), ("sad", "triste"), ("hungry", "affame"))
ADVERBS = (("", ""), ("too ", "trop "), ("very ", "tres "))
# the French sentences the tutorial translates after training (each word must be known to its vocabulary)
TRANSLATED = (("I am too cold.", "Je suis trop froid."),
              ("She is five years younger than me.", "Elle a cinq ans de moins que moi."),
              ("She is too short.", "Elle est trop petit."),
              ("I am not afraid of dying.", "Je ne crains pas de mourir."),
              ("He is a talented young manager.", "C'est un jeune directeur plein de talent."))
# lines the tutorial filters out (no English prefix, too long)
FILTERED_OUT = (("Go.", "Va !"), ("Run!", "Cours !"),
                ("Who knows what will happen to us next week?", "Qui sait ce qui nous arrivera la semaine prochaine ?"))


def _shorten(folder: Path, script: str) -> None:
    """Replace each of ``SHORTER[script]``'s lines, which must each be in the script exactly once."""
    path = folder / script
    lines = path.read_text().splitlines(keepends=True)
    for old, new in SHORTER[script]:
        found = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
        if len(found) != 1:
            raise SystemExit(f"{script}: the line to shorten is there {len(found)} times, not once: {old!r}")
        lines[found[0]] = new + "\n"
    path.write_text("".join(lines))


def _write_names(folder: Path) -> None:
    """``data/names/<Language>.txt``: 40 made-up names a language, one a line, each ending as the language's do."""
    rng = random.Random(0)
    names = folder / "data" / "names"
    names.mkdir(parents=True, exist_ok=True)
    for language, endings in LANGUAGES.items():
        lines = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 2))).capitalize() + rng.choice(endings)
                 for _ in range(40)]
        (names / f"{language}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_eng_fra(folder: Path) -> None:
    """``data/eng-fra.txt``: English and French sentences, tab-separated, most passing the tutorial's filters."""
    pairs = [
        (f"{english} {adverb}{adjective}.", f"{french} {adverbe}{adjectif}.")
        for english, french in SUBJECTS for adverb, adverbe in ADVERBS for adjective, adjectif in ADJECTIVES
    ]
    random.Random(1).shuffle(pairs)
    lines = [f"{english}\t{french}" for english, french in (*pairs, *TRANSLATED, *FILTERED_OUT)]
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "eng-fra.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _setup(script: str, data: Callable[[Path], None]) -> Callable[[Path], None]:
    """The setup of a tutorial's cases: its data written, its run shortened."""

    def setup(folder: Path) -> None:
        data(folder)
        _shorten(folder, script)

    return setup


TUTORIAL_SETUPS: dict[str, Callable[[Path], None]] = {
    "tutorial-names-classification": _setup(CLASSIFY.script, _write_names),
    "tutorial-names-generation": _setup(GENERATE.script, _write_names),
    "tutorial-eng-fra": _setup(TRANSLATE.script, _write_eng_fra),
}


def _pair(name: str, source: Source, setup: str, returned: str, bug: str) -> list[Case]:
    """The tutorial unchanged (silent) and with ``train()`` returning the loss tensor (``returned`` -> ``bug``)."""
    return [
        Case(f"{name} tutorial", source, setup=setup),
        Case(
            f"{name} tutorial, train() returns the loss tensor",
            source, setup=setup,
            mutation=((returned, bug),),
            expect=("graph-kept-alive",),
            cite=bug.strip(),
        ),
    ]


TUTORIALS: list[Case] = [
    *_pair("char-RNN classification", CLASSIFY, "tutorial-names-classification",
           "    return output, loss.item()", "    return output, loss"),
    *_pair("char-RNN generation", GENERATE, "tutorial-names-generation",
           "    return output, loss.item() / input_line_tensor.size(0)",
           "    return output, loss / input_line_tensor.size(0)"),
    *_pair("seq2seq translation", TRANSLATE, "tutorial-eng-fra",
           "    return loss.item() / target_length", "    return loss / target_length"),
]
