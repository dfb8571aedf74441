"""The server's own tokenizer wrapper answers exactly as transformers' tokenizer does."""

from __future__ import annotations

import pytest

from pairaudit.refserver.tokenizer import ChatTokenizer
from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model

TEXTS = ["The capital of France is", "  leading spaces and\ttabs\n\nnew lines", "naïve café – 東京 🙂",
         "def f(x):\n    return x ** 2  # comment", "#### 1,234.50", "<|im_start|>user\nhi<|im_end|>"]
CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


@pytest.fixture(scope="module")
def pair():
    transformers = pytest.importorskip("transformers")
    path, _ = resolve_model(EMBEDDED_NAME)
    return ChatTokenizer(path), transformers.AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(pair, text):
    ours, theirs = pair
    for special in (True, False):
        assert ours(text, add_special_tokens=special).input_ids == theirs(text, add_special_tokens=special).input_ids
    ids = theirs(text).input_ids
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert [ours.decode([t]) for t in ids] == [theirs.decode([t]) for t in ids]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_template_matches_transformers(pair, messages):
    ours, theirs = pair
    for gen in (True, False):
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == \
            theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def test_eos_matches(pair):
    ours, theirs = pair
    assert ours.eos_token_id == theirs.eos_token_id == 2
