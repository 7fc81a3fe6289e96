"""Simplified Chinese and English: chosen from the browser's languages, switched in the header,
remembered per user; validation, API errors, stored texts and e-mails in the reader's language."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core import mail
from django.test import Client, override_settings
from django.utils import translation

from console.language import SESSION_KEY, language_of_scope
from jobs import stored_text
from jobs.models import EventKind, JobEvent, TrainingJob, UserPreference
from jobs.notify import Email
from tests.helpers import BUSYBOX, api_client

pytestmark = pytest.mark.django_db

ZH = "zh-hans"


def logged_in(user, **headers) -> Client:
    client = Client(headers=headers)
    client.force_login(user)
    return client


def page_language(response) -> str:
    return response.headers["Content-Language"]


# -- choosing the language --------------------------------------------------------------------------
def test_english_by_default_and_chinese_from_the_browser(demo):
    assert page_language(logged_in(demo.owner).get("/")) == "en"
    response = logged_in(demo.owner, accept_language="zh-CN,zh;q=0.9,en;q=0.8").get("/")
    assert page_language(response) == ZH
    html = response.content.decode()
    assert '<html lang="zh-Hans">' in html and "创建训练作业" in html and "训练作业" in html
    # A language the console does not speak falls back to English, not to a half-translated page.
    assert page_language(logged_in(demo.owner, accept_language="fr-FR,fr;q=0.9").get("/")) == "en"


def test_the_login_page_follows_the_browser_and_the_switcher_is_there(client):
    html = client.get("/accounts/login/", headers={"accept-language": "zh-Hans"}).content.decode()
    assert "用户名" in html and "密码" in html
    assert 'name="language" value="zh-hans"' in html and 'name="language" value="en"' in html


def test_switching_sets_the_cookie_and_remembers_the_choice_per_user(demo):
    browser = logged_in(demo.owner)
    response = browser.post("/i18n/setlang/", {"language": ZH}, headers={"referer": "http://testserver/"})
    assert response.status_code == 302 and response.url == "http://testserver/"
    assert response.cookies[settings.LANGUAGE_COOKIE_NAME].value == ZH
    assert UserPreference.objects.get(user=demo.owner).language == ZH
    assert page_language(browser.get("/")) == ZH
    # Another user keeps their own (the browser's) language.
    assert page_language(logged_in(demo.member).get("/")) == "en"


def test_the_choice_survives_logout_and_login_on_another_browser(demo):
    first = logged_in(demo.owner)
    first.post("/i18n/setlang/", {"language": ZH})
    first.post("/accounts/logout/")
    # A fresh browser that asks for English: the user's choice wins once they log in.
    second = Client(headers={"accept-language": "en-US,en;q=0.9"})
    assert page_language(second.get("/accounts/login/")) == "en"
    response = second.post("/accounts/login/", {"username": "owner", "password": "owner-password"})
    assert response.status_code == 302
    assert second.session[SESSION_KEY] == ZH
    page = second.get("/")
    assert page_language(page) == ZH and "训练作业" in page.content.decode()
    # The cookie follows, so that this browser's login page stays Chinese after a logout.
    assert page.cookies[settings.LANGUAGE_COOKIE_NAME].value == ZH
    # Switching back is remembered the same way.
    second.post("/i18n/setlang/", {"language": "en"})
    assert UserPreference.objects.get(user=demo.owner).language == "en"
    assert page_language(second.get("/")) == "en"


def test_a_visitor_may_switch_without_anything_stored(client):
    response = client.post("/i18n/setlang/", {"language": "zh-CN"})
    assert response.cookies[settings.LANGUAGE_COOKIE_NAME].value == ZH  # the console's own code
    assert not UserPreference.objects.exists()
    assert page_language(client.get("/accounts/login/")) == ZH


def test_an_unknown_language_is_refused(demo):
    browser = logged_in(demo.owner)
    for code in ("fr", "xx", ""):
        response = browser.post("/i18n/setlang/", {"language": code})
        assert response.status_code == 400, code
    assert not UserPreference.objects.exists()
    assert browser.get("/i18n/setlang/").status_code == 405


def test_websocket_fragments_use_the_language_of_the_page():
    assert language_of_scope({"headers": [(b"accept-language", b"zh-CN,zh;q=0.9")]}) == ZH
    assert language_of_scope({"cookies": {settings.LANGUAGE_COOKIE_NAME: ZH}, "headers": []}) == ZH
    assert language_of_scope({"session": {SESSION_KEY: ZH}, "headers": [(b"accept-language", b"en")]}) == ZH
    assert language_of_scope({"headers": [(b"accept-language", b"de")]}) == "en"
    assert language_of_scope({}) == "en"


# -- validation messages and the API --------------------------------------------------------------
def refused(demo, **fields) -> dict:
    from django.core.exceptions import ValidationError

    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, image=BUSYBOX, command="echo hi", **fields)
    with pytest.raises(ValidationError) as info:
        job.full_clean()
    return info.value.message_dict


NAME_RULE_ZH = "作业名称必须为1~64 位字符：大小写字母、数字、中划线（-）或下划线（_）。"


def test_a_validation_message_in_chinese_and_the_same_in_english(demo):
    with translation.override(ZH):
        errors = refused(demo, name="bad name!", fault_tolerance=True, max_restarts=129)
    assert errors["name"] == [NAME_RULE_ZH]
    assert errors["max_restarts"] == ["开启容错与恢复时，最大重启次数必须在 1 到 128 之间。"]
    with translation.override("en"):
        errors = refused(demo, name="bad name!", fault_tolerance=True, max_restarts=129)
    assert errors["name"] == ["Name must be 1-64 characters: letters, digits, '-' and '_'."]
    assert errors["max_restarts"] == ["Max restarts must be between 1 and 128 when fault tolerance is on."]


def test_the_wizard_explains_a_field_in_the_page_language(demo):
    browser = logged_in(demo.owner)
    browser.post("/i18n/setlang/", {"language": ZH})
    response = browser.post("/jobs/create/validate/?field=name", {"name": "bad name!", "command": "echo"})
    assert "作业名称必须为1~64 位字符" in response.content.decode()
    wizard = browser.get("/jobs/create/").content.decode()
    for words in ("训练模式", "基本信息", "高可用配置", "容错与恢复（自动重启）", "下一步", "单机训练"):
        assert words in wizard, words


API_BODY = {
    "kind": "job",
    "metadata": {"name": "bad name!", "annotations": {"fault-tolerance/job-retry-num": "129"}},
    "algorithm": {"command": "echo hi", "engine": {"image_url": BUSYBOX}},
    "spec": {"resource": {"node_count": 1}},
}


@pytest.mark.parametrize("accept", ["zh-Hans", "zh-CN,zh;q=0.9"])
def test_api_errors_follow_accept_language_under_the_same_keys(demo, accept):
    url = f"/v2/{demo.workspace.project_id}/training-jobs"
    api = api_client(demo.token)
    english = api.post(url, API_BODY, format="json").json()
    chinese = api.post(url, API_BODY, format="json", headers={"accept-language": accept}).json()
    assert set(chinese["errors"]) == set(english["errors"]) >= {"metadata.name"}
    assert english["errors"]["metadata.name"] == ["Name must be 1-64 characters: letters, digits, '-' and '_'."]
    assert chinese["errors"]["metadata.name"] == [NAME_RULE_ZH]
    retry = "metadata.annotations.fault-tolerance/job-retry-num"
    assert "128" in " ".join(chinese["errors"][retry]) and "最大重启次数" in " ".join(chinese["errors"][retry])
    assert not TrainingJob.objects.exists()


def test_api_follows_the_request_not_the_token_owners_choice(demo):
    UserPreference.objects.create(user=demo.owner, language=ZH)
    api = api_client(demo.token)
    response = api.post(f"/v2/{demo.workspace.project_id}/training-jobs", API_BODY, format="json")
    assert response.json()["errors"]["metadata.name"][0].startswith("Name must be")


# -- stored texts, labels and e-mail --------------------------------------------------------------
@pytest.mark.parametrize(
    "stored,shown",
    [
        ("Stopped by the user.", "被用户停止。"),
        ("Started on local.", "已在 local 上启动。"),
        ("restart (container level): transient is retryable", "重启（容器级）：瞬时故障可重试"),
        (
            "user_error (exit code 1): The process exited with a non-zero status and no known signature. "
            "Decision: end: max restarts used up (3/3).",
            "用户错误（退出码 1）：进程以非零状态退出，且没有已知的故障特征。 决策：结束：最大重启次数已用完（3/3）。",
        ),
        ("Auto stopped after 2 hours of running. Containers kept for 1 hour (retention).", None),
        ("Something the table does not know: kept as it was.", "Something the table does not know: kept as it was."),
    ],
)
def test_stored_english_is_shown_in_the_readers_language(stored, shown):
    with translation.override("en"):
        assert stored_text.translate(stored) == stored
    with translation.override(ZH):
        result = stored_text.translate(stored)
    if shown is None:  # nested templates: the reason inside the retention note
        assert result == "运行 2 小时后自动停止。 容器保留 1 小时（保留时长）。"
    else:
        assert result == shown


def test_a_long_stored_text_is_shown_as_it_is_at_once():
    """A start error quotes a path the job chose: 10 kB of it made three `.+?` placeholders take 26 s
    to match (cubic). Past MAX_TRANSLATED_CHARS a text is not matched at all."""
    from tests.helpers import no_longer_than

    path = "obs://b/" + "a (b, attempt c) " * 600
    stored = f"Could not start: '{path}' does not exist (job, attempt 1)"
    with translation.override(ZH), no_longer_than(20):
        assert stored_text.translate(stored) == stored


def test_the_events_tab_shows_stored_messages_translated(demo):
    job = TrainingJob.objects.create(
        workspace=demo.workspace, created_by=demo.owner, name="zh-events", image=BUSYBOX, command="echo"
    )
    JobEvent.objects.create(job=job, kind=EventKind.TERMINATED, message="Stopped by the user.")
    browser = logged_in(demo.owner, accept_language="zh-Hans")
    html = browser.get(f"/jobs/{job.id}/?tab=events", headers={"hx-request": "true"}).content.decode()
    assert "被用户停止。" in html and "作业终止" in html
    html = logged_in(demo.owner).get(f"/jobs/{job.id}/?tab=events", headers={"hx-request": "true"}).content.decode()
    assert "Stopped by the user." in html


@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")
def test_an_email_in_the_language_its_job_creator_chose(demo):
    job = TrainingJob.objects.create(
        workspace=demo.workspace, created_by=demo.owner, name="zh-mail", image=BUSYBOX, command="echo"
    )
    TrainingJob.objects.filter(id=job.id).update(phase="Completed")
    job.refresh_from_db()
    event = JobEvent.objects.create(job=job, kind=EventKind.COMPLETED, message="The job completed.")
    Email().send("ops@example.com", event)
    UserPreference.objects.create(user=demo.owner, language=ZH)
    before = translation.get_language()
    Email().send("ops@example.com", event)
    assert translation.get_language() == before  # the worker's language is left as it was
    english, chinese = mail.outbox
    assert english.subject == "[training console] zh-mail: Completed"
    assert english.body == f"The job completed.\n\nJob zh-mail ({job.id}) is Completed."
    assert chinese.subject == "[训练控制台] zh-mail：作业完成"
    assert chinese.body == f"作业已完成。\n\n训练作业 zh-mail（{job.id}）当前状态：已完成。"


def test_a_code_wraps_after_its_underscores_and_stays_escaped():
    """The recovery table's class tag in a narrow column: `resource_` / `error`, not `resource_e` /
    `rror` (test_browser_recovery looks at it at 900 px)."""
    from jobs.templatetags.console_i18n import breakable

    assert breakable("resource_error") == "resource_<wbr>error"
    assert breakable("env_check_failed") == "env_<wbr>check_<wbr>failed"
    assert breakable("a_<b>") == "a_<wbr>&lt;b&gt;"
    assert breakable("瞬时故障") == "瞬时故障"
