#!/usr/bin/env python3
"""Training text for memra-tiny: chat conversations made from the prose of
The Debian Administrator's Handbook (Debian package debian-handbook, English
HTML; dual-licensed GPL-2+ / CC-BY-SA-3.0).

    scripts/memra-tiny-data.py [HTML_DIR] > chats.txt

Keeps the text of <p> elements (inline markup flattened, code blocks,
tables, lists, navigation and boilerplate dropped), grouped under their
section titles, and writes every example as one Qwen chat-template
conversation, exactly as the fixture GGUF's template renders a finished
user/assistant exchange:

    <|im_start|>user\\nQUESTION<|im_end|>\\n<|im_start|>assistant\\n
    <think>\\n\\n</think>\\n\\nANSWER<|im_end|>\\n

Questions are "Tell me about TITLE.", "What is TITLE?", "Explain TITLE." and
"Continue: FIRST SENTENCE"; answers are the section's paragraphs (at most
about 900 characters each, so a prompt and its answer fit the 1024-token
context with room to spare).  Standard library only; deterministic.
"""
import html.parser
import os
import random
import re
import sys

HTML_DIR = "/usr/share/doc/debian-handbook/html/en-US"
MAX_ANSWER = 900
VOID = {"br", "img", "hr", "meta", "link", "input", "col", "area", "wbr"}
DROP_TAGS = {"pre", "table", "script", "style", "ul", "ol", "dl", "head"}
DROP_CLASSES = {"navheader", "navfooter", "note", "important", "warning", "tip", "sidebar",
                "screen", "programlisting", "example", "figure", "itemizedlist",
                "orderedlist", "variablelist", "indexterm", "footnote", "footnotes"}


class Extract(html.parser.HTMLParser):
    """Collects (title, [paragraph, ...]) sections of one page.  A paragraph
    is a <div class="para"> (or <p>); code, screens, lists, tables, notes and
    navigation inside or around it are dropped."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections = []
        self.buf = None      # text of the paragraph or heading being read
        self.stack = []      # per open element: "drop", "para", "head" or ""
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        cls = (dict(attrs).get("class") or "").split()
        kind = ""
        if tag in DROP_TAGS or any(c in DROP_CLASSES for c in cls):
            kind = "drop"
            self.skip += 1
        elif not self.skip and self.buf is None:
            if tag in ("h1", "h2", "h3"):
                kind = "head"
                self.buf = []
            elif tag == "p" or (tag == "div" and "para" in cls):
                kind = "para"
                self.buf = []
        self.stack.append(kind)

    def handle_endtag(self, tag):
        if tag in VOID or not self.stack:
            return
        kind = self.stack.pop()
        if kind == "drop":
            self.skip -= 1
        elif kind == "head":
            t = clean("".join(self.buf))
            t = re.sub(r"^(Chapter |Appendix )?[0-9A-Z]+(\.[0-9]+)*\.?\s+", "", t)
            self.sections.append((t if 3 <= len(t) <= 80 else None, []))
            self.buf = None
        elif kind == "para":
            t = clean("".join(self.buf))
            if self.sections and good_paragraph(t):
                self.sections[-1][1].append(t)
            self.buf = None

    def handle_data(self, data):
        if not self.skip and self.buf is not None:
            self.buf.append(data)


def clean(t):
    t = t.replace("\u00a0", " ").replace("\u2019", "'").replace("\u2018", "'")
    t = t.replace("\u201c", '"').replace("\u201d", '"').replace("\u2014", " - ").replace("\u2013", "-")
    t = t.replace("\u2026", "...")
    t = re.sub(r"\s+", " ", t).strip()
    return t


def good_paragraph(t):
    """Plain English prose: long enough, mostly letters, no leftover markup."""
    if len(t) < 80 or "<|" in t:
        return False
    letters = sum(c.isalpha() or c == " " for c in t)
    if letters < 0.8 * len(t):
        return False
    if not t[0].isupper() or t[-1] not in ".!?:)\"":
        return False
    return all(ord(c) < 128 for c in t)


def chunks(paragraphs):
    """Consecutive paragraphs joined into answers of at most MAX_ANSWER chars."""
    cur = ""
    for p in paragraphs:
        if len(p) > MAX_ANSWER:
            p = cut(p, MAX_ANSWER)
        if cur and len(cur) + 2 + len(p) > MAX_ANSWER:
            yield cur
            cur = ""
        cur = p if not cur else cur + "\n\n" + p
    if cur:
        yield cur


def cut(t, n):
    """t cut after its last full sentence within n characters."""
    head = t[:n]
    i = max(head.rfind(". "), head.rfind("? "), head.rfind("! "))
    return head[: i + 1] if i > 40 else head


def chat(question, answer):
    return ("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n" + answer + "<|im_end|>\n")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else HTML_DIR
    pages = sorted(f for f in os.listdir(root) if f.endswith(".html"))
    if not pages:
        sys.exit("memra-tiny-data: no .html files in " + root)
    rng = random.Random(1)
    out = []
    n_par = 0
    for name in pages:
        ex = Extract()
        with open(os.path.join(root, name), encoding="utf-8") as f:
            ex.feed(f.read())
        for title, paras in ex.sections:
            n_par += len(paras)
            if not paras:
                continue
            for i, ans in enumerate(chunks(paras)):
                if title and i == 0:
                    q = rng.choice(["Tell me about %s.", "What is %s?", "Explain %s.",
                                    "Tell me about %s."]) % title
                    out.append(chat(q, ans))
                first = ans.split("\n\n")[0]
                m = re.match(r"(.{20,200}?[.?!]) (.+)", first)
                if m:
                    out.append(chat("Continue: " + m.group(1), m.group(2)))
                elif title:
                    out.append(chat("Tell me more about %s." % title, ans))
    rng.shuffle(out)
    sys.stdout.write("".join(out))
    sys.stderr.write("memra-tiny-data: %d pages, %d paragraphs, %d conversations, %d chars\n" %
                     (len(pages), n_par, len(out), sum(map(len, out))))


if __name__ == "__main__":
    main()
