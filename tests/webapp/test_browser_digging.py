"""memory_viz's digging on oomscope's report (issue 20, item 6), in a real browser at 1440 px and 390 px: an event
list stepped with the keys, the allocator's state following it (checked against the recorded replay), every
segment in a compact view with its blocks coloured by stack, and C++ frames folded by default."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp import test_browser
from tests.webapp.test_browser import SCREENSHOTS, Visit, _analysed, _session_cookie
from tests.webapp.test_browser_honest import WIDTHS, _clean, _fits_the_screen

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the module's Chromium, a pytest fixture shared with test_browser.py


def _selected_state(visit: Visit) -> int:
    """Wait until the state shown is the selected event's; that event."""
    visit.wait_for(
        "() => { const l = document.querySelector('#state-0 .event-list');"
        " return l && l.dataset.selected && document.getElementById('state-0').dataset.state === l.dataset.selected; }"
    )
    return int(visit.page.locator("#state-0 .event-list").get_attribute("data-selected"))


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_event_list_steps_with_the_keys_and_the_state_follows(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from django.urls import reverse

    from analysis.allocator.recorded import recorded_replay
    from analysis.reader import read_snapshot
    from tests.webapp.helpers import GPT_OOM

    width, height = WIDTHS[form]
    snap = read_snapshot(GPT_OOM)
    rep = recorded_replay(snap, snap.devices[0])
    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
        width=width,
        height=height,
    )
    try:
        page = visit.page
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.exploreReady === '1'")
        # The segment timeline got its bands for the whole trace from segments.json.
        visit.wait_for(
            "() => /^[0-9]+$/.test(document.querySelector('[data-chart=\"segtime-0\"]').dataset.bands || '')"
        )
        segtime = page.locator('[data-chart="segtime-0"]')
        assert int(segtime.get_attribute("data-bands")) > 10 and int(segtime.get_attribute("data-segments")) > 10
        if form == "desktop":
            segtime.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "segment-timeline.png"), full_page=False)
        opener = page.get_by_role("button", name="Step through the events from the OOM")
        opener.click()
        oom_event = int(opener.get_attribute("data-event"))
        first = _selected_state(visit)
        assert first == oom_event
        listbox = page.get_by_role("listbox", name="Events")
        assert listbox.evaluate("(e) => e === document.activeElement")
        seen = [first]
        for key in ("ArrowDown", "ArrowDown", "ArrowUp", "ArrowUp", "ArrowUp", "PageUp"):
            page.keyboard.press(key)
            page.wait_for_timeout(120)
            seen.append(_selected_state(visit))
        # Every event is in the list (issue 35): the keys step one event, free requests included.
        assert seen == [first, first + 1, first + 2, first + 1, first, first - 1, first - 41]
        # The timeline marks the selected event.
        cursor = page.evaluate(
            "(() => { for (const d of Bokeh.documents) { const c = d.get_model_by_name('timeline-cursor');"
            " if (c) return [c.location, c.visible]; } })()"
        )
        assert cursor == [seen[-1], True]
        # The state shown is the recorded replay's after that event.
        index = seen[-1]
        for figure, column in (("allocated", rep.allocated), ("reserved", rep.reserved), ("requested", rep.requested)):
            shown = page.locator(f'#state-0 dd[data-figure="{figure}"]').get_attribute("data-bytes")
            assert int(shown) == int(column[index]), figure
        # The compact view: every segment, their widths adding up, the blocks coloured by stack.
        state = client.get(f"/s/{upload.code}/state.json?i={index}").json()
        segments = page.locator("#state-0 .state-segments.compact .segment")
        assert segments.count() == len(state["segments"])
        colours = page.locator("#state-0 .block.active_allocated").evaluate_all(
            "bs => bs.map(b => [b.title.split(' · ')[1] || '', getComputedStyle(b).backgroundColor])"
        )
        by_label: dict[str, set[str]] = {}
        for label, colour in colours:
            by_label.setdefault(label.split(" (segment")[0], set()).add(colour)
        assert len(by_label) >= 3 and all(len(c) == 1 for c in by_label.values()), by_label
        assert len({next(iter(c)) for c in by_label.values()}) >= 3  # stacks in different colours
        _clean(visit)
        _fits_the_screen(visit, width)
        page.locator("#state-0").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"events-state-{form}.png"), full_page=False)
    finally:
        visit.close()


def test_cpp_frames_are_folded_by_default(
    browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """big_all_stacks was recorded with stacks="all": a block's stack is mostly C++ (the unwinder, the
    dispatcher, autograd); the Python frames show, each run of C++ frames folds behind one line."""
    from django.urls import reverse

    upload = _analysed(alpha, alice, "big_all_stacks")
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
        width=1440,
    )
    try:
        page = visit.page
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.exploreReady === '1'")
        page.get_by_role("button", name="Step through the events from the reserved peak").click()
        _selected_state(visit)
        block = page.locator('#state-0 .block.active_allocated[title*=".py:"]').first
        alloc = int(block.get_attribute("data-alloc"))
        block.click()
        visit.wait_for("() => document.querySelector('#state-0 .block-detail').dataset.alloc !== undefined")
        info = client.get(f"/s/{upload.code}/block.json?alloc={alloc}").json()
        frames = info["alloc_frames"]
        python = [f for f in frames if str(f.get("filename") or "").endswith(".py")]
        assert python and len(python) < len(frames)  # a mixed stack
        stack = page.locator("#state-0 .block-detail ol.frames-list").first
        folds = stack.locator(":scope > li > details.cpp-frames")
        assert folds.count() >= 1
        assert all(d.get_attribute("open") is None for d in folds.all())
        # Shown at once: the Python frames; folded: every C++ frame, none lost.
        visible = stack.locator(":scope > li:not(.cpp-run)").count()
        folded = sum(int(s.split(" ")[0]) for s in folds.locator("summary").all_inner_texts())
        assert visible == len(python) and visible + folded == len(frames)
        folds.first.locator("summary").click()
        assert folds.first.get_attribute("open") is not None
        _clean(visit)
        page.locator("#state-0 .block-detail").scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "block-cpp-folded.png"), full_page=False)
    finally:
        visit.close()
