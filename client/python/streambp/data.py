"""Data helpers: batches from Python values and from JSONL files, in the formats of the C++
client and CLI (client/src/data.cpp). One example per line (blank lines skipped):

  sft       {"tokens": [...], "loss_mask": [0|1, ...]?}  or  {"prompt": [ids], "completion": [ids]}
            {"input_ids": [...], "labels": [... -100 = no loss ...]?}      (Hugging Face)
            {"text": "..."}                                                (TRL language modeling)
            {"messages": [{"role": ..., "content": ...}, ...]}             (loss on assistant turns)
            {"prompt": "...", "completion": "..."}  or both as message lists (loss on the completion)
  dpo       {"prompt": ..., "chosen": ..., "rejected": ..., "ref_chosen_logp": x?, "ref_rejected_logp": y?}
            prompt/chosen/rejected all ids, all strings or all message lists
  grpo      {"prompt": ids | "..." | [messages], "completions": [{"tokens": [...] | "text": "...",
             "reward": r, "logprobs": [...]?, "advantages": [...]?}, ...]}
  weighted  {"tokens": [...], "weights": [...]}   weights[i] multiplies log p(tokens[i+1])

Text forms are tokenized by the server with the model's tokenizer. Errors raise
StreambpError: NOT_FOUND for a file that cannot be opened, INVALID_ARGUMENT naming the
file, line and field ("data.jsonl:3: completions[1]: missing field 'reward'").
"""
from __future__ import annotations

import dataclasses
import json
import math
import uuid
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from .errors import StreambpError, invalid
from .types import AdamParams
from .v1 import trainer_pb2 as pb

__all__ = [
    "KINDS", "read_jsonl", "parse_jsonl", "batch_from_records", "sft_batch", "dpo_batch", "grpo_batch",
    "weighted_batch", "text_input", "chat_messages", "rollout_group", "batch_kind", "batch_examples",
    "batch_has_text", "split_by_examples", "text_inputs", "objective_options", "engine_options", "to_message",
    "Messages", "TextLike", "tensor_data", "datum", "data_batch", "loss_fn_config",
]

KINDS = ("sft", "dpo", "grpo", "weighted")

#: A conversation: messages as dicts ({"role", "content", "reasoning_content"?, "train"?}) or ChatMessage.
Messages = Sequence[Union[Mapping[str, Any], pb.ChatMessage]]
#: A text input: a string, a conversation, or a Text message.
TextLike = Union[str, Messages, pb.Text]


def _bad(where: str, message: str) -> StreambpError:
    return invalid(f"{where}: {message}")


def _check_keys(obj: Mapping[str, Any], where: str, known: Sequence[str]) -> None:
    for key in obj:
        if key not in known:
            raise _bad(where, f"unknown field '{key}' (known: {', '.join(known)})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _token_list(obj: Mapping[str, Any], key: str, where: str) -> List[int]:
    if key not in obj:
        raise _bad(where, f"missing field '{key}'")
    values = obj[key]
    if not isinstance(values, list):
        raise _bad(where, f"field '{key}' must be a list of token ids")
    for i, v in enumerate(values):
        if not _is_int(v):
            raise _bad(where, f"{key}[{i}] must be an integer token id, got {json.dumps(v)}")
        if v < 0 or v > 2**31 - 1:
            raise _bad(where, f"{key}[{i}] = {v} is not a token id (must be in [0, 2^31))")
    return list(values)


def _finite(v: Any, what: str, where: str) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool)):
        raise _bad(where, f"{what} must be a number, got {json.dumps(v)}")
    if not math.isfinite(v):
        raise _bad(where, f"{what} is not finite")
    return float(v)


def _optional_number(obj: Mapping[str, Any], key: str, where: str) -> Optional[float]:
    v = obj.get(key)
    return None if v is None else _finite(v, f"field '{key}'", where)


def _number_list(obj: Mapping[str, Any], key: str, where: str) -> List[float]:
    values = obj.get(key)
    if values is None:
        return []
    if not isinstance(values, list):
        raise _bad(where, f"field '{key}' must be a list of numbers")
    return [_finite(v, f"{key}[{i}]", where) for i, v in enumerate(values)]


