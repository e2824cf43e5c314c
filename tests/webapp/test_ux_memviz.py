"""memory_viz parity (issue 35), in a real browser at 1440 and 390 px and by keyboard: the event list holds
every event of the trace (virtualised: End is the trace's last event), ↑/↓ step the ``free_requested`` halves
too, the selected event's whole stack is shown under the list, the state's blocks take the focus and show
their details, no "unknown / no frames" where the backward pass is known, the timeline's y axis leaves 0
when zoomed, the segment maps fit the page, and an open shared tab says its link was revoked.
Data: gpt_varlen_oom (stacks="python", an OOM) analysed by the worker's own task, checked against the
recorded replay run here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.webapp import test_browser
from tests.webapp.helpers import GPT_OOM
from tests.webapp.test_browser import SCREENSHOTS, Visit, _analysed, _session_cookie
from tests.webapp.test_browser_honest import WIDTHS, _clean, _fits_the_screen

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the module's Chromium, a pytest fixture shared with test_browser.py

LIST = "#state-0 .event-list"


@pytest.fixture(scope="module")
def replay() -> Any:
    from analysis.allocator.recorded import recorded_replay
    from analysis.reader import read_snapshot

    snap = read_snapshot(GPT_OOM)
    return recorded_replay(snap, snap.devices[0]), snap


def _open(browser: Any, live_server: Any, url: str, cookies: Any, width: int, height: int) -> Visit:
    visit = Visit(browser, live_server.url + url, cookies, width=width, height=height)
    visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.exploreReady === '1'")
    return visit


def _open_report(browser: Any, live_server: Any, client: Any, alice: Any, alpha: Any, form: str) -> tuple[Any, Visit]:
    """gpt_varlen_oom analysed and its report page opened by its owner, at ``form``'s size."""
    from django.urls import reverse

    width, height = WIDTHS[form]
    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    cookies = _session_cookie(client, alice, live_server)
    return upload, _open(browser, live_server, reverse("snapshots:detail", args=[upload.code]), cookies, width, height)


def _selected(visit: Visit) -> int:
    """Wait until the state and the stack shown are the selected event's; that event."""
    visit.wait_for(
        f"() => {{ const l = document.querySelector({json.dumps(LIST)}); const s = l && l.dataset.selected;"
        " return s && document.getElementById('state-0').dataset.state === s"
        " && document.querySelector('#state-0 .event-stack').dataset.event === s; }"
    )
    return int(visit.page.locator(LIST).get_attribute("data-selected"))


def _figure(visit: Visit, name: str) -> int:
    return int(visit.page.locator(f'#state-0 dd[data-figure="{name}"]').get_attribute("data-bytes"))


