"""The page at / in a real headless Chromium (Playwright): a model picked, inputs typed,
the outputs and scores shown as the API gives them; a streaming model's tokens appearing
while the sentence is still being typed. Skipped where node is missing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser import LAUNCH_ARGS, chromium
from servers import reference, running, streamed
from test_inference import copy_run

from seqtrans.inference.loading import load
from seqtrans.serving.models import Served

playwright = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    root = tmp_path_factory.mktemp("page")
    runs = {"copy": copy_run(root / "copy", seed=3, vocab_size=30),
            "waitk": copy_run(root / "waitk", seed=2, model=("model.causal_encoder=true", "decode.wait_k=2"))}
    return {name: Served(name, load(run, device="cpu")) for name, run in runs.items()}


@pytest.fixture(scope="module")
def page(models: dict[str, Served]) -> Iterator[Any]:
    executable = chromium()
    with running(models) as url, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            tab = browser.new_page()
            tab.goto(url + "/")
            yield tab
        finally:
            browser.close()


def ask(page: Any, text: str, *, beam: int, nbest: int, check: str | None = None) -> None:
    """Type ``text`` for the copy model with these options (and one box ticked) and send it."""
    page.select_option("#model", "copy")
    page.fill("#input", text)
    page.fill("#beam", str(beam))
    page.fill("#nbest", str(nbest))
    if check is not None:
        page.check(check)
    page.click("#go")


def test_the_page_decodes_typed_inputs_with_n_best_and_scores(page: Any, models: dict[str, Served]) -> None:
    ask(page, "1 2 3\n4 5 6 7", beam=4, nbest=2, check="#scores")
    page.wait_for_selector("tr.output")
    rows = [[cell.inner_text() for cell in row.query_selector_all("td")]
            for row in page.query_selector_all("tr.output")]
    wanted = []
    for text in ("1 2 3", "4 5 6 7"):
        answer = reference(models["copy"].loaded, text, beam=4, nbest=2, scores=True)
        wanted += [[text, str(k + 1), h["output"], f"{h['score'].expected:.4f}"]
                   for k, h in enumerate(answer["hypotheses"])]
    assert rows == wanted
    assert page.inner_text("#error") == ""


def test_the_page_shows_an_error_from_the_server(page: Any) -> None:
    ask(page, "1", beam=2, nbest=3)
    page.wait_for_function("document.getElementById('error').textContent !== ''")
    assert "nbest" in page.inner_text("#error")


def test_a_streaming_model_translates_while_the_sentence_is_typed(page: Any,
                                                                  models: dict[str, Served]) -> None:
    words = ["1", "2", "3", "4", "5"]
    [(tokens, delays)] = streamed(models["waitk"], [words])
    page.select_option("#model", "waitk")
    page.check("#stream")
    page.fill("#input", "")
    page.type("#input", " ".join(words) + " ", delay=20)
    page.wait_for_selector("span.token")  # before the sentence's end is sent: wait-2 writes early
    page.click("#go")
    page.wait_for_function(f"document.querySelectorAll('span.token').length === {len(tokens.split())}")
    shown = live_tokens(page)
    assert [token for token, _ in shown] == tokens.split()
    assert [delay for _, delay in shown] == delays


def live_tokens(page: Any, selector: str = "span.token") -> list[tuple[str, int]]:
    """Each shown token (or word) and its delay: the text, then the subscript after it."""
    return [(span.evaluate("s => s.firstChild.textContent"),
             int(span.query_selector("sub.delay").inner_text()))
            for span in page.query_selector_all(selector)]


def finals(page: Any, count: int) -> list[str]:
    """The final outputs of the first ``count`` sentences, once shown."""
    page.wait_for_function(f"document.querySelectorAll('#live .final').length >= {count}")
    return [final.inner_text() for final in page.query_selector_all("#live .final")]


def test_live_mode_sends_the_last_word_shows_each_output_and_keeps_sentences_apart(
        page: Any, models: dict[str, Served]) -> None:
    sentences = [["1", "2", "3"], ["4", "5"]]
    wanted = streamed(models["waitk"], sentences)
    page.select_option("#model", "waitk")
    page.check("#stream")
    for words in sentences:
        page.fill("#input", "")
        page.type("#input", " ".join(words), delay=10)  # no space after the last word
        page.click("#go")
    finals(page, 2)
    blocks = page.query_selector_all("#live .sentence")
    assert len(blocks) == 2
    for block, (tokens, delays) in zip(blocks, wanted):
        shown = [(s.evaluate("s => s.firstChild.textContent"), int(s.query_selector("sub").inner_text()))
                 for s in block.query_selector_all("span.token")]
        assert shown == list(zip(tokens.split(), delays))  # every word was read, the last one too
        words = [s.evaluate("s => s.firstChild.textContent") for s in block.query_selector_all("span.word")]
        assert words == tokens.split()  # the copy task's output words are its tokens
    # each delay is a subscript after its token, then a space before the next token
    first = blocks[0].query_selector("span.token")
    assert first.evaluate("s => s.lastChild.tagName") == "SUB"
    assert first.evaluate("s => s.nextSibling.textContent") == " "


def test_live_mode_recovers_after_a_server_error_and_a_new_model_clears_the_screen(
        page: Any, models: dict[str, Served]) -> None:
    from seqtrans.serving.settings import ServeSettings

    with running(models, ServeSettings(max_input_tokens=3)) as url:
        tab, back = page, page.url  # the same tab (the browser runs as a single process), then back
        try:
            tab.goto(url + "/")
            tab.select_option("#model", "waitk")
            tab.check("#stream")
            tab.type("#input", "1 2 3 4 ", delay=10)  # one word too many: the server closes the session
            tab.wait_for_function("document.getElementById('error').textContent !== ''")
            assert "3 words" in tab.inner_text("#error")
            tab.fill("#input", "")
            tab.type("#input", "5 6", delay=10)
            tab.click("#go")  # a new session, without toggling live mode
            [(tokens, _)] = streamed(models["waitk"], [["5", "6"]])
            finals(tab, 1)
            assert [word for word, _ in live_tokens(tab, "#live .final span.word")] == tokens.split()
            assert tab.inner_text("#error") == ""
            tab.select_option("#model", "copy")  # another model: nothing of the previous one stays
            assert tab.inner_text("#live") == "" and tab.inner_text("#error") == ""
            assert tab.is_hidden("#outputs")
        finally:
            tab.goto(back)


def test_the_page_draws_the_attention_of_each_output(page: Any, models: dict[str, Served]) -> None:
    ask(page, "1 2 3", beam=3, nbest=1, check="#attention")
    page.wait_for_selector("table.heatmap")
    answer = httpx.post(page.url + "v1/models/copy/predict",
                        json={"inputs": ["1 2 3"], "beam": 3, "attention": True})
    attention = answer.json()["outputs"][0]["attention"]
    heatmap = page.query_selector("table.heatmap")
    assert [th.inner_text() for th in heatmap.query_selector_all("thead th")][1:] == attention["source"]
    rows = heatmap.query_selector_all("tbody tr")
    assert [r.query_selector("th").inner_text() for r in rows] == attention["target"]
    shown = [[float(td.get_attribute("title")) for td in r.query_selector_all("td")] for r in rows]
    assert shown == attention["weights"]
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
