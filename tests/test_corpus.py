"""Corpora: the split, tokenisation, packing, and the three built-in corpora."""

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from dihal_builtin.corpora import (
    FilesCorpus,
    HFDatasetCorpus,
    StdlibDocsCorpus,
    handles_files,
    handles_hf_dataset,
    hf_dataset,
    register_corpora,
)
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

import dihal_bench.api.corpus as corpus_module
from dihal_bench.api.corpus import (
    Corpus,
    Document,
    pack,
    split_of,
    split_stats,
    tokenize_documents,
)
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import load_corpus


class ListCorpus(Corpus):
    name = "list"
    description = "documents given in a list"

    def __init__(self, documents, **options):
        super().__init__(**options)
        self._documents = documents

    def documents(self):
        return list(self._documents)


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level tokenizer: "t<i>" is token i, anything else is [UNK]=0; it would add [BOS]=100."""
    vocab = {"[UNK]": 0, **{f"t{i}": i for i in range(1, 100)}, "[BOS]": 100}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 100)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="[BOS]", model_max_length=4)


def words(*ids):
    return " ".join(f"t{i}" for i in ids)


# --- split -----------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_near_the_fractions():
    documents = [Document(f"doc-{i}", "x") for i in range(3000)]
    corpus = ListCorpus(documents)
    parts = {name: corpus.split(name) for name in ("train", "validation", "test")}
    ids = {name: {d.id for d in part} for name, part in parts.items()}
    assert sum(map(len, ids.values())) == len(documents)
    assert set.union(*ids.values()) == {d.id for d in documents}
    assert abs(len(ids["train"]) / 3000 - 0.8) < 0.03
    assert abs(len(ids["validation"]) / 3000 - 0.1) < 0.02
    assert abs(len(ids["test"]) / 3000 - 0.1) < 0.02
    assert corpus.split("valid") == parts["validation"]
    assert ListCorpus(documents).split("test") == parts["test"]
    # sha256 of the id, not hash(): known answers that hold in every process and on every machine
    assert [split_of(f"doc-{i}") for i in (0, 3, 9)] == ["train", "test", "validation"]  # u = 0.739, 0.941, 0.804
    assert {split_of(d.id) for d in parts["validation"]} == {"validation"}


def test_split_does_not_depend_on_document_order():
    documents = [Document(f"doc-{i}", f"text {i}") for i in range(200)]
    forward, backward = ListCorpus(documents), ListCorpus(documents[::-1])
    for name in ("train", "validation", "test"):
        assert set(forward.split(name)) == set(backward.split(name))
        assert backward.split(name) == forward.split(name)[::-1]  # corpus order is kept


def test_split_fractions_are_configurable_and_checked():
    documents = [Document(f"doc-{i}", "x") for i in range(50)]
    everything_trains = ListCorpus(documents, split_fractions=(1.0, 0.0, 0.0))
    assert len(everything_trains.split("train")) == 50
    assert everything_trains.split("test") == []
    with pytest.raises(DihalError, match="summing to 1"):
        ListCorpus(documents, split_fractions=(0.8, 0.3, 0.1))
    with pytest.raises(DihalError, match="non-negative"):
        ListCorpus(documents, split_fractions=(1.2, -0.1, -0.1))


def test_split_errors_name_the_problem():
    with pytest.raises(DihalError, match="unknown split 'dev'"):
        ListCorpus([Document("a", "x")]).split("dev")
    with pytest.raises(DihalError, match="corpus 'list' has no documents"):
        ListCorpus([]).split("train")


# --- tokenise and pack ---------------------------------------------------------------------


def test_tokenize_documents_adds_no_special_tokens_and_keeps_order(tokenizer, monkeypatch):
    assert tokenizer("t1")["input_ids"] == [100, 1]  # the tokenizer would add [BOS] by default
    monkeypatch.setattr(corpus_module, "TOKENIZE_BATCH", 2)  # 5 documents -> 3 batches
    documents = [Document(str(i), words(*range(1, i + 2))) for i in range(5)]
    documents[2] = Document("2", "t7 hello t8")
    assert tokenize_documents(documents, tokenizer) == [[1], [1, 2], [7, 0, 8], [1, 2, 3, 4], [1, 2, 3, 4, 5]]


def test_pack_cuts_each_document_into_windows_and_drops_tails():
    token_lists = [[1, 2, 3, 4, 5, 6, 7], [11, 12], [21, 22, 23], [31, 32, 33, 34, 35, 36, 37, 38]]
    packed = pack(token_lists, 3)
    assert packed.dtype == torch.long
    expected = [[1, 2, 3], [4, 5, 6], [21, 22, 23], [31, 32, 33], [34, 35, 36]]
    assert packed.tolist() == expected  # 7 and 37, 38 dropped; [11, 12] too short
    # no window mixes two documents (their ids are in different decades)
    assert all(len({token // 10 for token in row}) == 1 for row in packed.tolist())
    assert pack(token_lists, 8).tolist() == [[31, 32, 33, 34, 35, 36, 37, 38]]


def test_pack_errors_name_the_split_and_longest_document():
    with pytest.raises(DihalError, match=r"^sequence length 9 exceeds every document in the validation split \(longest: 8 tokens\)$"):
        pack([[1] * 8, [2] * 3], 9, split_name="validation")
    with pytest.raises(DihalError, match="no documents in the test split"):
        pack([], 4, split_name="test")
    with pytest.raises(DihalError, match="at least 1"):
        pack([[1, 2]], 0)


def test_split_stats_match_pack(tokenizer):
    documents = [Document(f"doc-{i}", words(*range(1, 2 + i % 9))) for i in range(40)]
    corpus = ListCorpus(documents)
    stats = split_stats(corpus, tokenizer, seq_len=3)
    assert sum(s["documents"] for s in stats.values()) == 40
    for name, s in stats.items():
        token_lists = tokenize_documents(corpus.split(name), tokenizer)
        assert s["tokens"] == sum(map(len, token_lists))
        assert s["sequences"] == pack(token_lists, 3).shape[0]
        assert s["packed_tokens"] == 3 * s["sequences"]
        assert s["characters"] == sum(len(d.text) for d in corpus.split(name))


# --- files ---------------------------------------------------------------------------------


def test_files_corpus_reads_a_directory_of_txt_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.txt").write_text("first file\n\nwith two paragraphs\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("not a corpus file", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    records = [{"text": "line one", "meta": 1}, {"text": ""}, {"text": "line three"}]
    (tmp_path / "sub" / "b.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n\n", encoding="utf-8")
    pq.write_table(pa.table({"text": ["row zero", None, "row two"], "n": [0, 1, 2]}), tmp_path / "sub" / "c.parquet")

    documents = FilesCorpus(tmp_path).documents()
    assert [(d.id, d.text) for d in documents] == [
        ("a.txt", "first file\n\nwith two paragraphs\n"),
        ("sub/b.jsonl:1", "line one"),
        ("sub/b.jsonl:3", "line three"),
        ("sub/c.parquet:0", "row zero"),
        ("sub/c.parquet:2", "row two"),
    ]
    assert [d.id for d in FilesCorpus(tmp_path / "sub" / "b.jsonl").documents()] == ["b.jsonl:1", "b.jsonl:3"]


def test_files_corpus_uses_the_configured_text_field(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"body": "some prose"}) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"body": ["more prose"]}), tmp_path / "d.parquet")
    texts = [d.text for d in FilesCorpus(tmp_path, text_field="body").documents()]
    assert texts == ["some prose", "more prose"]


def test_files_corpus_errors_name_the_file(tmp_path):
    with pytest.raises(DihalError, match="does not exist"):
        FilesCorpus(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(DihalError, match=r"data\.csv has unsupported type '\.csv'"):
        FilesCorpus(tmp_path / "data.csv")
    with pytest.raises(DihalError, match="holds no .txt, .jsonl, .parquet files"):
        FilesCorpus(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DihalError, match=r"bad\.jsonl:2: no field 'text' \(fields: body\)"):
        FilesCorpus(tmp_path / "bad.jsonl").documents()
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DihalError, match=r"broken\.jsonl:2: not valid JSON"):
        FilesCorpus(tmp_path / "broken.jsonl").documents()
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "t.parquet")
    with pytest.raises(DihalError, match=r"t\.parquet has no column 'text' \(columns: body\)"):
        FilesCorpus(tmp_path / "t.parquet").documents()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("\n")
    with pytest.raises(DihalError, match="has no documents"):
        FilesCorpus(tmp_path / "empty").split("train")


# --- Hugging Face datasets (the network code path, exercised on local files) -----------------


def test_hf_dataset_corpus_loads_json_and_parquet(tmp_path):
    rows = [{"text": f"document number {i}"} for i in range(6)]
    rows[2] = {"text": "   "}
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(map(json.dumps, rows)) + "\n", encoding="utf-8")
    parquet = tmp_path / "data.parquet"
    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), parquet)

    expected = [(f"row:{i}", f"document number {i}") for i in (0, 1, 3, 4, 5)]
    for builder, files in (("json", jsonl), ("parquet", parquet)):
        corpus = HFDatasetCorpus(builder, data_files=str(files), cache_dir=tmp_path / "cache")
        assert [(d.id, d.text) for d in corpus.documents()] == expected
    first_three = HFDatasetCorpus(
        "json", data_files=str(jsonl), max_documents=3, streaming=True, cache_dir=tmp_path / "cache"
    )
    assert [d.id for d in first_three.documents()] == ["row:0", "row:1", "row:3"]


def test_hf_dataset_corpus_errors(tmp_path):
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DihalError, match=r"dataset hf:json has no column 'text' \(columns: body\)"):
        HFDatasetCorpus("json", data_files=str(jsonl), cache_dir=tmp_path / "cache").documents()
    with pytest.raises(DihalError, match="cannot load dataset hf:json"):
        HFDatasetCorpus("json", data_files=str(tmp_path / "missing.jsonl"), cache_dir=tmp_path / "cache").documents()


# --- stdlib-docs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stdlib_documents():
    side_effect_modules = [m for m in ("antigravity", "this") if m not in sys.modules]
    documents = StdlibDocsCorpus().documents()
    assert not [m for m in side_effect_modules if m in sys.modules], "stdlib-docs imported a module"
    return documents


def test_stdlib_docs_is_english_prose_from_topics_and_module_docstrings(stdlib_documents):
    ids = [d.id for d in stdlib_documents]
    assert len(ids) > 100
    assert ids == sorted(set(ids))
    assert "topic:assignment:000" in ids and "module:json" in ids
    assert max(len(d.text) for d in stdlib_documents if d.id.startswith("topic:")) < 2 * 2000 + 10_000
    assert min(len(d.text) for d in stdlib_documents) >= 200
    text = " ".join(d.text for d in stdlib_documents).lower().split()
    assert text.count("the") / len(text) > 0.03  # English: "the" is ~5% of words


def test_stdlib_docs_is_deterministic_and_splits(stdlib_documents):
    again = StdlibDocsCorpus()  # reads the documents afresh
    for name in ("validation", "test"):
        assert again.split(name) == [d for d in stdlib_documents if split_of(d.id) == name]
        assert len(again.split(name)) > 5


# --- resolution and registration ---------------------------------------------------------------


def test_load_corpus_maps_each_accepted_form(tmp_path):
    assert isinstance(load_corpus("stdlib-docs"), StdlibDocsCorpus)
    (tmp_path / "a.txt").write_text("hello")
    assert isinstance(load_corpus(str(tmp_path)), FilesCorpus)
    assert load_corpus(str(tmp_path / "a.txt"), text_field="body").text_field == "body"
    hub = load_corpus("hf:allenai/dolma:v1_7", max_documents=10)
    assert (hub.path, hub.config, hub.max_documents, hub.name) == ("allenai/dolma", "v1_7", 10, "hf:allenai/dolma:v1_7")
    assert load_corpus("hf:wikitext").config is None
    assert load_corpus("hf:data.jsonl").path == "data.jsonl"  # a scheme prefix keeps `files` out of it
    with pytest.raises(DihalError, match="does not exist"):
        load_corpus(str(tmp_path / "missing.jsonl"))
    for unknown in ("wikipedia", "hf:", "hf::config"):  # the last two name no dataset
        with pytest.raises(DihalError, match=rf"^unknown corpus '{unknown}'; known: files, hf-dataset, markov, stdlib-docs; "
                                             r"or a reference handled by .*hf:<dataset>\[:<config>\]"):
            load_corpus(unknown)


def test_builtin_corpus_handlers():
    assert handles_files("notes/a.txt") and handles_files("C:/data/a.parquet")  # a drive letter is no scheme
    assert not handles_files("s3:bucket/a.txt") and not handles_files("stdlib-docs")
    assert handles_hf_dataset("hf:wikitext") and handles_hf_dataset("hf:wikitext:wikitext-2-raw-v1")
    assert not handles_hf_dataset("hf:") and not handles_hf_dataset("wikitext")
    with pytest.raises(DihalError, match=r"^corpus 'wikitext' is not of the form 'hf:<dataset>\[:<config>\]'$"):
        hf_dataset("wikitext")


def test_register_corpora_registers_the_three_factories():
    registered = {}
    register_corpora(lambda name, factory, **meta: registered.update({name: (factory, meta)}))
    assert {name: factory for name, (factory, _) in registered.items()} == {
        "stdlib-docs": StdlibDocsCorpus,
        "files": FilesCorpus,
        "hf-dataset": hf_dataset,
    }
    assert all(meta["description"] for _, meta in registered.values())
    assert {name: meta.get("handles") for name, (_, meta) in registered.items()} == {
        "stdlib-docs": None, "files": handles_files, "hf-dataset": handles_hf_dataset,
    }