def _frames_shown(box: Any) -> int:
    """Frames in a stack list: the Python ones shown plus the C++ ones folded behind their summaries."""
    stack = box.locator("ol.frames-list").first
    shown = stack.locator(":scope > li:not(.cpp-run)").count()
    return shown + sum(int(s.split(" ")[0]) for s in stack.locator(":scope > li > details > summary").all_inner_texts())


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_event_list_holds_every_event_and_shows_the_selected_stack(
    form: str, replay: Any, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:

    from analysis.model import FREE_REQUESTED

    rep, snap = replay
    trace = snap.devices[0].trace
    n = len(trace)
    _, visit = _open_report(browser, live_server, client, alice, alpha, form)
    try:
        page = visit.page
        opener = page.get_by_role("button", name="Step through the events from the OOM")
        opener.click()
        oom = int(opener.get_attribute("data-event"))
        assert _selected(visit) == oom
        listbox = page.get_by_role("listbox", name="Events")
        assert listbox.evaluate("(e) => e === document.activeElement")
        # The whole trace is in the list, drawn a screenful at a time (not a 120-event window).
        assert int(listbox.get_attribute("data-events")) == n == rep.events
        assert page.locator(f"{LIST} [role=option]").count() < 80
        assert listbox.locator(f"#event-0-{oom}").get_attribute("aria-setsize") == str(n)
        # ↑ steps every event, the free requests too: back to the last free request before the OOM.
        target = max(i for i in range(oom) if int(trace.action[i]) == FREE_REQUESTED)
        assert oom - target < 40
        for expected in range(oom - 1, target - 1, -1):
            page.keyboard.press("ArrowUp")
            assert _selected(visit) == expected
        row = page.locator(f"#event-0-{target}")
        assert row.get_attribute("aria-selected") == "true" and row.get_attribute("data-action") == "free_requested"
        assert row.inner_text().split("\n")[1].startswith("free requested")
        assert _figure(visit, "allocated") == int(rep.allocated[target])
        # Its whole stack under the list: every frame of the event's recorded stack.
        stack = page.locator("#state-0 .event-stack")
        frames = snap.stacks.frames_of(int(trace.stack[target])) if int(trace.stack[target]) >= 0 else []
        if frames:
            assert _frames_shown(stack) == len(frames)
        else:
            assert "No frames" in stack.inner_text()
        assert stack.locator("h4").inner_text().startswith(f"Event {target:,}: free requested")
        # End is the trace's last event, Home its first; the state follows both.
        page.keyboard.press("End")
        assert _selected(visit) == n - 1
        assert page.locator(f"#event-0-{n - 1}").get_attribute("aria-selected") == "true"
        assert _figure(visit, "reserved") == int(rep.reserved[n - 1])
        if form == "desktop":
            page.locator("#state-0").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "memviz-list-end.png"), full_page=False)
        page.keyboard.press("Home")
        assert _selected(visit) == 0
        assert _figure(visit, "allocated") == int(rep.allocated[0])
        page.keyboard.press("PageDown")
        assert _selected(visit) == 40
        assert page.locator(f"{LIST} [role=option]").count() < 80
        _clean(visit)
        assert visit.warnings() == []
        _fits_the_screen(visit, WIDTHS[form][0])
        page.locator("#state-0").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"memviz-list-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_states_blocks_take_the_focus_and_show_their_details(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:

    upload, visit = _open_report(browser, live_server, client, alice, alpha, form)
    try:
        page = visit.page
        page.get_by_role("button", name="Step through the events from the OOM").click()
        at = _selected(visit)
        state = client.get(f"/s/{upload.code}/state.json?i={at}").json()
        blocks = [(s, b) for s in state["segments"] for b in s["blocks"]]
        # The map is one tab stop after the list; its first block takes the focus.
        for _ in range(30):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.classList.contains('block')"):
                break
        else:
            raise AssertionError("no block took the focus")
        detail = page.locator("#state-0 .block-detail")
        _seg, first = blocks[0]
        assert detail.locator("h4").first.inner_text().startswith(f"Block {first['address']} at +0 B in segment")
        # The arrows go block by block, in address order, each with its details; an allocated block's stacks follow.
        k = next(i for i, (_s, b) in enumerate(blocks) if b.get("alloc_event") is not None)
        for _ in range(k):
            page.keyboard.press("ArrowRight")
        _seg, block = blocks[k]
        focused = page.evaluate("document.activeElement.getAttribute('aria-label')")
        assert focused.startswith(f"Block {block['address']}, {block['size_text']}")
        facts = detail.locator(".block-facts").inner_text()
        assert f"{block['size']:,} B" in facts and (block["label"] in facts)
        alloc = block["alloc_event"]
        visit.wait_for(f"() => document.querySelector('#state-0 .block-detail').dataset.alloc === '{alloc}'")
        info = client.get(f"/s/{upload.code}/block.json?alloc={block['alloc_event']}").json()
        if info["alloc_frames"]:
            assert _frames_shown(detail) == len(info["alloc_frames"])
        assert "unknown / no frames" not in detail.inner_text()
        # One tab stop: Tab leaves the map rather than walking its blocks.
        page.keyboard.press("Tab")
        assert not page.evaluate("document.activeElement.classList.contains('block')")
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        detail.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"memviz-block-focus-{form}.png"), full_page=False)
    finally:
        visit.close()


def test_the_backward_pass_is_named_not_unknown(
    replay: Any, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """stacks="python": the autograd thread's allocations have no frames. The event list names them as the
    compare page does, and frees name what they free; no event says "unknown / no frames"."""
    from django.urls import reverse

    from analysis.stacks import BACKWARD_NO_FRAMES

    rep, _snap = replay
    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    cookies = _session_cookie(client, alice, live_server)  # logs ``client`` in too
    texts: list[str] = []
    for start in range(0, rep.events, 500):
        body = client.get(f"/s/{upload.code}/events.json?start={start}&count=500").json()
        assert body["start"] == start and body["end"] == min(rep.events, start + 500)
        texts.extend(body["what"])
    assert len(texts) == rep.events
    assert not [t for t in texts if "unknown / no frames" in t]
    backward = [i for i, t in enumerate(texts) if t.endswith(BACKWARD_NO_FRAMES)]
    assert len(backward) > 1000
    visit = _open(browser, live_server, reverse("snapshots:detail", args=[upload.code]), cookies, 1440, 900)
    try:
        page = visit.page
        page.get_by_role("button", name="Step through the events from the OOM").click()
        _selected(visit)
        # Scroll the list to a backward event: its row is drawn with the page's words.
        k = backward[len(backward) // 2]
        page.locator(LIST).evaluate(f"(l) => {{ l.scrollTop = {k} * 24 - 100; }}")
        visit.wait_for(f"() => {{ const r = document.getElementById('event-0-{k}'); return r && r.dataset.read; }}")
        assert page.locator(f"#event-0-{k}").get_attribute("title") == f"{k:,}: {texts[k]}"
        page.locator(f"#event-0-{k}").click()
        assert _selected(visit) == k
        assert f"No frames: {BACKWARD_NO_FRAMES}." in page.locator("#state-0 .event-stack").inner_text()
        assert "unknown / no frames" not in page.locator("#state-0").inner_text()
        _clean(visit)
        page.locator("#state-0").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "memviz-backward-named.png"), full_page=False)
    finally:
        visit.close()