def _form(v: Any, where: str, key: str) -> str:
    """What a prompt / completion value is: "ids", "text" or "messages"."""
    if isinstance(v, str):
        return "text"
    if isinstance(v, list) and v and isinstance(v[0], Mapping):
        return "messages"
    if isinstance(v, list):
        return "ids"
    raise _bad(where, f"field '{key}' must be token ids, a string or a list of messages, got {json.dumps(v)}")


def _messages(v: Any, where: str, key: str) -> List[pb.ChatMessage]:
    if not isinstance(v, list) or not v:
        raise _bad(where, f"field '{key}' must be a non-empty list of messages")
    out = []
    for i, m in enumerate(v):
        w = f"{where}: {key}[{i}]"
        if isinstance(m, pb.ChatMessage):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise invalid(w + ': expected a message {"role": ..., "content": ...}')
        _check_keys(m, w, ("role", "content", "reasoning_content", "train"))
        if not isinstance(m.get("role"), str):
            raise invalid(w + ": field 'role' must be a string")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise invalid(w + ": field 'content' must be a string")
        c = pb.ChatMessage(role=m["role"], content=content or "")
        if "reasoning_content" in m:
            if not isinstance(m["reasoning_content"], str):
                raise invalid(w + ": field 'reasoning_content' must be a string")
            c.reasoning_content = m["reasoning_content"]
        if "train" in m:
            if not isinstance(m["train"], bool):
                raise invalid(w + ": field 'train' must be true or false")
            c.train = m["train"]
        out.append(c)
    return out


def _text(obj: Mapping[str, Any], key: str, where: str) -> pb.Text:
    v = obj[key]
    if _form(v, where, key) == "text":
        if not v:
            raise _bad(where, f"field '{key}' is empty")
        return pb.Text(text=v)
    return pb.Text(messages=_messages(v, where, key))


def _input_ids(obj: Mapping[str, Any], where: str) -> pb.SftExample:
    """HF's input_ids + labels: labels[i] = -100 leaves token i out of the loss."""
    _check_keys(obj, where, ("input_ids", "labels", "attention_mask"))
    e = pb.SftExample(tokens=_token_list(obj, "input_ids", where))
    if not e.tokens:
        raise _bad(where, "field 'input_ids' is empty")
    if "attention_mask" in obj:
        mask = obj["attention_mask"]
        if not isinstance(mask, list) or len(mask) != len(e.tokens):
            raise _bad(where, "attention_mask must have one entry per input id")
        for i, m in enumerate(mask):
            if m != 1 or isinstance(m, bool):
                raise _bad(where, f"attention_mask[{i}] is not 1: strip padding from examples")
    if "labels" in obj:
        labels = obj["labels"]
        if not isinstance(labels, list) or len(labels) != len(e.tokens):
            raise _bad(where, "labels must have one entry per input id")
        for i, label in enumerate(labels):
            if not _is_int(label):
                raise _bad(where, f"labels[{i}] must be an integer")
            if label != -100 and label != e.tokens[i]:
                raise _bad(where, f"labels[{i}] = {label} is neither -100 nor input_ids[{i}]")
            e.loss_mask.append(0 if label == -100 else 1)
    return e


def _sft(obj: Any, where: str) -> pb.SftExample:
    if isinstance(obj, list):  # a bare token list
        obj = {"tokens": obj}
    if not isinstance(obj, Mapping):
        raise _bad(where, "expected a JSON object")
    if "tokens" in obj:
        for key in obj:
            if key not in ("tokens", "loss_mask"):
                raise _bad(where, f"unknown field '{key}' (with 'tokens' only 'loss_mask' is allowed)")
        e = pb.SftExample(tokens=_token_list(obj, "tokens", where))
        if not e.tokens:
            raise _bad(where, "field 'tokens' is empty")
        if "loss_mask" in obj:
            mask = obj["loss_mask"]
            if not isinstance(mask, list):
                raise _bad(where, "field 'loss_mask' must be a list of 0/1")
            if len(mask) != len(e.tokens):
                raise _bad(where, f"loss_mask has {len(mask)} entries but tokens has {len(e.tokens)}")
            for i, m in enumerate(mask):
                if not (isinstance(m, bool) or (_is_int(m) and m in (0, 1))):
                    raise _bad(where, f"loss_mask[{i}] must be 0 or 1, got {json.dumps(m)}")
                e.loss_mask.append(int(m))
        return e
    if "input_ids" in obj:
        return _input_ids(obj, where)
    if "text" in obj:
        _check_keys(obj, where, ("text",))
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise _bad(where, "field 'text' must be a non-empty string")
        return pb.SftExample(text=obj["text"])
    if "messages" in obj:
        _check_keys(obj, where, ("messages",))
        return pb.SftExample(messages=_messages(obj["messages"], where, "messages"))
    if "prompt" in obj or "completion" in obj:
        _check_keys(obj, where, ("prompt", "completion"))
        for key in ("prompt", "completion"):
            if key not in obj:
                raise _bad(where, f"missing field '{key}'")
        form = _form(obj["prompt"], where, "prompt")
        if _form(obj["completion"], where, "completion") != form:
            raise _bad(where, "'prompt' and 'completion' must have the same form (ids, strings or messages)")
        if form == "ids":
            e = pb.SftExample(prompt=_token_list(obj, "prompt", where), completion=_token_list(obj, "completion", where))
            if not e.completion:
                raise _bad(where, "field 'completion' is empty")
            return e
        return pb.SftExample(prompt_text=_text(obj, "prompt", where), completion_text=_text(obj, "completion", where))
    raise _bad(where, "expected one of the fields 'tokens', 'input_ids', 'text', 'messages', or 'prompt' and "
                      "'completion'")


