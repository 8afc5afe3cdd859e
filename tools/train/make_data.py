#!/usr/bin/env python3
"""Assemble the English training corpus of the default model from text that
Debian's packages ship.

    python3 tools/train/make_data.py --work /tmp/atlas-data --out .train-data

The packages named in PACKAGES are fetched with `apt-get download` into
WORK/debs and unpacked with `dpkg -x` into WORK/x (nothing is installed); the
manual pages and the README-like files of this machine's /usr/share/man and
/usr/share/doc are added. Every source becomes plain UTF-8 text (HTML through
html.parser, man pages through groff, POD through pod2text, info files and
dictionaries from their own layouts), long sources are cut into documents of
about CHUNK bytes at paragraph boundaries, identical documents are dropped,
and about 1% of the documents (chosen by a hash of their text, so the split
does not depend on the order) are held out for validation:

    OUT/train.txt.xz, OUT/val.txt.xz   documents separated by U+001E
    OUT/manifest.json                  packages and versions, what every source
                                       gave (files, documents, bytes), totals and
                                       the sha256 of both outputs

The corpus is not committed; the manifest is (models/atlas-tiny/data-manifest.json).
Needs Debian's apt-get, dpkg, groff, pod2text and bible-kjv's `bible` (fetched
with the packages). Standard library only.
"""
import argparse
import concurrent.futures
import glob
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import re
import subprocess
import sys
import unicodedata

PACKAGES = ["fortunes", "fortunes-min", "fortunes-bofh-excuses", "jargon-text", "bible-kjv",
            "bible-kjv-text", "python3.11-doc", "manpages", "manpages-dev", "wordnet-base",
            "dict-gcide", "dict-devil", "dict-foldoc", "debian-reference-en",
            "debian-handbook", "maint-guide", "perl-doc", "gnu-standards"]
CHUNK = 24 * 1024
SEP = "\x1e"
VAL_PER_MILLE = 10
HOST_MAN_SECTIONS = ("man1", "man5", "man7", "man8")
HOST_MAN_MAX = 1500
SKIP_DOC = re.compile(r"change|news|history|release.?notes|authors|copying|license", re.I)
# Bytes kept of the largest sources, so that no one of them rules the mix.
CAPS = {"gcide": 16_000_000, "host-doc": 12_000_000, "host-man": 16_000_000}

# Train-only sources, added in the corpus' second version (2026-11-27) when
# the default model had seen the first version's text about ten times and
# more passes no longer helped. They come after every source above and none
# of their documents is held out, so val.txt.xz is byte for byte the first
# version's and held-out losses of both versions compare. They are: what the
# caps above left out of gcide, host-doc and host-man (and the host's man
# pages past HOST_MAN_MAX), and the HTML manuals of EXTRA_PACKAGES, each
# source capped at the bytes given.
EXTRA_PACKAGES = ["linux-doc-6.1", "postgresql-doc-15", "git-doc", "sqlite3-doc",
                  "debian-policy", "developers-reference", "zsh-doc", "vim-doc", "nodejs-doc",
                  "bash-doc", "autoconf-doc", "debian-faq", "gnuplot-doc"]
EXTRA_HTML = [
    ("linux-doc", "linux-doc-6.1", "usr/share/doc/linux-doc-6.1/html/**/*.html", 30_000_000),
    ("postgresql-doc", "postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html/*.html",
     10_000_000),
    ("sqlite-doc", "sqlite3-doc", "usr/share/doc/sqlite3/**/*.html", 8_000_000),
    ("git-doc", "git-doc", "usr/share/doc/git-doc/**/*.html", 6_000_000),
    ("vim-doc", "vim-doc", "usr/share/doc/vim/html/*.html", 6_000_000),
    ("nodejs-doc", "nodejs-doc", "usr/share/doc/nodejs/api/*.html", 6_000_000),
    ("zsh-doc", "zsh-doc", "usr/share/doc/zsh-common/html/*.html", 3_000_000),
    ("gnuplot-doc", "gnuplot-doc", "usr/share/doc/gnuplot/htmldocs/*.html", 2_000_000),
    ("debian-policy", "debian-policy developers-reference debian-faq",
     "usr/share/doc/{debian-policy,developers-reference,debian}/**/*.html", 4_000_000),
    ("bash-autoconf", "bash-doc autoconf-doc", "usr/share/doc/{bash,autoconf}/*.html",
     4_000_000),
]
EXTRA_SKIP = re.compile(r"/translations/|/releaselog/|/(genindex|search|index|py-modindex)\.html$|"
                        r"\.(de|es|fr|it|ja|ko|pt|ru|zh)[-_.]")
