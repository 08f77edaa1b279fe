"""Token-mask grammars: JSON Schema, regex and choices compiled over a tokenizer vocabulary."""
