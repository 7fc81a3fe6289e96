"""The code dir browser (SPEC §3): /storage/ lists object storage, views .log/.json/.md files,
edits .txt/.py/.sh/.yaml files, and is the create wizard's folder picker (pick=<field>).

View tests use Django's test client on a storage root in tmp_path; the same in a real browser is
tests/test_browser_storage.py.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils.html import escape

from jobs import storage
from jobs.runtime import hostpaths
from tests.folders import BROWSE, browse
from tests.helpers import no_longer_than

SAVE = "/storage/save/"
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def obs(settings, tmp_path) -> Path:
    """A storage root with bucket b01 (a code folder with one file of each kind) and a bucket 'data-1'."""
    root = tmp_path / "obs"
    code = root / "b01" / "code"
    (code / "sub" / "deeper").mkdir(parents=True)
    (code / "train.py").write_text("import os\nprint('hello')\n")
    (code / "run.sh").write_text("#!/bin/sh\npython train.py\n")
    (code / "run.sh").chmod(0o755)
    (code / "config.yaml").write_text("lr: 0.1\n")
    (code / "notes.md").write_text("# Notes\n")
    (code / "train.log").write_text("step 1\nstep 2\n")
    (code / "model.bin").write_bytes(b"\x00\x01\x02")
    (root / "data-1").mkdir()
    (root / "NotABucket").mkdir()  # upper case: not a bucket name, not listed
    settings.OBJECT_STORAGE_ROOT = str(root)
    return root


@pytest.fixture
def user_client(client, django_user_model):
    """A user whose workspace owns the buckets of `obs` (and 'linked', a bucket folder linking out of the root)."""
    from jobs.models import Bucket, Workspace

    reader = django_user_model.objects.create_user("reader", password="pw")
    workspace = Workspace.objects.create(name="readers")
    workspace.members.add(reader)
    for name in ("b01", "data-1", "linked"):
        Bucket.objects.create(name=name, workspace=workspace)
    client.force_login(reader)
    return client


def version_of(html: str) -> str:
    return re.search(r'name="version" id="storage-version" value="([0-9a-f]*)"', html).group(1)


# -- access ---------------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_anonymous_is_sent_to_login(client, obs):
    response = client.get(browse("obs://b01/code/"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    response = client.post(SAVE, {"path": "obs://b01/code/train.py", "text": "pwned", "version": "", "overwrite": "1"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert (obs / "b01/code/train.py").read_text() == "import os\nprint('hello')\n"
    # htmx would follow a redirect and swap the login page into the status line or the picker: say it instead.
    response = client.post(SAVE, {"path": "obs://b01/code/train.py", "text": "x", "overwrite": "1"}, **HX)
    assert response.status_code == 401 and "Your session has ended" in response.content.decode()
    assert response["X-Storage-Browser"] == "1"
    response = client.get(browse("obs://b01/", pick="code_dir"), **HX, HTTP_HX_CURRENT_URL="http://x/jobs/create/")
    assert response.status_code == 401 and "Your session has ended" in response.content.decode()
    assert 'href="/accounts/login/?next=http%3A//x/jobs/create/"' in response.content.decode()
    assert (obs / "b01/code/train.py").read_text() == "import os\nprint('hello')\n"


# -- listing and navigation -----------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_bucket_list_then_folder_listing(user_client, obs):
    html = user_client.get(BROWSE).content.decode()
    assert "<html" in html and 'id="storage-browser"' in html
    assert re.findall(r'data-name="([^"]+)"', html) == ["b01", "data-1"]  # NotABucket is no bucket name
    assert f'href="{browse("obs://b01/")}"' in html

    response = user_client.get(browse("obs://b01/code/"))
    html = response.content.decode()
    assert response.status_code == 200
    names = re.findall(r'data-name="([^"]+)"', html)
    assert names == ["sub", "config.yaml", "model.bin", "notes.md", "run.sh", "train.log", "train.py"]  # folders first
    rows = {n: kind for kind, n in re.findall(r'<tr class="storage-row kind-(\w+)" data-name="([^"]+)"', html)}
    assert rows == {
        "sub": "dir",
        "config.yaml": "edit",
        "model.bin": "none",
        "notes.md": "view",
        "run.sh": "edit",
        "train.log": "view",
        "train.py": "edit",
    }
    assert '<td class="num nowrap">26 B</td>' in html  # train.py's size
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", html)  # modified
    assert "cannot be opened" in html and 'data-name="model.bin"' in html
    assert f'hx-get="{browse("obs://b01/code/train.py")}"' in html
    assert f'hx-get="{browse("obs://b01/code/sub/")}"' in html
    assert f'href="{browse("obs://b01/code/model.bin")}"' not in html  # listed, not a link
    # Breadcrumbs: Buckets / b01 / code, and a way up.
    crumbs = re.search(r'<nav class="storage-crumbs".*?</nav>', html, re.S).group(0)
    assert f'href="{browse()}"' in crumbs and f'href="{browse("obs://b01/")}"' in crumbs
    assert '<span aria-current="page">code</span>' in crumbs
    assert "Parent folder" in html


@pytest.mark.django_db
def test_htmx_navigation_gets_only_the_browser(user_client, obs):
    response = user_client.get(browse("obs://b01/code/sub/"), **HX)
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html
    assert 'id="storage-browser"' in html and 'hx-push-url="true"' in html and 'data-name="deeper"' in html
    assert "HX-Request" in response["Vary"]
    # htmx asks for the whole page when it restores history it has not cached.
    restore = user_client.get(browse("obs://b01/code/sub/"), **HX, HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in restore.content.decode()


@pytest.mark.django_db
def test_one_spelling_per_folder_and_missing_paths(user_client, obs):
    html = user_client.get(browse("obs://b01//code")).content.decode()
    assert "<code>obs://b01/code/</code>" in html
    response = user_client.get(browse("obs://b01/nowhere/"))
    assert response.status_code == 404
    assert "&#x27;obs://b01/nowhere/&#x27; does not exist in object storage." in response.content.decode()
    assert user_client.get(browse("obs://nobucket/")).status_code == 404


# -- viewing and editing --------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_viewable_files_are_shown_read_only(user_client, obs):
    (obs / "b01/code/notes.md").write_text("# Notes\n<script>alert(1)</script>\n")
    for name, text in (("train.log", "step 1\nstep 2\n"), ("notes.md", "&lt;script&gt;alert(1)&lt;/script&gt;")):
        html = user_client.get(browse(f"obs://b01/code/{name}")).content.decode()
        assert '<pre class="storage-view"' in html and text in html
        assert "<textarea" not in html and "view only" in html
    (obs / "b01/code/data.json").write_text('{"a": 1}')
    html = user_client.get(browse("obs://b01/code/data.json")).content.decode()
    assert "{&quot;a&quot;: 1}" in html and "<textarea" not in html


@pytest.mark.django_db
def test_other_files_are_listed_but_not_opened(user_client, obs):
    html = user_client.get(browse("obs://b01/code/model.bin")).content.decode()
    assert "This file is listed but cannot be opened" in html and ".txt .py .sh .yaml" in html
    assert "<textarea" not in html and "<pre" not in html and "\x00" not in html


@pytest.mark.django_db
def test_edit_and_save_round_trip(user_client, obs):
    html = user_client.get(browse("obs://b01/code/train.py")).content.decode()
    assert '<textarea id="storage-text" name="text"' in html
    assert "\nimport os\nprint(&#x27;hello&#x27;)\n</textarea>" in html  # after the newline the parser drops
    version = version_of(html)
    assert version == hashlib.sha256(b"import os\nprint('hello')\n").hexdigest()

    # A browser sends a textarea's lines with CRLF: the file keeps its LF.
    text = "import os\r\nprint('edited')\r\n"
    response = user_client.post(SAVE, {"path": "obs://b01/code/train.py", "text": text, "version": version}, **HX)
    body = response.content.decode()
    assert response.status_code == 200, body
    assert (obs / "b01/code/train.py").read_bytes() == b"import os\nprint('edited')\n"
    assert "Saved obs://b01/code/train.py (26 B)" in body and 'class="save-status ok"' in body
    new_version = hashlib.sha256(b"import os\nprint('edited')\n").hexdigest()
    assert f'value="{new_version}" hx-swap-oob="true"' in body  # the next save compares against this
    assert "<textarea" not in body  # only the status: the textarea keeps the user's text and place

    # Saving again with the new version works; no temporary file is left behind.
    again = user_client.post(SAVE, {"path": "obs://b01/code/train.py", "text": "x = 1\n", "version": new_version}, **HX)
    assert again.status_code == 200 and (obs / "b01/code/train.py").read_text() == "x = 1\n"
    assert sorted(p.name for p in (obs / "b01/code").iterdir() if p.name.startswith(".")) == []


@pytest.mark.django_db
def test_saving_keeps_the_execute_bit_and_crlf_files(user_client, obs):
    version = version_of(user_client.get(browse("obs://b01/code/run.sh")).content.decode())
    text = "#!/bin/sh\r\necho edited\r\n"
    response = user_client.post(SAVE, {"path": "obs://b01/code/run.sh", "text": text, "version": version}, **HX)
    assert response.status_code == 200
    script = obs / "b01/code/run.sh"
    assert script.read_bytes() == b"#!/bin/sh\necho edited\n" and os.access(script, os.X_OK)
    assert oct(script.stat().st_mode & 0o777) == oct(0o755)

    (obs / "b01/code/win.txt").write_bytes(b"a\r\nb\r\n")
    html = user_client.get(browse("obs://b01/code/win.txt")).content.decode()
    assert 'name="newline" value="crlf"' in html
    post = {"path": "obs://b01/code/win.txt", "text": "a\r\nc\r\n", "version": version_of(html), "newline": "crlf"}
    assert user_client.post(SAVE, post, **HX).status_code == 200
    assert (obs / "b01/code/win.txt").read_bytes() == b"a\r\nc\r\n"


@pytest.mark.django_db
def test_a_conflict_is_refused_until_overwritten(user_client, obs):
    version = version_of(user_client.get(browse("obs://b01/code/config.yaml")).content.decode())
    (obs / "b01/code/config.yaml").write_text("lr: 0.5\n")  # someone else saves meanwhile
    post = {"path": "obs://b01/code/config.yaml", "text": "lr: 0.2\n", "version": version}
    response = user_client.post(SAVE, post, **HX)
    body = response.content.decode()
    assert response.status_code == 409
    assert response["X-Storage-Browser"] == "1"  # storage.js swaps our 4xx messages in
    assert "was changed by someone else since you opened it" in body and "Overwrite anyway" in body
    assert (obs / "b01/code/config.yaml").read_text() == "lr: 0.5\n"

    response = user_client.post(SAVE, post | {"overwrite": "1"}, **HX)
    assert response.status_code == 200 and (obs / "b01/code/config.yaml").read_text() == "lr: 0.2\n"

    # Deleted meanwhile: a conflict too.
    (obs / "b01/code/config.yaml").unlink()
    response = user_client.post(SAVE, post | {"version": version}, **HX)
    assert response.status_code == 409 and "was deleted since you opened it" in response.content.decode()

    # Without JavaScript the whole page comes back, with the text as typed.
    (obs / "b01/code/config.yaml").write_text("lr: 0.9\n")
    response = user_client.post(SAVE, post)
    html = response.content.decode()
    assert response.status_code == 409 and "<html" in html and "\nlr: 0.2\n</textarea>" in html


@pytest.mark.django_db
def test_too_big_files_are_neither_opened_nor_saved(user_client, obs):
    big = "x" * (storage.MAX_TEXT_BYTES + 1)
    (obs / "b01/code/big.py").write_text(big)
    html = user_client.get(browse("obs://b01/code/big.py")).content.decode()
    assert "larger than the 1 MB the browser opens" in html and "<textarea" not in html

    version = version_of(user_client.get(browse("obs://b01/code/train.py")).content.decode())
    post = {"path": "obs://b01/code/train.py", "text": big, "version": version}
    response = user_client.post(SAVE, post, **HX)
    assert response.status_code == 413
    assert "Not saved: the text is 1.0 MB; at most 1 MB can be saved from the editor." in response.content.decode()
    assert (obs / "b01/code/train.py").read_text() == "import os\nprint('hello')\n"


@pytest.mark.django_db
def test_only_editable_types_can_be_saved(user_client, obs):
    for name in ("train.log", "notes.md", "model.bin", "new.json"):
        post = {"path": f"obs://b01/code/{name}", "text": "changed", "version": "", "overwrite": "1"}
        response = user_client.post(SAVE, post, **HX)
        assert response.status_code == 400, name
        assert "cannot be edited; only .txt .py .sh .yaml files can be edited" in response.content.decode()
    assert (obs / "b01/code/train.log").read_text() == "step 1\nstep 2\n"
    assert (obs / "b01/code/model.bin").read_bytes() == b"\x00\x01\x02"
    assert not (obs / "b01/code/new.json").exists()
    assert user_client.get(SAVE).status_code == 405


@pytest.mark.django_db
def test_non_utf8_text_is_shown_read_only(user_client, obs):
    (obs / "b01/code/latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    html = user_client.get(browse("obs://b01/code/latin.txt")).content.decode()
    assert "not UTF-8 text: it is shown read-only" in html and "<textarea" not in html and "<pre" in html


# -- confinement to the storage root --------------------------------------------------------------------------------
@pytest.mark.django_db
def test_paths_leaving_the_root_are_refused(user_client, obs, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.txt").write_text("root:x:0:0\n")
    (obs / "b01/code/escape").symlink_to(secret)  # a folder link out of the bucket
    (obs / "b01/code/escape.txt").symlink_to(secret / "passwd.txt")  # a file link out of the bucket
    (obs / "b01/code/other").symlink_to(obs / "data-1")  # into another bucket
    (obs / "linked").symlink_to(secret)  # a bucket folder that is a link out of the root
    refused = {
        "obs://b01/../linked/": "&#x27;.&#x27; and &#x27;..&#x27; are not allowed",
        "obs://b01/code/../../../secret/": "&#x27;.&#x27; and &#x27;..&#x27; are not allowed",
        "obs://b01/./code/": "are not allowed",
        "/etc/passwd": "Not an object storage path",
        "file:///etc/passwd": "Not an object storage path",
        "obs:///etc/passwd": "Not a bucket name",
        "obs://../etc/": "Not a bucket name",
        "obs://b01/code/escape/": "leaves its bucket",
        "obs://b01/code/escape/passwd.txt": "leaves its bucket",
        "obs://b01/code/escape.txt": "leaves its bucket",
        "obs://b01/code/other/": "leaves its bucket",
        "obs://linked/": "leaves the object storage root",
        "obs://linked/passwd.txt": "leaves the object storage root",
        "obs://b01/" + "a" * 300 + "/": "longer than 255 bytes",
        "obs://b01/a\x00b/": "are not allowed",
    }
    for path, message in refused.items():
        response = user_client.get(browse(path))
        html = response.content.decode()
        assert response.status_code == 400, path
        assert message in html and 'class="storage-error" role="alert"' in html, path
        assert "root:x:0:0" not in html
        partial = user_client.get(browse(path), **HX)
        assert partial.status_code == 400 and message in partial.content.decode() and partial["X-Storage-Browser"]
    # Percent-encoded dots arrive decoded once, and are refused as dots.
    assert user_client.get(BROWSE + "?path=obs%3A%2F%2Fb01%2F%2e%2e%2Fetc%2F").status_code == 400
    # The link out of the root is not in the bucket list; links in a folder are listed as what they are.
    assert 'data-name="linked"' not in user_client.get(BROWSE).content.decode()
    for path in ("obs://b01/code/escape.txt", "obs://linked/passwd.txt", "obs://b01/../b01/code/x.txt"):
        post = {"path": path, "text": "owned\n", "version": "", "overwrite": "1"}
        response = user_client.post(SAVE, post, **HX)
        assert response.status_code == 400, path
    assert (secret / "passwd.txt").read_text() == "root:x:0:0\n" and sorted(os.listdir(secret)) == ["passwd.txt"]


@pytest.mark.django_db
def test_a_fifo_a_job_made_is_refused_at_once(user_client, obs):
    """A job writes its bucket: a FIFO named out.log is listed, and opening it is refused without
    waiting for a writer (the request's thread and database connection would wait forever); so is
    a save over one."""
    os.mkfifo(obs / "b01/code/out.log")
    os.mkfifo(obs / "b01/code/out.txt")
    post = {"path": "obs://b01/code/out.txt", "text": "x", "version": "", "overwrite": "1"}
    with no_longer_than(20):
        listing = user_client.get(browse("obs://b01/code/")).content.decode()
        response = user_client.get(browse("obs://b01/code/out.log"))
        saved = user_client.post(SAVE, post, **HX)
    assert 'data-name="out.log"' in listing
    assert response.status_code == 400 and "is not a regular file" in response.content.decode()
    assert saved.status_code == 400 and "is not a regular file" in saved.content.decode()


@pytest.mark.django_db
def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(user_client, obs, monkeypatch):
    """The race a job can run against the browser, made to happen every time: after the last check
    of a path (local_path, which resolves it) and before its folders are opened, the job swaps a
    folder of its bucket for a link to another workspace's folder. The folders are opened without
    following links, so the other folder is neither read, nor listed, nor written."""
    other = obs / "data-1/code"
    other.mkdir()
    (other / "train.py").write_text("SECRET = 'of data-1'\n")
    (other / "hidden.py").write_text("x\n")
    sub, moved = obs / "b01/code/sub", obs / "b01/code/sub-moved"
    (sub / "train.py").write_text("mine\n")
    real, armed = hostpaths.open_dir, []

    def swapped_then_opened(root, relative="", **options):
        if armed:  # the swap, between the check and the open
            armed.clear()
            sub.rename(moved)
            sub.symlink_to(other)
        return real(root, relative, **options)

    monkeypatch.setattr(hostpaths, "open_dir", swapped_then_opened)
    post = {"path": "obs://b01/code/sub/train.py", "text": "owned\n", "version": "", "overwrite": "1"}
    for request in (
        lambda: user_client.get(browse("obs://b01/code/sub/train.py")),
        lambda: user_client.get(browse("obs://b01/code/sub/")),
        lambda: user_client.post(SAVE, post, **HX),
    ):
        armed.append(True)
        response = request()
        html = response.content.decode()
        assert response.status_code == 400 and "is a symbolic link: the console never follows a link" in html
        assert "SECRET" not in html and "hidden.py" not in html
        sub.unlink()
        moved.rename(sub)
    assert (other / "train.py").read_text() == "SECRET = 'of data-1'\n"
    assert sorted(os.listdir(other)) == ["hidden.py", "train.py"]


@pytest.mark.django_db
def test_links_that_name_each_other_are_refused_not_an_error(user_client, obs):
    """A job's `ln -s b a; ln -s a b`: resolving either never ends (Python raises RuntimeError);
    the browser says so, as it does for any path it cannot use."""
    (obs / "b01/code/a").symlink_to("b")
    (obs / "b01/code/b").symlink_to("a")
    response = user_client.get(browse("obs://b01/code/a/x.py"))
    assert response.status_code == 400 and "is a loop of symbolic links" in response.content.decode()
    assert storage.code_dir_errors("obs://b01/code/a/") == [
        "Code dir: 'obs://b01/code/a/' is a loop of symbolic links."
    ]


@pytest.mark.django_db
def test_a_folder_of_more_entries_than_the_browser_reads_is_listed_in_part(user_client, obs, monkeypatch):
    """A job can fill its bucket with millions of empty files: the listing reads MAX_READ of them
    (plus one, to know there are more) and says so, instead of holding every one in the web process."""
    from jobs.views import storage_browser

    monkeypatch.setattr(storage_browser, "MAX_ROWS", 2)
    monkeypatch.setattr(storage_browser, "MAX_READ", 5)
    many = obs / "data-1" / "many"
    many.mkdir()
    for i in range(5):
        (many / f"f{i}.txt").write_text("")
    html = user_client.get(browse("obs://data-1/many/")).content.decode()
    assert "Showing the first 2 of 5 entries." in html
    for i in range(5, 8):
        (many / f"f{i}.txt").write_text("")
    html = user_client.get(browse("obs://data-1/many/")).content.decode()
    assert "Showing the first 2 of the first 5 entries read: the folder holds more" in html
    assert len(storage.listdir("obs://data-1/many/", 3)) == 3


def test_local_path_confines_to_the_root(settings, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "good" / "dir").mkdir(parents=True)
    outside.mkdir()
    (root / "alias").symlink_to(root / "good")  # a link inside the root is fine
    (root / "away").symlink_to(outside)
    (root / "good" / "out").symlink_to(outside)
    settings.OBJECT_STORAGE_ROOT = str(root)
    assert storage.local_path("obs://good/dir/") == (root / "good" / "dir").resolve()
    assert storage.local_path("obs://alias/dir/") == (root / "good" / "dir").resolve()
    for bad in ("obs://away/", "obs://away/x.py", "obs://good/out/", "obs://good/out/x.py", "obs://good/../away/"):
        with pytest.raises(storage.StorageError):
            storage.local_path(bad)
    (root / "good" / "dir.txt").mkdir()
    with pytest.raises(storage.StorageError, match="is a folder"):
        storage.write_text("obs://good/dir.txt", "x")


# -- the picker -----------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_picker_partial_offers_folders(user_client, obs):
    response = user_client.get(browse("obs://b01/code/", pick="code_dir"))
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html  # always the partial: it goes into a <dialog>
    assert 'data-pick="code_dir"' in html and "hx-push-url" not in html and 'id="storage-browser"' not in html
    uses = re.findall(r'data-storage-use="([^"]+)"', html)
    assert uses == ["obs://b01/code/", "obs://b01/code/sub/"]  # the current folder, then each folder
    assert f'hx-get="{escape(browse("obs://b01/code/sub/", pick="code_dir"))}"' in html  # navigation stays a picker
    assert f'hx-get="{escape(browse("obs://b01/", pick="code_dir"))}"' in html
    assert "train.py" in html and "code%2Ftrain.py" not in html  # files are listed, not opened

    buckets = user_client.get(browse(pick="code_dir")).content.decode()
    assert re.findall(r'data-storage-use="([^"]+)"', buckets) == ["obs://b01/", "obs://data-1/"]


@pytest.mark.django_db
def test_picker_starts_at_the_nearest_folder(user_client, obs):
    html = user_client.get(browse("obs://b01/code/train.py", pick="code_dir")).content.decode()
    assert re.findall(r'data-storage-use="([^"]+)"', html)[0] == "obs://b01/code/"
    assert "storage-notice" not in html
    html = user_client.get(browse("obs://b01/code/new/deeper/", pick="code_dir")).content.decode()
    assert re.findall(r'data-storage-use="([^"]+)"', html)[0] == "obs://b01/code/"
    assert "&#x27;obs://b01/code/new/deeper/&#x27; does not exist (yet)" in html
    html = user_client.get(browse("obs://nobucket/x/", pick="code_dir")).content.decode()
    assert re.findall(r'data-storage-use="([^"]+)"', html) == ["obs://b01/", "obs://data-1/"]
    html = user_client.get(browse("obs://b01/../x/", pick="code_dir")).content.decode()  # what the field held
    assert "are not allowed" in html and 'data-storage-use="obs://b01/"' in html
    response = user_client.get(browse("obs://b01/", pick='x" onclick="alert(1)'))
    assert response.status_code == 400 and "Not a form field name" in response.content.decode()


def test_storage_lists_reads_and_edits_by_suffix(settings, tmp_path):
    settings.OBJECT_STORAGE_ROOT = str(tmp_path)
    (tmp_path / "b01" / "code" / "sub").mkdir(parents=True)
    (tmp_path / "b01" / "code" / "train.py").write_text("print(1)\n")
    (tmp_path / "b01" / "code" / "run.log").write_text("log\n")
    (tmp_path / "b01" / "code" / "model.bin").write_bytes(b"\0")
    entries = storage.listdir("obs://b01/code/")
    assert [(e.name, e.is_dir, e.editable, e.viewable) for e in entries] == [
        ("sub", True, False, False),
        ("model.bin", False, False, False),
        ("run.log", False, False, True),
        ("train.py", False, True, True),
    ]
    storage.write_text("obs://b01/code/train.py", "print(2)\n")
    assert storage.read_text("obs://b01/code/train.py") == "print(2)\n"
    assert storage.read_text("obs://b01/code/run.log") == "log\n"
    with pytest.raises(storage.StorageError):
        storage.write_text("obs://b01/code/run.log", "x")
    with pytest.raises(storage.StorageError):
        storage.read_text("obs://b01/code/model.bin")
