"""The DSL examples run end to end (fast variants) and print their results.

Each runs in its own process with an in-process engine; ``agent_tools.py`` needs a running
server and is exercised by hand (see its docstring).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from lang_testlib import REPO_ROOT, grammar_available

EXAMPLES = [
    ("json_extraction.py", ["--max-tokens", "32"], "'city': 'Madrid'"),
    ("multi_turn_chat.py", ["--max-tokens", "8"], "from the cache]"),
    ("few_shot_classify.py", [], "accuracy "),
    ("tree_of_thought.py", ["--max-tokens", "8", "--branches", "2"], "prompt tokens cached]"),
]


@pytest.mark.parametrize("script, args, expected", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs_and_prints_its_result(script, args, expected):
    if script == "json_extraction.py" and not grammar_available():
        pytest.skip("json_extraction needs radixgen.grammar (grammar engine in progress)")
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout
