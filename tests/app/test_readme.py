"""The documents' Python examples run as written, and their links lead somewhere: every ```python
block of README.md and of the pages in docs/ is executed (blocks that need a GPU guard themselves
with ``tc.gpu_available()``; the CUDA graph example also runs on the CuPy stand-in), and every
relative link names a file that exists (and, with ``#anchor``, one of its headings)."""
import re

import pytest

from paths import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "RESULTS.md",
             *sorted((ROOT / "benchmarks" / "history").glob("*.md"))]
BLOCKS = [(path, index, code) for path in DOCUMENTS
          for index, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def name(path):
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path, index, code", BLOCKS, ids=[f"{name(p)}-{i}" for p, i, _ in BLOCKS])
def test_document_example_runs(path, index, code):
    exec(compile(code, f"{name(path)} block {index}", "exec"), {})


def test_the_docs_folder_has_its_pages_and_the_readme_links_each():
    readme = (ROOT / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {"engine.md", "kernels-and-gpu.md", "data.md", "training.md", "gradient-flow.md", "distributed.md",
            "reliability.md", "conventions.md", "testing.md"} <= pages
    for page in pages:
        assert f"(docs/{page})" in readme, f"README.md does not link docs/{page}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_relative_link_leads_to_a_file_and_heading(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute address (https:, mailto:)
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{name(path)} links {target}, which does not exist"
        if fragment:
            assert fragment in headings(linked), f"{name(path)} links {target}, a heading {linked.name} lacks"


@pytest.mark.slow
def test_the_cuda_graph_example_runs_on_the_stand_in():
    from standin import run_standin

    (code,) = [c for p, _, c in BLOCKS if p.name == "kernels-and-gpu.md" and "CapturedStep(" in c]
    assert run_standin(["-c", code], devices=1).split()[0] == "True"  # captured, then replayed
