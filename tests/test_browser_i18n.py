"""The console in Simplified Chinese, as a team coming from ModelArts uses it: a real Chromium whose
browser language is Chinese walks the create wizard, submits, reads the job page, and switches
the language in the header. Screenshots go to test-artifacts/i18n-zh-*.png; on every page the
layout is checked for Chinese text that would not fit (nothing wider than the window)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from jobs.models import Phase, TrainingJob, UserPreference
from tests.browser_page import ARTIFACTS, page_maker
from tests.helpers import BUSYBOX, wait_for
from tests.wizard_page import htmx_idle, step

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def chinese_page(browser, live_url):
    """A page of a browser that asks for Chinese (Accept-Language: zh-CN), as a Chinese desktop does."""
    with page_maker(browser, live_url, locale="zh-CN") as make:
        yield make()


def shot(page: Page, name: str) -> None:
    fits(page)
    page.screenshot(path=str(ARTIFACTS / f"i18n-zh-{name}.png"), full_page=True)


def fits(page: Page) -> None:
    """Nothing is wider than the window, and no step label, button or table header is cut."""
    overflow = page.evaluate(
        """() => {
          const wide = document.documentElement.scrollWidth > window.innerWidth + 1;
          const cut = [...document.querySelectorAll('.steps .label, button, .tabs a, th, label, h1, h2')]
            .filter(el => el.offsetParent !== null && !el.closest('[aria-hidden="true"]')
                    && el.scrollWidth > el.clientWidth + 1
                    && getComputedStyle(el).overflow !== 'visible')
            .map(el => el.textContent.trim());
          return {wide, cut};
        }"""
    )
    assert not overflow["wide"] and not overflow["cut"], overflow


def next_step(page: Page, title: str):
    page.locator(".wizard-actions").get_by_role("button", name=re.compile(r"^(下一步|确认配置)$")).click()
    return step(page, title)


def test_walk_the_wizard_in_chinese_and_switch_languages(demo, chinese_page):
    page = chinese_page
    page.goto("/accounts/login/")
    expect(page.get_by_role("heading", name="登录")).to_be_visible()
    shot(page, "00-login")
    page.get_by_label("用户名").fill("owner")
    page.get_by_label("密码").fill("owner-password")
    page.get_by_role("button", name="登录").click()
    expect(page.get_by_role("heading", name="训练作业")).to_be_visible()

    page.get_by_role("navigation").get_by_role("link", name="创建训练作业").click()
    expect(page.get_by_role("heading", name="创建训练作业")).to_be_visible()
    step(page, "训练模式")
    page.locator(".scenario-cards").get_by_text("多机多卡训练").click()
    checklist = page.locator("#scenario-checklist")
    expect(checklist).to_contain_text("多机多卡训练：检查清单")
    expect(checklist).to_contain_text("CheckPoint保存在可靠共享存储中。")
    expect(page.locator(".notice")).to_contain_text("已按“多机多卡训练”场景的推荐配置设置高可用")
    shot(page, "01-mode")

    # A refused value is explained in Chinese next to the field, as soon as it is left.
    section = next_step(page, "基本信息")
    section.get_by_label("作业名称").fill("坏 名字!")
    section.get_by_label("描述").click()
    expect(page.locator("#errors-name")).to_contain_text("作业名称必须为1~64 位字符")
    shot(page, "02-basic-error")
    section.get_by_label("作业名称").fill("zh-walk")
    section.get_by_label("描述").fill("中文界面走查，使用默认配置。")
    expect(page.locator("#errors-name")).to_be_empty()

    section = next_step(page, "训练配置")
    section.get_by_label("镜像", exact=True).fill(BUSYBOX)
    section.get_by_label("启动命令").fill('echo "你好 $GREETING"; sleep 30')
    section.locator('input[name="environments-0-name"]').fill("GREETING")
    section.locator('input[name="environments-0-value"]').fill("训练控制台")
    expect(section.locator("#runtime-preview")).to_contain_text("运行环境预览")
    shot(page, "03-training")

    section = next_step(page, "资源配置")
    section.get_by_label("资源池类型").select_option("dedicated")
    expect(section.get_by_label("作业调度优先级")).to_be_visible()
    shot(page, "04-resources-dedicated")
    section.get_by_label("资源池类型").select_option("public")
    section.get_by_label("实例数").fill("1")

    next_step(page, "数据配置")
    next_step(page, "存储训练产物")
    section = next_step(page, "高可用配置")
    expect(section.get_by_label("容错与恢复（自动重启）")).to_be_checked()
    expect(section.get_by_label("无条件自动重启")).to_be_checked()
    expect(section.get_by_label("作业卡死重启")).to_be_checked()
    expect(section.locator("#whatif")).to_contain_text("如果发生故障会怎样")
    expect(section.locator("#whatif tr[data-class='user_error']")).to_contain_text("代码出错（退出码 1，程序缺陷）")
    shot(page, "05-ha")
    next_step(page, "访问配置")
    next_step(page, "可观测配置")
    section = next_step(page, "更多配置")
    shot(page, "06-more")

    section = next_step(page, "提交与查看")
    expect(section).to_contain_text("全部检查通过")
    expect(section.locator('[data-step="basic"]')).to_contain_text("zh-walk")
    shot(page, "07-review")
    page.get_by_role("button", name="提交", exact=True).click()

    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    job = TrainingJob.objects.get(name="zh-walk")
    assert job.description == "中文界面走查，使用默认配置。" and job.environment_dict() == {"GREETING": "训练控制台"}
    header = page.locator("#job-header")
    expect(header.locator(".phase")).to_have_attribute("data-phase", "Running")
    expect(header.locator(".phase")).to_have_text("运行中")
    expect(header.locator("#restarts")).to_have_text("重启次数 0/10")
    page.locator("nav.tabs").get_by_role("link", name="事件").click()
    expect(page.locator("#event-table")).to_contain_text("已在 local 上启动。")
    shot(page, "08-job-events")
    page.locator("nav.tabs").get_by_role("link", name="故障恢复").click()
    expect(page.locator("#recoveries h2")).to_have_text("故障恢复")
    shot(page, "09-job-recovery")

    # The header's switcher: English for this user from now on, then Chinese again.
    page.locator(".language-switch").get_by_role("button", name="English").click()
    expect(page.locator("#job-header .phase")).to_have_text("Running")
    expect(page.locator("nav.tabs")).to_contain_text("Fault recovery")
    assert UserPreference.objects.get(user=demo.owner).language == "en"
    shot(page, "10-switched-to-english")
    page.locator(".language-switch").get_by_role("button", name="简体中文").click()
    expect(page.locator("#job-header .phase")).to_have_text("运行中")
    # The switch reloads the page: its Stop button sends nothing until htmx processed the page
    # (a full run clicked it before, and no POST ever came).
    htmx_idle(page)
    dialogs: list[str] = []
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    page.locator("#job-header").get_by_role("button", name="停止").click()
    wait_for(lambda: TrainingJob.objects.get(id=job.id).phase == Phase.TERMINATED, message="the job to stop")
    assert dialogs == ["停止 zh-walk？其容器将被停止并删除，且不会再重启。"]
    expect(page.locator("#phase-reason")).to_have_text("被用户停止。")
    shot(page, "11-stopped")


@pytest.fixture
def english_then_chinese(browser, live_url):
    with page_maker(browser, live_url) as make:
        yield lambda locale: make(locale=locale)


def test_the_choice_follows_the_user_to_another_browser(demo, english_then_chinese):
    first = english_then_chinese("en-US")
    first.goto("/accounts/login/")
    first.locator(".language-switch").get_by_role("button", name="简体中文").click()
    expect(first.get_by_role("heading", name="登录")).to_be_visible()
    first.get_by_label("用户名").fill("member")
    first.get_by_label("密码").fill("member-password")
    first.get_by_role("button", name="登录").click()
    expect(first.get_by_role("heading", name="训练作业")).to_be_visible()
    first.locator(".language-switch").get_by_role("button", name="简体中文").click()  # remembered for member
    first.get_by_role("button", name="退出登录").click()
    expect(first.get_by_role("heading", name="登录")).to_be_visible()

    second = english_then_chinese("en-US")  # another browser, asking for English
    second.goto("/accounts/login/")
    expect(second.get_by_role("heading", name="Log in")).to_be_visible()
    second.get_by_label("User name").fill("member")
    second.get_by_label("Password").fill("member-password")
    second.get_by_role("button", name="Log in").click()
    expect(second.get_by_role("heading", name="训练作业")).to_be_visible()
    expect(second.locator(".language-switch [aria-current]")).to_have_text("简体中文")
    shot(second, "12-another-browser")
