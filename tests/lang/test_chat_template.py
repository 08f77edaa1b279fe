"""Role markers derived from a chat template reproduce ``apply_chat_template`` exactly."""

from __future__ import annotations

import pytest

from radixgen.lang.chat_template import RoleMarkers, derive_markers


def render_with(markers: RoleMarkers, messages: list[dict]) -> str:
    text = "" if messages[0]["role"] == "system" else markers.preamble
    return text + "".join(
        markers.prefix(m["role"]) + m["content"] + markers.suffix(m["role"]) for m in messages
    )


@pytest.mark.parametrize(
    "roles",
    [
        ["system", "user", "assistant"],
        ["user", "assistant", "user", "assistant"],
        ["system", "user", "assistant", "user"],
    ],
)
def test_markers_reproduce_the_default_models_template(tokenizer, roles):
    markers = RoleMarkers.from_tokenizer(tokenizer)
    messages = [{"role": r, "content": f"message {i} of {r}"} for i, r in enumerate(roles)]
    assert render_with(markers, messages) == tokenizer.apply_chat_template(
        messages, add_generation_prompt=False
    )
    prompt = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True)
    assert prompt == render_with(markers, messages[:2]) + markers.prefix("assistant")


def test_smollm2_markers_are_chatml_with_a_default_system_prompt(tokenizer):
    markers = RoleMarkers.from_tokenizer(tokenizer)
    assert (
        markers.prefix("user") == "<|im_start|>user\n"
        and markers.suffix("assistant") == "<|im_end|>\n"
    )
    assert markers.preamble.startswith("<|im_start|>system\n")


def test_a_template_that_rewrites_earlier_messages_is_refused():
    def render(messages, add_generation_prompt):  # puts the message count first: not prefix-stable
        return f"{len(messages)}|" + "".join(f"<{m['role']}>{m['content']}</>" for m in messages)

    with pytest.raises(
        ValueError, match="rendering more messages changes the text of earlier ones"
    ):
        derive_markers(render)


def test_a_template_without_default_system_has_no_preamble():
    def render(messages, add_generation_prompt):
        text = "".join(f"[{m['role']}]{m['content']}[/]" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "")

    markers = derive_markers(render)
    assert markers.preamble == "" and markers.prefix("assistant") == "[assistant]"
