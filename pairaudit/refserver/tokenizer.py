"""The served model's tokenizer and chat template, without importing transformers.

The server only needs encode/decode and the chat template; the ``tokenizers``
library reads ``tokenizer.json`` directly and jinja2 renders the template the
way transformers does (sandboxed, ``trim_blocks``/``lstrip_blocks``).  Skipping
the transformers import and its tokenizer wrapper halves the server's start
time, which every job that needs a server pays.  ``tests/test_refserver_tokenizer.py``
checks the result against transformers' own tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


@dataclass
class Encoding:
    input_ids: list[int]


class TemplateError(ValueError):
    pass


def _raise(message: str):
    raise TemplateError(message)


class ChatTokenizer:
    def __init__(self, path: Path):
        path = Path(path)
        self.tk = Tokenizer.from_file(str(path / "tokenizer.json"))
        cfg = json.loads((path / "tokenizer_config.json").read_text()) if (path / "tokenizer_config.json").is_file() \
            else {}
        template_file = path / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else cfg.get("chat_template")
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token_id = self.tk.token_to_id(self.eos_token) if self.eos_token else None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(template) if template else None

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(self.tk.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self.tk.id_to_token(i) for i in ids]

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, add_generation_prompt: bool = False,
                            **kwargs) -> str:
        if tokenize:
            raise ValueError("apply_chat_template renders text only; encode it with __call__")
        if self.template is None:
            raise TemplateError("the model has no chat template")
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)


def _token_text(token) -> str | None:
    # tokenizer_config.json stores special tokens either as text or as {"content": ...}
    if isinstance(token, dict):
        return token.get("content")
    return token


class IncrementalText:
    """The text of a growing list of token ids, decoding only its last few tokens per new token.

    vLLM's scheme: keep two offsets into the ids, decode ``ids[prefix:]`` and
    ``ids[prefix:read]`` and append the difference.  Decoding from a few tokens
    back (not from the new token alone) keeps what a tokenizer's decoder does
    at a word start; a text that ends in U+FFFD (half a UTF-8 character) is held
    back until the next token completes it.  So each new token costs two small
    decodes where re-decoding the whole output costs O(length), and ``text`` is
    the whole decode less a trailing half character.
    """

    def __init__(self, tok, skip_special_tokens: bool = True):
        self.tok = tok
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0
        self.text = ""

    def extend(self, ids: list[int]) -> str:
        """``ids`` is every token so far (what was seen before must be its start); the text so far."""
        for token in ids[len(self.ids):]:
            self.ids.append(token)
            before = self.tok.decode(self.ids[self.prefix:self.read], skip_special_tokens=self.skip)
            after = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=self.skip)
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self.text += after[len(before):]
                self.prefix, self.read = self.read, len(self.ids)
        return self.text
