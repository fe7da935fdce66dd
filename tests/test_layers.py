"""The packages form layers, each importing only those below it: common < data, model < trainer < study <
scripts and eval_llm.py. A script is an entry point, never a library, so no script imports another. extras/
(converters, benchmarks) sits beside them, one way: it may import the core (common, data, model, trainer) and
itself, and nothing else imports it, so the core and the study never depend on what extras/ holds."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = {"common", "data", "model", "trainer"}
# Each layer and the project packages it may import (itself included).
ALLOWED = {
    "common": {"common"},
    "data": {"common", "data"},
    "model": {"common", "model"},
    "trainer": CORE,
    "study": CORE | {"study"},
    "scripts": CORE | {"study", "scripts"},
    "eval_llm": CORE,
    "extras": CORE | {"extras"},
}


def imported_modules(source: str, package: tuple[str, ...] = ()) -> list[str]:
    """Every module a file imports, anywhere in it, as dotted names (`from scripts import x`:
    scripts.x), a relative import resolved against the file's package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) + 1 - node.level] if node.level else ()
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def violations(repo: Path) -> list[str]:
    """`file: imports module` for each import that runs up the layers or from one script into another."""
    found = []
    top_level = sorted(p for p in repo.glob("*.py") if p.stem in ALLOWED)  # eval_llm.py, not conftest.py
    for path in top_level + sorted(p for layer in ALLOWED for p in (repo / layer).rglob("*.py")):
        rel = path.relative_to(repo)
        if rel.parts[:2] == ("extras", "tests"):
            continue  # tests, like tests/, call whatever they check
        layer = rel.parts[0].removesuffix(".py")
        for module in imported_modules(path.read_text(encoding="utf-8")):
            parts = module.split(".")
            if parts[0] not in ALLOWED:
                continue  # the standard library or a third-party package
            other_script = (layer == "scripts" and parts[0] == "scripts" and len(parts) > 1
                            and parts[1] != path.stem and (repo / "scripts" / f"{parts[1]}.py").is_file())
            if parts[0] not in ALLOWED[layer] or other_script:
                found.append(f"{rel}: imports {module}")
    return found


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_no_import_runs_up_the_layers_or_between_scripts_or_into_extras():
    assert violations(REPO) == []


def test_an_upward_script_to_script_or_extras_import_is_found(tmp_path):
    files = {
        "common/cli.py": "import json\nfrom model import MiniMindConfig\n",
        "data/corpus.py": "from common.cli import UserError\nfrom trainer.cli import UserError\n",
        "model/norms.py": "def f():\n    import data.corpus\n",  # inside a function counts too
        "trainer/args.py": "from model import NORM_TYPES\nfrom data import corpus\nimport extras.bench\n",
        "study/runner.py": "from extras.interop.export import export_model\n",
        "scripts/a.py": "from scripts import b\nimport scripts.a\nfrom trainer.args import build_parser\n",
        "scripts/b.py": "from scripts.a import VARIANTS\nfrom extras.interop import hf_export\n",
        "eval_llm.py": "import scripts.a\nimport extras\n",
        "conftest.py": "import extras\n",  # tests and their fixtures are no layer
        "extras/tests/test_x.py": "import eval_llm\nfrom study import runner\n",
        # extras may import the core and itself, not the study or the scripts
        "extras/interop/convert.py": "from trainer.checkpoint import load_newest\n"
                                     "from extras.interop import x\n"
                                     "from study import runner\nimport scripts.a\n",
    }
    write_tree(tmp_path, files)
    assert violations(tmp_path) == [
        "eval_llm.py: imports scripts.a", "eval_llm.py: imports extras",
        "common/cli.py: imports model", "common/cli.py: imports model.MiniMindConfig",
        "data/corpus.py: imports trainer.cli", "data/corpus.py: imports trainer.cli.UserError",
        "extras/interop/convert.py: imports study", "extras/interop/convert.py: imports study.runner",
        "extras/interop/convert.py: imports scripts.a",
        "model/norms.py: imports data.corpus",
        "scripts/a.py: imports scripts.b",
        "scripts/b.py: imports scripts.a", "scripts/b.py: imports scripts.a.VARIANTS",
        "scripts/b.py: imports extras.interop", "scripts/b.py: imports extras.interop.hf_export",
        "study/runner.py: imports extras.interop.export",
        "study/runner.py: imports extras.interop.export.export_model",
        "trainer/args.py: imports extras.bench",
    ]


# ---------------------------------------------------------------------------------------------------------
# Size tripwires. Every Python file is in exactly one area, so a file in a new folder fails until an
# area owns it. Three counts (`wc -l` of their Python files) are tripwires set with room above where
# they stand, not targets: crossing one asks whether the code grew for a reason, and a tool or feature
# a user runs is never removed to stay under one. When a tripwire moves, a docs/LOG.md paragraph says
# why.
AREAS = {  # area: the folders and files it owns
    "core": ["model", "data", "trainer", "common", "eval_llm.py"],
    "study": ["study", "scripts/run_ablation.py", "scripts/write_claims.py"],
    "scripts": ["scripts/train_tokenizer.py", "scripts/why_normalization.py", "scripts/plot_runs.py"],
    "extras": ["extras/interop", "extras/bench", "extras/__init__.py"],
    "tests": ["tests", "extras/tests", "conftest.py"],
}
# what each counts (areas, files, or a file and what it imports: "+"), at most this many lines
TRIPWIRES = {
    "core": (["core"], 4600),
    "what a training run imports": (["trainer/train_pretrain.py+"], 4050),
    # what a reader follows from the model's formulas to the training step
    "reading path": (["model/model_minimind.py", "model/norms.py", "trainer/train_pretrain.py"], 1575),
}


