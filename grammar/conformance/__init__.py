"""Conformance support for tests and ``benchmarks/grammar_coverage.py``.

``corpus`` loads labelled JSON Schema corpora (MaskBench, the JSON-Schema-Test-Suite),
compiles every schema and judges each instance as the grammar writes it: a valid one must
be accepted, an invalid one rejected, a refusal only costs coverage. ``tokens`` is the
token-level checker: it walks the tokenizer's ids through a matcher instead of a regex.
"""
