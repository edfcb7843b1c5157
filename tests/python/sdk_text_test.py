#!/usr/bin/env python3
"""Text through the Python SDK: a tiny model made by `streambp-server init-model --tokenizer`
around the real Qwen3 tokenizer (the text.reference fixture's folder), served; Tokenize and
Detokenize of text and conversations, Sample from text and messages (completions come
with their text), an SFT step on a conversation, a conversation as a Datum's model input
(cross_entropy = SFT summed), and an export with the tokenizer files.
Without the tokenizer folder the test is skipped (exit 77) saying why, except with CI=true.

    sdk_text_test.py <streambp-server> [TOKENIZER_MODELS_DIR]
"""
import os
import subprocess
import sys
import time

from sdk_util import TMP, check, start, text_models_dir

import streambp


def main() -> int:
    server_bin = sys.argv[1]
    models = sys.argv[2] if len(sys.argv) > 2 and os.path.isfile(os.path.join(sys.argv[2], "qwen3",
                                                                              "tokenizer.json")) else text_models_dir()
    if models is None:
        why = "no Qwen3 tokenizer folder (the text.reference fixture's models/qwen3; or set STREAMBP_TEXT_MODELS)"
        if os.environ.get("CI") == "true":
            print(f"FAIL (CI=true): {why}", flush=True)
            return 1
        print(f"SKIPPED: {why}", flush=True)
        return 77
    t0 = time.time()
    model = os.path.join(TMP, "model")
    r = subprocess.run([server_bin, "init-model", "--out", model, "--tokenizer", os.path.join(models, "qwen3")],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"init-model failed: {r.stdout}{r.stderr}")
    (server,) = start(server_bin, ("text", {"log": {"level": "warn"}}, ("--model", model)))
    with streambp.ServiceClient(server.target) as service:
        tokenizer = service.info().tokenizer
        check(tokenizer.available and tokenizer.chat_format == "qwen3" and tokenizer.eos_token_ids,
              f"GetInfo.tokenizer: {tokenizer}")
        (hello,) = service.tokenize("Hello, world!")
        check(hello.ids and not hello.loss_mask, f"Tokenize text: {hello}")
        check(service.detokenize([hello.ids]) == ["Hello, world!"], "Detokenize")
        chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
        (rendered,) = service.tokenize(chat)
        check("<|im_start|>assistant" in rendered.text and sum(rendered.loss_mask) > 0,
              f"Tokenize a conversation: {rendered.text!r} {rendered.loss_mask}")
        (prompt,) = service.tokenize(chat[:1], add_generation_prompt=True)
        check(prompt.text.endswith("<|im_start|>assistant\n"), f"generation prompt: {prompt.text!r}")

        tc = service.training_client()
        out = tc.sample(text=["Once upon a time", "2+2="], n=2, max_tokens=6, seed=3)
        check(len(out.completions) == 4, f"Sample text: {out}")
        for c in out.completions:
            check(c.text == tc.detokenize([c.tokens], skip_special_tokens=True)[0], f"completion text: {c}")
        out = tc.sample(messages=chat[:1], max_tokens=4, seed=1, enable_thinking=False)
        check(len(out.completions) == 1 and out.completions[0].tokens, f"Sample messages: {out}")
        step = tc.train_step(streambp.sft_batch([{"messages": chat}, {"text": "Hello, world!"}]))
        check(step.loss > 0 and step.stats.targets > 0, f"SFT on text: {step}")
        ids = service.tokenize_batch(streambp.sft_batch([{"messages": chat}]))
        check(list(ids.sft.examples[0].tokens) == rendered.ids, "tokenize_batch gives the ids a step trains on")
        # A conversation as a Datum's model input: cross_entropy with nothing else trains on the
        # assistant turn, summed: SFT's mean loss times its targets, on the same ids.
        sft = tc.forward_backward(streambp.sft_batch([{"messages": chat}]))
        resolved = service.tokenize_batch(streambp.data_batch([streambp.datum(chat)]))
        d = resolved.data.data[0]
        check(list(d.model_input.tokens) == rendered.ids[:-1] and
              list(d.loss_fn_inputs["target_tokens"].int_data) == rendered.ids[1:] and
              list(d.model_input.loss_mask) == rendered.loss_mask[1:],
              "a text datum resolves to the conversation's ids, shifted targets and its assistant mask")
        ce = tc.forward_backward([streambp.datum(chat)], "cross_entropy")
        check(ce.stats.targets == sft.stats.targets and
              abs(ce.stats.loss - sft.stats.loss * sft.stats.targets) <= 1e-4 * ce.stats.loss,
              f"text datum: cross_entropy {ce.stats.loss} = sft {sft.stats.loss} x {sft.stats.targets}")
        exported = tc.save_weights(os.path.join(TMP, "export"), with_files=True)
        check("tokenizer.json" in exported.files and "config.json" in exported.files, f"with_files: {exported.files}")
    print(f"sdk text test: passed ({time.time() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
