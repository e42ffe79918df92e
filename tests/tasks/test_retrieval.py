import json

import numpy as np
import pytest

from topotuner_lab._io.errors import ParameterError, TaskError
from topotuner_lab.tasks.loading import data_dir
from topotuner_lab.tasks.retrieval import (
    BeirSplit,
    bm25_candidates,
    candidate_recall,
    ranking_rows,
    read_beir,
)
from topotuner_lab.training.evaluation import continuation_logprobs
from topotuner_lab.training.ranking import ranking_example_scores, rerank_scores
from topotuner_lab.weights.models import build_tiny_model

DOCS = {
    "d1": ("Aspirin and the heart", "Daily aspirin lowers the risk of heart attacks in adults."),
    "d2": ("Coffee", "Coffee consumption and sleep quality in students."),
    "d3": ("Vitamin D", "Vitamin D supplements do not prevent bone fractures in older people."),
    "d4": ("Exercise", "Running improves mood and lowers blood pressure."),
}
QUERIES = {"q1": "aspirin prevents heart attacks", "q2": "vitamin D prevents fractures", "q3": "coffee and sleep"}


def _write_beir(folder, qrels_lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for doc, (title, text) in DOCS.items():
            f.write(json.dumps({"_id": doc, "title": title, "text": text}) + "\n")
    with open(folder / "queries.jsonl", "w") as f:
        for query, text in QUERIES.items():
            f.write(json.dumps({"_id": query, "text": text, "metadata": {}}) + "\n")
    (folder / "qrels").mkdir(exist_ok=True)
    lines = qrels_lines or ["q1\td1\t1", "q2\td3\t1", "q2\td4\t0"]
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(lines) + "\n")
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td2\t1\n")
    return folder


def test_read_beir_tiny_folder(tmp_path):
    split = read_beir(_write_beir(tmp_path / "beir"), "test")
    assert isinstance(split, BeirSplit)
    assert split.corpus["d1"] == {"title": DOCS["d1"][0], "text": DOCS["d1"][1]} and len(split.corpus) == 4
    assert split.queries == {"q1": QUERIES["q1"], "q2": QUERIES["q2"]}  # only the judged queries
    assert split.qrels == {"q1": {"d1": 1}, "q2": {"d3": 1, "d4": 0}}
    assert list(read_beir(tmp_path / "beir", "train").queries) == ["q3"]
    rows = ranking_rows(split, {"q1": ["d2", "d1"], "q2": ["d3"]})
    assert [r["query_id"] for r in rows] == ["q1", "q2"] and rows[0]["query"] == QUERIES["q1"]
    assert rows[0]["candidates"] == [
        {"id": "d2", "title": DOCS["d2"][0], "text": DOCS["d2"][1]},
        {"id": "d1", "title": DOCS["d1"][0], "text": DOCS["d1"][1]},
    ]
    assert rows[1]["qrels"] == {"d3": 1, "d4": 0}
    with pytest.raises(TaskError, match="no candidate list for the query 'q2'"):
        ranking_rows(split, {"q1": ["d1"]})


def test_read_beir_errors(tmp_path):
    folder = _write_beir(tmp_path / "beir")
    with pytest.raises(TaskError, match=r"qrels file .*dev\.tsv does not exist") as err:
        read_beir(folder, "dev")
    assert "test, train" in err.value.fix
    with pytest.raises(TaskError, match="BEIR folder .* does not exist"):
        read_beir(tmp_path / "nowhere", "test")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(TaskError, match=r"queries\.jsonl does not exist"):
        read_beir(folder, "test")

    bad = _write_beir(tmp_path / "bad_json")
    with open(bad / "corpus.jsonl", "a") as f:
        f.write('{"_id": "d9", "title": "x", "text": \n')
    with pytest.raises(TaskError, match=r"line 5 of .*corpus\.jsonl is not JSON") as err:
        read_beir(bad, "test")
    assert "one JSON object per line" in err.value.fix

    no_text = _write_beir(tmp_path / "no_text")
    with open(no_text / "queries.jsonl", "a") as f:
        f.write('{"_id": "q9"}\n')
    with pytest.raises(TaskError, match=r"line 4 of .*queries\.jsonl has no string field 'text'"):
        read_beir(no_text, "test")

    with pytest.raises(TaskError, match=r"line 3 of .*test\.tsv has 2 field\(s\), not 3"):
        read_beir(_write_beir(tmp_path / "short", ["q1\td1\t1", "q2\td3"]), "test")
    with pytest.raises(TaskError, match=r"line 2 of .*test\.tsv has the score 'yes', not an integer"):
        read_beir(_write_beir(tmp_path / "word", ["q1\td1\tyes"]), "test")
    with pytest.raises(TaskError, match="judges the query 'q7'"):
        read_beir(_write_beir(tmp_path / "query", ["q7\td1\t1"]), "test")
    with pytest.raises(TaskError, match="judges the document 'd7'"):
        read_beir(_write_beir(tmp_path / "doc", ["q1\td7\t1"]), "test")