def _dpo(obj: Any, where: str) -> pb.DpoPair:
    if not isinstance(obj, Mapping):
        raise _bad(where, "expected a JSON object")
    _check_keys(obj, where, ("prompt", "chosen", "rejected", "ref_chosen_logp", "ref_rejected_logp"))
    for key in ("prompt", "chosen", "rejected"):
        if key not in obj:
            raise _bad(where, f"missing field '{key}'")
    form = _form(obj["prompt"], where, "prompt")
    for key in ("chosen", "rejected"):
        if _form(obj[key], where, key) != form:
            raise _bad(where, "'prompt', 'chosen' and 'rejected' must have the same form (ids, strings or messages)")
    if form == "ids":
        p = pb.DpoPair(prompt=_token_list(obj, "prompt", where), chosen=_token_list(obj, "chosen", where),
                       rejected=_token_list(obj, "rejected", where))
        if not p.prompt:
            raise _bad(where, "field 'prompt' is empty (a completion needs a token before it)")
        if not p.chosen:
            raise _bad(where, "field 'chosen' is empty")
        if not p.rejected:
            raise _bad(where, "field 'rejected' is empty")
    else:
        p = pb.DpoPair(prompt_text=_text(obj, "prompt", where), chosen_text=_text(obj, "chosen", where),
                       rejected_text=_text(obj, "rejected", where))
    ref_c = _optional_number(obj, "ref_chosen_logp", where)
    ref_r = _optional_number(obj, "ref_rejected_logp", where)
    if (ref_c is None) != (ref_r is None):
        raise _bad(where, "give both ref_chosen_logp and ref_rejected_logp, or neither")
    if ref_c is not None and ref_r is not None:
        p.ref_chosen_logp, p.ref_rejected_logp = ref_c, ref_r
    return p


def _grpo(obj: Any, where: str) -> pb.GrpoGroup:
    if not isinstance(obj, Mapping):
        raise _bad(where, "expected a JSON object")
    _check_keys(obj, where, ("prompt", "completions"))
    if "prompt" not in obj:
        raise _bad(where, "missing field 'prompt'")
    g = pb.GrpoGroup()
    if _form(obj["prompt"], where, "prompt") == "ids":
        g.prompt.extend(_token_list(obj, "prompt", where))
        if not g.prompt:
            raise _bad(where, "field 'prompt' is empty (a completion needs a token before it)")
    else:
        g.prompt_text.CopyFrom(_text(obj, "prompt", where))
    completions = obj.get("completions")
    if not isinstance(completions, list):
        raise _bad(where, "missing field 'completions' (a list)")
    if not completions:
        raise _bad(where, "field 'completions' is empty")
    for i, c in enumerate(completions):
        w = f"{where}: completions[{i}]"
        if not isinstance(c, Mapping):
            raise invalid(w + ": expected a JSON object")
        _check_keys(c, w, ("tokens", "text", "reward", "logprobs", "advantages"))
        out = g.completions.add()
        if "text" in c:
            if "tokens" in c:
                raise invalid(w + ": give 'tokens' or 'text', not both")
            if not isinstance(c["text"], str) or not c["text"]:
                raise invalid(w + ": field 'text' must be a non-empty string")
            out.text = c["text"]
        else:
            out.tokens.extend(_token_list(c, "tokens", w))
            if not out.tokens:
                raise invalid(w + ": field 'tokens' is empty")
        out.logprobs.extend(_number_list(c, "logprobs", w))
        out.advantages.extend(_number_list(c, "advantages", w))
        reward = _optional_number(c, "reward", w)
        if reward is None and not out.advantages:
            raise invalid(w + ": missing field 'reward'")
        out.reward = reward or 0.0
        if out.text:
            continue  # lengths are checked once the server has tokenized it
        for name, n in (("logprobs", len(out.logprobs)), ("advantages", len(out.advantages))):
            if n and n != len(out.tokens):
                raise invalid(f"{w}: {name} has {n} entries but the completion has {len(out.tokens)} tokens")
    return g


