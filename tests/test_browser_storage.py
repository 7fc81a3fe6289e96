"""The code dir browser (SPEC §3) in a real browser: Debian's Chromium (Playwright) against the
harness's daphne, whose root is the session's <VAR_DIR>/object-storage: browse, view, edit and
save, and pick a folder for the wizard. Screenshots go to /tmp/shots/."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from tests.folders import BROWSE, browse
from tests.helpers import wait_for

SHOTS = Path("/tmp/shots")


@pytest.fixture
def chromium_page(browser, daphne_server):
    daphne_server.ensure_running()
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(base_url=daphne_server.url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def live_bucket(settings, demo):
    """A bucket of this test (the demo workspace's) in the storage root the daphne process uses (VAR_DIR)."""
    from jobs.models import Bucket

    name = f"browser-{uuid.uuid4().hex[:8]}"
    Bucket.objects.create(name=name, workspace=demo.workspace)
    bucket = Path(settings.OBJECT_STORAGE_ROOT) / name
    (bucket / "code" / "data").mkdir(parents=True)
    (bucket / "code" / "gone").mkdir()
    (bucket / "code" / "train.py").write_text("print('v1')\n")
    (bucket / "code" / "train.log").write_text("epoch 1 loss 0.9\nepoch 2 loss 0.5\n")
    (bucket / "code" / "weights.bin").write_bytes(b"\x00" * 2048)
    yield name, bucket
    shutil.rmtree(bucket, ignore_errors=True)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_browse_edit_and_pick_in_a_browser(demo, chromium_page, live_bucket):
    from playwright.sync_api import expect

    page = chromium_page
    name, bucket = live_bucket
    page.goto("/accounts/login/")
    page.get_by_label("User name").fill("member")
    page.get_by_label("Password").fill("member-password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Training jobs")).to_be_visible()

    page.goto(BROWSE)
    expect(page.get_by_role("heading", name="Object storage")).to_be_visible()
    page.screenshot(path=str(SHOTS / "00-buckets.png"), full_page=True)
    page.evaluate("window.__notReloaded = true")
    page.get_by_role("link", name=f"{name}/", exact=True).click()
    expect(page.locator(".storage-url code")).to_have_text(f"obs://{name}/")
    page.get_by_role("link", name="code/").click()
    expect(page.locator(".storage-url code")).to_have_text(f"obs://{name}/code/")
    assert page.url.endswith(browse(f"obs://{name}/code/")), page.url  # pushed
    expect(page.locator('tr[data-name="weights.bin"]')).to_contain_text("cannot be opened")
    expect(page.locator('tr[data-name="weights.bin"]')).to_contain_text("2 KB")
    page.screenshot(path=str(SHOTS / "01-folder.png"), full_page=True)

    # A folder removed after the listing was shown: our 404 message is swapped in, the page stays.
    (bucket / "code" / "gone").rmdir()
    page.get_by_role("link", name="gone/").click()
    expect(page.locator(".storage-error")).to_contain_text(f"'obs://{name}/code/gone/' does not exist in object")
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
    expect(page.get_by_role("heading", name="Object storage")).to_be_visible()
    page.go_back()
    expect(page.locator(".storage-url code")).to_have_text(f"obs://{name}/code/")
    page.get_by_role("row", name=re.compile("weights.bin")).get_by_text("weights.bin").click()  # not a link
    expect(page.locator(".storage-url code")).to_have_text(f"obs://{name}/code/")
    page.goto(browse(f"obs://{name}/code/weights.bin"))
    expect(page.locator(".storage-notice")).to_contain_text("This file is listed but cannot be opened")
    page.screenshot(path=str(SHOTS / "01b-not-openable.png"), full_page=True)
    page.go_back()
    page.evaluate("window.__notReloaded = true")
    page.get_by_role("link", name="train.log").click()
    expect(page.locator("pre.storage-view")).to_contain_text("epoch 2 loss 0.5")
    page.screenshot(path=str(SHOTS / "02-view-log.png"), full_page=True)
    page.locator(".storage-crumbs").get_by_role("link", name="code", exact=True).click()

    page.get_by_role("link", name="train.py").click()
    editor = page.get_by_label("Content of train.py")
    expect(editor).to_have_value("print('v1')\n")
    editor.fill("import sys\nprint('v2', sys.argv)\n")
    # Leaving unsaved text asks first (the dismissed question keeps the editor).
    questions: list[str] = []
    page.once("dialog", lambda d: (questions.append(d.message), d.dismiss()))
    page.locator(".storage-crumbs").get_by_role("link", name="code", exact=True).click()
    wait_for(lambda: questions, timeout=10, message="the unsaved-changes question")
    assert "not saved" in questions[0]
    expect(editor).to_have_value("import sys\nprint('v2', sys.argv)\n")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#save-status")).to_contain_text(f"Saved obs://{name}/code/train.py")
    assert (bucket / "code" / "train.py").read_text() == "import sys\nprint('v2', sys.argv)\n"
    page.screenshot(path=str(SHOTS / "03-saved.png"), full_page=True)

    # Someone else saves meanwhile: a clear conflict, the text stays, then an explicit overwrite.
    (bucket / "code" / "train.py").write_text("print('theirs')\n")
    editor.fill("print('mine')\n")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#save-status")).to_contain_text("was changed by someone else since you opened it")
    expect(editor).to_have_value("print('mine')\n")
    assert (bucket / "code" / "train.py").read_text() == "print('theirs')\n"
    page.screenshot(path=str(SHOTS / "04-conflict.png"), full_page=True)
    with page.expect_response(re.compile(r"/storage/save/$")) as answer:
        page.get_by_role("button", name="Overwrite anyway").click()
    assert answer.value.status == 200
    expect(page.locator("#save-status")).to_contain_text("Saved")
    assert (bucket / "code" / "train.py").read_text() == "print('mine')\n"
    # The new version came back out of band: saving again is no conflict.
    editor.fill("print('mine again')\n")
    with page.expect_response(re.compile(r"/storage/save/$")) as answer:
        page.get_by_role("button", name="Save").click()
    assert answer.value.status == 200, answer.value.text()
    expect(page.locator("#save-status")).to_contain_text("Saved")
    assert (bucket / "code" / "train.py").read_text() == "print('mine again')\n"

    # Too big for the editor: refused in the page, nothing sent.
    page.evaluate("document.getElementById('storage-text').value = 'x'.repeat(1024 * 1024 + 1)")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#save-status")).to_contain_text("at most 1 MB can be saved from the editor")
    assert (bucket / "code" / "train.py").read_text() == "print('mine again')\n"
    assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"

    # Back: htmx restores the folder.
    page.go_back()
    expect(page.locator(".storage-url code")).to_have_text(f"obs://{name}/code/")

    # A path leaving the root: a clear 400.
    response = page.goto(browse(f"obs://{name}/../etc/"))
    assert response.status == 400
    expect(page.locator(".storage-error")).to_contain_text("'.' and '..' are not allowed")
    page.screenshot(path=str(SHOTS / "05-refused.png"), full_page=True)

    # The picker, as the create wizard uses it: a page with the field, its button and storage.js.
    page.goto(BROWSE)
    htmx_src = page.locator("script[src*='htmx']").first.get_attribute("src")
    wizard = f"""<!doctype html><html><head><link rel="stylesheet" href="/static/console/console.css">
      <script src="{htmx_src}"></script></head><body><main><form class="card">
      <div class="field"><label for="id_code_dir">Code dir</label>
      <input type="text" name="code_dir" id="id_code_dir" value="obs://{name}/code/new/">
      <button type="button" data-storage-pick="code_dir">Browse…</button></div></form></main>
      <script src="/static/console/storage.js" defer></script></body></html>"""
    html = "text/html; charset=utf-8"
    page.route("**/picker-test/", lambda route: route.fulfill(status=200, content_type=html, body=wizard))
    page.goto("/picker-test/")
    page.evaluate(
        "window.__events = [];"
        "for (const t of ['input', 'change']) document.getElementById('id_code_dir')"
        ".addEventListener(t, e => window.__events.push(e.type + ':' + e.target.value))"
    )
    page.get_by_role("button", name="Browse…").click()
    dialog = page.get_by_role("dialog", name="Choose a folder for Code dir")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".storage-notice")).to_contain_text("does not exist (yet)")
    expect(dialog.locator(".storage-pick-current")).to_contain_text("Use this folder")
    page.screenshot(path=str(SHOTS / "06-picker.png"))
    dialog.get_by_role("link", name=name, exact=True).click()  # navigate up inside the dialog
    expect(dialog.locator(".storage-url code")).to_have_text(f"obs://{name}/")
    dialog.get_by_role("link", name="code/").click()
    expect(dialog.locator('tr[data-name="data"]')).to_be_visible()
    assert page.url.endswith("/picker-test/")  # the picker pushes no URL
    page.screenshot(path=str(SHOTS / "07-picker-folder.png"))
    dialog.locator('tr[data-name="data"]').get_by_role("button", name="Use this folder").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_role("textbox", name="Code dir")).to_have_value(f"obs://{name}/code/data/")
    chosen = f"obs://{name}/code/data/"
    assert page.evaluate("window.__events") == [f"input:{chosen}", f"change:{chosen}"]
    # Again, from the new value: the current folder's button.
    page.get_by_role("button", name="Browse…").click()
    expect(dialog.locator(".storage-url code")).to_have_text(chosen)
    dialog.locator(".storage-pick-current").get_by_role("button", name="Use this folder").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_role("textbox", name="Code dir")).to_have_value(chosen)
    page.get_by_role("button", name="Browse…").click()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    page.screenshot(path=str(SHOTS / "08-picked.png"))
