"""Role markers: the text a model's chat template puts around each message, derived by rendering.

A program's prompt is append-only text, so everything generated so far stays a prefix of the
next call's prompt and the radix cache hits. Role blocks therefore append fixed strings instead
of re-rendering the whole conversation: ``prefix(role) + content + suffix(role)``. The strings
come from ``apply_chat_template`` itself, by rendering conversations around a marker::

    render([system S])                         = sys_prefix  S sys_suffix
    render([system A, user U])      - render([system A])            = user_prefix U user_suffix
    render([system A, user B, assistant X]) - render([system A, user B]) = asst_prefix X asst_suffix
    render([user U])                           = preamble user_prefix U user_suffix

``preamble`` is what the template adds when a conversation does not open with a system message
(SmolLM2 inserts a default system prompt; many templates add nothing). The assistant prefix is
the template's generation prompt, which is what the model was trained to continue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MARK = "RADIXGENROLECONTENT"

Render = Callable[[list[dict], bool], str]  # (messages, add_generation_prompt) -> text


@dataclass(frozen=True)
class RoleMarkers:
    prefixes: dict[str, str]
    suffixes: dict[str, str]
    preamble: str = ""  # before a conversation whose first role is not "system"

    def prefix(self, role: str) -> str:
        return self.prefixes[role]

    def suffix(self, role: str) -> str:
        return self.suffixes[role]

    @classmethod
    def plain(cls) -> RoleMarkers:
        """Readable markers for backends that take messages, not text (``text()`` only)."""
        roles = ("system", "user", "assistant")
        return cls({r: f"{r}: " for r in roles}, {r: "\n" for r in roles})

    @classmethod
    def from_tokenizer(cls, tokenizer) -> RoleMarkers:
        """Derive the markers from ``tokenizer.apply_chat_template``; ``ValueError`` if the
        template cannot be split into per-message pieces (it reorders or merges messages)."""

        def render(messages: list[dict], add_generation_prompt: bool) -> str:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt
            )

        try:
            return derive_markers(render)
        except ValueError:
            raise
        except Exception as exc:  # the template itself refused (e.g. no system role)
            raise ValueError(f"chat template: cannot derive role markers ({exc})") from exc


def derive_markers(render: Render) -> RoleMarkers:
    def msg(role: str, content: str = MARK) -> dict:
        return {"role": role, "content": content}

    system_a, user_b = msg("system", "A"), msg("user", "B")
    sys_pre, sys_suf = _split(render([msg("system")], False), "system")
    user_pre, user_suf = _split(_added(render, [system_a], [msg("user")]), "user")
    asst_pre, asst_suf = _split(_added(render, [system_a, user_b], [msg("assistant")]), "assistant")
    generation_prompt = _added(render, [system_a, user_b], [], add_generation_prompt=True)
    asst_pre = generation_prompt or asst_pre  # continue exactly what the model is prompted with
    preamble, _ = _split(render([msg("user")], False), "user")
    if not preamble.endswith(user_pre):
        raise ValueError(
            "chat template: a conversation opening with a user message does not end in "
            f"the user prefix {user_pre!r}; cannot derive role markers"
        )
    return RoleMarkers(
        prefixes={"system": sys_pre, "user": user_pre, "assistant": asst_pre},
        suffixes={"system": sys_suf, "user": user_suf, "assistant": asst_suf},
        preamble=preamble[: len(preamble) - len(user_pre)],
    )


def _added(
    render: Render, before: list[dict], new: list[dict], add_generation_prompt: bool = False
) -> str:
    """The text that rendering ``before + new`` appends to rendering ``before``."""
    base = render(before, False)
    full = render(before + new, add_generation_prompt)
    if not full.startswith(base):
        raise ValueError(
            "chat template: rendering more messages changes the text of earlier ones; "
            "cannot derive role markers"
        )
    return full[len(base) :]


def _split(text: str, role: str) -> tuple[str, str]:
    if text.count(MARK) != 1:
        raise ValueError(
            f"chat template: the content of a {role} message does not appear exactly once "
            "in the rendered text; cannot derive role markers"
        )
    before, after = text.split(MARK)
    return before, after
