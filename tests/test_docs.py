"""The manual's shape: every page is in the site's navigation, the README stays a front door, and
the product speaks of itself only (no development-log wording in the README, docs or changelog).

Read from the files (no mkdocs run: `make docs` builds the site strictly, this stays in-process).
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 200

# A release note or a page says what the product does, not which ticket or sitting changed it.
DEV_LOG = re.compile(r"\bissues?\s*#?\d+|\bsessions?\s*#?\d+\b|\bthis round\b|\bround \d+\b", re.IGNORECASE)


def nav_pages(entries):
    """The page paths of mkdocs.yml's nav, however deeply sections nest."""
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from nav_pages(value)
        elif not re.match(r"[a-z]+://", value):
            yield value


def mkdocs_config():
    # safe_load: the configuration uses no `!!python/name:` tags (no emoji extension), keep it so.
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    in_nav = list(nav_pages(mkdocs_config()["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert len(in_nav) == len(set(in_nav)), "a page is listed twice in the nav"
    assert sorted(on_disk - set(in_nav)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(in_nav) - on_disk) == [], "nav entries without a page under docs/"


def test_the_site_builds_strictly_and_fetches_nothing():
    config = mkdocs_config()
    assert config["strict"] is True
    assert config["theme"]["name"] == "material"
    assert config["theme"]["font"] is False, "Google fonts would be fetched by every reader"
    plugins = {p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])}
    assert not plugins & {"privacy", "social"}, "plugins that download at build time"


def test_the_architecture_page_includes_the_one_map():
    page = (DOCS / "development" / "architecture.md").read_text()
    assert '--8<-- "ARCHITECTURE.md"' in page
    assert (ROOT / "ARCHITECTURE.md").is_file()


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for command in ("make run", "make test", "make check", "make docs"):
        assert command in readme, command
    assert "docs/screenshot.png" in readme


def test_the_readme_links_only_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to the docs pages"
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_no_development_log_wording():
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in [DEV_LOG.search(line)]
        if match
    ]
    assert found == []
