"""vLLM's OpenAI-compatible request surface: validation, prompts, response bodies (no torch, no HTTP).

The API process (:mod:`.frontend`) parses a request with this, sends the
engine process the prompt's token ids and the sampling parameters, and builds
the response from what comes back.  A request here is anything with the
fields of :class:`.frontend.Stream` (``prompt``, ``output``, ``emitted``,
``finish_reason``, ``stop_reason``, ``prompt_logprobs``).  Field names,
response shapes and the error contract follow vLLM's OpenAI server: HTTP 400
with ``{"error": {"message", "type", "param", "code"}}`` for a bad request,
404 for an unknown model.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from .protocol import SamplingParams

MAX_LOGPROBS = 20
SPECIAL_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class ApiError(Exception):
    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(self.status, "InternalServerError")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


# field -> (accepted python types, description used in the message)
_NUM = (int, float)
FIELD_TYPES = {
    "model": ((str,), "a string"),
    "temperature": (_NUM, "a number"),
    "top_p": (_NUM, "a number"),
    "top_k": ((int,), "an integer"),
    "min_p": (_NUM, "a number"),
    "seed": ((int,), "an integer"),
    "max_tokens": ((int,), "an integer"),
    "max_completion_tokens": ((int,), "an integer"),
    "min_tokens": ((int,), "an integer"),
    "stop": ((str, list), "a string or a list of strings"),
    "stop_token_ids": ((list,), "a list of integers"),
    "ignore_eos": ((bool,), "a boolean"),
    "prompt_logprobs": ((int,), "an integer"),
    "return_tokens_as_token_ids": ((bool,), "a boolean"),
    "cache_salt": ((str,), "a string"),
    "stream": ((bool,), "a boolean"),
    "stream_options": ((dict,), "an object"),
    "n": ((int,), "an integer"),
    "echo": ((bool,), "a boolean"),
    "skip_special_tokens": ((bool,), "a boolean"),
    "chat_template_kwargs": ((dict,), "an object"),
    "add_generation_prompt": ((bool,), "a boolean"),
    "top_logprobs": ((int,), "an integer"),
    "presence_penalty": (_NUM, "a number"),
    "frequency_penalty": (_NUM, "a number"),
    "repetition_penalty": (_NUM, "a number"),
    "priority": ((int,), "an integer"),
    "user": ((str,), "a string"),
}


def check_types(body: dict, extra: dict) -> None:
    types = {**FIELD_TYPES, **extra}
    for key, value in body.items():
        if value is None or key not in types:
            continue
        accepted, desc = types[key]
        # bool is an int in Python; JSON true is never a valid integer or number here
        if isinstance(value, bool) and bool not in accepted:
            raise ApiError(f"{key}: expected {desc}, got {json.dumps(value)}", param=key)
        if not isinstance(value, accepted):
            raise ApiError(f"{key}: expected {desc}, got {type(value).__name__} {json.dumps(value)[:80]}", param=key)


# An API key, as vLLM's --api-key / VLLM_API_KEY guards it: the variable the server reads it from (the
# audit sets a fresh one per start, ``serving.launch``); only paths under these prefixes need it, so
# /health, /metrics, /version, /tokenize answer without, as in vLLM. 401 {"error": "Unauthorized"}.
API_KEY_ENV = "PAIRAUDIT_REF_API_KEY"
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def authorized(path: str, authorization: str | None, key: str | None) -> bool:
    """Whether a request to ``path`` with this Authorization header may pass (no key configured: any)."""
    if not key or not path.startswith(GUARDED_PREFIX):
        return True
    scheme, _, token = (authorization or "").partition(" ")
    # compare_digest: the time a wrong key takes says nothing of the right one
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())


MAX_CACHE_SALT = 128
CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")


def check_cache_salt(salt) -> None:
    """vLLM 0.32's cache_salt check, with its texts: non-empty, <= 128 characters, no @ / \\ NUL."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
                       param="cache_salt")
    if len(salt) > MAX_CACHE_SALT or any(c in salt for c in CACHE_SALT_FORBIDDEN):
        raise ApiError("Parameter 'cache_salt' must be at most 128 characters and must not contain "
                       "'@', '/', '\\\\', or NUL. (parameter=cache_salt)", param="cache_salt")