def test_bm25_ranks_the_matching_document_first_and_is_deterministic(tmp_path):
    split = read_beir(_write_beir(tmp_path / "beir"), "test")
    queries = {**QUERIES, "q4": "the of and", "q5": "zebra"}  # stop words only / an unknown word: all ties
    first = bm25_candidates(split.corpus, queries, k=3)
    assert first["q1"][0] == "d1" and first["q2"][0] == "d3" and first["q3"][0] == "d2"
    assert all(len(docs) == 3 for docs in first.values())
    assert first["q4"] == first["q5"] == ["d1", "d2", "d3"]  # ties broken by document id
    assert bm25_candidates(split.corpus, queries, k=3) == first
    shuffled = {doc: split.corpus[doc] for doc in reversed(list(split.corpus))}
    assert bm25_candidates(shuffled, dict(reversed(list(queries.items()))), k=3) == first
    assert len(bm25_candidates(split.corpus, queries, k=50)["q1"]) == 4  # k past the corpus: every document
    assert candidate_recall(first, split.qrels, k=1) == 1.0
    assert candidate_recall({"q1": ["d1"], "q2": ["d1"]}, split.qrels) == 0.5
    with pytest.raises(ParameterError, match="k=0"):
        bm25_candidates(split.corpus, queries, k=0)


def test_bm25_recall_on_scifact():
    try:
        folder = data_dir() / "scifact"
    except TaskError:
        pytest.skip("no offline data folder (shared/data)")
    if not folder.is_dir():
        pytest.skip("no shared/data/scifact")
    split = read_beir(folder, "test")
    assert len(split.corpus) == 5183 and len(split.queries) == 300
    candidates = bm25_candidates(split.corpus, split.queries, k=50)
    recall = {k: candidate_recall(candidates, split.qrels, k) for k in (10, 20, 50)}
    assert recall[10] == pytest.approx(0.818, abs=0.01)  # the module docstring's numbers
    assert recall[20] > 0.84 and recall[50] > 0.87
    train = read_beir(folder, "train")
    assert sum(rel > 0 for docs in train.qrels.values() for rel in docs.values()) == 919


def _rows():
    docs = [
        {"id": f"d{i}", "title": f"Title {i}", "text": "word " * (3 * i + 1) + f"end {i}."} for i in range(7)
    ]  # prompts of many lengths
    return [
        {"query_id": "a", "query": "does aspirin work", "candidates": docs[:5], "qrels": {"d1": 1}},
        {"query_id": "b", "query": "x", "candidates": docs[3:], "qrels": {"d6": 1, "d9": 1}},
        {"query_id": "c", "query": "a long query " * 3, "candidates": docs[::2], "qrels": {}},
    ]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
@pytest.mark.parametrize("max_length", [256, 24])  # 24: prompts cut from the left, one target cut too
def test_rerank_scores_equal_unbatched_continuation_logprobs(name, max_length):
    loaded = build_tiny_model(name, seed=0)
    model, tok = loaded.model, loaded.tokenizer
    rows = _rows()
    doc_to_prompt = lambda d: f"Document: {d['title']}. {d['text']}\nQuery:"
    query_to_target = lambda q: " " + q
    scores = rerank_scores(model, tok, rows, doc_to_prompt, query_to_target, max_length=max_length, batch_size=4)
    assert [list(s) for s in scores] == [[d["id"] for d in row["candidates"]] for row in rows]
    for row, got in zip(rows, scores):
        for doc in row["candidates"]:
            want = continuation_logprobs(
                model, tok, [doc_to_prompt(doc)], [query_to_target(row["query"])], max_length=max_length, batch_size=1
            )[0, 0]
            assert np.isclose(got[doc["id"]], want, rtol=1e-5, atol=1e-4), (row["query_id"], doc["id"])


