#!/usr/bin/python3
"""`slidedp-data tokenize` input formats, packing, the validation split, --max-len, the summary
line and bad input, on the real Llama 3.1 and Qwen3 tokenizer files. References: the messages
format (itself checked against jinja2 by test_chat.py) for sharegpt and alpaca, HF's Rust
tokenizers for prompt-completion, and the unpacked shard for --pack and --val."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello! How can I help?"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": " 6 "}],
    [{"role": "user", "content": "Translate 'cat' to German."}, {"role": "assistant", "content": "Katze"}],
]
SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


class Case:
    def __init__(self, scratch):
        self.scratch = scratch
        self.failures = 0

    def path(self, name):
        return os.path.join(self.scratch, name)

    def check(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        self.failures += not ok

    def tokenize(self, model, rows, *extra, expect_rc=0, out="out.bin"):
        write_jsonl(self.path("in.jsonl"), rows)
        p = tokutil.run_tokenize(["--model", model, "--in", self.path("in.jsonl"), "--out", self.path(out),
                                  "--threads", "2", "--date", "26 Jul 2024"] + list(extra), expect_rc=expect_rc)
        return p

    def shard(self, name="out.bin"):
        return tokutil.read_shard(self.path(name))


def check_formats(c, llama):
    messages = [{"messages": m} for m in CONVERSATIONS]
    c.tokenize(llama, messages, "--format", "messages")
    want = c.shard()
    c.tokenize(llama, messages)
    c.check(c.shard() == want, "auto detects messages")
    sharegpt = [{"conversations": [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in conv]}
                for conv in CONVERSATIONS]
    c.tokenize(llama, sharegpt)
    c.check(c.shard() == want, "sharegpt gives the same shard as messages")
    alpaca = [{"instruction": "Name a color.", "input": "", "output": "Blue."},
              {"instruction": "Sum these.", "input": "1 2 3", "output": "6", "system": "Be exact."}]
    as_messages = [{"messages": [{"role": "user", "content": "Name a color."},
                                 {"role": "assistant", "content": "Blue."}]},
                   {"messages": [{"role": "system", "content": "Be exact."},
                                 {"role": "user", "content": "Sum these.\n1 2 3"},
                                 {"role": "assistant", "content": "6"}]}]
    c.tokenize(llama, as_messages)
    want_alpaca = c.shard()
    c.tokenize(llama, alpaca)
    c.check(c.shard() == want_alpaca, "alpaca = messages [user: instruction + newline + input, assistant: output]")

    pc = [{"prompt": "Q: capital of France?\nA:", "completion": " Paris."}, {"prompt": "x", "completion": "y z"}]
    c.tokenize(llama, pc)
    docs = tokutil.documents(*c.shard())
    items = [{"text": r["prompt"] + r["completion"], "spans": [[len(r["prompt"]), len(r["prompt"] + r["completion"])]]}
             for r in pc]
    with open(c.path("pc.json"), "w") as f:
        json.dump(items, f)
    subprocess.run(["node", os.path.join(HERE, "ref_chat.mjs"), os.path.abspath(tokutil.NODE_MODULES), llama,
                    c.path("pc.json"), c.path("pc_ref.json")], check=True)
    ref = json.load(open(c.path("pc_ref.json")))
    bos, eos = 128000, 128009   # Llama 3.1: the post-processor's BOS, tokenizer_config's eos_token
    ok = all(ids == [bos] + r["ids"] + [eos] and [f & 1 for f in flags] == [0] + r["mask"] + [1]
             for (ids, flags), r in zip(docs, ref))
    c.check(ok and len(docs) == 2, "prompt-completion: BOS + ids + EOS, targets from the completion through EOS")


def check_pack_val_maxlen(c, qwen):
    rows = [{"text": "word " * n} for n in (3, 40, 7, 90, 12, 1, 25, 60, 5, 33)]
    p = c.tokenize(qwen, rows, "--format", "text")
    docs = tokutil.documents(*c.shard())
    lens = [len(d[0]) for d in docs]
    m = re.fullmatch(r"slidedp-data tokenize: 10 examples \(text, 0 dropped, 0 truncated\): \S+ (\d+) tokens, "
                     r"(\d+) targets; \d+ tokens/s on 2 threads\n", p.stdout)
    c.check(bool(m) and int(m.group(1)) == sum(lens) and int(m.group(2)) == sum(lens) - len(lens),
            f"summary line: {p.stdout.strip()}")

    T = 64
    p = c.tokenize(qwen, rows, "--format", "text", "--pack", str(T))
    tokens, flags = c.shard()
    kept = [d for d in docs if len(d[0]) <= T]
    ok = (len(tokens) - 1) % T == 0 and flags[-1] == 0
    placed = []
    for w in range(0, len(tokens) - 1, T):
        win = tokutil.documents(tokens[w:w + T], flags[w:w + T])
        ok = ok and flags[w] & tokutil.FLAG_DOC_START != 0
        for ids, fl in win:
            # a window's documents, then padding that is never a target
            real = next((d for d in kept[len(placed):len(placed) + 1] if ids[:len(d[0])] == d[0]), None)
            ok = ok and real is not None and all(f == 0 for f in fl[len(real[0]):])
            placed.append(real)
    ok = ok and len(placed) == len(kept)
    c.check(ok, f"--pack {T}: {len(kept)} documents whole and in order in {(len(tokens) - 1) // T} windows, "
                f"{len(docs) - len(kept)} longer ones dropped")
    c.check(f"{len(docs) - len(kept)} dropped" in p.stdout, "--pack: the summary counts the dropped documents")

    c.tokenize(qwen, rows, "--format", "text", "--max-len", "20", "--overflow", "truncate")
    got = tokutil.documents(*c.shard())
    c.check([d[0] for d in got] == [d[0][:20] for d in docs], "--max-len 20 --overflow truncate keeps the first 20")

    many = [{"text": f"line {i}: " + "ab " * (i % 17)} for i in range(700)]   # several 256-line batches
    c.tokenize(qwen, many, "--threads", "1")
    one = c.shard()
    c.tokenize(qwen, many, "--threads", "2")
    c.check(c.shard() == one and len(tokutil.documents(*one)) == 700, "--threads 2 writes what --threads 1 writes")

    c.tokenize(qwen, rows, "--format", "text", "--val", "3", "--val-out", c.path("val.bin"))
    train, val = tokutil.documents(*c.shard()), tokutil.documents(*c.shard("val.bin"))
    c.check(train == docs[:7] and val == docs[7:], "--val 3: the last 3 examples go to --val-out, in order")


def bad_model(c, src, name, edit, config_edit=None):
    d = c.path(name)
    shutil.copytree(src, d)
    for fname, fn in (("tokenizer.json", edit), ("tokenizer_config.json", config_edit)):
        if fn:
            j = json.load(open(os.path.join(d, fname)))
            fn(j)
            json.dump(j, open(os.path.join(d, fname), "w"))
    return d


def check_bad_input(c, llama, qwen):
    def refused(model, rows, needle, *extra):
        check_refused(c, model, rows, needle, *extra)

    good = {"messages": CONVERSATIONS[0]}
    refused(llama, [good, good, "{not json"], "in.jsonl:3: ")
    refused(llama, [good, {"messages": [{"role": "robot", "content": "beep"}]}], "in.jsonl:2: ")
    refused(llama, [good, {"messages": [{"role": "robot", "content": "beep"}]}], "unknown role 'robot'")
    refused(llama, [{"conversations": [{"from": "alien", "value": "x"}]}], "unknown role 'alien'")
    # tool data a template does not render is refused, never silently dropped (test_chat.py checks
    # the renders of the tool data the Qwen templates take); null or empty tool fields (as exports
    # carry) render nothing, as the templates' `if` gives, and change nothing
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ask = {"role": "user", "content": "Weather in Paris?"}
    calling = {"role": "assistant", "content": "", "tool_calls": [call]}
    refused(llama, [good, {"messages": [ask, calling]}],
            "in.jsonl:2: messages[1]: tool_calls: the chat template does not render tools")
    refused(llama, [{"messages": [ask, {"role": "tool", "content": "sunny"}]}], "role 'tool'")
    refused(llama, [{"tools": [call["function"]], "messages": CONVERSATIONS[0]}], "tools: ")
    refused(qwen, [{"tools": [call["function"]], "conversations": [{"from": "human", "value": "hi"}]}],
            "tools: tool data is read from the messages format", "--format", "sharegpt")
    refused(qwen, [{"messages": [ask, {"role": "function", "content": "sunny"}]}], "give tool results as role tool")
    refused(qwen, [{"messages": [ask, dict(calling, tool_calls=None, function_call={"name": "f", "arguments": "{}"})]}],
            "function_call: give calls as tool_calls")
    refused(qwen, [{"messages": [dict(ask, tool_calls=[call])]}], "tool_calls: belong to assistant turns")
    refused(qwen, [{"messages": [ask, dict(calling, tool_calls={"name": "f"})]}], "tool_calls: needs a list")
    refused(qwen, [{"messages": [ask, dict(calling, tool_calls=[{"name": "f"}])]}],
            "tool_calls[0]: needs a string name and arguments")
    refused(qwen, [{"messages": [ask, dict(calling, tool_calls=[{"function": {}}])]}],
            "tool_calls[0]: function: needs an object")
    refused(qwen, [{"tools": {"name": "f"}, "messages": CONVERSATIONS[0]}], "tools: needs a list")
    # Llama 3.1's template takes one call a turn, in the `function` form, and drops content beside it
    llama31 = tokutil.model_dir(c.path("l31"), "llama3_2")
    refused(llama31, [{"messages": [ask, dict(calling, tool_calls=[call, call])]}], "takes one call a turn (it has 2)")
    refused(llama31, [{"messages": [ask, dict(calling, tool_calls=[call["function"]])]}],
            "tool_calls[0]: function: needs an object")
    refused(llama31, [{"messages": [ask, dict(calling, content="Let me look.")]}], "drops an assistant's content")
    refused(llama31, [{"tools": [], "messages": [{"role": "assistant", "content": "hi"}]}],
            "must begin (after the system message) with a user turn")
    refused(qwen, [{"messages": [ask, {"role": "ipython", "content": "sunny"}]}], "give tool results as role tool")
    # string arguments (OpenAI's form): Llama 3.1 and Qwen2.5 write them as a JSON string, and say so
    as_text = dict(call, function=dict(call["function"], arguments='{"city": "Paris"}'))
    p = c.tokenize(llama31, [{"messages": [ask, calling]}, {"messages": [ask, dict(calling, tool_calls=[as_text])]}])
    c.check("note: 1 tool call(s) (the first in " in p.stderr and "in.jsonl:2) give their arguments as a string, "
            "which the llama3.1 template writes as a JSON string" in p.stderr, f"string arguments noted: {p.stderr.strip()}")
    p = c.tokenize(qwen, [{"messages": [ask, dict(calling, tool_calls=[as_text])]}])
    c.check("note:" not in p.stderr, "Qwen3 writes string arguments as they are: no note")
    # a call-only turn may have a null content, as OpenAI's exports write it: rendered as empty
    c.tokenize(qwen, [{"messages": [ask, calling]}])
    empty = c.shard()
    c.tokenize(qwen, [{"messages": [ask, dict(calling, content=None)]}])
    c.check(c.shard() == empty, "a tool-call turn with content null: the shard of content \"\"")
    c.tokenize(qwen, [{"messages": CONVERSATIONS[0]}])
    plain = c.shard()
    empty_tools = [dict(m, tool_calls=None, function_call=None) if m["role"] == "assistant" else m
                   for m in CONVERSATIONS[0]]
    c.tokenize(qwen, [{"tools": [], "messages": empty_tools}])
    c.check(c.shard() == plain, "null tool_calls and function_call, an empty tools list: the shard of the "
                                "conversation without them")
    refused(llama, [], "empty")
    refused(llama, ["", "  "], "empty")
    refused(llama, [{"text": "x"}, {"text": 5}], "in.jsonl:2: text: needs a string field text")
    # cJSON's strings end at a NUL: a \u0000 is refused rather than the rest of its string lost
    refused(llama, [{"text": "x"}, {"text": "cut\u0000here"}], "in.jsonl:2: a JSON string holds \\u0000")
    c.tokenize(llama, [{"text": "an escaped backslash, then u0000: \\u0000"}])
    c.check(len(tokutil.documents(*c.shard())) == 1, "a \\\\u0000 (a backslash, then text) is no NUL and passes")
    small = bad_model(c, llama, "small_vocab", None)
    json.dump({"vocab_size": 1000}, open(os.path.join(small, "config.json"), "w"))
    refused(small, [{"text": "hello world"}], "not below the config's vocab_size 1000")
    refused(bad_model(c, llama, "fallback", lambda j: j["model"].update(byte_fallback=True)),
            [{"text": "x"}], "byte_fallback is not supported")
    refused(bad_model(c, llama, "wordpiece", lambda j: j["model"].update(type="WordPiece")),
            [{"text": "x"}], "model WordPiece is not supported")
    refused(bad_model(c, qwen, "nfkc", lambda j: j.update(normalizer={"type": "NFKC"})),
            [{"text": "x"}], "normalizer NFKC is not supported")
    refused(bad_model(c, llama, "metaspace", lambda j: j.update(pre_tokenizer={"type": "Metaspace"})),
            [{"text": "x"}], "pre_tokenizer Metaspace is not supported")
    unknown = bad_model(c, llama, "unknown_template", None, lambda j: j.update(chat_template="{{ messages }}"))
    refused(unknown, [good], "not one of the known templates (qwen2.5, qwen3, llama3, llama3.1)")
    c.tokenize(unknown, [good], "--template", "llama3")
    c.check(os.path.exists(c.path("out.bin")), "an unknown template is accepted when --template names the family")
    refused(llama, [good], "--max-len 100 exceeds --pack 50", "--pack", "50", "--max-len", "100")


def check_refused(c, model, rows, needle, *extra):
    """Exit 2 with one line naming the problem (holding needle, or each of a tuple of them); an existing
    output file untouched, nothing on stdout."""
    needles = needle if isinstance(needle, tuple) else (needle,)
    with open(c.path("old.bin"), "w") as f:
        f.write("previous")
    p = c.tokenize(model, rows, *extra, expect_rc=2, out="old.bin")
    line = p.stderr.strip()
    untouched = open(c.path("old.bin")).read() == "previous" and not os.path.exists(c.path("old.bin.tmp"))
    c.check(all(n in line for n in needles) and "\n" not in line and untouched and not p.stdout,
            f"refused ({needle!r}), output untouched: {line}")


def check_no_assistant(c, qwen):
    """--train-on assistant: a conversation without an assistant turn has no target wherever it is
    in the file (issue 29: the first ones used to be all targets, later ones none)."""
    user_only = {"messages": [{"role": "user", "content": "Just saying hi, no answer needed."}]}
    system_user = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]}
    good = {"messages": CONVERSATIONS[0]}
    c.tokenize(qwen, [good])
    want = c.shard()
    p = c.tokenize(qwen, [user_only, good, system_user])
    c.check(c.shard() == want, "conversations without an assistant turn, before and after one with, add no token")
    c.check("1 examples (messages, template qwen3 (Qwen3), 2 dropped [2 without an assistant turn], 0 truncated)"
            in p.stdout, f"the summary counts them as dropped and names the template: {p.stdout.strip()}")
    check_refused(c, qwen, [user_only, system_user, user_only], "without an assistant turn")
    p = c.tokenize(qwen, [user_only, good], "--train-on", "all")
    docs = tokutil.documents(*c.shard())
    c.check(len(docs) == 2 and all(f & 1 for f in docs[0][1][1:]) and "0 dropped" in p.stdout,
            "--train-on all keeps them, every token a target")
    check_refused(c, qwen, [user_only] * 3, "3 conversation(s) without an assistant turn dropped")


def check_targets_left(c, llama, qwen):
    """slidedp-data tokenize never writes a shard without a target, and names the examples that
    lost all their targets to truncation."""
    check_refused(c, qwen, [{"messages": conv} for conv in CONVERSATIONS],
            ("3 example(s) lost all their targets to truncation by --pack 8 --overflow truncate (",
             "/in.jsonl:1, ", "/in.jsonl:2, ", "/in.jsonl:3): raise --pack"), "--pack", "8", "--overflow", "truncate")
    long_prompt = {"prompt": "Please read all of this first. " * 8, "completion": " Done."}
    short = {"prompt": "Q?", "completion": " A."}
    p = c.tokenize(qwen, [short, long_prompt, short], "--max-len", "16", "--overflow", "truncate")
    docs = tokutil.documents(*c.shard())
    c.check(len(docs) == 2 and "2 examples" in p.stdout
            and "1 dropped [1 with no target left after truncation]" in p.stdout
            and "lost all their targets to truncation by --max-len 16 and were dropped: " in p.stderr
            and p.stderr.strip().endswith("in.jsonl:2"),
            f"an example truncated to no target is dropped and named: {p.stdout.strip()} / {p.stderr.strip()}")
    check_refused(c, qwen, [{"text": "a b c d e f g h i j k l"}], "every example was dropped by --pack 4", "--pack", "4")
    check_refused(c, qwen, [{"messages": CONVERSATIONS[0]}], "writes <|begin_of_text|>, which", "--template", "llama3")
    check_refused(c, llama, [{"messages": CONVERSATIONS[0]}], "writes <|im_start|>, which", "--template", "qwen2.5")
    p = c.tokenize(llama, [{"messages": CONVERSATIONS[0]}], "--template", "llama3")
    c.check("(messages, template llama3 (--template), 0 dropped" in p.stdout,
            f"the summary names a --template: {p.stdout.strip()}")


def main():
    scratch = tempfile.mkdtemp(prefix="sd_tokenize_cli_")
    try:
        c = Case(scratch)
        llama = tokutil.model_dir(scratch, "llama3_1")
        qwen = tokutil.model_dir(scratch, "qwen3")
        check_formats(c, llama)
        check_pack_val_maxlen(c, qwen)
        check_bad_input(c, llama, qwen)
        check_no_assistant(c, qwen)
        check_targets_left(c, llama, qwen)
    finally:
        shutil.rmtree(scratch)
    sys.exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
