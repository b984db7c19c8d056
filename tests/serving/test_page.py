"""The page at / in a real headless Chromium (Playwright): a model picked, inputs typed,
the outputs and scores shown as the API gives them, late answers and failures handled;
live mode's sentences streamed line by line, through pauses, idle timeouts and a server
restart. Skipped where node is missing. With ``SEQTRANS_SCREENSHOTS=1`` a test writes the
screenshots of docs/serving.md into docs/images/."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser import LAUNCH_ARGS, chromium
from servers import ROOT, free_port, reference, running
from test_inference import copy_run

from seqtrans.inference.loading import load
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.streaming.session import StreamSession

playwright = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    root = tmp_path_factory.mktemp("page")
    runs = {"copy": copy_run(root / "copy", seed=3, vocab_size=30),
            "waitk": copy_run(root / "waitk", seed=2, vocab_size=30,
                              model=("model.causal_encoder=true", "decode.wait_k=2"))}
    return {name: Served(name, load(run, device="cpu")) for name, run in runs.items()}


# What the page sends on each WebSocket, and how many of those the server closed: the
# sentences the server was given, whatever the page shows.
SOCKET_LOG = """
window.socketLog = [];
window.socketsClosed = 0;
const realSend = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
    if (!this.logged) {
        this.logged = [];
        window.socketLog.push(this.logged);
        this.addEventListener("close", () => { window.socketsClosed++; });
    }
    this.logged.push(JSON.parse(data));
    return realSend.call(this, data);
};
"""


@pytest.fixture(scope="module")
def page_errors() -> list[Any]:
    """What the page threw, an unhandled rejection included."""
    return []


@pytest.fixture(scope="module")
def page(models: dict[str, Served], page_errors: list[Any]) -> Iterator[Any]:
    executable = chromium()
    with running(models) as url, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            tab = browser.new_page()
            tab.add_init_script(SOCKET_LOG)
            tab.on("pageerror", lambda error: page_errors.append(error))
            tab.goto(url + "/")
            yield tab
        finally:
            browser.close()


@pytest.fixture(autouse=True)
def no_page_errors(page: Any, page_errors: list[Any]) -> Iterator[None]:
    """Whatever happens, the page itself throws nothing."""
    page_errors.clear()
    yield
    assert page_errors == []


def ask(page: Any, text: str, *, beam: int, nbest: int, check: str | None = None,
        model: str = "copy") -> None:
    """Type ``text`` for ``model`` with these options (and one box ticked) and send it."""
    page.select_option("#model", model)
    page.fill("#input", text)
    page.fill("#beam", str(beam))
    page.fill("#nbest", str(nbest))
    if check is not None:
        page.check(check)
    page.click("#go")


def rows(page: Any) -> list[list[str]]:
    return [[cell.inner_text() for cell in row.query_selector_all("td")]
            for row in page.query_selector_all("tr.output")]


def test_the_page_decodes_typed_inputs_with_n_best_and_scores(page: Any, models: dict[str, Served]) -> None:
    ask(page, "1 2 3\n4 5 6 7", beam=4, nbest=2, check="#scores")
    page.wait_for_selector("tr.output")
    wanted = []
    for text in ("1 2 3", "4 5 6 7"):
        answer = reference(models["copy"].loaded, text, beam=4, nbest=2, scores=True)
        wanted += [[text, str(k + 1), h["output"], f"{h['score'].expected:.4f}"]
                   for k, h in enumerate(answer["hypotheses"])]
    assert rows(page) == wanted
    assert page.inner_text("#error") == ""
    # the outputs say which model and which request they answer
    assert page.inner_text("#results-title") == "Outputs of copy"
    assert page.get_attribute("#outputs", "data-model") == "copy"
    assert "beam 4, n-best 2, 2 inputs" in page.inner_text("#results-about")
    page.uncheck("#scores")


def test_the_page_shows_an_error_from_the_server(page: Any) -> None:
    ask(page, "1", beam=2, nbest=3)
    page.wait_for_function("document.getElementById('error').textContent !== ''")
    assert "nbest" in page.inner_text("#error")


def test_an_error_after_a_success_takes_the_old_outputs_away(page: Any) -> None:
    ask(page, "1 2", beam=2, nbest=1)
    page.wait_for_selector("tr.output")
    page.fill("#nbest", "3")  # refused: n-best over the beam
    page.click("#go")
    page.wait_for_function("document.getElementById('error').textContent !== ''")
    assert page.is_hidden("#outputs") and page.query_selector_all("tr.output") == []


def test_a_late_answer_for_the_previous_model_is_dropped(page: Any, models: dict[str, Served]) -> None:
    # the copy model's answer is held back in the browser until after the model has changed
    page.evaluate("""() => {
        window.realFetch = window.fetch;
        window.lateSettled = false;
        window.fetch = (url, options) => {
            if (!String(url).includes("/copy/predict")) return window.realFetch(url, options);
            return new Promise((wait) => setTimeout(wait, 1000))
                .then(() => window.realFetch(url, options))
                .finally(() => setTimeout(() => { window.lateSettled = true; }, 300));
        };
    }""")
    try:
        ask(page, "1 2 3", beam=2, nbest=1, model="copy")
        ask(page, "4 5", beam=2, nbest=1, model="waitk")
        page.wait_for_selector("tr.output")
        page.wait_for_function("window.lateSettled")  # the copy model's answer has come
        assert rows(page) == [["4 5", "1", reference(models["waitk"].loaded, "4 5", beam=2)["output"]]]
        assert page.inner_text("#results-title") == "Outputs of waitk"
        assert page.inner_text("#error") == ""
    finally:
        page.evaluate("() => { window.fetch = window.realFetch; }")


def test_the_page_says_when_the_server_cannot_be_reached(page: Any, models: dict[str, Served]) -> None:
    back = page.url
    try:
        with running(models) as url:
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        # the server is gone; its page stays
        ask(page, "1 2", beam=2, nbest=1)
        page.wait_for_function("document.getElementById('error').textContent !== ''", timeout=10_000)
        assert "cannot be reached" in page.inner_text("#error")
        live(page)
        page.type("#input", "1 ", delay=10)
        says(page, "cannot be reached")
        assert page.get_attribute("#live-status", "data-state") == "retrying"
    finally:
        page.goto(back)


# ---------------------------------------------------------------- live mode

def spoken(served: Served, words: list[str], *, end: bool = True) -> tuple[list[str], list[int]]:
    """The output words of one sentence streamed as the server streams it, and their delays;
    without ``end``, those written before the sentence has ended."""
    session = StreamSession(served.loaded, decode=dataclasses.replace(served.loaded.config.decode, nbest=1,
                                                                      sample=0))
    update = session.push(words)
    if not end:
        return [w.text for w in update.words], [w.delay for w in update.words]
    session.finish()
    return session.output.split(), session.word_delays


def live(page: Any, model: str = "waitk") -> None:
    """Live mode on for ``model``, from an empty box, with nothing sent yet."""
    page.select_option("#model", model)
    page.uncheck("#stream")
    page.fill("#input", "")
    page.check("#stream")
    page.evaluate("() => { window.socketLog = []; window.socketsClosed = 0; }")


def sent(page: Any) -> list[list[tuple[str, bool]]]:
    """What the page has sent, per WebSocket: the sentences as the server reads them, each
    its words and whether its end was sent."""
    sockets = []
    for messages in page.evaluate("window.socketLog"):
        sentences: list[tuple[str, bool]] = []
        words: list[str] = []
        for message in messages:
            words += message.get("words", "").split()
            if message.get("end"):
                sentences.append((" ".join(words), True))
                words = []
        if words:
            sentences.append((" ".join(words), False))
        sockets.append(sentences)
    return sockets


def says(page: Any, text: str) -> None:
    """Wait until the page says ``text`` somewhere."""
    page.wait_for_function(f"document.body.innerText.includes({text!r})", timeout=10_000)


# Each sentence shown: the words sent, its state, the tokens received, its output words
# with their delays, and its output as a reader sees it
SENTENCES = """() => [...document.querySelectorAll("#live .sentence")].filter((b) => !b.hidden).map((b) => ({
    sent: b.dataset.sent, state: b.dataset.state || (b.dataset.done ? "done" : "live"),
    tokens: Number(b.dataset.tokens || b.querySelectorAll("span.token").length),
    words: [...b.querySelectorAll("span.word")].map((s) => s.firstChild.textContent),
    delays: [...b.querySelectorAll("span.word sub.delay")].map((s) => Number(s.textContent)),
    text: (b.querySelector(".target") || b).innerText}))"""


def sentences(page: Any) -> list[dict[str, Any]]:
    return list(page.evaluate(SENTENCES))


def wait_done(page: Any, count: int) -> list[dict[str, Any]]:
    page.wait_for_function(f"({SENTENCES})().filter((s) => s.state === 'done').length >= {count}")
    return sentences(page)


def test_live_mode_shows_words_while_the_sentence_is_typed_and_their_delays_on_demand(
        page: Any, models: dict[str, Served]) -> None:
    words = ["1", "2", "3", "4", "5"]
    live(page)
    page.type("#input", " ".join(words) + " ", delay=20)
    page.wait_for_function(f"({SENTENCES})()[0].tokens > 0")  # before the end is sent: wait-2 writes early
    page.click("#go")  # ends the sentence
    [shown] = wait_done(page, 1)
    output, delays = spoken(models["waitk"], words)
    assert sent(page) == [[("1 2 3 4 5", True)]]
    assert shown["text"] == " ".join(output)  # words only, not pieces: the delays are hidden until asked for
    page.check("#delays")
    assert page.inner_text("#live .target") == " ".join(f"{w}{d}" for w, d in zip(output, delays))
    assert sentences(page)[0]["delays"] == delays
    page.uncheck("#delays")
    assert page.input_value("#input") == "1 2 3 4 5 \n"  # ending a sentence starts a new line


# A sentence as a subword model streams it: pieces as they are decided, words once complete
PIECES = [{"token": "▁Ein", "delay": 2, "word_delay": 2}, {"token": "▁Mann", "delay": 3, "word_delay": 3},
          {"word": "Ein", "delay": 3}, {"token": "▁fähr", "delay": 4, "word_delay": 3},
          {"word": "Mann", "delay": 3}, {"token": "t", "delay": 4, "word_delay": 3},
          {"done": True, "output": "Ein Mann fährt", "delays": [3, 3, 3], "token_delays": [2, 3, 4, 4]}]


def test_live_mode_shows_words_not_the_model_s_pieces(page: Any) -> None:
    if not hasattr(page, "route_web_socket"):
        pytest.skip("a WebSocket answered by the test needs Playwright 1.48")
    tab = page.context.browser.new_page()  # its own tab: its WebSocket route goes with it
    try:
        tab.add_init_script(SOCKET_LOG)

        def answer(ws: Any) -> None:
            def message(text: str | bytes) -> None:
                if json.loads(text).get("end"):
                    for reply in PIECES:
                        ws.send(json.dumps(reply))
            ws.on_message(message)

        tab.route_web_socket("**/stream", answer)
        tab.goto(page.url)
        tab.wait_for_function("document.querySelectorAll('#model option').length > 0")
        live(tab)
        tab.type("#input", "A man rides", delay=10)
        tab.click("#go")
        [shown] = wait_done(tab, 1)
        assert shown["text"] == "Ein Mann fährt" and "▁" not in tab.inner_text("#live")
        tab.check("#delays")
        assert sentences(tab)[0]["delays"] == [3, 3, 3]  # the words' delays, not the pieces'
    finally:
        tab.goto("about:blank")  # left open: closing a tab takes down this single-process browser


def test_live_mode_streams_each_line_as_its_own_sentence(page: Any, models: dict[str, Served]) -> None:
    live(page)
    page.type("#input", "1 2 3\n4 5", delay=10)  # no space after the last word
    page.click("#go")
    wait_done(page, 1)
    assert sent(page) == [[("1 2 3", True), ("4 5", True)]]  # the second line's words only
    shown = wait_done(page, 2)
    assert [s["sent"] for s in shown] == ["1 2 3", "4 5"]
    assert [s["words"] for s in shown] == [spoken(models["waitk"], ["1", "2", "3"])[0],
                                           spoken(models["waitk"], ["4", "5"])[0]]
    assert page.inner_text("#error") == ""


def test_live_mode_sends_an_edited_line_again_as_a_new_stream(page: Any, models: dict[str, Served]) -> None:
    live(page)
    page.type("#input", "1 2 3\n4 5 ", delay=10)
    page.wait_for_function(f"({SENTENCES})().length === 2 && ({SENTENCES})()[1].tokens > 0")
    page.fill("#input", "1 2 6\n4 5 ")  # the first line changed while the second is being translated
    page.click("#go")
    shown = wait_done(page, 2)
    # the open sentence is ended and dropped, then both are sent again, in order
    assert sent(page) == [[("1 2 3", True), ("4 5", True), ("1 2 6", True), ("4 5", True)]]
    assert [s["sent"] for s in shown] == ["1 2 6", "4 5"]
    assert [s["text"] for s in shown] == [" ".join(spoken(models["waitk"], ["1", "2", "6"])[0]),
                                          " ".join(spoken(models["waitk"], ["4", "5"])[0])]


def test_live_mode_sends_the_last_word_when_typing_pauses_and_says_so(page: Any,
                                                                       models: dict[str, Served]) -> None:
    live(page)
    page.type("#input", "12 13 ", delay=10)  # words of two characters: a word is sent whole or not at all
    # the last word typed, and what the page says at once (before any pause can pass)
    said = page.evaluate("""() => {
        const box = document.getElementById("input");
        box.value += "14";
        box.dispatchEvent(new Event("input"));
        return document.body.innerText;
    }""")
    # the pause sends it, and the page says so
    page.wait_for_function("window.socketLog.flat().some((m) => (m.words || '').split(' ').includes('14'))",
                           timeout=5_000)
    assert sent(page) == [[("12 13 14", False)]]
    assert "“14” is sent when you" in said
    says(page, "You paused, so “14” was translated")
    written, _ = spoken(models["waitk"], ["12", "13", "14"], end=False)
    page.wait_for_function(f"({SENTENCES})()[0].words.length === {len(written)}")
    assert sentences(page)[0]["words"] == written
    # the word was not finished after all: the sentence is sent again, not added to
    page.press("#input", "Backspace")
    page.type("#input", "5", delay=10)
    page.press("#input", "Enter")
    [shown] = wait_done(page, 1)
    assert sent(page)[-1][-1] == ("12 13 15", True)
    output = spoken(models["waitk"], ["12", "13", "15"])[0]
    assert shown["sent"] == "12 13 15" and shown["words"] == output and shown["text"] == " ".join(output)


def test_live_mode_restarts_a_sentence_after_an_idle_timeout(page: Any, models: dict[str, Served]) -> None:
    back = page.url
    try:
        with running(models, ServeSettings(stream_idle_s=1.5)) as url:
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 0")
            live(page)
            page.type("#input", "1 2 ", delay=10)
            page.wait_for_function(f"({SENTENCES})()[0].tokens > 0")
            page.wait_for_function("window.socketsClosed > 0")  # the server closed the idle session
            page.wait_for_timeout(200)
            assert page.inner_text("#error") == ""  # a pause is not an error
            assert page.get_attribute("#live-status", "data-state") == "idle"
            page.type("#input", "3 ", delay=10)
            page.click("#go")
            [shown] = wait_done(page, 1)
            assert sent(page) == [[("1 2", False)], [("1 2 3", True)]]  # sent again whole, on a new session
            output = spoken(models["waitk"], ["1", "2", "3"])[0]
            assert shown["text"] == " ".join(output)  # the old session's tokens are gone, not added to
            assert page.inner_text("#error") == ""
    finally:
        page.goto(back)


def test_live_mode_restarts_a_sentence_after_a_server_restart(page: Any, models: dict[str, Served]) -> None:
    port = free_port()
    back = page.url
    try:
        with running(models, port=port) as url:
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 0")
            live(page)
            page.type("#input", "1 2 ", delay=10)
            page.wait_for_function(f"({SENTENCES})()[0].tokens > 0")
        says(page, "reconnecting")  # said on the page while the server is down
        with running(models, port=port):
            page.wait_for_selector("#live-status[data-state=open]")
            assert sent(page)[-1] == [("1 2", False)]  # the sentence's stream started again, by itself
            page.type("#input", "3", delay=10)
            page.click("#go")
            [shown] = wait_done(page, 1)
            assert sent(page)[-1] == [("1 2 3", True)]
            output = spoken(models["waitk"], ["1", "2", "3"])[0]
            assert shown["text"] == " ".join(output) and shown["sent"] == "1 2 3"
            assert page.inner_text("#error") == ""
    finally:
        page.goto(back)


def test_live_mode_shows_a_refused_sentence_and_a_new_model_clears_the_screen(
        page: Any, models: dict[str, Served]) -> None:
    back = page.url
    try:
        with running(models, ServeSettings(max_input_tokens=3)) as url:
            page.goto(url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 0")
            live(page)
            page.type("#input", "1 2 3 4 ", delay=10)  # one word too many: the server refuses the sentence
            page.wait_for_function("document.getElementById('error').textContent !== ''")
            assert "3 words" in page.inner_text("#error")
            assert [s["state"] for s in sentences(page)] == ["failed"]
            page.fill("#input", "")
            page.type("#input", "5 6", delay=10)
            page.click("#go")  # a new session, without toggling live mode
            [shown] = wait_done(page, 1)
            assert shown["words"] == spoken(models["waitk"], ["5", "6"])[0]
            assert page.inner_text("#error") == ""
            page.select_option("#model", "copy")  # another model: nothing of the previous one stays
            assert page.is_hidden("#live-card") and page.inner_text("#error") == ""
            assert sentences(page) == [] and page.is_hidden("#outputs")
    finally:
        page.goto(back)


# ---------------------------------------------------------------- drawings

def test_the_page_draws_the_attention_of_each_output_with_a_scale_and_a_caption(page: Any) -> None:
    ask(page, "1 2 3", beam=3, nbest=1, check="#attention")
    page.wait_for_selector("table.heatmap")
    answer = httpx.post(page.url + "v1/models/copy/predict",
                        json={"inputs": ["1 2 3"], "beam": 3, "attention": True})
    attention = answer.json()["outputs"][0]["attention"]
    heatmap = page.query_selector("table.heatmap")
    assert [th.inner_text() for th in heatmap.query_selector_all("thead th")][1:] == attention["source"]
    body = heatmap.query_selector_all("tbody tr")
    assert [r.query_selector("th").inner_text() for r in body] == attention["target"]
    shown = [[float(td.get_attribute("title")) for td in r.query_selector_all("td")] for r in body]
    assert shown == attention["weights"]
    figure = page.query_selector("figure.attention")
    assert figure.query_selector(".axis-source").inner_text().lower().startswith("source tokens")
    assert "target tokens" in figure.query_selector(".axis-target").inner_text().lower()
    assert [t.inner_text() for t in figure.query_selector_all(".scale .tick")] == ["0", "1"]
    caption = figure.query_selector("figcaption").inner_text()
    assert "each row is a target token" in caption and "“1 2 3”" in caption
    page.uncheck("#attention")


def test_the_page_draws_a_bracketed_output_as_a_tree(page: Any) -> None:
    drawn = page.evaluate("""() => {
        const svg = drawTree(parseTree("(S (NP (DT the) (NN dog)) (VP (VBD barked)))"));
        document.body.append(svg);
        return [...svg.querySelectorAll("text")].map((t) => [t.textContent, Number(t.getAttribute("x")),
                                                           Number(t.getAttribute("y"))]);
    }""")
    where = {label: (x, y) for label, x, y in drawn}
    assert sorted(where) == sorted(["S", "NP", "DT", "the", "NN", "dog", "VP", "VBD", "barked"])
    assert where["the"][0] < where["dog"][0] < where["barked"][0]  # the words left to right
    assert where["the"][1] == where["dog"][1] == where["barked"][1] > where["NP"][1] > where["S"][1]
    assert where["NP"][0] == (where["DT"][0] + where["NN"][0]) / 2  # a parent over its children
    assert page.evaluate("[parseTree('a man (rides'), parseTree('(S a) b'), parseTree('plain text')]") == [
        None, None, None]
    page.evaluate("() => document.querySelectorAll('body > svg.tree').forEach((s) => s.remove())")


# ---------------------------------------------------------------- screenshots for the docs

@pytest.mark.skipif(os.environ.get("SEQTRANS_SCREENSHOTS") != "1",
                    reason="writes docs/images/page-*.png only when SEQTRANS_SCREENSHOTS=1 asks")
def test_screenshots_of_the_page_for_the_docs(page: Any) -> None:
    images = ROOT / "docs" / "images"
    try:
        page.set_viewport_size({"width": 1200, "height": 900})
        ask(page, "1 2 3 4\n5 6 7", beam=4, nbest=2, check="#scores")
        page.check("#attention")
        page.click("#go")
        page.wait_for_selector("table.heatmap")
        page.screenshot(path=images / "page-decode.png", full_page=True)
        page.uncheck("#attention")
        page.uncheck("#scores")
        live(page)
        page.type("#input", "1 2 3 4 5\n6 7 8 9\n", delay=5)
        wait_done(page, 2)
        page.check("#delays")
        page.type("#input", "4 2 7 1", delay=5)
        page.wait_for_function(f"({SENTENCES})().length === 3 && ({SENTENCES})()[2].sent === '4 2 7 1'")
        page.screenshot(path=images / "page-live.png", full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.uncheck("#delays")
        page.evaluate("() => document.activeElement.blur()")
        page.screenshot(path=images / "page-phone.png", full_page=True)
    finally:
        page.set_viewport_size({"width": 1280, "height": 720})
        page.uncheck("#stream")