def test_rerank_scores_one_batch_equals_many(tiny_llama):
    rows = _rows()
    args = (tiny_llama.model, tiny_llama.tokenizer, rows, lambda d: d["text"], lambda q: " " + q)
    one = rerank_scores(*args, batch_size=1)
    many = rerank_scores(*args, batch_size=64, progress=True)
    for a, b in zip(one, many):
        assert a.keys() == b.keys() and np.allclose(list(a.values()), list(b.values()), atol=1e-4)
    empty = rerank_scores(*args[:4], lambda q: "")
    assert all(v == 0.0 for s in empty for v in s.values())


def test_ranking_example_scores_of_a_scorer_preferring_the_relevant_document():
    rows = _rows()
    perfect = [
        {d["id"]: float(rel) for d, rel in ((d, row["qrels"].get(d["id"], 0)) for d in row["candidates"])}
        for row in rows
    ]
    scores = ranking_example_scores(rows, perfect)
    assert set(scores) == {"ndcg@10", "mrr@10"}
    assert scores["ndcg@10"][0] == 1.0 and scores["mrr@10"][0] == 1.0
    # row b: d6 is first, but the judged d9 is not among the candidates: nDCG < 1, MRR = 1
    assert scores["mrr@10"][1] == 1.0 and 0.0 < scores["ndcg@10"][1] < 1.0
    assert scores["ndcg@10"][2] == 0.0 and scores["mrr@10"][2] == 0.0  # no relevant document: 0.0
    worst = [{d: -s for d, s in run.items()} for run in perfect]
    low = ranking_example_scores(rows, worst)
    assert low["mrr@10"][0] == pytest.approx(1 / 5) and low["ndcg@10"][0] < 1.0
    by_query = ranking_example_scores(rows, {"a": perfect[0]})  # a mapping by query id; the missing ones score 0
    assert by_query["ndcg@10"].tolist() == [1.0, 0.0, 0.0]


def test_beir_split_is_frozen():
    split = BeirSplit(corpus={}, queries={}, qrels={})
    with pytest.raises(AttributeError):
        split.queries = {}  # type: ignore[misc]


# ------------------------------------------------------------------------- one tie rule for every ranking metric

#: candidates in the first stage's order, chosen so that it differs from document-id order both ways
TIED = {"b": 0.0, "c": 0.0, "a": 0.0}


@pytest.mark.parametrize("relevant, place", [("b", 1), ("c", 2), ("a", 3)])
def test_ndcg_and_mrr_break_ties_alike_by_the_candidates_order(relevant, place):
    """All candidates score 0: each metric ranks them b, c, a (the given order), not by id ascending or descending.

    Before, nDCG (trec_eval: id descending, c b a) and MRR (ir-measures' msmarco: id ascending, a b c) disagreed:
    relevant ``a`` scored nDCG 0.5 and MRR 1.0.
    """
    from topotuner_lab.tasks.metrics import ranking_scores

    record = ranking_scores({"q": TIED}, {"q": {relevant: 1}}).set_index("query").loc["q"]
    assert record["mrr@10"] == pytest.approx(1 / place)
    assert record["ndcg@10"] == pytest.approx(1 / np.log2(place + 1))
    rows = [{"query_id": "q", "qrels": {relevant: 1}, "candidates": [{"id": d} for d in TIED]}]
    per_row = ranking_example_scores(rows, [TIED])  # the reranked task's path: a constant scorer keeps BM25's order
    assert per_row["mrr@10"][0] == record["mrr@10"] and per_row["ndcg@10"][0] == record["ndcg@10"]


def test_partial_ties_and_nan_scores_follow_the_same_rule():
    from topotuner_lab.tasks.metrics import ranking_scores

    run = {"q": {"n": float("nan"), "b": 0.5, "x": 1.0, "a": 0.5}}  # ranked x, b, a, n
    for relevant, place in (("x", 1), ("b", 2), ("a", 3), ("n", 4)):
        record = ranking_scores(run, {"q": {relevant: 1}}).set_index("query").loc["q"]
        assert record["mrr@10"] == pytest.approx(1 / place)
        assert record["ndcg@10"] == pytest.approx(1 / np.log2(place + 1))
