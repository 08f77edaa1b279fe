"""Model-family output formats: where a model writes its reasoning and its tool calls.

Two registries, one module per model family in each:

- ``reasoning``: the markers around a thinking model's reasoning (``<think>`` ... ``</think>``)
  and whether its output starts inside them (``--reasoning-parser``);
- ``tools``: how a family writes tool calls, how to read them back while they stream, and the
  structural tag that holds strict calls to their schemas in that same format
  (``--tool-call-parser``).

Each registry picks a format from the chat template where the template is unambiguous
(``detect``); the server and the engine then share the one chosen.
"""