EXTRA_REST_CAP = 24_000_000   # of each capped source's left-out documents


# ---- questions for the chat examples; pick() chooses one by a hash of
# the answer, so the output does not depend on the order of the sources ----

FORTUNE_QUESTIONS = ["Tell me a fortune.", "Give me a quote.", "Say something witty.",
                     "Tell me something interesting.", "Do you have a saying for me?"]
VERSE_QUESTIONS = ["What does {ref} say?", "Quote {ref}.", "Recite {ref} from the Bible."]
TERM_QUESTIONS = ["What is {term}?", "Explain {term}.", "What does {term} mean?"]
WORD_QUESTIONS = ["What does the word \"{word}\" mean?", "Define {word}.",
                  "What is the meaning of {word}?"]
COMMAND_QUESTIONS = ["What does the {cmd} command do?", "What is {cmd}?",
                     "What is {cmd} used for?"]


def pick(options, key):
    return options[int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % len(options)]


# ---- text clean-up ----

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text):
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = CONTROL.sub("", text.replace(SEP, " "))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def chunks(text, size=CHUNK):
    """Pieces of about `size` bytes cut at blank lines (or lines, if a
    paragraph is longer than `size`)."""
    out, cur, n = [], [], 0
    for para in re.split(r"\n\n+", text):
        for piece in [para] if len(para) < size else para.split("\n"):
            cur.append(piece)
            n += len(piece) + 2
            if n >= size:
                out.append("\n\n".join(cur))
                cur, n = [], 0
    if cur:
        out.append("\n\n".join(cur))
    return [c for c in out if c.strip()]


def read(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


# ---- HTML ----

SKIP_TAGS = {"script", "style", "head", "title"}
SKIP_CLASSES = {"navheader", "navfooter", "sphinxsidebar", "related", "footer", "header",
                "toc", "breadcrumb", "headerlink"}
BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt",
              "dd", "table", "ul", "ol", "dl", "blockquote", "section", "hr"}
VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr"}


class HtmlText(html.parser.HTMLParser):
    """Visible text of a page: navigation, scripts and headers left out,
    block elements on their own lines, <pre> kept as written."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.stack, self.skip, self.pre = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        skipping = tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        if tag in BLOCK_TAGS:
            self.out.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4") else "\n")
        if tag in VOID_TAGS:
            return
        self.stack.append((tag, skipping))
        self.skip += skipping
        self.pre += tag == "pre"

    def handle_endtag(self, tag):
        while self.stack:
            t, skipping = self.stack.pop()
            self.skip -= skipping
            self.pre -= t == "pre"
            if t == tag:
                break
        if tag in BLOCK_TAGS:
            self.out.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self):
        lines = (line.strip() if not line.startswith("    ") else line
                 for line in "".join(self.out).split("\n"))
        return "\n".join(lines)


def html_text(path):
    p = HtmlText()
    p.feed(read(path))
    p.close()
    return p.text()


# ---- sources: each yields documents (strings) and counts files ----

class Source:
    def __init__(self, name, package):
        self.name, self.package, self.files, self.docs, self.qa = name, package, 0, [], []

    def add(self, text, split=True):
        self.files += 1
        text = clean(text)
        if text:
            self.docs.extend(chunks(text) if split else [text])


def src_fortunes(x):
    s = Source("fortunes", "fortunes fortunes-min fortunes-bofh-excuses")
    for path in sorted(glob.glob(f"{x}/usr/share/games/fortunes/*")):
        base = os.path.basename(path)
        if "." in base or os.path.islink(path) or base in ("ascii-art",):
            continue
        items = [c.strip("\n") for c in read(path).split("\n%\n")]
        s.files += 1
        for i in range(0, len(items), 40):
            s.docs.append(clean("\n\n".join(items[i:i + 40])))
        for item in items:
            item = clean(item)
            if 20 < len(item) < 300:
                s.qa.append((pick(FORTUNE_QUESTIONS, item), item))
    return s


def src_bible(x):
    s = Source("bible", "bible-kjv bible-kjv-text")
    out = subprocess.run([f"{x}/usr/bin/bible", "-p", f"{x}/usr/lib", "gen1:1-rev22:21"],
                         capture_output=True, check=True).stdout.decode("utf-8", "replace")
    for chapter in re.split(r"\n(?=\S[^\n]* \d+\n)", out):
        head, _, body = chapter.strip("\n").partition("\n")
        verses = re.split(r"\n  \d+ ", "\n" + body.strip("\n"))
        verses = [v.replace("\n", " ").strip() for v in verses if v.strip()]
        if verses:
            s.docs.append(clean(f"{head}\n\n{' '.join(verses)}"))
        for n, verse in enumerate(verses, 1):
            s.qa.append((pick(VERSE_QUESTIONS, verse).format(ref=f"{head}:{n}"), verse))
    s.files = 1
    return s


def src_html(x, name, package, pattern, skip=None):
    s = Source(name, package)
    for path in sorted(expand(f"{x}/{pattern}")):
        if os.path.isfile(path) and not (skip and skip.search(path)):
            s.add(html_text(path))
    return s


def expand(pattern):
    """glob with one {a,b} alternation."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return glob.glob(pattern, recursive=True)
    return [p for alt in m.group(1).split(",")
            for p in glob.glob(pattern[:m.start()] + alt + pattern[m.end():], recursive=True)]


