"""lm-eval's ``local-completions`` model (unmodified) against the live server's /v1/completions:
a multiple-choice task (loglikelihood: ``max_tokens`` 1 with ``echo`` and prompt logprobs) and a
generate_until task, both tiny local tasks written into tmp_path. Nothing reaches a model hub or
a dataset hub: the documents are a local JSON-lines file (datasets' packaged json builder) and
the tokenizer is the default model's, saved as a local HF folder."""

from __future__ import annotations

import json
import math

import pytest
from clients_testlib import API_KEY, MODEL

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-eval is not installed (pip install -e '.[dev]')"
)

DOCS = [
    {
        "question": "What color is the sky on a clear day?",
        "choices": ["blue", "green"],
        "answer": 0,
    },
    {"question": "How many legs does a cat have?", "choices": ["four", "seven"], "answer": 0},
    {"question": "What is 2 + 2?", "choices": ["three", "four"], "answer": 1},
]
PROMPT = '"Question: {{question}}\\nAnswer:"'


def _task(name: str, docs: str, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {docs}\n"
        f"test_split: test\ndoc_to_text: {PROMPT}\n{body}"
    )


@pytest.fixture
def tasks(tmp_path, tokenizer, monkeypatch):
    """The two task YAMLs and the tokenizer folder in tmp_path; hubs switched off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)  # local-completions sends it as the bearer
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "rg_mc.yaml").write_text(
        _task(
            "rg_mc",
            docs,
            'output_type: multiple_choice\ndoc_to_choice: "{{choices}}"\ndoc_to_target: answer\n'
            "metric_list:\n  - metric: acc\n",
        )
    )
    (tmp_path / "rg_gen.yaml").write_text(
        _task(
            "rg_gen",
            docs,
            'output_type: generate_until\ndoc_to_target: "{{choices[answer]}}"\n'
            'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n'
            "metric_list:\n  - metric: exact_match\n    aggregation: mean\n"
            "    higher_is_better: true\n",
        )
    )
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"})
    )
    return tmp_path


@pytest.mark.slow
def test_loglikelihood_and_generate_until(server_url, tasks):
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{server_url}/v1/completions",
            "model": MODEL,
            "tokenizer": str(tasks / "tokenizer"),
            "tokenizer_backend": "huggingface",
            "max_retries": 1,
        },
        tasks=["rg_mc", "rg_gen"],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
    )
    results = out["results"]
    assert 0.0 <= results["rg_mc"]["acc,none"] <= 1.0
    assert 0.0 <= results["rg_gen"]["exact_match,none"] <= 1.0
    for sample in out["samples"]["rg_mc"]:  # one (loglikelihood, is_greedy) per choice
        scores = [loglik for loglik, _ in sample["filtered_resps"]]
        assert len(scores) == 2 and all(math.isfinite(s) and s < 0 for s in scores)
    sky = out["samples"]["rg_mc"][0]["filtered_resps"]
    assert sky[0][0] > sky[1][0]  # the real model finds "blue" likelier than "green"
    answers = [sample["filtered_resps"][0] for sample in out["samples"]["rg_gen"]]
    assert all(isinstance(a, str) and a.strip() and "\n" not in a for a in answers)