class Api:
    def __init__(self, tokenizer, *, served_name: str, model_root: str, info: dict, max_model_len: int,
                 vocab: int, eos: int | None):
        self.tok = tokenizer
        self.name = served_name
        self.root = model_root
        self.info = info
        self.created = int(time.time())
        self.max_model_len = max_model_len
        self.vocab = vocab
        self.eos = eos

    # --- helpers ----------------------------------------------------------
    def check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.name:
            raise ApiError(f"The model `{model}` does not exist.", param="model", status=404)

    def token_text(self, token: int, as_ids: bool) -> str:
        return f"token_id:{token}" if as_ids else self.tok.decode([token])

    def sampling(self, body: dict, prompt_len: int, *, chat: bool) -> SamplingParams:
        for key, neutral in SPECIAL_NEUTRAL.items():
            if body.get(key) not in (None, neutral):
                raise ApiError(f"{key}={body[key]} is not supported by the reference server (only {neutral})", param=key)
        if body.get("n", 1) != 1:
            raise ApiError("n: only n=1 is supported by the reference server", param="n")
        if body.get("echo"):
            raise ApiError("echo is not supported by the reference server", param="echo")
        given_t, given_p, given_k = body.get("temperature"), body.get("top_p"), body.get("top_k")
        temperature = float(given_t if given_t is not None else 1.0)
        top_p = float(given_p if given_p is not None else 1.0)
        top_k = given_k if given_k is not None else 0
        min_p = float(body.get("min_p") or 0.0)
        if temperature < 0:
            raise ApiError(f"temperature must be non-negative, got {temperature}.", param="temperature")
        if not 0 < top_p <= 1:
            raise ApiError(f"top_p must be in (0, 1], got {top_p}.", param="top_p")
        if top_k < -1:
            raise ApiError(f"top_k must be -1 (disable), or at least 1, got {top_k}.", param="top_k")
        if not 0 <= min_p <= 1:
            raise ApiError(f"min_p must be in [0, 1], got {min_p}.", param="min_p")
        if chat:
            logprobs = None
            if body.get("logprobs"):
                logprobs = body.get("top_logprobs") or 0
            elif body.get("top_logprobs"):
                raise ApiError("top_logprobs requires logprobs=true", param="top_logprobs")
            if body.get("logprobs") is not None and not isinstance(body.get("logprobs"), bool):
                raise ApiError("logprobs: expected a boolean (the count goes in top_logprobs)", param="logprobs")
            max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        else:
            logprobs = body.get("logprobs")
            if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
                raise ApiError(f"logprobs: expected an integer, got {json.dumps(logprobs)}", param="logprobs")
            max_key = "max_tokens"
        for key, value in (("logprobs", logprobs), ("prompt_logprobs", body.get("prompt_logprobs"))):
            if value is not None and value > MAX_LOGPROBS:
                raise ApiError(
                    f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}",
                    param=key,
                )
            if value is not None and value < 0:
                raise ApiError(f"{key} must be non-negative, got {value}.", param=key)
        if body.get("prompt_logprobs") is not None and body.get("stream"):
            raise ApiError("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        max_tokens = body.get(max_key)
        # vLLM 0.32's context policy: a prompt longer than max_model_len is
        # refused; anything shorter is served, max_tokens silently lowered to
        # what fits (finish_reason "length" with fewer tokens than asked). A
        # prompt of exactly max_model_len leaves 0, which the max_tokens check
        # refuses. Older releases refused prompt + max_tokens > max_model_len.
        if prompt_len > self.max_model_len:
            qualifier = "at least " if prompt_len == self.max_model_len + 1 else ""
            raise ApiError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                f"contains {qualifier}{prompt_len} input tokens, which exceeds this limit even without any output "
                f"tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_len})",
                param="input_tokens",
            )
        room = self.max_model_len - prompt_len
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        if max_tokens < 1:
            raise ApiError(f"max_tokens must be at least 1, got {max_tokens}. "
                           f"(parameter=max_tokens, value={max_tokens})", param="max_tokens")
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not all(isinstance(s, str) for s in stop):
            raise ApiError("stop: expected a string or a list of strings", param="stop")
        stop_ids = body.get("stop_token_ids") or []
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
            raise ApiError("stop_token_ids: expected a list of integers", param="stop_token_ids")
        min_tokens = body.get("min_tokens") or 0
        if min_tokens < 0:
            raise ApiError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", param="min_tokens")
        if min_tokens > max_tokens:
            raise ApiError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
                           param="min_tokens")
        check_cache_salt(body.get("cache_salt"))
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=0 if top_k == -1 else top_k,
            min_p=min_p,
            seed=body.get("seed"),
            stop=tuple(stop),
            stop_token_ids=tuple(stop_ids),
            ignore_eos=bool(body.get("ignore_eos")),
            min_tokens=min_tokens,
            logprobs=logprobs,
            prompt_logprobs=body.get("prompt_logprobs"),
        )

    def completion_prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = self.tok(prompt).input_ids
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab]
            if bad:
                raise ApiError(f"prompt: token id {bad[0]} is out of vocabulary (0..{self.vocab - 1})",
                               param="prompt")
        else:
            raise ApiError("prompt: expected a string or a list of token ids (one prompt per request)", param="prompt")
        if not ids:
            raise ApiError("prompt: the prompt cannot be empty", param="prompt")
        return ids

    def chat_prompt(self, body: dict) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("messages: expected a non-empty list of {role, content} objects", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ApiError(f"messages[{i}]: expected {{role: str, content: str}}", param="messages")
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs.setdefault("add_generation_prompt", body.get("add_generation_prompt", True))
        try:
            text = self.tok.apply_chat_template(messages, tokenize=False, **kwargs)
        except Exception as exc:
            raise ApiError(f"chat template failed: {exc}", param="messages") from None
        return self.tok(text, add_special_tokens=False).input_ids

    def final_text(self, req: Any) -> str:
        ids = [t for t in req.output if not (req.finish_reason == "stop" and t == req.stop_reason)]
        if ids and ids[-1] == self.eos and req.finish_reason == "stop" and req.stop_reason is None:
            ids = ids[:-1]
        text = self.tok.decode(ids, skip_special_tokens=True)
        if isinstance(req.stop_reason, str):
            cut = text.find(req.stop_reason)
            if cut >= 0:
                text = text[:cut]
        return text

    def usage(self, req: Any) -> dict:
        n = len(req.output)
        return {"prompt_tokens": len(req.prompt), "total_tokens": len(req.prompt) + n, "completion_tokens": n,
                "prompt_tokens_details": None}

    def completion_logprobs(self, req: Any, as_ids: bool, start: int = 0, end: int | None = None) -> dict:
        tokens, lps, tops, offsets = [], [], [], []
        offset = len(self.tok.decode(req.output[:start], skip_special_tokens=True)) if start else 0
        for i, e in enumerate(req.emitted[start:end], start=start):
            tokens.append(self.token_text(e.token, as_ids))
            lps.append(_clamp(e.logprob))
            top = {self.token_text(t, as_ids): _clamp(v) for t, v in e.top}
            top.setdefault(self.token_text(e.token, as_ids), _clamp(e.logprob))
            tops.append(top)
            offsets.append(offset)
            offset = len(self.tok.decode(req.output[: i + 1], skip_special_tokens=True))
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}

    def chat_logprobs(self, req: Any, as_ids: bool, start: int = 0, end: int | None = None) -> dict:
        content = []
        for e in req.emitted[start:end]:
            text = self.token_text(e.token, as_ids)
            top = [{"token": self.token_text(t, as_ids), "logprob": _clamp(v),
                    "bytes": list(self.token_text(t, as_ids).encode())} for t, v in e.top]
            content.append({"token": text, "logprob": _clamp(e.logprob), "bytes": list(text.encode()),
                            "top_logprobs": top})
        return {"content": content}

    def prompt_logprobs(self, req: Any) -> list | None:
        if req.prompt_logprobs is None:
            return None
        out: list[dict | None] = []
        for entry in req.prompt_logprobs:
            if entry is None:
                out.append(None)
                continue
            out.append({str(t): {"logprob": _clamp(v), "rank": r, "decoded_token": self.tok.decode([t])}
                        for t, (v, r) in entry.items()})
        return out


def _clamp(value: float) -> float:
    # vLLM clamps -inf to -9999.0 so the JSON stays valid
    return max(value, -9999.0)


__all__ = ["Api", "ApiError", "FIELD_TYPES", "check_cache_salt", "check_types"]