def src_pod(x):
    s = Source("perl-doc", "perl-doc")
    for path in sorted(glob.glob(f"{x}/usr/share/perl/*/pod/*.pod")):
        r = subprocess.run(["pod2text", "-w", "80", path], capture_output=True)
        s.add(r.stdout.decode("utf-8", "replace"))
    return s


def src_info(x):
    s = Source("gnu-standards", "gnu-standards")
    for path in sorted(glob.glob(f"{x}/usr/share/info/[ms]*.info.gz")):
        text = re.sub(r"\x1f\n?(File|Tag Table|End Tag Table|Indirect)[^\n]*\n", "\n\n", read(path))
        s.add(text)
    return s


def src_plain(x, name, package, pattern):
    s = Source(name, package)
    for path in sorted(glob.glob(f"{x}/{pattern}")):
        s.add(read(path))
    return s


def src_dict(x, name, package):
    """A dictd database: entries after the 00-database-* headers, with the
    GCIDE's pronunciation marks and source tags taken out."""
    s = Source(name, package)
    text = read(f"{x}/usr/share/dictd/{name}.dict.dz")
    entries = [e for e in re.split(r"\n(?=\S)", text) if not e.startswith("00-database")]
    text = "\n".join(entries)
    if name != "gcide":
        for e in entries:
            head, _, body = e.partition("\n")
            para = clean(re.split(r"\n\s*\n", body.strip("\n"))[0])
            para = re.sub(r"\s+", " ", para).strip()
            if head.strip() and 40 < len(para) < 600:
                s.qa.append((pick(TERM_QUESTIONS, para).format(term=head.strip()), para))
    text = re.sub(r"[ \t]*\[(1913 Webster|PJC|WordNet 1\.5|Century Dict\.)[^\]]*\]\n?", "", text)
    text = re.sub(r"\\[^\\\n]{1,60}\\,?", "", text)
    s.add(text)
    return s


def src_wordnet(x):
    s = Source("wordnet", "wordnet-base")
    pos_name = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
    for pos in ("noun", "verb", "adj", "adv"):
        lines = []
        for line in read(f"{x}/usr/share/wordnet/data.{pos}").split("\n"):
            if not line or line.startswith(" ") or "|" not in line:
                continue
            fields, gloss = line.split("|", 1)
            f = fields.split()
            words = [f[4 + 2 * i].replace("_", " ") for i in range(int(f[3], 16))]
            words = [re.sub(r"\(\w+\)$", "", w) for w in words]
            lines.append(f"{', '.join(words)} ({pos_name[pos]}): {gloss.strip()}")
            gloss = gloss.strip()
            if len(gloss) < 300:
                q = pick(WORD_QUESTIONS, gloss).format(word=words[0])
                s.qa.append((q, f"{words[0].capitalize()} ({pos_name[pos]}): {gloss}."))
        s.files += 1
        for i in range(0, len(lines), 150):
            s.docs.append(clean("\n".join(lines[i:i + 150])))
    return s