def _weighted(obj: Any, where: str) -> pb.WeightedSequence:
    if not isinstance(obj, Mapping):
        raise _bad(where, "expected a JSON object")
    _check_keys(obj, where, ("tokens", "weights"))
    s = pb.WeightedSequence(tokens=_token_list(obj, "tokens", where))
    if len(s.tokens) < 2:
        raise _bad(where, "field 'tokens' needs at least 2 tokens")
    weights = obj.get("weights")
    if not isinstance(weights, list):
        raise _bad(where, "missing field 'weights' (a list of numbers)")
    s.weights.extend(_finite(v, f"weights[{i}]", where) for i, v in enumerate(weights))
    if len(s.weights) + 1 != len(s.tokens):
        raise _bad(where, f"weights has {len(s.weights)} entries; it needs {len(s.tokens) - 1} (one per token after "
                          "the first)")
    return s


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise invalid(f"no data format for objective '{kind}' (known: {', '.join(KINDS)})")


def batch_from_records(records: Iterable[Any], kind: str, name: str = "records") -> pb.Batch:
    """A Batch of kind ``kind`` (sft | dpo | grpo | weighted) from records in the JSONL
    formats above (dicts; for sft a bare token list is one example too). ``name`` prefixes
    error messages, with the record's 1-based position."""
    _check_kind(kind)
    batch = pb.Batch()
    n = 0
    for n, record in enumerate(records, 1):
        _add(batch, kind, record, f"{name}:{n}")
    if n == 0:
        raise invalid(f"{name}: no examples")
    return batch


def _add(batch: pb.Batch, kind: str, record: Any, where: str) -> None:
    if kind == "sft":
        batch.sft.examples.append(_sft(record, where))
    elif kind == "dpo":
        batch.dpo.pairs.append(_dpo(record, where))
    elif kind == "grpo":
        batch.grpo.groups.append(_grpo(record, where))
    else:
        batch.weighted.sequences.append(_weighted(record, where))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_jsonl(lines: Iterable[str], kind: str, name: str = "<jsonl>") -> pb.Batch:
    """Every example of JSONL text (an iterable of lines, e.g. an open file) in one Batch."""
    _check_kind(kind)
    batch = pb.Batch()
    examples = 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        try:
            record = json.loads(line, parse_constant=_reject_constant)
        except ValueError as e:
            raise _bad(where, f"not valid JSON ({e})") from None
        _add(batch, kind, record, where)
        examples += 1
    if examples == 0:
        raise invalid(f"{name}: no examples (the file is empty)")
    return batch


def read_jsonl(path: str, kind: str) -> pb.Batch:
    """Every example of a JSONL file in one Batch of kind ``kind`` (sft | dpo | grpo | weighted)."""
    _check_kind(kind)
    try:
        with open(path, encoding="utf-8") as f:
            return parse_jsonl(f, kind, path)
    except OSError as e:
        raise StreambpError(grpc.StatusCode.NOT_FOUND, f"cannot open data file {path}: {e.strerror}") from None


def sft_batch(examples: Iterable[Any]) -> pb.Batch:
    """An SFT batch from token lists or SFT records (see the module doc)."""
    return batch_from_records(examples, "sft", "sft examples")


def dpo_batch(pairs: Iterable[Mapping[str, Any]]) -> pb.Batch:
    """A DPO batch from records {"prompt", "chosen", "rejected", "ref_chosen_logp"?, "ref_rejected_logp"?}."""
    return batch_from_records(pairs, "dpo", "dpo pairs")


