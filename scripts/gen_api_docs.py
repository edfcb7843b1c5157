#!/usr/bin/python3
"""Writes docs/api.md, the API reference of streambp-server, from the .proto files.

protoc compiles every .proto under proto/ into a FileDescriptorSet with source info
(--include_source_info keeps the comments); this script reads that set with Debian's
python3-protobuf and renders Markdown: every service and RPC (request and response types,
streaming, the comments above it), every message (fields with type, label, number and
comments, oneofs, maps) and every enum. Nothing else reads the proto files: what protoc
accepts is what is documented.

    /usr/bin/python3 scripts/gen_api_docs.py              # from the repository root: rewrites docs/api.md
    /usr/bin/python3 scripts/gen_api_docs.py --out -      # to stdout
    /usr/bin/python3 scripts/gen_api_docs.py --protoc /path/to/protoc --out /tmp/api.md

The output depends only on the proto files (declaration order, no dates), so the test
docs.api_reference can compare a fresh rendering with the committed docs/api.md.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    from google.protobuf import descriptor_pb2
except ImportError:
    sys.exit("gen_api_docs: needs Debian's python3-protobuf (apt-get install python3-protobuf; "
             "run it with /usr/bin/python3, not another Python)")

REGENERATE = "/usr/bin/python3 scripts/gen_api_docs.py"

FDP = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    FDP.TYPE_DOUBLE: "double", FDP.TYPE_FLOAT: "float", FDP.TYPE_INT64: "int64",
    FDP.TYPE_UINT64: "uint64", FDP.TYPE_INT32: "int32", FDP.TYPE_FIXED64: "fixed64",
    FDP.TYPE_FIXED32: "fixed32", FDP.TYPE_BOOL: "bool", FDP.TYPE_STRING: "string",
    FDP.TYPE_BYTES: "bytes", FDP.TYPE_UINT32: "uint32", FDP.TYPE_SFIXED32: "sfixed32",
    FDP.TYPE_SFIXED64: "sfixed64", FDP.TYPE_SINT32: "sint32", FDP.TYPE_SINT64: "sint64",
}

# Field numbers inside descriptor.proto, the elements of SourceCodeInfo.Location.path.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE, FILE_SYNTAX, FILE_PACKAGE = 4, 5, 6, 12, 2
MSG_FIELD, MSG_NESTED, MSG_ENUM, MSG_ONEOF = 2, 3, 4, 8
ENUM_VALUE = 2
SERVICE_METHOD = 2


def run_protoc(protoc, proto_root, files):
    """The FileDescriptorSet of `files` (relative to proto_root), with comments."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "descriptors.pb")
        cmd = [protoc, f"--proto_path={proto_root}", "--include_source_info", f"--descriptor_set_out={out}", *files]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"gen_api_docs: protoc failed ({' '.join(cmd)}):\n{r.stderr}")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
        return fds


class Comments:
    """Comments of one file by element path (a tuple of descriptor field numbers and indexes)."""

    def __init__(self, file_proto):
        self.by_path = {tuple(loc.path): loc for loc in file_proto.source_code_info.location}

    def leading(self, path):
        loc = self.by_path.get(tuple(path))
        return clean(loc.leading_comments) if loc else ""

    def trailing(self, path):
        loc = self.by_path.get(tuple(path))
        return clean(loc.trailing_comments) if loc else ""

    def detached(self, path):
        loc = self.by_path.get(tuple(path))
        return [clean(c) for c in loc.leading_detached_comments] if loc else []

    def both(self, path):
        return "\n".join(c for c in (self.leading(path), self.trailing(path)) if c)


