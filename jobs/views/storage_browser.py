"""The code dir browser (SPEC §3): browse object storage, view and edit small text files.

One view serves the whole page and (for htmx) only the browser part, as the job list does.
With `pick=<field>` it is the folder picker of the create wizard: always the partial (it is
loaded into a <dialog> by static/console/storage.js), never pushing a URL, files not opened,
and a "Use this folder" button per folder.

Access (docs/decisions.md "Workspaces own their storage"): a logged-in user browses and edits
the buckets owned by or granted to their workspaces (`storage.buckets_of`), nothing else; any
path in another bucket -- listing, file, save, the picker -- is refused (404) before the disk is
read, with the same message whether or not the bucket exists. What keeps a request inside the
storage root is `storage.local_path`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import wraps
from pathlib import Path
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET, require_POST

from jobs import storage
from jobs import validators as v
from jobs.i18n import lazy_fill

MAX_ROWS = 1000  # a folder with more entries shows the first ones (folders first, by name)
# A folder is read no further than this: a job can fill its bucket with millions of empty files,
# and a listing of all of them held every one in the web process (~200 bytes each, estimated).
MAX_READ = 10 * MAX_ROWS
PICK_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # becomes part of an element id: #id_<field>
SUFFIX_RULE = lazy_fill(
    _("only %(editable)s files can be edited and %(viewable)s files viewed here"),
    editable=" ".join(storage.EDITABLE_SUFFIXES),
    viewable=" ".join(storage.VIEWABLE_SUFFIXES),
)


@dataclass(frozen=True)
class Crumb:
    name: str
    href: str


@dataclass(frozen=True)
class Row:
    name: str
    url: str
    href: str
    is_dir: bool
    size: str
    modified: datetime | None
    kind: str  # "dir", "edit", "view" or "none"


class Refused(Exception):
    """A request the browser answers with a message instead of content (400 or 404)."""

    def __init__(self, message: str, status: int = 400, *, says_not_saved: bool = False):
        super().__init__(message)
        # says_not_saved: the message is a save's whole answer ("Not saved: ..."), not a reason for one.
        self.message, self.status, self.says_not_saved = message, status, says_not_saved


# -- helpers -------------------------------------------------------------------------------------------------------
def _href(path: str = "", pick: str = "") -> str:
    params = {k: val for k, val in (("path", path), ("pick", pick)) if val}
    return reverse("storage-browser") + (f"?{urlencode(params)}" if params else "")


def _parts(url: str) -> tuple[str, list[str]]:
    """Bucket and path parts of `url`, which `storage.local_path` has accepted."""
    bucket, _, key = url.removeprefix("obs://").partition("/")
    return bucket, [p for p in key.split("/") if p]


def _normal(url: str, is_dir: bool) -> str:
    """One spelling per place: 'obs://b//x' and 'obs://b/x/' both become 'obs://b/x/' for a folder."""
    bucket, parts = _parts(url)
    key = "/".join(parts)
    return f"obs://{bucket}/" + (key + "/" if key and is_dir else key)


def _crumbs(url: str, pick: str) -> list[Crumb]:
    """'Buckets' then each folder of `url` (a folder or a file); the last one is the current place."""
    crumbs = [Crumb(gettext("Buckets"), _href(pick=pick))]
    if not url:
        return crumbs
    bucket, parts = _parts(url)
    so_far = f"obs://{bucket}/"
    crumbs.append(Crumb(bucket, _href(so_far, pick)))
    for i, part in enumerate(parts):
        so_far += part if i == len(parts) - 1 and not url.endswith("/") else part + "/"
        crumbs.append(Crumb(part, _href(so_far, pick)))
    return crumbs


def _parent(url: str) -> str:
    """The folder above folder or file `url`; '' (the bucket list) above a bucket."""
    bucket, parts = _parts(url)
    if not parts:
        return ""
    return f"obs://{bucket}/" + "".join(p + "/" for p in parts[:-1])


def _modified(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.lstat().st_mtime, tz=UTC)
    except OSError:
        return None


def _version(data: bytes) -> str:
    """What the editor sends back to detect that the file changed meanwhile (a conflict)."""
    return hashlib.sha256(data).hexdigest()


def _refuse_foreign(url: str, allowed: set[str]) -> None:
    """Refused unless `url` is in one of `allowed` (the user's buckets): 404, as a bucket that does not
    exist, so that neither the status nor the message says whether another workspace has it."""
    try:
        bucket = storage.bucket_of(url)
    except storage.StorageError as exc:
        raise Refused(str(exc)) from None
    if bucket not in allowed:
        message = gettext(
            "Bucket '%(bucket)s' is not one of your workspaces': ask an operator to grant it to your workspace."
        )
        raise Refused(message % {"bucket": bucket}, 404)


def _buckets(pick: str, allowed: set[str]) -> list[Row]:
    top = storage.root()
    try:
        names = sorted(
            p.name for p in top.iterdir() if p.name in allowed and re.fullmatch(v.OBS_BUCKET, p.name) and p.is_dir()
        )
    except OSError:  # no storage root yet: no buckets
        return []
    rows = []
    for name in names:
        url = f"obs://{name}/"
        try:
            path = storage.local_path(url)  # leaves out a bucket folder linking out of the root
        except storage.StorageError:
            continue
        rows.append(Row(name, url, _href(url, pick), True, "", _modified(path), "dir"))
    return rows


def _rows(url: str, pick: str) -> list[Row]:
    rows = []
    # One more than MAX_READ: whether there are more. Times too: read through the opened folder, not by path.
    for entry in storage.listdir(url, MAX_READ + 1):
        kind = "dir" if entry.is_dir else "edit" if entry.editable else "view" if entry.viewable else "none"
        size = "" if entry.is_dir else storage.human_bytes(entry.size)
        modified = datetime.fromtimestamp(entry.modified, tz=UTC)
        rows.append(Row(entry.name, entry.url, _href(entry.url, pick), entry.is_dir, size, modified, kind))
    return rows


def _file(url: str) -> dict:
    """What the file view shows: the editor, a read-only text, or why neither. Read with
    storage.read_stored: through folders opened without following links, a regular file only, at
    most MAX_TEXT_BYTES of it (a job may swap a folder for a link, or plant a FIFO, meanwhile)."""
    kind = "edit" if storage.can_edit(url) else "view" if storage.can_view(url) else "none"
    stored = storage.read_stored(url)
    modified = datetime.fromtimestamp(stored.modified, tz=UTC)
    info = {"kind": kind, "size": storage.human_bytes(stored.size), "modified": modified, "problem": ""}
    if kind == "none":
        info["problem"] = gettext("This file is listed but cannot be opened: %(rule)s.") % {"rule": SUFFIX_RULE}
        return info
    if stored.data is None:
        limit = storage.human_bytes(storage.MAX_TEXT_BYTES)
        message = gettext("This file is %(size)s, larger than the %(limit)s the browser opens.")
        info["problem"] = message % {"size": info["size"], "limit": limit}
        info["kind"] = "none"
        return info
    data = stored.data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Shown with replacement characters; saving that text back would damage the file.
        text = data.decode("utf-8", errors="replace")
        if kind == "edit":
            kind = "view"
            info["problem"] = gettext(
                "This file is not UTF-8 text: it is shown read-only so that saving cannot damage it."
            )
    info |= {"kind": kind, "text": text, "version": _version(data), "newline": "crlf" if b"\r\n" in data else "lf"}
    return info


def _browse(url: str, pick: str, allowed: set[str]) -> dict:
    """The context for `url` ('' = the bucket list) in the buckets `allowed`: a listing or a file. Raises Refused."""
    context: dict = {"pick": pick, "url": url, "notice": "", "parent_href": None}
    if not url:
        rows = _buckets(pick, allowed)
        return context | {"mode": "buckets", "rows": rows, "total": len(rows), "crumbs": _crumbs("", pick)}
    _refuse_foreign(url, allowed)
    try:
        path = storage.local_path(url)
        if pick:  # the picker chooses folders: show a file's folder, or the nearest folder that exists
            while not path.is_dir():
                if not context["notice"] and not path.exists():
                    context["notice"] = f"'{url}' does not exist (yet); showing the nearest folder above it."
                url = _parent(url)
                if not url:
                    return _browse("", pick, allowed) | {"notice": context["notice"]}
                path = storage.local_path(url)
        if path.is_dir():
            url = _normal(url, True)
            rows = _rows(url, pick)
            cut = len(rows) > MAX_READ
            context |= {"mode": "folder", "rows": rows[:MAX_ROWS], "total": min(len(rows), MAX_READ), "cut": cut}
        elif path.exists():
            url = _normal(url, False)
            name = _parts(url)[1][-1]  # a file is never a bucket: it has a last part
            context |= {"mode": "file", "file": _file(url), "name": name, "max_bytes": storage.MAX_TEXT_BYTES}
        else:
            raise Refused(gettext("'%(url)s' does not exist in object storage.") % {"url": url}, 404)
    except storage.StorageError as exc:
        raise Refused(str(exc)) from None
    except OSError as exc:  # unreadable, a name the file system refuses, ...
        raise Refused(gettext("Cannot read '%(url)s': %(why)s.") % {"url": url, "why": exc.strerror or exc}) from None
    parent = _parent(url)
    return context | {"url": url, "crumbs": _crumbs(url, pick), "parent_href": _href(parent, pick)}


def _partial(request: HttpRequest) -> bool:
    htmx = request.htmx
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def _respond(request: HttpRequest, template: str, context: dict, status: int = 200) -> HttpResponse:
    response = render(request, template, context, status=status)
    # storage.js swaps 4xx answers carrying this header (our messages), not any error page.
    response["X-Storage-Browser"] = "1"
    patch_vary_headers(response, ["HX-Request"])  # the page and its partial share one URL
    return response


def _login_required(view: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """login_required, except that an htmx request gets a message where its answer goes: following
    the redirect would swap the login page into the editor's status line or the picker's dialog."""
    plain = login_required(view)

    @wraps(view)
    def wrapped(request: HttpRequest) -> HttpResponse:
        if request.user.is_authenticated or not request.htmx:
            return plain(request)
        login = redirect_to_login(request.htmx.current_url or reverse("storage-browser")).url
        message = gettext("Your session has ended: log in again (in another tab, to keep this page), then retry.")
        if request.method == "POST":
            save = {"message": message, "ok": False, "login_href": login}
            return _respond(request, "storage/_save_status.html", {"save": save}, 401)
        context = {"pick": request.GET.get("pick", ""), "error": message, "login_href": login}
        return _respond(request, "storage/_browser.html", context | {"crumbs": []}, 401)

    return wrapped


# -- views ---------------------------------------------------------------------------------------------------------
@_login_required
@require_GET
def storage_browser(request: HttpRequest) -> HttpResponse:
    """The bucket list (no path), a folder or a file; the partial for htmx and for the picker."""
    pick = request.GET.get("pick", "")
    url = request.GET.get("path", "").strip()
    partial = bool(pick) or _partial(request)
    template = "storage/_browser.html" if partial else "storage/browser.html"
    if pick and not PICK_FIELD.fullmatch(pick):
        error = gettext("Not a form field name: '%(pick)s'.") % {"pick": pick}
        return _respond(request, template, {"error": error, "crumbs": []}, 400)
    allowed = storage.buckets_of(request.user)
    try:
        context = _browse(url, pick, allowed)
    except Refused as exc:
        if pick:  # the field held something that is not a folder of ours: start from the buckets
            return _respond(request, template, _browse("", pick, allowed) | {"notice": exc.message})
        context = {"pick": pick, "url": url, "error": exc.message, "crumbs": _crumbs("", pick)}
        return _respond(request, template, context, exc.status)
    return _respond(request, template, context)


@_login_required
@require_POST
def storage_save(request: HttpRequest) -> HttpResponse:
    """Save the editor's text. With htmx the answer is only the status line (and the new
    version, out of band), so the textarea keeps the user's text and place either way."""
    partial = _partial(request)
    # A body over DATA_UPLOAD_MAX_MEMORY_SIZE never gets here (the CSRF check reads the form first
    # and answers 400): storage.js refuses a text over MAX_TEXT_BYTES before sending it.
    post = request.POST
    url, text = post.get("path", "").strip(), post.get("text", "")
    # Browsers send a textarea's lines with CRLF; keep the file's own line ends (a '\r' breaks a #! line).
    text = text.replace("\r\n", "\n")
    if post.get("newline") == "crlf":
        text = text.replace("\n", "\r\n")
    data = text.encode("utf-8")
    allowed = storage.buckets_of(request.user)
    try:
        _refuse_foreign(url, allowed)  # before the disk is touched: nothing is read or written
        storage.local_path(url)  # refuses a path out of its bucket, before anything else is said
        if not storage.can_edit(url):
            message = gettext("Not saved: '%(url)s' cannot be edited; %(rule)s.")
            raise Refused(message % {"url": url, "rule": SUFFIX_RULE}, says_not_saved=True)
        if len(data) > storage.MAX_TEXT_BYTES:
            limit = storage.human_bytes(storage.MAX_TEXT_BYTES)
            size = storage.human_bytes(len(data))
            message = gettext("Not saved: the text is %(size)s; at most %(limit)s can be saved from the editor.")
            raise Refused(message % {"size": size, "limit": limit}, 413, says_not_saved=True)
        try:
            stored = storage.read_stored(url)
            # A file over the editor's size cannot be the version the editor holds: a conflict.
            current = _version(stored.data) if stored.data is not None else "too large"
        except storage.NotInStorage:
            current = None
        if post.get("overwrite") != "1" and (current is None or current != post.get("version")):
            if current is None:
                message = gettext(
                    "Not saved: '%(url)s' was deleted since you opened it. Your text is still here: "
                    "reload the file to see the other version (copy your changes first), or overwrite it."
                )
            else:
                message = gettext(
                    "Not saved: '%(url)s' was changed by someone else since you opened it. Your text is still here: "
                    "reload the file to see the other version (copy your changes first), or overwrite it."
                )
            raise Refused(message % {"url": url}, 409, says_not_saved=True)
        storage.write_text(url, text)
    except Refused as exc:
        message = exc.message if exc.says_not_saved else gettext("Not saved: %(why)s") % {"why": exc.message}
        return _save_answer(request, allowed, partial, url, text, message, exc.status)
    except storage.StorageError as exc:
        message = gettext("Not saved: %(why)s") % {"why": exc}
        return _save_answer(request, allowed, partial, url, text, message, 400)
    except OSError as exc:
        message = gettext("Not saved: %(why)s.") % {"why": exc.strerror or exc}
        return _save_answer(request, allowed, partial, url, text, message, 400)
    at = datetime.now(UTC).strftime("%H:%M:%S UTC")
    message = gettext("Saved %(url)s (%(size)s) at %(at)s.") % {
        "url": url,
        "size": storage.human_bytes(len(data)),
        "at": at,
    }
    return _save_answer(request, allowed, partial, url, text, message, 200, version=_version(data))


def _save_answer(
    request: HttpRequest,
    allowed: set[str],
    partial: bool,
    url: str,
    text: str,
    message: str,
    status: int,
    version: str = "",
) -> HttpResponse:
    ok = status == 200
    save = {"message": message, "ok": ok, "conflict": status == 409, "version": version, "reload_href": _href(url)}
    if partial:
        return _respond(request, "storage/_save_status.html", {"save": save, "oob": True}, status)
    # Without JavaScript: the whole page again, with the text as typed (not lost on an error).
    try:
        context = _browse(url, "", allowed)
    except Refused as exc:
        context = {"pick": "", "url": url, "error": exc.message, "crumbs": _crumbs("", "")}
        return _respond(request, "storage/browser.html", context | {"save": save}, status)
    if context.get("mode") == "file" and context["file"]["kind"] == "edit" and not ok:
        context["file"] = context["file"] | {"text": text.replace("\r\n", "\n")}
        if status == 409:  # keep the version the user edited, so that the conflict stays a conflict
            context["file"]["version"] = request.POST.get("version", "")
    return _respond(request, "storage/browser.html", context | {"save": save}, status)
