"""Every relative link and image in README.md and docs/ points at a tracked file, every `page.md#anchor` names
a heading of that page, and the pages' commands run in reading order, so the docs cannot silently break."""

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def tracked_files() -> set[str] | None:
    """Paths git tracks (one call), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(out.decode().split("\0")) - {""}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than - dropped, spaces become -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def page_problems(page: Path, text: str, tracked: set[str] | None) -> list[str]:
    """The broken relative links of one page's text, resolved from the page's folder."""
    problems = []
    for target in (m.group(1) for m in LINK.finditer(CODE.sub("", FENCE.sub("", text)))):
        if re.match(r"(https?|mailto):", target) or target.startswith("#"):
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve()
        where = f"{page.relative_to(ROOT)}: {target}"
        try:
            rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            problems.append(f"{where} (outside the repository)")
            continue
        exists = rel in tracked if tracked is not None else resolved.is_file()
        if not exists:
            problems.append(f"{where} (no such tracked file)")
        elif fragment and rel.endswith(".md") and fragment not in anchors(resolved):
            problems.append(f"{where} (no heading #{fragment})")
    return problems


def test_docs_links_resolve():
    tracked = tracked_files()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        assert page_problems(page, page.read_text(encoding="utf-8"), tracked) == []


def test_checker_finds_a_broken_link_and_anchor():
    # a page as if it lived in docs/, checked against the real tracked files without writing it there
    text = ("# Title\n\n[ok](#x) [gone](missing.png) ![fig](model.md#no-such-heading) [web](https://x.y) "
            "[fine](model.md)\n")
    problems = page_problems(ROOT / "docs" / "probe.md", text, tracked_files())
    assert len(problems) == 2
    assert "missing.png" in problems[0] and "no-such-heading" in problems[1]
    assert page_problems(ROOT / "docs" / "probe.md", text, None) == problems  # outside a git checkout


def test_slug_follows_github():
    assert slug("2. DyT with the paper's per-position α₀ (3 seeds)") == (
        "2-dyt-with-the-papers-per-position-α₀-3-seeds")
    assert slug("Training throughput against `transformers.LlamaForCausalLM`") == (
        "training-throughput-against-transformersllamaforcausallm")


def switch_table() -> str:
    """docs/model.md's table of switches, as the model config's declaration (SWITCHES) gives it."""
    from model import SWITCHES
    from trainer.args import DEVICE_DEFAULTS

    def values(switch) -> str:
        if switch.choices:
            return ", ".join(f"`{v}`" for v in switch.choices)
        return {bool: "flag", int: "integer", float: "number"}[switch.type]

    rows = ["| flag | values | default | what it does |", "|---|---|---|---|"]
    for s in SWITCHES:
        flag = f"`--{s.name}`" + (f" (`--{s.flag}`)" if s.flag else "")
        default = "derived" if s.default is None else f"`{s.default}`"
        if s.name in DEVICE_DEFAULTS["cpu"]:  # the trainer's default, where it differs by device
            cuda, cpu = (DEVICE_DEFAULTS[device][s.name] for device in ("cuda", "cpu"))
            default = f"`{cuda}` on CUDA, `{cpu}` on CPU"
        rows.append(f"| {flag} | {values(s)} | {default} | {s.help.replace('|', '/')} |")
    return "\n".join(rows)


def test_the_switch_table_in_docs_is_the_declaration():
    text = (ROOT / "docs" / "model.md").read_text(encoding="utf-8")
    start = "<!-- switches: generated from SWITCHES, checked by tests/test_docs.py -->\n"
    end = "\n<!-- /switches -->"
    assert start in text and end in text
    table = text.split(start, 1)[1].split(end, 1)[0]
    assert table == switch_table(), f"replace the table in docs/model.md with:\n{switch_table()}"



@pytest.mark.slow  # nine tiny training runs and six exports, in-process
def test_the_pages_commands_run_in_reading_order_in_one_folder(tmp_path, monkeypatch, tiny_flags):
    """README.md, then the pages after it: each trainer and converter command whose input is there runs as
    written (the trainer's at the tiny size, 2 steps), in that order in one folder, and none is refused."""
    monkeypatch.chdir(tmp_path)
    ran = []
    for page in ["README.md", "docs/gguf.md", "docs/minimind-import.md", "extras/README.md"]:
        # (README's command 1 runs .venv/bin/python, after its set-up)
        pattern = (r"(?:^|`|\.venv/bin/)python "
                   r"((?:trainer|scripts/plot_runs|extras/interop/convert_to_(?:hf|gguf))[^`\n]+)")
        for line in re.findall(pattern, (ROOT / page).read_text(encoding="utf-8"), re.M):
            script, *args = line.split("#")[0].split()
            tiny = [*tiny_flags, "--max_steps", "2"] if script.startswith("trainer/") else []
            if tiny or Path(args[0]).exists():  # (MiniMind's files, or a step the tiny runs do not reach)
                importlib.import_module(script[:-3].replace("/", ".")).main([*args, *tiny])
                ran.append(page)
    assert sorted(set(ran)) == ["README.md", "docs/gguf.md", "extras/README.md"], ran
    assert Path("out/curves.png").stat().st_size > 10_000  # README's plot of two of its runs
