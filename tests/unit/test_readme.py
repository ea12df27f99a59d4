"""The READMEs stay true: the README is a front door of a few screens whose map links every
section of the references beside the code (and reaches every Markdown file), every relative
link in every Markdown file resolves (anchors by GitHub's rules), every citation in code
names a section that exists, app/README.md's settings table is Settings, and every
environment variable the test command reads is documented."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
APP_README = ROOT / "app" / "README.md"  # the Configuration reference, beside settings.py
# Not the project's: virtualenvs, caches, git, mutmut's copy of the tree.
SKIPPED_DIRS = {"mutants", "node_modules", "__pycache__"}
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_files() -> list[Path]:
    """Every Markdown file of the repository (dot folders, like .venv and .git, left out)."""
    found = []
    for path in ROOT.rglob("*.md"):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part in SKIPPED_DIRS for part in parts[:-1]):
            continue
        found.append(path)
    return sorted(found)


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered, lower case, punctuation but
    hyphens and underscores dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a Markdown file; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every link or image in a file that is not a URL."""
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
                continue
            yield number, target


def broken_links(path: Path) -> list[str]:
    broken = []
    for number, target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{where}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{where}: no heading with that anchor in {linked.name}")
        elif fragment and linked.suffix != ".md" and not re.fullmatch(r"L\d+(-L\d+)?", fragment):
            broken.append(f"{where}: an anchor into a file that has no headings")
    return broken


def section(text: str, heading: str) -> str:
    """The text under a heading, up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    end = len(lines)
    for index in range(start + 1, len(lines)):
        match = HEADING.match(lines[index])
        if match and len(match.group(1)) <= level:
            end = index
            break
    return "\n".join(lines[start + 1 : end])


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([cell.strip() for cell in cells])
    return rows


def documented_settings(text: str) -> dict[str, str]:
    """app/README.md's settings table: variable -> its Default cell."""
    table = section(text, "## Configuration")
    documented = {}
    for row in table_rows(table, "| Variable | Default |"):
        name = re.fullmatch(r"`([A-Z][A-Z0-9_]*)`", row[0])
        assert name, f"not one variable per row: {row[0]}"
        documented[name.group(1)] = row[1]
    return documented


@pytest.fixture
def defaults(monkeypatch, tmp_path) -> dict[str, object]:
    """Each setting's effective default: Settings built from an empty environment."""
    for field in Settings.model_fields.values():
        if field.alias:
            monkeypatch.delenv(field.alias, raising=False)
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    return {
        field.alias: getattr(settings, name)
        for name, field in Settings.model_fields.items()
        if field.alias
    }


def default_problem(name: str, cell: str, value: object, data_dir: Path) -> str | None:
    """Why a Default cell does not say `value`, or None when it does."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None or value == "":
        word = "unset" if value is None else "empty"
        return None if cell.lower().startswith(word) else f"{name}: say {word!r}, not {cell!r}"
    shown = re.search(r"`([^`]*)`", cell)
    if shown is None:
        return f"{name}: no default in code in {cell!r}"
    token = shown.group(1)
    if isinstance(value, bool):
        expected = "true" if value else "false"
    elif isinstance(value, int | float):
        try:
            ok = float(token) == float(value)
        except ValueError:
            ok = False
        return None if ok else f"{name}: the default is {value}, the README says {token!r}"
    elif isinstance(value, Path):
        expected = os.path.relpath(value) if value.is_absolute() else str(value)
    elif isinstance(value, tuple):
        expected = ",".join(map(str, value))
    else:
        expected = str(value).replace(str(data_dir), "<data dir>")
    return None if token == expected else f"{name}: the default is {expected!r}, not {token!r}"


def test_the_settings_table_is_every_setting_with_its_default(defaults):
    documented = documented_settings(APP_README.read_text())
    missing = sorted(set(defaults) - set(documented))
    made_up = sorted(set(documented) - set(defaults))
    assert missing == [], "add these to app/README.md's settings table (## Configuration)"
    assert made_up == [], "app/README.md's settings table names settings that do not exist"
    data_dir = defaults["FL_DISPATCHER_DATA_DIR"]
    assert isinstance(data_dir, Path)
    wrong = [
        problem
        for name, value in defaults.items()
        if (problem := default_problem(name, documented[name], value, data_dir))
    ]
    assert wrong == []


def test_the_essentials_name_only_settings_that_exist():
    essentials = section(README.read_text(), "## Configuration essentials")
    named = {
        name
        for row in table_rows(essentials, "| Setting |")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row[0])
    }
    aliases = {field.alias for field in Settings.model_fields.values()}
    assert named, "the essentials table is gone"
    assert named - aliases == set()


def test_every_relative_link_in_every_markdown_file_resolves():
    files = markdown_files()
    assert README in files and len(files) > 1
    broken = [problem for path in files for problem in broken_links(path)]
    assert broken == []


# A citation in code or tests: README "Title", README, "Title", app/x/README.md "Title"; a
# citation may run on over a line break (a comment's `#` continues it).
CITATION = re.compile(
    r"""((?:[\w./-]+/)?README(?:\.md)?)\)?,?\s+(?:\#\s*)?(?:section\s+)?["'“]"""
    r"""((?:[^"'”\n]|\n[ \t]*(?:\#[ \t]*)?){1,120}?)["'”]"""
)
# Where citations live: code, scripts, configuration, the dashboard (Markdown links are
# checked as links).
CITING_SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".json", ".toml", ".env", ".cfg", ".tf", ".txt"}
CITING_SUFFIXES.add("")  # scripts without one, as in .ci/


