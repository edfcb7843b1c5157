#!/usr/bin/python3
"""Every relative link in the user-facing Markdown resolves.

Checks README.md, deploy/README.md and every docs/**/*.md: each relative link target of an
inline link or image ([text](target), ![alt](target)), a reference definition
([id]: target) or an HTML href/src must name a file or folder of the repository (relative to
the Markdown file; a leading / is the repository root), must not leave the repository, and
an anchor (#name, alone or after a .md target) must be a heading of that file (GitHub's
slugs) or an explicit id="name". Links inside code blocks and code spans are not links;
URLs with a scheme (https:, mailto:) are not checked (no network here).

usage: links_test.py REPO_ROOT
"""
import os
import re
import sys
from urllib.parse import unquote

repo = os.path.realpath(sys.argv[1])
failures = []

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HTML = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text):
    """The text outside fenced code blocks and code spans (both replaced by blanks, so
    line numbers stay)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line))
    return "\n".join(out)


def slugs(path):
    """Anchors of a Markdown file: GitHub heading slugs (numbered when repeated) and explicit ids."""
    text = open(path, encoding="utf-8").read()
    anchors = set(re.findall(r"""\bid\s*=\s*["']([^"']+)["']""", text))
    seen = {}
    fence = None
    for line in text.split("\n"):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if fence or m:
            if m and (not fence or (m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence))):
                fence = None if fence else m.group(1)
            continue
        h = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not h:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", h.group(1))  # a link's text only
        title = re.sub(r"<[^>]+>", "", title)
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def markdown_files():
    files = [os.path.join(repo, "README.md"), os.path.join(repo, "deploy", "README.md")]
    for dirpath, dirs, names in os.walk(os.path.join(repo, "docs")):
        dirs.sort()
        files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".md")]
    return [f for f in files if os.path.exists(f)]


files = markdown_files()
if not any(f.endswith(os.path.join("docs", "guide.md")) for f in files):
    failures.append("docs/guide.md is missing")
checked = 0
anchor_cache = {}
for md in files:
    rel_md = os.path.relpath(md, repo)
    text = prose(open(md, encoding="utf-8").read())
    targets = []
    for pattern in (INLINE, REFDEF, HTML):
        for m in pattern.finditer(text):
            targets.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    for line, target in targets:
        if SCHEME.match(target):
            continue
        checked += 1
        path_part, _, fragment = target.partition("#")
        path_part = unquote(path_part)
        if path_part.startswith("/"):
            dest = os.path.join(repo, path_part.lstrip("/"))
        elif path_part:
            dest = os.path.join(os.path.dirname(md), path_part)
        else:
            dest = md
        dest = os.path.realpath(dest)
        where = f"{rel_md}:{line}: link {target}"
        if dest != repo and not dest.startswith(repo + os.sep):
            failures.append(f"{where} leaves the repository")
            continue
        if not os.path.exists(dest):
            failures.append(f"{where}: {os.path.relpath(dest, repo)} does not exist")
            continue
        if fragment and dest.endswith(".md"):
            if dest not in anchor_cache:
                anchor_cache[dest] = slugs(dest)
            if unquote(fragment) not in anchor_cache[dest]:
                failures.append(f"{where}: no heading or id '{fragment}' in {os.path.relpath(dest, repo)}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"PASS: {checked} relative links in {len(files)} Markdown files resolve "
      f"({', '.join(os.path.relpath(f, repo) for f in files)})")
