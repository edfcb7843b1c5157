#!/usr/bin/env python3
"""The reference side of the chat-format tests: Jinja2 renders each case with the model's own
chat_template, the way transformers' apply_chat_template does (an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loopcontrols; its tojson filter, raise_exception and
strftime_now globals; the tokenizer's special tokens as variables).

    chat_reference.py TESTS_TEXT_DIR REFERENCE_DIR      (writes REFERENCE_DIR/chat.json)

For every case of chat_cases.json it writes the rendered text and the byte ranges of the
assistant turns' bodies, found by the format's own markers (what follows the assistant header,
through the turn's end token) in the text as the tokenizer sees it (NFC for Qwen).
"""
import datetime
import json
import os
import re
import sys
import unicodedata

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

src, ref = sys.argv[1], sys.argv[2]

# Which template renders each format, and with which tokenizer's special tokens.
FORMATS = {
    "qwen3": {"template": ("config", "qwen3"), "tokenizer": "qwen3"},
    "llama3": {"template": ("config", "llama3"), "tokenizer": "llama3"},
    "llama3.2": {"template": ("file", "llama-3.2.jinja"), "tokenizer": "llama3"},
    "gemma": {"template": ("config", "gemma3"), "tokenizer": "gemma3"},
    "chatml": {"template": ("file", "chatml.jinja"), "tokenizer": "qwen3"},
}
# The body of an assistant turn: after its header, through its end token.
ASSISTANT_BODY = {
    "qwen3": re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S),
    "chatml": re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S),
    "llama3": re.compile(r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)", re.S),
    "llama3.2": re.compile(r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)", re.S),
    "gemma": re.compile(r"<start_of_turn>model\n(.*?<end_of_turn>)", re.S),
}
# strftime_now at a fixed moment, so that both sides can agree on it.
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(config):
    tokens = {}
    for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            tokens[key] = value
    if config.get("additional_special_tokens"):
        tokens["additional_special_tokens"] = config["additional_special_tokens"]
    return tokens


def byte_offset(text, char_index):
    return len(text[:char_index].encode("utf-8"))


env = environment()
cases = json.load(open(os.path.join(src, "chat_cases.json"), encoding="utf-8"))
results = []
for case in cases:
    fmt = FORMATS[case["format"]]
    config = json.load(open(os.path.join(ref, "models", fmt["tokenizer"], "tokenizer_config.json"), encoding="utf-8"))
    kind, name = fmt["template"]
    if kind == "config":
        source = json.load(open(os.path.join(ref, "models", name, "tokenizer_config.json"), encoding="utf-8"))["chat_template"]
    else:
        source = open(os.path.join(src, "templates", name), encoding="utf-8").read()
    kwargs = dict(special_tokens(config))
    if "enable_thinking" in case:
        kwargs["enable_thinking"] = case["enable_thinking"]
    if "date_string" in case:
        kwargs["date_string"] = case["date_string"]
    text = env.from_string(source).render(
        messages=case["messages"], tools=None, documents=None,
        add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)
    # The spans in the text the tokenizer sees: NFC where its normalizer says so (the markers
    # are ASCII, so normalization never moves them across a body's ends).
    tokenizer_json = json.load(open(os.path.join(ref, "models", fmt["tokenizer"], "tokenizer.json"), encoding="utf-8"))
    # Gemma's Replace(" " -> "\u2581") is undone by its decoder: its tokens' bytes line up
    # with the text itself.
    normalizer = tokenizer_json.get("normalizer") or {}
    assert normalizer.get("type") in (None, "NFC", "Replace"), normalizer
    seen = unicodedata.normalize("NFC", text) if normalizer.get("type") == "NFC" else text
    spans = [[byte_offset(seen, m.start(1)), byte_offset(seen, m.end(1))]
             for m in ASSISTANT_BODY[case["format"]].finditer(seen)]
    results.append({"name": case["name"], "format": case["format"], "tokenizer": fmt["tokenizer"],
                    "template": source, "text": text, "normalized_text": seen, "assistant_spans": spans})

with open(os.path.join(ref, "chat.json"), "w", encoding="utf-8") as out:
    json.dump(results, out, ensure_ascii=False, indent=1)
print(f"chat reference: {len(results)} cases rendered by Jinja2 {jinja2.__version__}")