def render_man(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        src = f.read()
    if src.lstrip().startswith(b".so ") or len(src) < 800:
        return ""
    r = subprocess.run(["groff", "-t", "-man", "-Tutf8", "-P-cbou", "-rLL=80n"], input=src,
                       capture_output=True, timeout=60)
    return r.stdout.decode("utf-8", "replace")


MAN_NAME = re.compile(r"^NAME\n +(\S[^\n]*?) +[-\u2010\u2012-\u2015] +(\S[^\n]*)$", re.M)


def src_man(name, package, paths, jobs):
    s = Source(name, package)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for path, text in zip(paths, pool.map(render_man, paths)):
            s.add(text)
            m = MAN_NAME.search(text)
            if m and re.search(r"/man[18]/", path):
                cmd, what = m.group(1).split(",")[0].strip(), m.group(2).strip().rstrip(".")
                s.qa.append((pick(COMMAND_QUESTIONS, what).format(cmd=cmd), f"{cmd}: {what}."))
    return s


def man_paths(root, sections):
    paths = []
    for sec in sections:
        paths += [p for p in sorted(glob.glob(f"{root}/{sec}/*")) if os.path.isfile(p)
                  and not os.path.islink(p)]
    return paths


def host_man_paths(package_pages):
    have = {os.path.basename(p) for p in package_pages}
    return [p for p in man_paths("/usr/share/man", HOST_MAN_SECTIONS)
            if os.path.basename(p) not in have and not os.path.basename(p).startswith("gcloud")]


def host_man(package_pages, jobs):
    return src_man("host-man", "host /usr/share/man", host_man_paths(package_pages)[:HOST_MAN_MAX],
                   jobs)


def host_doc():
    s = Source("host-doc", "host /usr/share/doc")
    pat = re.compile(r"^(README|FAQ|USAGE|HOWTO|INTRO|TUTORIAL)[^/]*$|\.(txt|md|rst)(\.gz)?$",
                     re.I)
    for d, _, files in sorted(os.walk("/usr/share/doc")):
        for fn in sorted(files):
            path = os.path.join(d, fn)
            if (pat.search(fn) and not SKIP_DOC.search(path) and not os.path.islink(path)
                    and os.path.getsize(path) < 2 << 20):
                s.add(read(path))
    return s


# ---- assembly ----

def fetch(work, packages, into):
    """Downloads `packages` into WORK/debs and unpacks them into WORK/`into`;
    returns that folder and the packages' versions."""
    debs, x = os.path.join(work, "debs"), os.path.join(work, into)
    os.makedirs(debs, exist_ok=True)
    missing = [p for p in packages if not glob.glob(f"{debs}/{p}_*.deb")]
    if missing:
        subprocess.run(["apt-get", "download"] + missing, cwd=debs, check=True)
    versions = {}
    for p in packages:
        deb = sorted(glob.glob(f"{debs}/{p}_*.deb"))[-1]
        done = os.path.join(work, f".{into}.{p}.done")
        if not os.path.isdir(x) or not os.path.exists(done):
            subprocess.run(["dpkg", "-x", deb, x], check=True)
            open(done, "w").close()
        versions[p] = subprocess.run(["dpkg-deb", "-f", deb, "Version"], capture_output=True,
                                     text=True, check=True).stdout.strip()
    return x, versions


def sources(x, jobs):
    pkg_man = man_paths(f"{x}/usr/share/man", ("man2", "man3", "man4", "man5", "man7"))
    yield src_fortunes(x)
    yield src_bible(x)
    yield src_plain(x, "jargon", "jargon-text", "usr/share/doc/jargon-text/jargon.txt.gz")
    yield src_dict(x, "gcide", "dict-gcide")
    yield src_dict(x, "devil", "dict-devil")
    yield src_dict(x, "foldoc", "dict-foldoc")
    yield src_wordnet(x)
    yield src_html(x, "python-doc", "python3.11-doc",
                   "usr/share/doc/python3.11/html/**/*.html")
    yield src_html(x, "debian-handbook", "debian-handbook",
                   "usr/share/doc/debian-handbook/html/en-US/*.html")
    yield src_html(x, "debian-reference", "debian-reference-en",
                   "usr/share/debian-reference/*.en.html")
    yield src_html(x, "maint-guide", "maint-guide", "usr/share/doc/maint-guide/html/*.en.html")
    yield src_pod(x)
    yield src_info(x)
    yield src_man("manpages", "manpages manpages-dev", pkg_man, jobs)
    yield host_man(pkg_man, jobs)
    yield host_doc()


def extra_sources(x, xe, rest, jobs):
    """The train-only sources (EXTRA_* above): `rest` maps a capped source's
    name to the documents its cap left out."""
    for name, docs in rest.items():
        s = Source(f"{name}-rest", f"what the cap of {name} left out")
        s.docs = docs
        yield s
    pkg_man = man_paths(f"{x}/usr/share/man", ("man2", "man3", "man4", "man5", "man7"))
    yield src_man("host-man-more", "host /usr/share/man past HOST_MAN_MAX",
                  host_man_paths(pkg_man)[HOST_MAN_MAX:], jobs)
    for name, package, pattern, _ in EXTRA_HTML:
        yield src_html(xe, name, package, pattern, EXTRA_SKIP)


def val_doc(text):
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1000 < VAL_PER_MILLE


def take(s, cap, seen):
    """The documents of source `s` that are kept, in order: duplicates (of
    anything kept before) and pieces under 200 bytes dropped, until `cap`
    bytes; a capped source's documents are taken in the order of their
    hashes. Returns the kept ones and those the cap left out."""
    docs = s.docs
    if cap is not None:
        docs = sorted(docs, key=lambda d: hashlib.sha256(d.encode()).digest())
    kept, nbytes = [], 0
    for i, doc in enumerate(docs):
        if cap is not None and nbytes >= cap:
            return kept, docs[i:]
        h = hashlib.sha256(doc.encode()).digest()
        if h in seen or len(doc) < 200:
            continue
        seen.add(h)
        kept.append(doc)
        nbytes += len(doc.encode())
    return kept, []


def report_line(s, kept, n_qa, train_only):
    nbytes = sum(len(d.encode()) for d in kept)
    print(f"{s.name:18} {s.files:6} files {len(kept):7} docs {nbytes / 1e6:8.2f} MB "
          f"{n_qa:7} qa", file=sys.stderr)
    return {"source": s.name, "package": s.package, "files": s.files, "documents": len(kept),
            "bytes": nbytes, "qa_pairs": n_qa, "train_only": train_only}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="download and unpack folder")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--jobs", type=int, default=2, help="man page renderers")
    args = ap.parse_args()
    x, versions = fetch(args.work, PACKAGES, "x")
    xe, extra_versions = fetch(args.work, EXTRA_PACKAGES, "x-extra")
    versions.update(extra_versions)
    os.makedirs(args.out, exist_ok=True)
    seen, split = set(), {"train": [], "val": []}
    qa = {"train": [], "val": []}
    report, rest = [], {}
    for s in sources(x, args.jobs):
        kept, left_out = take(s, CAPS.get(s.name), seen)
        for doc in kept:
            split["val" if val_doc(doc) else "train"].append(doc)
        if left_out:
            rest[s.name] = left_out
        for q, a in s.qa:
            qa["val" if val_doc(a) else "train"].append({"q": q, "a": a})
        report.append(report_line(s, kept, len(s.qa), False))
    extra_caps = {name: cap for name, _, _, cap in EXTRA_HTML}
    for s in extra_sources(x, xe, rest, args.jobs):
        kept, _ = take(s, extra_caps.get(s.name, EXTRA_REST_CAP), seen)
        split["train"] += kept
        qa["train"] += [{"q": q, "a": a} for q, a in s.qa]
        report.append(report_line(s, kept, len(s.qa), True))
    manifest = {"version": 2, "packages": versions, "sources": report,
                "val_per_mille": VAL_PER_MILLE,
                "chunk_bytes": CHUNK, "separator": "U+001E", "outputs": {}}
    for name, docs in split.items():
        data = SEP.join(docs).encode()
        path = os.path.join(args.out, f"{name}.txt.xz")
        with lzma.open(path, "wb", preset=6) as f:
            f.write(data)
        manifest["outputs"][name] = {"file": f"{name}.txt.xz", "documents": len(docs),
                                     "bytes": len(data),
                                     "sha256": hashlib.sha256(data).hexdigest()}
        print(f"{name}: {len(docs)} docs, {len(data) / 1e6:.1f} MB", file=sys.stderr)
    for name, pairs in qa.items():
        data = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs).encode()
        with lzma.open(os.path.join(args.out, f"qa-{name}.jsonl.xz"), "wb", preset=6) as f:
            f.write(data)
        manifest["outputs"][f"qa-{name}"] = {"file": f"qa-{name}.jsonl.xz", "pairs": len(pairs),
                                             "bytes": len(data),
                                             "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
