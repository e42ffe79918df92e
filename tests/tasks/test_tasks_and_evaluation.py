import pytest
import torch

from topotuner_lab._io.errors import TaskError
from topotuner_lab.tasks.loading import load_task
from topotuner_lab.tasks.metrics import final_number
from topotuner_lab.training.evaluation import classification_accuracy, continuation_logprobs, perplexity
from topotuner_lab.weights.models import build_tiny_model


@pytest.mark.parametrize(
    "task, split, labels",
    [
        ("sst2", "train", {0, 1}),
        ("sst2", "test", {0, 1}),
        ("agnews", "train", {0, 1, 2, 3}),
        ("agnews", "test", {0, 1, 2, 3}),
        ("boolq", "train", {0, 1}),
        ("boolq", "test", {0, 1}),
    ],
)
def test_local_classification_tasks(task, split, labels):
    ds = load_task(task, split, n=200, seed=0)
    assert len(ds) == 200 and ds.column_names == ["prompt", "target", "label"]
    assert set(ds["label"]) == labels
    assert ds[0]["prompt"].endswith(":") and ds[0]["target"].startswith(" ")


def test_gsm8k_and_final_number():
    ds = load_task("gsm8k", "test", n=5)
    assert all(final_number(t) is not None for t in ds["target"])
    assert final_number("so 3,200 + 5 = 3205\n#### 3,205") == "3205"
    assert final_number("no digits") is None


def test_sampling_is_seeded():
    a, b, c = (load_task("sst2", "train", n=20, seed=s)["prompt"] for s in (1, 1, 2))
    assert a == b and a != c


def test_task_errors(tmp_path):
    with pytest.raises(TaskError, match="unknown task 'mnli'"):
        load_task("mnli")
    bad = tmp_path / "bad.tsv"
    bad.write_text("text\tstars\nfine\t5\n")
    with pytest.raises(TaskError, match=r"no column\(s\) \['sentence', 'label'\]"):
        load_task("sst2", source=bad)
    with pytest.raises(TaskError, match="does not exist"):
        load_task("sst2", source=tmp_path / "none.tsv")


@torch.no_grad()
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gpt2"])
def test_single_token_fast_path_equals_full_scoring(name):
    # prompts of many lengths over several batches: length-sorted batching and the last-token-only LM head must give
    # every row what its own unpadded forward gives
    loaded = build_tiny_model(name, seed=0)
    model, tok = loaded.model, loaded.tokenizer
    prompts = [f"Review: {'word ' * k}\nSentiment:" for k in (3, 0, 9, 1, 14, 2, 7, 5, 11)]
    fast = continuation_logprobs(model, tok, prompts, ["a", "b"], batch_size=4)  # one byte token each
    for i, p in enumerate(prompts):
        for j, c in enumerate(["a", "b"]):
            ids = tok(p + c).input_ids
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -2], -1)[ids[-1]]
            assert fast[i, j] == pytest.approx(float(logp), abs=1e-5)


def test_accuracy_and_perplexity_ranges(tiny_llama):
    ds = load_task("sst2", "test", n=8)
    acc = classification_accuracy(tiny_llama.model, tiny_llama.tokenizer, ds, [" negative", " positive"])
    assert 0.0 <= acc <= 1.0
    ppl = perplexity(tiny_llama.model, tiny_llama.tokenizer, ["hello world"] * 3)
    assert 100 < ppl < 2000  # random 258-token byte model: near-uniform
