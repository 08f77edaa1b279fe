"""The vocabulary side of a grammar: which tokens may come next.

``vocabulary`` reduces each token id to the bytes it writes; ``table`` holds the same as
numpy arrays for vectorized walks (lengths, byte columns, first-two-byte groups in
lexicographic order); ``index`` computes a lexer state's token mask (candidate groups, the
walk, packing into int32 rows) with ``safe_runs``, the byte patterns whose every token is
allowed without walking it (most of the vocabulary inside a JSON string).
"""
