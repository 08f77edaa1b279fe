"""Model families for parser tests: each family's real chat template and its special tokens.

No weights of those families may be downloaded, so a family here is the default model's
tokenizer with the family's own marker tokens added (special where the family marks them
special, as Mistral's ``[TOOL_CALLS]``), its real chat template (``tests/parsers/
chat_templates``, from llama.cpp) and its BOS/EOS. ``family_tokenizer`` builds the tokenizer;
``family_model_folder`` a tiny random-weight Llama with it, which ``radixgen serve`` loads (the
weights are random: what the model writes is not the family's, what the parsers and the
grammar do with it is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from radixgen.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "parsers" / "chat_templates"


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # the file in TEMPLATES
    bos: str
    eos: str
    special: tuple[str, ...] = ()  # added as special tokens
    plain: tuple[str, ...] = ()  # added as ordinary (non-special) tokens
    tool_format: str = ""  # the tool-call parser the template is detected as
    reasoning: str | None = None  # the reasoning parser detected (None: none)
    ends: tuple[str, ...] = field(default=())  # what ends an assistant turn in the template

    @property
    def template_text(self) -> str:
        return (TEMPLATES / self.template).read_text()


_CHATML = ("<|im_start|>", "<|im_end|>")
_DEEPSEEK = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
_MISTRAL = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[ARGS]",
    "[CALL_ID]",
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "qwen3",
            "Qwen-Qwen3-0.6B.jinja",
            "<|im_start|>",
            "<|im_end|>",
            special=_CHATML,
            plain=("<think>", "</think>", "<tool_call>", "</tool_call>"),
            tool_format="hermes",
            reasoning="qwen3",
            ends=("<|im_end|>",),
        ),
        Family(
            "qwen3-coder",
            "Qwen3-Coder.jinja",
            "<|im_start|>",
            "<|im_end|>",
            special=_CHATML,
            plain=("<tool_call>", "</tool_call>"),
            tool_format="qwen3-coder",
            ends=("<|im_end|>",),
        ),
        Family(
            "llama3",
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "<|begin_of_text|>",
            "<|eot_id|>",
            special=(
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ),
            tool_format="llama3",
            ends=("<|eot_id|>", "<|eom_id|>"),
        ),
        Family(
            "mistral-v3",
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "<s>",
            "</s>",
            special=_MISTRAL,
            tool_format="mistral",
            ends=("</s>",),
        ),
        Family(
            "mistral-v11",
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            "<s>",
            "</s>",
            special=_MISTRAL,
            tool_format="mistral",
            ends=("</s>",),
        ),
        Family(
            "deepseek-v3.1",
            "deepseek-ai-DeepSeek-V3.1.jinja",
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            special=_DEEPSEEK,
            plain=("<think>", "</think>"),
            tool_format="deepseek",
            reasoning="deepseek-r1",
            ends=("<｜end▁of▁sentence｜>",),
        ),
        Family(
            "deepseek-r1",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            special=_DEEPSEEK,
            plain=("<think>", "</think>"),
            tool_format="deepseek",
            reasoning="deepseek-r1",
            ends=("<｜end▁of▁sentence｜>",),
        ),
        Family(
            "lfm2",
            "LFM2-8B-A1B.jinja",
            "<|startoftext|>",
            "<|im_end|>",
            special=(
                "<|startoftext|>",
                *_CHATML,
                "<|tool_call_start|>",
                "<|tool_call_end|>",
                "<|tool_list_start|>",
                "<|tool_list_end|>",
                "<|tool_response_start|>",
                "<|tool_response_end|>",
            ),
            tool_format="pythonic",
            ends=("<|im_end|>",),
        ),
    ]
}


def family_backend(base: Tokenizer, family: Family) -> HFTokenizer:
    """The base tokenizer's backend with the family's marker tokens added."""
    backend = HFTokenizer.from_str(base.backend.to_str())
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in family.special]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.plain])
    return backend


def family_tokenizer(base: Tokenizer, family: Family) -> Tokenizer:
    return Tokenizer(
        family_backend(base, family),
        chat_template=family.template_text,
        bos_token=family.bos,
        eos_token=family.eos,
    )


def save_tiny_llama(dest: Path, backend: HFTokenizer, tokenizer_config: dict) -> Path:
    """A 2-layer random-weight Llama (hidden size 64, GQA 4/2) with ``backend`` as an HF folder
    in ``dest``: a real engine or server whose steps take milliseconds."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,  # long streams (shutdown tests) fit its context
        tie_word_embeddings=True,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(dest, safe_serialization=True)
    backend.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return dest


def family_model_folder(dest: Path, base: Tokenizer, family: Family) -> Path:
    """A tiny random-weight Llama in ``dest`` with ``family``'s tokenizer and template."""
    config = {
        "chat_template": family.template_text,
        "eos_token": family.eos,
        "bos_token": family.bos,
    }
    return save_tiny_llama(dest, family_backend(base, family), config)