def citing_files() -> list[Path]:
    """Every file of the project's own folders (and the root's) that may cite a README."""
    found = [path for path in ROOT.iterdir() if path.is_file() and path.suffix in CITING_SUFFIXES]
    for top in ("app", "tasks", "models", "migrations", "tests", ".ci"):
        for path in (ROOT / top).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if any(part in SKIPPED_DIRS for part in parts) or not path.is_file():
                continue
            if path.suffix in CITING_SUFFIXES and path != Path(__file__).resolve():
                found.append(path)  # this file's own examples left out
    return sorted(found)


def citations(text: str) -> Iterator[tuple[str, str]]:
    """(README path as written, section title) of every citation in a file's text."""
    for ref, title in CITATION.findall(text.replace('\\"', '"')):  # JSON escapes its quotes
        yield ref, " ".join(re.sub(r"\n[ \t]*#?", " ", title).split())


def cited_places(markdown: Path) -> list[str]:
    """What a citation may name in a markdown file: its headings, bold paragraph and list leads."""
    text = markdown.read_text(encoding="utf-8")
    places = [
        re.sub(r"^#+\s*", "", line).strip() for line in text.splitlines() if line.startswith("#")
    ]
    places += re.findall(r"^(?:[-*] )?\*\*([^*]+)\*\*", text, flags=re.M)
    return [place.replace("`", "") for place in places] + places


def citation_problems(path: Path) -> list[str]:
    """Each citation in a file whose README or section does not exist."""
    missing = []
    for ref, title in citations(path.read_text(encoding="utf-8", errors="replace")):
        markdown = README if ref in ("README", "README.md") else ROOT / ref
        if not markdown.is_file():
            missing.append(f"{path.relative_to(ROOT)}: {ref} does not exist")
        elif not any(place.startswith(title) for place in cited_places(markdown)):
            missing.append(f'{path.relative_to(ROOT)}: {ref} has no "{title}"')
    return missing


def test_every_readme_section_cited_in_code_exists():
    # A docstring or comment that sends a reader to README "X" must find X there (issue 39:
    # two citations pointed at sections long gone).
    sources = citing_files()
    missing = [problem for path in sources for problem in citation_problems(path)]
    assert len(sources) > 100
    assert missing == []


# The references moved out of the README into the folders of the code they describe (issue
# 39): the map links every section of each.
REFERENCES = [
    ROOT / "tasks" / "README.md",
    ROOT / "app" / "usecases" / "README.md",
    ROOT / "app" / "adapters" / "README.md",
    ROOT / "app" / "entrypoints" / "README.md",
    ROOT / "app" / "README.md",
    ROOT / "tests" / "README.md",
]


def test_the_readme_is_a_few_screens_and_opens_with_the_front_door():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) < 300, "the README is the front door: move references beside their code"
    first_40 = "\n".join(lines[:40])
    demo = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/fl-dispatcher demo"
    assert demo in first_40
    assert "\nbash tests/run.sh\n" in first_40
    headings = [line for _, line in prose_lines(text) if line.startswith("## ")]
    front = [
        "## The two commands",
        "## Architecture",
        "## How flip-api calls it",
        "## Configuration essentials",
        "## What to page on",
        "## Where things are",
    ]
    assert [h for h in headings if h in front] == front, "the front door, in this order"