def grpo_batch(groups: Iterable[Mapping[str, Any]]) -> pb.Batch:
    """A GRPO batch from records {"prompt", "completions": [{"tokens" | "text", "reward", ...}]}."""
    return batch_from_records(groups, "grpo", "grpo groups")


def weighted_batch(sequences: Sequence[Sequence[int]], weights: Sequence[Sequence[float]],
                   policy_version: int = 0) -> pb.Batch:
    """A weighted_logprobs batch: loss = sum_s sum_i weights[s][i] * log p(sequences[s][i+1]),
    with the policy version the weights were computed at (0 = not checked)."""
    if len(sequences) != len(weights):
        raise invalid(f"{len(sequences)} sequences but {len(weights)} weight lists")
    batch = batch_from_records(({"tokens": list(s), "weights": list(w)} for s, w in zip(sequences, weights)),
                               "weighted", "weighted sequences")
    batch.weighted.policy_version = policy_version
    return batch


def _flatten(values: Any, where: str) -> "tuple[List[Any], List[int], Optional[bool]]":
    """Values in row-major order, their shape, and whether they are integers (None: unknown,
    as for an empty list): from a TensorData, a numpy array, a torch tensor or nested lists."""
    if hasattr(values, "detach"):  # a torch tensor
        t = values.detach().cpu()
        return t.reshape(-1).tolist(), list(t.shape), not (t.dtype.is_floating_point or t.dtype.is_complex)
    if hasattr(values, "dtype") and hasattr(values, "tolist") and hasattr(values, "shape"):  # numpy
        return list(values.reshape(-1).tolist()), list(values.shape), values.dtype.kind in "iu"
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise _bad(where, f"expected a list, numpy array, torch tensor or TensorData, got {type(values).__name__}")
    flat: List[Any] = []
    shape = [len(values)]
    inner: Optional[List[int]] = None
    for i, v in enumerate(values):
        if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
            part, part_shape, _ = _flatten(v, f"{where}[{i}]")
            if inner is not None and part_shape != inner:
                raise _bad(where, f"rows of different shapes ({inner} and {part_shape})")
            inner = part_shape
            flat.extend(part)
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(f"{where}[{i}]", f"expected a number, got {type(v).__name__}")
        else:
            flat.append(v)
    if inner is not None:
        shape += inner
    integers = all(isinstance(v, int) for v in flat) if flat else None
    return flat, shape, integers


def tensor_data(values: Any, name: str = "tensor", integers: Optional[bool] = None) -> pb.TensorData:
    """A TensorData (Tinker's) from a list (nested lists for more dimensions), a numpy array or a
    torch tensor: integers go as int_data, other numbers as float_data (float64), with the shape.
    ``integers`` forces the kind (a list of whole floats as token ids, or ints as weights)."""
    if isinstance(values, pb.TensorData):
        return values
    flat, shape, found = _flatten(values, name)
    as_ints = found if integers is None else integers
    out = pb.TensorData(shape=shape)
    if as_ints:
        if any(float(v) != int(v) for v in flat):
            raise _bad(name, "token ids must be whole numbers")
        out.int_data.extend(int(v) for v in flat)
    else:
        out.float_data.extend(_finite(v, "value", f"{name}[{i}]") for i, v in enumerate(flat))
    return out


def datum(model_input: Any, loss_fn_inputs: Optional[Mapping[str, Any]] = None) -> pb.Datum:
    """A Datum (Tinker's): the N tokens the model reads and the loss's per-token inputs, each N
    values (entry t about the token position t predicts): ``target_tokens`` (the input shifted by
    one, plus the token after it) and the loss's own, e.g. ``weights`` for cross_entropy or
    ``logprobs`` and ``advantages`` for ppo (GetInfo's objectives list each loss's inputs).
    cross_entropy also takes 2-D ``target_tokens`` and ``weights`` (N rows of K: a teacher's
    top-k candidates and their weights, for distillation).

    ``model_input`` may also be text (a string, a conversation as a list of messages, or a
    Text): the server tokenizes it, and ``target_tokens`` may then be left out (the tokenization
    shifted by one); a conversation trains on its assistant turns, and cross_entropy's
    ``weights`` may be left out (1 each). ``tokenize(batch=...)`` shows the tokens it becomes."""
    if isinstance(model_input, pb.ModelInput):
        out = pb.Datum(model_input=model_input)
    elif isinstance(model_input, (str, pb.Text)) or _is_conversation(model_input):
        out = pb.Datum(model_input=pb.ModelInput(text=text_input(model_input)))
    else:
        flat, _, ints = _flatten(model_input, "model_input")
        if ints is False:
            raise _bad("model_input", "token ids must be integers")
        out = pb.Datum(model_input=pb.ModelInput(tokens=[int(v) for v in flat]))
    for name, values in (loss_fn_inputs or {}).items():
        # Token ids as integers, every other input as float64 (weights [1, 0, 1] included).
        out.loss_fn_inputs[name].CopyFrom(tensor_data(values, f"loss_fn_inputs[{name}]",
                                                      integers=name == "target_tokens"))
    return out