ZOOM_STATE = """(() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');
  const s = d.get_model_by_name('timeline-source');
  const all = ['reserved', 'allocated', 'requested', 'largest_free'].flatMap((k) => Array.from(s.data[k] || []));
  if (f && s) return {start: f.y_range.start, end: f.y_range.end, x0: f.x_range.start, x1: f.x_range.end,
    lo: Math.min(...all), hi: Math.max(...all)}; } })()"""


HIDE_LARGEST_FREE = """(() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');
  if (f) f.renderers.forEach((r) => {
    if (r.glyph && r.glyph.y && r.glyph.y.field === 'largest_free') r.visible = false; }); } })()"""
LOWEST_SHOWN = """(() => { for (const d of Bokeh.documents) { const s = d.get_model_by_name('timeline-source');
  if (s) return Math.min(...['reserved', 'allocated', 'requested'].flatMap((k) => Array.from(s.data[k]))); } })()"""


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_zoomed_timelines_y_axis_leaves_zero_and_the_segment_maps_fit(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:

    _, visit = _open_report(browser, live_server, client, alice, alpha, form)
    try:
        page = visit.page
        slot = page.locator('[data-chart="timeline-0"]')
        slot.focus()
        for _ in range(5):  # + zooms by two around the middle: 1/32 of the trace
            page.keyboard.press("+")
        visit.wait_for(
            "() => { const s = document.querySelector('[data-chart=\"timeline-0\"]'); return s.dataset.zoom === '1'"
            " && s.dataset.zoomY !== undefined; }"
        )
        page.wait_for_timeout(400)  # the last key's fetch
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.zoom === '1'")
        z = page.evaluate(ZOOM_STATE)
        assert z["x1"] - z["x0"] < 36_316 / 16
        # From just under the lowest line shown to just over the highest, not from 0 (here the largest
        # free block, a few hundred MiB, keeps it near 0).
        room = max((z["hi"] - z["lo"]) * 0.06, z["hi"] * 0.002, 1)
        assert z["start"] == pytest.approx(max(0, z["lo"] - room)) and z["end"] == pytest.approx(z["hi"] + room), z
        # Hide that line as its legend entry does: the axis fits the three lines left, far from 0.
        page.evaluate(HIDE_LARGEST_FREE)
        visit.wait_for(f"() => {{ const z = {ZOOM_STATE}; return z.start > 0; }}")
        z = page.evaluate(ZOOM_STATE)
        lo = page.evaluate(LOWEST_SHOWN)
        assert 0 < z["start"] <= lo < z["end"] and z["start"] > 0.5 * lo, (z, lo)
        if form == "desktop":
            slot.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "memviz-zoomed-y.png"), full_page=False)
        page.keyboard.press("Home")  # the whole trace: from zero to the limit again
        visit.wait_for(f"() => {{ const z = {ZOOM_STATE}; return z.start === 0; }}")
        # The segment maps: each at most a screen tall; side by side at 1440 px, one under the other at 390.
        visit.open_folds()
        boxes = [page.locator(f'[data-chart="segments-{m}-0"]').bounding_box() for m in ("peak", "oom")]
        assert all(b is not None and b["height"] <= 620 for b in boxes), boxes
        if form == "desktop":
            assert abs(boxes[0]["y"] - boxes[1]["y"]) < 2 and boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"]
        else:
            assert boxes[1]["y"] >= boxes[0]["y"] + boxes[0]["height"]
        _clean(visit)
        assert visit.warnings() == []
        _fits_the_screen(visit, WIDTHS[form][0])
        page.locator('[data-chart="segments-peak-0"]').scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"memviz-segment-maps-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_an_open_shared_tab_says_its_link_was_revoked(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any
) -> None:
    from django.urls import reverse

    from webapp.snapshots.teams import shares

    width, height = WIDTHS[form]
    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    token = shares.share_create(upload, alice)
    visit = _open(browser, live_server, reverse("snapshots:share_view", args=[token]), None, width, height)
    try:
        page = visit.page
        page.get_by_role("button", name="Step through the events from the OOM").click()
        _selected(visit)
        shares.share_revoke(upload)
        page.keyboard.press("End")  # a page of events not read yet: the request meets the revoked link
        visit.wait_for("() => document.getElementById('link-gone') !== null")
        gone = page.get_by_role("alert")
        assert "revoked" in gone.inner_text() and "Ask whoever sent it for a new one" in gone.inner_text()
        assert gone.is_visible()  # sticky at the top of the page, wherever the reader scrolled
        assert page.locator("#state-0 .event-stack").inner_text() == gone.inner_text()
        assert "Not found" not in page.locator("main").inner_text()
        # The browser logs the refused requests (404) and nothing else; no warning from our scripts.
        assert [e for e in visit.errors() if "status of 404" not in e] == [] and visit.csp_violations() == []
        assert visit.warnings() == []
        assert visit.failed and all(f.endswith(" 404") and "/r/" in f for f in visit.failed)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"memviz-link-revoked-{form}.png"), full_page=False)
    finally:
        visit.close()
