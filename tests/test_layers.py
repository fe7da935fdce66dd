"""The packages form layers, each importing only those below it: common < data, model < trainer < study <
scripts and eval_llm.py. A script is an entry point, never a library, so no script imports another."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each layer and the project packages it may import (itself included).
ALLOWED = {
    "common": {"common"},
    "data": {"common", "data"},
    "model": {"common", "model"},
    "trainer": {"common", "data", "model", "trainer"},
    "study": {"common", "data", "model", "trainer", "study"},
    "scripts": {"common", "data", "model", "trainer", "study", "scripts"},
    "eval_llm": {"common", "data", "model", "trainer"},
}


def imported_modules(source: str) -> list[str]:
    """Every module a file imports, anywhere in it, as dotted names (`from scripts import x` gives scripts.x)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def violations(repo: Path) -> list[str]:
    """`file: imports module` for each import that runs up the layers or from one script into another."""
    found = []
    for path in sorted(repo.glob("*.py")) + sorted(p for layer in ALLOWED for p in (repo / layer).rglob("*.py")):
        rel = path.relative_to(repo)
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


def test_no_import_runs_up_the_layers_or_between_scripts():
    assert violations(REPO) == []


def test_an_upward_or_script_to_script_import_is_found(tmp_path):
    files = {
        "common/cli.py": "import json\nfrom model import MiniMindConfig\n",
        "data/corpus.py": "from common.cli import UserError\nfrom trainer.cli import UserError\n",
        "model/norms.py": "def f():\n    import data.corpus\n",  # inside a function counts too
        "trainer/args.py": "from model import NORM_TYPES\nfrom data import corpus\n",
        "scripts/a.py": "from scripts import b\nimport scripts.a\nfrom trainer.args import build_parser\n",
        "scripts/b.py": "from scripts.a import VARIANTS\n",
        "eval_llm.py": "import scripts.a\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(source)
    assert violations(tmp_path) == [
        "eval_llm.py: imports scripts.a",
        "common/cli.py: imports model", "common/cli.py: imports model.MiniMindConfig",
        "data/corpus.py: imports trainer.cli", "data/corpus.py: imports trainer.cli.UserError",
        "model/norms.py: imports data.corpus",
        "scripts/a.py: imports scripts.b",
        "scripts/b.py: imports scripts.a", "scripts/b.py: imports scripts.a.VARIANTS",
    ]
