"""A model module read at submit without running it: what its top level binds for
certain, the benefit of the doubt where a module may bind names no reading shows."""

from __future__ import annotations

import pytest

from service.jobs.sources import missing_function, top_level_names

BOUND = """
import keras as k, os.path
from nets import tiny as small
from .layers import block
CONSTANT: int = 3
first, (second, third) = 1, (2, 3)
counter = 0
counter += 1
for looped in range(2):
    pass
with open(__file__) as opened:
    pass
if k:
    def inside_if(p): ...
else:
    class InsideElse: ...
try:
    import torch
except ImportError as missing:
    def fallback(p): ...
finally:
    done = True

def build(params):
    hidden = 1  # a function's own names are not the module's
    return hidden

async def later(params): ...

class Net:
    method_name = 1
"""


def test_every_way_a_top_level_binds_a_name_is_read() -> None:
    names = top_level_names(BOUND)
    assert names is not None
    assert {
        "k", "os", "small", "block", "CONSTANT", "first", "second", "third", "counter", "looped", "opened",
        "inside_if", "InsideElse", "torch", "missing", "fallback", "done", "build", "later", "Net",
    } <= names  # fmt: skip
    assert "hidden" not in names and "method_name" not in names


@pytest.mark.parametrize(
    "source",
    [
        "from nets import *\n",
        "def __getattr__(name):\n    return lambda p: None\n",
        "globals()['build'] = lambda p: None\n",
        "import sys\nsetattr(sys.modules[__name__], 'build', print)\n",
    ],
)
def test_a_module_that_may_bind_unseen_names_gets_the_benefit_of_the_doubt(source: str) -> None:
    assert top_level_names(source) is None
    assert missing_function(source, "build", "nets.py") is None


def test_what_is_missing_is_said_with_the_nearest_name() -> None:
    source = "def build(params): ...\ndef tiny(params): ...\n"
    assert missing_function(source, "build", "nets/tiny.py") is None
    said = "nets/tiny.py has no function 'biuld' (did you mean 'build'?)"
    assert missing_function(source, "biuld", "nets/tiny.py") == said
    assert missing_function(source, "resnet", "nets/tiny.py") == "nets/tiny.py has no function 'resnet'"
    assert missing_function("def build(p)\n", "build", "x.py") == "x.py does not parse: line 1: expected ':'"
