"""The translation catalogs (locale/zh_Hans/LC_MESSAGES/): every text the code marks has a
Simplified Chinese translation, the .po files are what scripts/messages.sh makes of today's code,
the committed .mo files are the .po files compiled, and the table of stored texts
(jobs/stored_texts.py) still matches the modules that build them."""

from __future__ import annotations

import ast
import gettext
import os
import re
import shutil
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest

from faulttolerance import classify, policy, whatif
from jobs import stored_text, stored_texts

ROOT = Path(__file__).resolve().parent.parent
LOCALE = ROOT / "locale" / "zh_Hans" / "LC_MESSAGES"
DOMAINS = ("django", "djangojs")
# Placeholders a translation must keep: %(name)s, %s, {name} (format_lazy), and HTML tags.
PLACEHOLDER = re.compile(r"%\(\w+\)[sdr]|%[sd]|\{\w*\}|</?(?:a|b|br|code|em|i|small|span|strong)\b[^>]*>")


# -- a small .po reader (no dependency: the format is simple and Django writes it one way) ---------
def read_po(path: Path) -> dict[tuple[str, str, str], dict]:
    """(msgctxt, msgid, msgid_plural) -> {"msgstr": [forms], "fuzzy": bool}; the header is left out."""
    entries: dict[tuple[str, str, str], dict] = {}
    current: dict = {}
    field = None

    def flush() -> None:
        if "msgid" in current and current["msgid"]:
            key = (current.get("msgctxt", ""), current["msgid"], current.get("msgid_plural", ""))
            forms = [current[k] for k in sorted(k for k in current if k.startswith("msgstr"))]
            entries[key] = {"msgstr": forms, "fuzzy": current.get("fuzzy", False)}

    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip():
            flush()
            current, field = {}, None
        elif line.startswith("#,"):
            current["fuzzy"] = "fuzzy" in line
        elif line.startswith("#"):
            continue
        elif line.startswith('"'):
            current[field] += ast.literal_eval(line)
        else:
            keyword, _, value = line.partition(" ")
            field = keyword.replace("[", "_").replace("]", "")  # msgstr[0] -> msgstr_0
            current[field] = ast.literal_eval(value)
    return entries


def entries(domain: str, locale_dir: Path = LOCALE) -> dict:
    return read_po(locale_dir / f"{domain}.po")


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_text_has_a_chinese_translation(domain):
    problems = []
    for (context, msgid, plural), entry in entries(domain).items():
        where = f"{context + ' | ' if context else ''}{msgid!r}"
        if entry["fuzzy"]:
            problems.append(f"fuzzy: {where}")
        if not entry["msgstr"] or not all(form.strip() for form in entry["msgstr"]):
            problems.append(f"untranslated: {where}")
            continue
        wanted = sorted(PLACEHOLDER.findall(plural or msgid))
        for form in entry["msgstr"]:
            if sorted(PLACEHOLDER.findall(form)) != wanted:
                problems.append(f"placeholders differ: {where} -> {form!r}")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """scripts/messages.sh run on a copy of the project: the catalogs today's code makes."""
    if shutil.which("xgettext") is None or shutil.which("msgfmt") is None:
        pytest.fail("gettext is not installed (scripts/setup.sh --test installs it): the catalogs cannot be checked")
    copy = tmp_path_factory.mktemp("i18n") / "project"
    skipped = {".venv", "var", ".git", "test-artifacts", "__pycache__", ".ruff_cache", ".pytest_cache", ".hypothesis"}
    shutil.copytree(ROOT, copy, ignore=lambda _dir, names: [n for n in names if n in skipped])
    env = os.environ | {
        "PYTHON": sys.executable,
        "CONSOLE_VAR_DIR": str(copy / "var"),
        "DJANGO_SECRET_KEY": "catalog-check",
        "DJANGO_SETTINGS_MODULE": "console.settings",
    }
    for args in ([], ["--compile"]):
        result = subprocess.run(
            ["bash", "scripts/messages.sh", *args], cwd=copy, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
    return copy / "locale" / "zh_Hans" / "LC_MESSAGES"


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_catalogs_hold_exactly_the_texts_the_code_marks(domain, regenerated):
    committed, made = set(entries(domain)), set(entries(domain, regenerated))
    assert not made - committed, (
        f"texts marked in the code but not in {domain}.po (run scripts/messages.sh, then translate them): "
        f"{sorted(made - committed)}"
    )
    assert not committed - made, f"{domain}.po has texts the code no longer marks: {sorted(committed - made)}"


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_committed_mo_files_are_the_po_files_compiled(domain, regenerated):
    with open(LOCALE / f"{domain}.mo", "rb") as committed, open(regenerated / f"{domain}.mo", "rb") as made:
        assert gettext.GNUTranslations(committed)._catalog == gettext.GNUTranslations(made)._catalog, (
            f"{domain}.mo is behind {domain}.po: run scripts/messages.sh --compile"
        )


# -- the table of stored texts --------------------------------------------------------------------
def literal_parts(template: str) -> list[str]:
    return [part for part in re.split(r"%\(\w+\)s", template) if len(part.strip(" .:,;()")) > 3]


def test_the_stored_text_table_matches_the_modules_that_build_them():
    """Each entry's words occur in its module: a reworded message must be reworded in the table too
    (else a Chinese page shows it in English)."""
    stale = []
    for module, templates in stored_texts.BY_MODULE.items():
        source = " ".join((ROOT / module).read_text().split())  # one line: f-strings split over lines
        source = re.sub(r'"\s+f?"', "", source)  # implicit concatenation of adjacent string literals
        for template in templates:
            for part in literal_parts(template):
                if part.strip() not in source:
                    stale.append(f"{module}: {part.strip()!r} (of {template!r})")
    assert not stale, "\n".join(stale)


def translated(text: str) -> bool:
    return any(pattern.fullmatch(text) for pattern, _template in stored_text._patterns())


def test_every_explanation_and_decision_of_fault_tolerance_is_in_the_table():
    assert [rule.explanation for rule in classify.RULES if not translated(rule.explanation)] == []
    assert [label for _cls, label in whatif.SCENARIOS if not translated(label)] == []
    classes = [classify.USER_ERROR, classify.RESOURCE_ERROR, classify.ENV_CHECK_FAILED, classify.NODE_FAILURE]
    classes += [classify.TRANSIENT, classify.HANG, classify.PREEMPTED, classify.TERMINATED]
    untranslated = set()
    for r, u, h, p, used, hang, unc, multi, cls in product(
        (0, 3), (False, True), (False, True), (0, 1), (0, 3), (0, 3), (0, 3), (False, True), classes
    ):
        counters = policy.Counters(used, hang, unc, hang, 0)
        decision = policy.decide(policy.Policy(r, u, h, p), counters, cls, multi_instance=multi)
        for text in (decision.summary, decision.reason):
            if not translated(text):
                untranslated.add(text)
        outcome = whatif.outcome(policy.Policy(max(r, 1), u, h, p), cls, multi_instance=multi)
        for step in outcome.restarts:
            if not translated(step.consumes):
                untranslated.add(step.consumes)
    assert not untranslated, sorted(untranslated)
