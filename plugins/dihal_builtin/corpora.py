"""Built-in corpora: `stdlib-docs`, local `files`, and any Hugging Face `hf-dataset`.

`dihal_bench.registry.resolve.load_corpus` turns the string a user types (`--corpus ...`) into one of them.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from dihal_bench import hookimpl
from dihal_bench.api.corpus import DEFAULT_SPLIT_FRACTIONS, Corpus, Document
from dihal_bench.errors import DihalError

#: the file types `files` reads
FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
#: a scheme prefix such as "hf:" or "s3:"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
#: what starts a `hf-dataset` reference: hf:<dataset>[:<config>]
HF_PREFIX = "hf:"


class StdlibDocsCorpus(Corpus):
    """English prose that every CPython ships, so a run needs no download.

    Documents, sorted by id:
      - "topic:<key>:<part>": every help topic in `pydoc_data.topics.topics` (the text of
        the language reference that `help("assignment")` prints), cut at paragraph
        boundaries into parts of about `part_chars` characters. A handful of topics hold
        most of the text; whole, they would make the hash split lopsided (one split
        getting 40% of the tokens), so they are split into passage-sized documents;
      - "module:<name>": the docstring of each public top-level standard-library module
        in `sys.stdlib_module_names` that has a pure-Python source file.

    Docstrings are read from source with `ast`, never by importing: importing some
    stdlib modules has side effects (`antigravity` opens a browser, `this` prints).
    Sources are looked up in the stdlib directory only, so a third-party shim on
    `sys.meta_path` (setuptools' `distutils`) cannot substitute its own module.
    Texts shorter than `min_chars` (one-line docstrings) are left out.

    Deterministic for a given Python version; other versions ship different text.
    """

    name = "stdlib-docs"
    description = "Python's own documentation: pydoc help topics and standard-library module docstrings"

    def __init__(
        self,
        *,
        min_chars: int = 200,
        part_chars: int = 2000,
        split_fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS,
    ):
        super().__init__(split_fractions=split_fractions)
        self.min_chars = min_chars
        self.part_chars = part_chars

    def documents(self) -> list[Document]:
        documents = _help_topics(self.part_chars) + _module_docstrings()
        return sorted(
            (document for document in documents if len(document.text) >= self.min_chars),
            key=lambda document: document.id,
        )


def _help_topics(part_chars: int) -> list[Document]:
    try:
        from pydoc_data.topics import topics
    except ImportError as error:
        raise DihalError(
            "this Python has no pydoc_data module (some Linux distributions package it "
            "separately), which the stdlib-docs corpus needs"
        ) from error
    return [
        Document(f"topic:{key}:{index:03d}", part)
        for key, text in topics.items()
        for index, part in enumerate(_paragraph_parts(text, part_chars))
    ]


def _paragraph_parts(text: str, part_chars: int) -> list[str]:
    """Consecutive runs of whole paragraphs, each closed once it reaches `part_chars`."""
    parts, current = [], []
    for paragraph in text.split("\n\n"):
        current.append(paragraph)
        if sum(len(p) for p in current) >= part_chars:
            parts.append("\n\n".join(current))
            current = []
    if current:
        parts.append("\n\n".join(current))
    return parts


def _module_docstrings() -> list[Document]:
    stdlib_dir = sysconfig.get_path("stdlib")
    documents = []
    for name in sys.stdlib_module_names:
        if name.startswith("_"):
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, [stdlib_dir])
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue  # a C extension or a module this platform lacks
        docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_bytes()))
        if docstring:
            documents.append(Document(f"module:{name}", docstring))
    return documents


class FilesCorpus(Corpus):
    """Local text: a `.txt`, `.jsonl` or `.parquet` file, or a directory searched recursively for them.

    - `.txt`: the whole file is one document, id "<file>".
    - `.jsonl`: one document per line, from the string field `text_field`, id "<file>:<line number>".
    - `.parquet`: one document per row, from the string column `text_field`, id "<file>:<row index>".

    "<file>" is the path relative to the given directory (or the file's name), so ids and
    hence the split do not change when the data moves. Blank texts are skipped.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        text_field: str = "text",
        split_fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS,
    ):
        super().__init__(split_fractions=split_fractions)
        self.path = Path(path)
        self.text_field = text_field
        self.name = str(path)
        self.description = f"local files at {path}"
        self.files = _corpus_files(self.path)

    def documents(self) -> list[Document]:
        root = self.path if self.path.is_dir() else self.path.parent
        documents = []
        for file in self.files:
            file_id = file.relative_to(root).as_posix()
            if file.suffix == ".txt":
                documents += _read_txt(file, file_id)
            elif file.suffix == ".jsonl":
                documents += _read_jsonl(file, file_id, self.text_field)
            else:
                documents += _read_parquet(file, file_id, self.text_field)
        return documents


def _corpus_files(path: Path) -> list[Path]:
    if not path.exists():
        raise DihalError(f"corpus path {path} does not exist")
    if path.is_file():
        if path.suffix not in FILE_SUFFIXES:
            raise DihalError(
                f"corpus file {path} has unsupported type {path.suffix!r}; "
                f"supported: {', '.join(FILE_SUFFIXES)}"
            )
        return [path]
    files = sorted(file for file in path.rglob("*") if file.is_file() and file.suffix in FILE_SUFFIXES)
    if not files:
        raise DihalError(f"corpus directory {path} holds no {', '.join(FILE_SUFFIXES)} files")
    return files


def _read_txt(file: Path, file_id: str) -> list[Document]:
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        reason = f"{error.reason} at byte {error.start}"
        raise DihalError(f"corpus file {file} is not UTF-8 text ({reason})") from error
    return [Document(file_id, text)] if text.strip() else []


def _read_jsonl(file: Path, file_id: str, text_field: str) -> list[Document]:
    documents = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DihalError(f"{file}:{number}: not valid JSON ({error.msg})") from error
            if not isinstance(record, dict) or text_field not in record:
                fields = ", ".join(record) if isinstance(record, dict) else "none, not an object"
                raise DihalError(f"{file}:{number}: no field {text_field!r} (fields: {fields})")
            text = record[text_field]
            if not isinstance(text, str):
                kind = type(text).__name__
                raise DihalError(f"{file}:{number}: field {text_field!r} is {kind}, not a string")
            if text.strip():
                documents.append(Document(f"{file_id}:{number}", text))
    return documents


def _read_parquet(file: Path, file_id: str, text_field: str) -> list[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(file)
    except pa.ArrowException as error:
        raise DihalError(f"corpus file {file} is not a readable parquet file ({error})") from error
    if text_field not in schema.names:
        columns = ", ".join(schema.names)
        raise DihalError(f"corpus file {file} has no column {text_field!r} (columns: {columns})")
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise DihalError(f"column {text_field!r} of {file} holds {column_type}, not strings")
    texts = pq.read_table(file, columns=[text_field]).column(text_field).to_pylist()
    return [
        Document(f"{file_id}:{row}", text) for row, text in enumerate(texts) if text and text.strip()
    ]


class HFDatasetCorpus(Corpus):
    """Any dataset `datasets.load_dataset` can load: a Hub name, or a packaged builder such
    as "json"/"parquet"/"text" with `data_files`.

    One document per row of split `split` of the dataset (this may use slicing syntax,
    e.g. "train[:10000]"), from the string column `text_field`, id "row:<index>"; the
    train/validation/test split of the corpus is then made from these rows as for any
    corpus. Blank texts are skipped; `max_documents` keeps the first that many documents
    (with `streaming=True`, only those are downloaded). Loading scripts are never run
    (`trust_remote_code=False`). For offline use set HF_DATASETS_OFFLINE=1 before
    `datasets` is imported.
    """

    def __init__(
        self,
        path: str,
        config: str | None = None,
        *,
        split: str = "train",
        text_field: str = "text",
        data_files: str | Sequence[str] | dict | None = None,
        max_documents: int | None = None,
        streaming: bool = False,
        cache_dir: str | Path | None = None,
        split_fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS,
    ):
        super().__init__(split_fractions=split_fractions)
        self.path = path
        self.config = config
        self.dataset_split = split
        self.text_field = text_field
        self.data_files = data_files
        self.max_documents = max_documents
        self.streaming = streaming
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        label = f"{path}:{config}" if config else path
        self.name = f"hf:{label}"
        self.description = f"Hugging Face dataset {label}, split {split}"

    def documents(self) -> list[Document]:
        rows = self._load().select_columns([self.text_field])
        documents = []
        for index, row in enumerate(rows):
            if self.max_documents is not None and len(documents) >= self.max_documents:
                break
            text = row[self.text_field]
            if text is not None and not isinstance(text, str):
                kind = type(text).__name__
                raise DihalError(f"column {self.text_field!r} of {self.name} holds {kind}, not strings")
            if text and text.strip():
                documents.append(Document(f"row:{index}", text))
        return documents

    def _load(self):
        import datasets

        try:
            dataset = datasets.load_dataset(
                self.path,
                self.config,
                split=self.dataset_split,
                data_files=self.data_files,
                streaming=self.streaming,
                cache_dir=self.cache_dir,
                trust_remote_code=False,
            )
        except (datasets.exceptions.DatasetsError, FileNotFoundError, ValueError, ConnectionError) as error:
            # datasets' messages run to several lines of advice; the first names the problem
            reason = (str(error).strip() or type(error).__name__).splitlines()[0]
            raise DihalError(f"cannot load dataset {self.name}: {reason}") from error
        columns = dataset.column_names
        if columns is not None and self.text_field not in columns:
            raise DihalError(
                f"dataset {self.name} has no column {self.text_field!r} (columns: {', '.join(columns)})"
            )
        return dataset


def handles_files(reference: str) -> bool:
    """An existing path, or one that names a .txt, .jsonl or .parquet file (a missing one
    then fails with a clear "does not exist" when loaded, not as an unknown corpus). A
    missing path with a scheme prefix (``hf:data.jsonl``, ``s3:...``) is another plugin's."""
    path = Path(reference)
    if path.exists():
        return True
    # two letters at least: a Windows drive letter ("C:") is a path, not a scheme
    return path.suffix in FILE_SUFFIXES and _SCHEME.match(reference) is None


def _parse_hf_reference(reference: str) -> tuple[str, str | None] | None:
    """(dataset, config or None) for ``hf:<dataset>[:<config>]``, None for anything else."""
    if not reference.startswith(HF_PREFIX):
        return None
    dataset, _, config = reference[len(HF_PREFIX):].partition(":")
    return (dataset, config or None) if dataset else None


def handles_hf_dataset(reference: str) -> bool:
    return _parse_hf_reference(reference) is not None


def hf_dataset(reference: str, **options) -> HFDatasetCorpus:
    """The corpus for a reference ``hf:<dataset>[:<config>]``, as typed after ``--corpus``."""
    parsed = _parse_hf_reference(reference)
    if parsed is None:
        raise DihalError(f"corpus {reference!r} is not of the form '{HF_PREFIX}<dataset>[:<config>]'")
    dataset, config = parsed
    return HFDatasetCorpus(dataset, config, **options)


@hookimpl
def register_corpora(register):
    register("stdlib-docs", StdlibDocsCorpus, description=StdlibDocsCorpus.description)
    register(
        "files",
        FilesCorpus,
        handles=handles_files,
        description="a local .txt, .jsonl (field 'text') or .parquet file, or a directory of them, by path",
    )
    register(
        "hf-dataset",
        hf_dataset,
        handles=handles_hf_dataset,
        description=f"any Hugging Face `datasets` dataset, as {HF_PREFIX}<dataset>[:<config>]",
    )
