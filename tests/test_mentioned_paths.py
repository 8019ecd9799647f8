"""Every project file that the tree's text names by its path is there: a test or module moved or renamed
leaves no pointer to where it used to be."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".toml"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
SOURCES = ("harness", "tests", "benchmarks", "polyaxonfiles", "prompts", "scripts")
FOREIGN = ROOT / "tests" / "fixtures"  # vLLM's logs and configs, kept verbatim: their paths are not ours
MENTION = re.compile(r"(?<![\w./-])((?:tests|harness|benchmarks)/[\w/.-]*\.py|polyaxonfiles/[\w/.-]*\.yaml"
                     r"|prompts/[\w./<>-]*[\w>]|scripts/[\w.-]*\w)")
# Inventory paths made up as a record's data or as hostile input: never meant to exist.
INVENTED = {"prompts/x", "prompts/bench", "prompts/../../etc"}


def text_files() -> list[Path]:
    """The project's own text files: those at the top and in its source folders (not the outputs a run or a
    build leaves beside them), less the foreign fixtures."""
    candidates = [*ROOT.glob("*"), *(path for folder in SOURCES for path in (ROOT / folder).rglob("*"))]
    return sorted(path for path in candidates
                  if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES)
                  and FOREIGN not in path.parents)


def mentions() -> dict[str, list[str]]:
    """Each mentioned path → the files mentioning it, once per mention."""
    found: dict[str, list[str]] = {}
    for path in text_files():
        for mentioned in MENTION.findall(path.read_text(encoding="utf-8")):
            found.setdefault(mentioned, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_mentioned_path_exists() -> None:
    """A placeholder (`prompts/<name>`, a name in angle brackets) is the reader's to fill in, not a path."""
    found = mentions()
    assert sum(map(len, found.values())) >= 90 and len(found) >= 30
    assert {"polyaxonfiles/experiment.yaml", "scripts/install-engine.sh", "prompts/<name>"} <= found.keys()
    assert found.keys() >= INVENTED  # each exemption is still needed
    missing = {mentioned: sorted(set(where)) for mentioned, where in found.items()
               if "<" not in mentioned and mentioned not in INVENTED and not (ROOT / mentioned).exists()}
    assert missing == {}
