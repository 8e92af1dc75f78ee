"""The documents' Python examples run as written, and their links lead somewhere: every ```python
block of README.md and of the pages in docs/ is executed (blocks that need a GPU guard themselves
with ``tc.gpu_available()``; the CUDA graph example also runs on the CuPy stand-in), and every
relative link names a file that exists (and, with ``#anchor``, one of its headings)."""
import importlib.util
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


# Packages the README's set-up does not install: an example that imports one says so in its page
# and is skipped where it is missing (a newcomer's environment has none of them).
OPTIONAL_PACKAGES = ("torch", "jax", "ray", "cupy")
IMPORT = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)


def missing_optional_packages(code: str) -> list:
    """The optional packages ``code`` imports that this environment lacks."""
    return [p for p in dict.fromkeys(IMPORT.findall(code)) if p in OPTIONAL_PACKAGES and not installed(p)]


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (a finder that hides it counts as missing)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


@pytest.fixture
def registries_restored():
    """An example may register a routing, a study or a figure (docs/routing.md registers one): what
    it adds is taken out again, so that the tests after it, in this process, see the built-in ones."""
    from tinygrad_caps.models.analysis import figures
    from tinygrad_caps.models.app.studies import registry as studies
    from tinygrad_caps.models.capsnet.routing import registry as routings

    tables = (routings._ROUTINGS, routings._RECIPES, studies.STUDIES, figures.FIGURES)
    saved = [dict(table) for table in tables]
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)


@pytest.mark.parametrize("path, index, code", BLOCKS, ids=[f"{name(p)}-{i}" for p, i, _ in BLOCKS])
def test_document_example_runs(path, index, code, registries_restored):
    missing = missing_optional_packages(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, an optional package the README's set-up does not install")
    exec(compile(code, f"{name(path)} block {index}", "exec"), {})


def test_a_page_says_which_optional_package_its_example_needs():
    for path, index, code in BLOCKS:
        text = path.read_text()
        before = text[:text.index(code)][-600:].lower()  # the prose just above the block
        for package in dict.fromkeys(p for p in IMPORT.findall(code) if p in OPTIONAL_PACKAGES):
            assert package in before, f"{name(path)} block {index} imports {package} without a word above it"


def test_an_example_that_imports_a_missing_optional_package_is_skipped(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert missing_optional_packages("import numpy as np\nimport torch\nfrom jax import numpy\n") == ["torch", "jax"]


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


NUMBER = re.compile(r"^-?\d+(\.\d+)?(e[-+]\d+)?$")


def same_line(shown: str, printed: str) -> bool:
    """Whether a table line of a page and a printed line agree: the same words, and numbers equal to
    within what another CPU's float rounding can change (3 parts in 1,000, or 1e-6 near 0)."""
    a, b = shown.split(), printed.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if NUMBER.match(x) and NUMBER.match(y):
            if abs(float(x) - float(y)) > 1e-6 + 3e-3 * abs(float(y)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.slow
def test_the_gradflow_table_of_docs_is_what_the_command_prints(tmp_path, capsys):
    """docs/gradient-flow.md shows the table of its first ``gradflow`` command: every line it shows
    (its "..." leaves the other parameters out) is printed, in that order, by the command today."""
    from tinygrad_caps.data import DatasetError, load_dataset
    from tinygrad_caps.models import cli

    try:
        load_dataset("fashion-mnist", "test", download_missing=False)
    except DatasetError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    page = (ROOT / "docs" / "gradient-flow.md").read_text()
    command = re.search(r"^tinygrad-caps gradflow (--conv1-channels .*?) --out \S+$", page, re.M).group(1)
    table = re.search(r"```text\n(gradient flow: fresh initialisation.*?)```", page, re.S).group(1).splitlines()
    assert cli.main(["gradflow", *command.split(), "--out", str(tmp_path / "gf"), "--no-progress"]) == 0
    printed = iter(capsys.readouterr().out.splitlines())
    for line in (line for line in table if line != "..."):
        assert any(same_line(line, candidate) for candidate in printed), f"docs/gradient-flow.md shows {line!r}"