def clean(comment):
    """A comment's text without the one space after `//` and without blank edges."""
    lines = [line[1:] if line.startswith(" ") else line for line in comment.rstrip().split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(line.rstrip() for line in lines)


RULE = re.compile(r"^\s*[-=]{3,}\s*(.*?)\s*[-=]*\s*$")


def split_section(comment):
    """Files are cut into parts by rules: `// ------` followed by `// Title`, or
    `// --- Title -----` on one line. Returns (title or None, the rest of the comment)."""
    lines = comment.split("\n")
    title = None
    while lines and RULE.match(lines[0]):
        embedded = RULE.match(lines[0]).group(1)
        lines.pop(0)
        if embedded:
            title = title or embedded
        elif title is None and lines and lines[0].strip() and not RULE.match(lines[0]) and (
                len(lines) == 1 or RULE.match(lines[1]) or not lines[1].strip()):
            title = lines.pop(0).strip()
    if title is None:
        return None, comment
    return title, "\n".join(lines).strip("\n")


def no_html(text):
    """Comment text is text: `<name>` outside code spans would be taken for an HTML tag and
    vanish from the rendered page, so it is written &lt;name>."""
    parts = re.split(r"(`+[^`]*`+)", text)
    return "".join(p if p.startswith("`") else re.sub(r"<(?=[A-Za-z/!?])", "&lt;", p) for p in parts)


def cell(text):
    """Text for a Markdown table cell: pipes escaped, line breaks kept as <br>."""
    return no_html(text).replace("|", "\\|").replace("\n", "<br>")


def paragraph(text):
    """A comment as Markdown prose: its lines as they are, except that a leading `#` is not a
    heading and nothing is taken for HTML."""
    return "\n".join(("\\" + line) if line.startswith("#") else line for line in no_html(text).split("\n"))


def anchor(full_name):
    return full_name.lstrip(".")


class Renderer:
    def __init__(self, fds):
        self.fds = fds
        self.defined = set()  # full names (without the leading dot) of documented messages and enums
        self.map_entries = {}  # full name of a map entry message -> (key field, value field)
        for f in fds.file:
            prefix = f".{f.package}" if f.package else ""
            for m in f.message_type:
                self._index_message(m, prefix)
            for e in f.enum_type:
                self.defined.add(anchor(f"{prefix}.{e.name}"))
        self.out = []

    def _index_message(self, m, prefix):
        name = f"{prefix}.{m.name}"
        if m.options.map_entry:
            self.map_entries[name] = (m.field[0], m.field[1])
            return
        self.defined.add(anchor(name))
        for n in m.nested_type:
            self._index_message(n, name)
        for e in m.enum_type:
            self.defined.add(anchor(f"{name}.{e.name}"))

    def w(self, line=""):
        self.out.append(line)

    def entry(self, anchor_id, heading, text=""):
        """The start of one documented thing: an anchor to link to, its heading, its comment."""
        self.w()
        self.w(f'<a id="{anchor_id}"></a>')
        self.w()
        self.w(heading)
        if text:
            self.w()
            self.w(paragraph(text))

    def type_ref(self, field):
        """The field's type: a scalar name, or a link to the message/enum's entry."""
        if field.type in SCALARS:
            return f"`{SCALARS[field.type]}`"
        name = anchor(field.type_name)
        short = name.rsplit(".", 1)[-1]
        return f"[`{short}`](#{name})" if name in self.defined else f"`{name}`"

    def field_type(self, field):
        entry = self.map_entries.get(field.type_name)
        if entry and field.label == FDP.LABEL_REPEATED:
            return f"map<{self.type_ref(entry[0])}, {self.type_ref(entry[1])}>"
        return self.type_ref(field)

    def label(self, field, file_proto):
        if field.type_name in self.map_entries and field.label == FDP.LABEL_REPEATED:
            return "map"
        if field.label == FDP.LABEL_REPEATED:
            return "repeated"
        if field.label == FDP.LABEL_REQUIRED:
            return "required"
        if file_proto.syntax == "proto3":
            return "optional" if field.proto3_optional else ""
        return "optional"

    # --- the document ---------------------------------------------------------------
    def render(self):
        w = self.w
        w("# API reference")
        w()
        w("<!-- Generated from proto/ by scripts/gen_api_docs.py: do not edit by hand. -->")
        w(f"Generated from the `.proto` files under [`proto/`](../proto) by "
          f"[`scripts/gen_api_docs.py`](../scripts/gen_api_docs.py) (`{REGENERATE}`); the comments are the "
          "proto's own. Field labels: *repeated* (a list), *optional* (explicit presence: unset is "
          "distinguishable from the default), *map*, or empty (a plain proto3 field: unset reads as "
          "0, \"\" or false). The test `docs.api_reference` fails when this file and the proto disagree.")
        w()
        w("Contents:")
        w()
        for f in self.fds.file:
            w(f"- [`{f.name}`](#{self.file_anchor(f)}) — package `{f.package}`")
            for s in f.service:
                w(f"  - service [`{s.name}`](#{f.package}.{s.name}) ({len(s.method)} RPCs)")
        for f in self.fds.file:
            self.render_file(f)
        return "\n".join(self.out).rstrip() + "\n"

    @staticmethod
    def file_anchor(f):
        return "file-" + f.name.replace("/", "-").replace(".", "-")

    def render_file(self, f):
        w = self.w
        c = Comments(f)
        self.entry(self.file_anchor(f), f"## {f.name}")
        w()
        w(f"Package `{f.package}` ([source](../proto/{f.name})).")
        header = "\n\n".join(x for x in c.detached([FILE_SYNTAX]) + [c.leading([FILE_SYNTAX])] if x)
        if header:
            w()
            w(paragraph(header))
        for si, s in enumerate(f.service):
            self.render_service(f, c, s, [FILE_SERVICE, si])
        self.render_declarations(f, c)

    def render_service(self, f, c, s, path):
        w = self.w
        full = f"{f.package}.{s.name}"
        self.entry(full, f"### Service `{s.name}`", c.leading(path))
        w()
        w("| RPC | request | response | kind |")
        w("|---|---|---|---|")
        for mi, m in enumerate(s.method):
            w(f"| [`{m.name}`](#{full}.{m.name}) | {self.stream_ref(m.input_type, m.client_streaming)} | "
              f"{self.stream_ref(m.output_type, m.server_streaming)} | {self.kind(m)} |")
        group = None
        for mi, m in enumerate(s.method):
            mpath = path + [SERVICE_METHOD, mi]
            texts = []
            for d in c.detached(mpath) + [c.leading(mpath)]:
                title, rest = split_section(d)
                if title and title != group:
                    group = title
                    w()
                    w(f"**{title}**")
                if rest:
                    texts.append(rest)
            if c.trailing(mpath):
                texts.append(c.trailing(mpath))
            self.entry(f"{full}.{m.name}", f"#### {s.name}.{m.name}")
            w()
            w(f"{self.kind(m).capitalize()}: {self.stream_ref(m.input_type, m.client_streaming)} → "
              f"{self.stream_ref(m.output_type, m.server_streaming)}.")
            for t in texts:
                w()
                w(paragraph(t))

    @staticmethod
    def kind(m):
        if m.client_streaming and m.server_streaming:
            return "bidirectional streaming"
        if m.client_streaming:
            return "client streaming"
        if m.server_streaming:
            return "server streaming"
        return "unary"

    def type_ref_name(self, type_name):
        name = anchor(type_name)
        return f"[`{name.rsplit('.', 1)[-1]}`](#{name})" if name in self.defined else f"`{name}`"

    def stream_ref(self, type_name, streaming):
        return ("stream of " if streaming else "") + self.type_ref_name(type_name)

    def render_declarations(self, f, c):
        """Messages and enums in declaration order, grouped under the file's section titles."""
        items = [(c.by_path.get((FILE_MESSAGE, i)), "message", i, m) for i, m in enumerate(f.message_type)]
        items += [(c.by_path.get((FILE_ENUM, i)), "enum", i, e) for i, e in enumerate(f.enum_type)]
        # Declaration order = order of the source spans (messages and enums interleave).
        items.sort(key=lambda x: tuple(x[0].span[:2]) if x[0] is not None else (1 << 30, x[2]))
        prefix = f.package
        started = False
        for _, kind, i, d in items:
            path = [FILE_MESSAGE if kind == "message" else FILE_ENUM, i]
            title = None
            prose = []
            for det in c.detached(path):
                t, rest = split_section(det)
                title = t or title
                if rest:
                    prose.append(rest)
            if title or not started:
                self.w()
                self.w(f"### {title or 'Messages and enums'}")
                started = True
            for p in prose:
                self.w()
                self.w(paragraph(p))
            if kind == "message":
                self.render_message(f, c, d, path, prefix)
            else:
                self.render_enum(f, c, d, path, prefix)

    def render_message(self, f, c, m, path, prefix):
        w = self.w
        full = f"{prefix}.{m.name}" if prefix else m.name
        self.entry(full, f"#### message `{self.local(f, full)}`", split_section(c.leading(path))[1])
        real_oneofs = {}
        for fi, fld in enumerate(m.field):
            if fld.HasField("oneof_index") and not fld.proto3_optional:
                real_oneofs.setdefault(fld.oneof_index, []).append(fld.name)
        w()
        if not m.field:
            w("No fields.")
        else:
            w("| field | type | label | number | description |")
            w("|---|---|---|---:|---|")
            for fi, fld in enumerate(m.field):
                desc = c.both(path + [MSG_FIELD, fi])
                if fld.HasField("oneof_index") and not fld.proto3_optional:
                    oneof = m.oneof_decl[fld.oneof_index].name
                    desc = f"one of `{oneof}` ({', '.join(real_oneofs[fld.oneof_index])})" + ("; " + desc if desc else "")
                if fld.options.deprecated:
                    desc = "**deprecated**" + ("; " + desc if desc else "")
                w(f"| `{fld.name}` | {self.field_type(fld)} | {self.label(fld, f)} | {fld.number} | {cell(desc)} |")
        if m.reserved_range or m.reserved_name:
            ranges = [str(r.start) if r.end - r.start == 1 else f"{r.start}-{r.end - 1}" for r in m.reserved_range]
            w()
            w("Reserved: " + ", ".join(ranges + [f"`{n}`" for n in m.reserved_name]) + ".")
        for ni, n in enumerate(m.nested_type):
            if not n.options.map_entry:
                self.render_message(f, c, n, path + [MSG_NESTED, ni], full)
        for ei, e in enumerate(m.enum_type):
            self.render_enum(f, c, e, path + [MSG_ENUM, ei], full)

    @staticmethod
    def local(f, full):
        """A name relative to the file's package (Outer.Inner for nested declarations)."""
        return full[len(f.package) + 1:] if f.package and full.startswith(f.package + ".") else full

    def render_enum(self, f, c, e, path, prefix):
        w = self.w
        full = f"{prefix}.{e.name}" if prefix else e.name
        self.entry(full, f"#### enum `{self.local(f, full)}`", split_section(c.leading(path))[1])
        w()
        w("| value | number | description |")
        w("|---|---:|---|")
        for vi, v in enumerate(e.value):
            w(f"| `{v.name}` | {v.number} | {cell(c.both(path + [ENUM_VALUE, vi]))} |")


def proto_files(root):
    files = []
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        files += [os.path.relpath(os.path.join(dirpath, n), root) for n in sorted(names) if n.endswith(".proto")]
    # The project's own API first (streambp/...), then what it includes (grpc/health/...).
    return sorted(files, key=lambda p: (not p.startswith("streambp/"), p))


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protoc", default="protoc", help="protoc to run (default: protoc on PATH)")
    ap.add_argument("--proto-root", default=os.path.join(repo, "proto"), help="the --proto_path (default: proto/)")
    ap.add_argument("--out", default=os.path.join(repo, "docs", "api.md"), help="output file, - for stdout "
                    "(default: docs/api.md)")
    args = ap.parse_args()
    files = proto_files(args.proto_root)
    if not files:
        sys.exit(f"gen_api_docs: no .proto files under {args.proto_root}")
    text = Renderer(run_protoc(args.protoc, args.proto_root, files)).render()
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