def map_links() -> set[Path | tuple[Path, str]]:
    """What the README's "Where things are" links: files, and (file, anchor) pairs."""
    found: set[Path | tuple[Path, str]] = set()
    for line in section(README.read_text(), "## Where things are").splitlines():
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            file_part, _, fragment = target.partition("#")
            linked = (ROOT / file_part).resolve() if file_part else README
            found.add((linked, fragment) if fragment else linked)
    return found


def test_the_map_links_every_section_of_every_reference():
    links = map_links()
    unlisted = [
        f"{path.relative_to(ROOT)}#{github_slug(match.group(2))}"
        for path in REFERENCES
        for _, line in prose_lines(path.read_text())
        if (match := HEADING.match(line)) and len(match.group(1)) in (2, 3)
        if (path, github_slug(match.group(2))) not in links
    ]
    assert unlisted == [], "link these from README.md's Where things are"


def test_every_markdown_file_is_reachable_from_the_map():
    # From the map, following relative links file to file, a reader finds every Markdown
    # file of the repository.
    seen = {README}
    todo = [path if isinstance(path, Path) else path[0] for path in map_links()]
    while todo:
        path = todo.pop()
        if path in seen or path.suffix != ".md" or not path.is_file():
            continue
        seen.add(path)
        for _, target in relative_links(path):
            file_part = target.partition("#")[0]
            if file_part:
                todo.append((path.parent / file_part).resolve())
    assert sorted(set(markdown_files()) - seen) == []


def test_every_alert_rule_is_in_what_to_page_on():
    rules = yaml.safe_load((ROOT / "app" / "monitoring" / "alerts.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    page = section(README.read_text(), "## What to page on")
    listed = {re.sub(r"`", "", row[0]) for row in table_rows(page, "| Alert |")}
    assert listed == alerts


SHELL_SCRIPTS = [
    ROOT / "tests" / "run.sh",
    *sorted((ROOT / "tests" / "tools").glob("*.sh")),
    ROOT / "tests" / "mutation" / "run.sh",
    *sorted(path for path in (ROOT / ".ci").iterdir() if path.suffix in {"", ".sh"}),
]
SHELL_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]*):?-")  # ${NAME:-default}, ${NAME-default}
PYTHON_READ = re.compile(
    r"(?:os\.environ(?:\.get)?[\[(]\s*|os\.getenv\(\s*)\"([A-Z][A-Z0-9_]*)\""
    r"|\"([A-Z][A-Z0-9_]*)\"\s+(?:not\s+)?in\s+os\.environ"
)


def variables_read_by_the_tests() -> set[str]:
    names = {name for path in SHELL_SCRIPTS for name in SHELL_READ.findall(path.read_text())}
    for path in (ROOT / "tests").rglob("*.py"):
        for pair in PYTHON_READ.findall(path.read_text()):
            names.update(name for name in pair if name)
    return names


def test_every_variable_the_test_command_reads_is_in_the_readme():
    read = variables_read_by_the_tests()
    assert {"FL_VENV", "FL_TEST_WORKERS", "FL_TEST_WORKERS_UNIT", "FL_TEST_PG_URL"} <= read
    variables = section((ROOT / "tests" / "README.md").read_text(), "## Test variables")
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]*)`", variables))
    assert read - documented == set(), "add these to tests/README.md's Test variables"


def test_the_callbacks_section_says_the_attempt_is_1_based_since_0_2_0_as_the_changelog():
    """flip-api's receiver is written from this section: it says `attempt` counted from 0
    before 0.2.0, points at the CHANGELOG, and both say what a requeue's event carries."""
    tasks = (ROOT / "tasks" / "README.md").read_text()
    section = tasks.split("\n## Status callbacks\n", 1)[1].split("\n## ", 1)[0]
    assert "app/deploy/CHANGELOG.md" in section and "1-based since 0.2.0" in section
    assert "0-based" in section
    changelog = " ".join((ROOT / "app" / "deploy" / "CHANGELOG.md").read_text().split())
    said = "carries the attempt it waits for"
    assert said in " ".join(section.split()) and said in changelog