def data_batch(data: Iterable[Any]) -> pb.Batch:
    """A data batch from Datum messages (or dicts {"model_input": ..., "loss_fn_inputs": {...}}):
    for any loss function named by the step's objective (cross_entropy, ppo, ...)."""
    batch = pb.Batch(data=pb.DatumBatch())
    for i, d in enumerate(data):
        if isinstance(d, pb.Datum):
            batch.data.data.append(d)
        elif isinstance(d, Mapping):
            _check_keys(d, f"data[{i}]", ("model_input", "loss_fn_inputs"))
            batch.data.data.append(datum(d.get("model_input", []), d.get("loss_fn_inputs", {})))
        else:
            raise _bad(f"data[{i}]", f"expected a Datum or a dict, got {type(d).__name__}")
    return batch


def loss_fn_config(config: Mapping[str, Any]) -> "dict[str, pb.ConfigValue]":
    """loss_fn_config values as ConfigValue messages: numbers, strings and booleans."""
    out = {}
    for key, value in config.items():
        if isinstance(value, pb.ConfigValue):
            out[key] = value
        elif isinstance(value, bool):
            out[key] = pb.ConfigValue(flag=value)
        elif isinstance(value, (int, float)):
            out[key] = pb.ConfigValue(number=float(value))
        elif isinstance(value, str):
            out[key] = pb.ConfigValue(text=value)
        else:
            raise invalid(f"loss_fn_config[{key}]: expected a number, a string or a bool, got {type(value).__name__}")
    return out


def chat_messages(messages: Messages, where: str = "messages") -> List[pb.ChatMessage]:
    """ChatMessage protos from dicts {"role", "content", "reasoning_content"?, "train"?} (or protos)."""
    return _messages(list(messages), where, "messages")


def text_input(value: TextLike, enable_thinking: Optional[bool] = None) -> pb.Text:
    """A Text input from a string, a conversation (list of messages) or a Text message."""
    if isinstance(value, pb.Text):
        text = pb.Text()
        text.CopyFrom(value)
    elif isinstance(value, str):
        text = pb.Text(text=value)
    else:
        text = pb.Text(messages=chat_messages(value))
    if enable_thinking is not None:
        text.enable_thinking = enable_thinking
    return text