def python_files(repo: Path) -> list[Path]:
    """The repository's Python files, without walking the virtual environment or the results (slow)."""
    tops = [p for p in repo.iterdir() if p.name not in {".venv", ".git", "docs", "out", "wandb"}]
    files = [p for top in tops for p in ([top] if top.is_file() else top.rglob("*.py"))]
    return sorted(p for p in files if p.suffix == ".py")


def owners(repo: Path, path: Path) -> list[str]:
    return [area for area, parts in AREAS.items()
            if any(path == repo / part or repo / part in path.parents for part in parts)]


def not_in_one_area(repo: Path) -> dict[str, list[str]]:
    found = {str(p.relative_to(repo)): owners(repo, p) for p in python_files(repo)}
    return {path: areas for path, areas in found.items() if len(areas) != 1}


def closure(repo: Path, start: str) -> set[Path]:
    """The project files a file imports, transitively, itself and every package on the way included."""
    found, todo = set(), [repo / start]
    while todo:
        path = todo.pop()
        if path in found or not path.is_file():
            continue
        found.add(path)
        for module in imported_modules(path.read_text(encoding="utf-8"), path.relative_to(repo).parent.parts):
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__.py first
                base = repo.joinpath(*parts[:depth])
                todo += [base.with_suffix(".py"), base / "__init__.py"]
    return found


def counted_files(repo: Path, parts: list[str]) -> set[Path]:
    files = set()
    for part in parts:
        if part.endswith("+"):
            files |= closure(repo, part[:-1])
        else:
            files |= {p for p in python_files(repo) if part in owners(repo, p) or p == repo / part}
    return files


def lines(repo: Path, parts: list[str]) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in counted_files(repo, parts))


# Lines a reader can breathe in: a core line of WIDE columns or more is read sideways, so at most
# MOST_WIDE_PERCENT of the core's non-blank lines may be one (docs/LOG.md, 2026-11-27); a long string
# literal or a shell command, say, may stay whole where breaking it would hurt reading.
WIDE = 90
MOST_WIDE_PERCENT = 10


def wide_lines(repo: Path) -> tuple[int, int]:
    """(lines of WIDE columns or more, non-blank lines) over the core's Python files."""
    found = [line for p in sorted(counted_files(repo, ["core"]))
             for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sum(len(line) >= WIDE for line in found), len(found)


def too_wide(repo: Path) -> bool:
    wide, non_blank = wide_lines(repo)
    return 100 * wide > MOST_WIDE_PERCENT * non_blank


def test_every_python_file_is_in_one_area_and_no_tripwire_is_crossed():
    assert not_in_one_area(REPO) == {}
    counts = {name: (lines(REPO, parts), most) for name, (parts, most) in TRIPWIRES.items()}
    assert {name: n for name, n in counts.items() if n[0] > n[1]} == {}


def test_the_core_keeps_its_lines_narrow():
    wide, non_blank = wide_lines(REPO)
    assert not too_wide(REPO), f"{wide} of the core's {non_blank} non-blank lines are {WIDE}+ columns"


def test_wide_lines_are_counted_in_the_core_only_and_a_block_of_them_fails(tmp_path):
    narrow = "x = 1\n\n" * 9  # 9 non-blank lines, 9 blank ones
    wide = "w = '" + "w" * (WIDE - 6) + "'\n"  # exactly WIDE columns
    files = {"model/a.py": narrow + wide, "trainer/b.py": narrow + wide + "y = 2\n",
             "trainer/c.py": "z = '" + "z" * (WIDE - 7) + "'\n",  # WIDE - 1 columns: not wide
             "study/d.py": wide * 50, "tests/test_e.py": wide * 50, ".venv/lib/f.py": wide * 50}
    write_tree(tmp_path, files)
    assert wide_lines(tmp_path) == (2, 9 + 1 + 9 + 1 + 1 + 1)
    assert not too_wide(tmp_path)  # 2 of 22: under 10%
    with (tmp_path / "trainer/b.py").open("a") as f:  # a block of wide lines appended
        f.write(wide * 3)
    assert wide_lines(tmp_path) == (5, 25)
    assert too_wide(tmp_path)


def test_the_training_step_stays_a_page():
    """nanoGPT's whole step is 79 lines; train_loop stays within 100, a page with room."""
    tree = ast.parse((REPO / "trainer/train_pretrain.py").read_text(encoding="utf-8"))
    loop = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "train_loop")
    assert loop.end_lineno - loop.lineno + 1 <= 100


def test_a_count_takes_in_packages_and_relative_imports_and_a_file_in_a_new_folder_fails(tmp_path):
    files = {"trainer/train_pretrain.py": "from trainer import checkpoint\nimport model.norms\n",
             "trainer/checkpoint.py": "from .plots import x\n\n", "trainer/plots.py": "x = 1\n",
             "trainer/unused.py": "y = 1\n", "trainer/__init__.py": "\n",
             "model/__init__.py": "a\nb\nc\n", "model/norms.py": "a\nb\n", ".venv/lib/x.py": "ignored\n"}
    write_tree(tmp_path, files)
    assert lines(tmp_path, ["core"]) == 2 + 2 + 1 + 1 + 1 + 3 + 2
    assert lines(tmp_path, ["trainer/train_pretrain.py+"]) == 2 + 2 + 1 + 1 + 3 + 2  # not unused.py
    assert not_in_one_area(tmp_path) == {}
    write_tree(tmp_path, {"extras/viz/plot.py": "z = 1\n", "scripts/new_study.py": "z = 1\n"})
    assert not_in_one_area(tmp_path) == {"extras/viz/plot.py": [], "scripts/new_study.py": []}