def _is_conversation(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and bool(value) and \
        isinstance(value[0], (Mapping, pb.ChatMessage))


def text_inputs(inputs: Union[TextLike, Sequence[TextLike]]) -> List[TextLike]:
    """One text input (a string, a conversation, a Text) as a list of one; a list of them as is."""
    if isinstance(inputs, (str, pb.Text)) or _is_conversation(inputs):
        return [inputs]  # type: ignore[list-item]
    return list(inputs)  # type: ignore[arg-type]


def rollout_group(prompt: Union[Sequence[int], TextLike], completions: Sequence[Any], rewards: Sequence[float],
                  policy_version: int, group_id: Optional[str] = None) -> pb.RolloutGroup:
    """A GRPO rollout group for push_rollouts: the prompt (ids, text or messages), the sampled
    completions (Completion results: their tokens and log-probs go along), one reward each,
    the policy version that sampled them, and a group id (random when None: a retried push
    of the same group is then recognized as a duplicate). Completions sampled with
    ``return_routed_experts`` carry their routing: training replays it (routing replay)."""
    if len(completions) != len(rewards):
        raise invalid(f"one reward per completion: {len(completions)} completions, {len(rewards)} rewards")
    group = pb.RolloutGroup(policy_version=policy_version, group_id=group_id or uuid.uuid4().hex)
    if isinstance(prompt, (str, pb.Text)) or (prompt and not _is_int(prompt[0])):
        group.prompt_text.CopyFrom(text_input(prompt))  # type: ignore[arg-type]
    else:
        group.prompt.extend(prompt)  # type: ignore[arg-type]
    for c, r in zip(completions, rewards):
        completion = pb.GrpoCompletion(tokens=list(c.tokens), logprobs=list(c.logprobs),
                                       reward=_finite(r, "reward", f"group {group.group_id}"))
        routed = getattr(c, "routed_experts", None)
        if routed is not None:
            completion.routed_experts.CopyFrom(pb.RoutedExperts(
                ids=routed.ids, bytes_per_id=routed.bytes_per_id, sparse_layers=routed.sparse_layers,
                experts_per_token=routed.experts_per_token))
        group.completions.append(completion)
    return group


def batch_kind(batch: pb.Batch) -> str:
    """"sft", "dpo", "grpo", "weighted", "data", or "" for an empty batch."""
    return batch.WhichOneof("kind") or ""


_ITEMS = {"sft": "examples", "dpo": "pairs", "grpo": "groups", "weighted": "sequences", "data": "data"}


def _items(batch: pb.Batch, kind: str) -> Any:
    return getattr(getattr(batch, kind), _ITEMS[kind])


def batch_examples(batch: pb.Batch) -> int:
    """Examples in the batch (SFT examples, DPO pairs, GRPO groups, weighted sequences)."""
    kind = batch_kind(batch)
    return len(_items(batch, kind)) if kind else 0


def batch_has_text(batch: pb.Batch) -> bool:
    """Whether any example is text (the server tokenizes it; tokenize_batch gives the ids)."""
    for e in batch.sft.examples:
        if e.text or e.messages or e.HasField("prompt_text") or e.HasField("completion_text"):
            return True
    for p in batch.dpo.pairs:
        if p.HasField("prompt_text") or p.HasField("chosen_text") or p.HasField("rejected_text"):
            return True
    for g in batch.grpo.groups:
        if g.HasField("prompt_text") or any(c.text for c in g.completions):
            return True
    return False


def split_by_examples(batch: pb.Batch, examples: int) -> List[pb.Batch]:
    """Consecutive examples, ``examples`` per batch (the last may hold fewer)."""
    if examples <= 0:
        raise invalid(f"examples per batch must be > 0, got {examples}")
    kind = batch_kind(batch)
    if not kind:
        return []
    items = _items(batch, kind)
    out = []
    for begin in range(0, len(items), examples):
        part = pb.Batch()
        getattr(part, kind).SetInParent()
        _items(part, kind).extend(items[begin:begin + examples])
        if kind == "weighted":
            part.weighted.policy_version = batch.weighted.policy_version
        out.append(part)
    return out


_OPTIONS = {"sft": pb.SftOptions, "dpo": pb.DpoOptions, "grpo": pb.GrpoOptions, "weighted": pb.WeightedOptions}


def to_message(value: Union[Message, Mapping[str, Any]], cls: type, what: str) -> Any:
    """``value`` as a message of type ``cls``: the message itself, or a dict of its fields
    (proto field names; an unknown field is INVALID_ARGUMENT naming it)."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Message):
        raise invalid(f"{what}: expected {cls.__name__} or a dict, got {type(value).__name__}")
    try:
        return json_format.ParseDict(dict(value), cls())
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as e:
        raise invalid(f"{what}: {e}") from None


def set_adam_params(request: Any, value: Any) -> None:
    """Sets ``request.adam_params`` (OptimStep, TrainStep) from an AdamParams or a dict of some of
    its fields; present even with no field set (then every field takes Tinker's default)."""
    fields = dataclasses.asdict(value) if isinstance(value, AdamParams) else value
    request.adam_params.CopyFrom(to_message(fields, pb.AdamParams, "adam_params"))
    request.adam_params.SetInParent()


def objective_options(kind: str, options: Union[Message, Mapping[str, Any]]) -> Message:
    """The options message of an objective kind (SftOptions, DpoOptions, GrpoOptions,
    WeightedOptions) from a dict of its fields, e.g. objective_options("dpo", {"beta": 0.1})."""
    _check_kind(kind)
    return to_message(options, _OPTIONS[kind], f"{kind} options")


def engine_options(engine: Union[pb.EngineOptions, Mapping[str, Any]]) -> pb.EngineOptions:
    """EngineOptions from the message or a dict ({"engine": "stream", "chunk": 256, ...})."""
    return to_message(engine, pb.EngineOptions, "engine options")
