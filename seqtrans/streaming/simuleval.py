"""A SimulEval agent for any seqtrans model that can stream (the ``simul`` extra)::

    pip install 'seqtrans[simul]'
    simuleval --agent-class seqtrans.streaming.simuleval.Agent --seqtrans-run RUN_DIR \\
        [--seqtrans-set decode.wait_k=3 ...] --source SRC --target TGT --output OUT

SimulEval 1.1 sends the source one word per call and asks the agent's policy what to do;
the agent pushes the words it has not seen to a
:class:`~seqtrans.streaming.session.StreamSession`, and writes the output words that
are now complete (the next piece has begun a new word, or the output has ended), all
of them in one write, or reads when there are none. Once the source has ended it ends
the session and writes the rest. SimulEval then scores the outputs with its own
scorers; they equal ``seqtrans evaluate --stream`` on the same sentences (its BLEU,
AL, LAAL, AP and DAL), which measures the same delays without a client.

The source file holds one input line per sentence, as ``seqtrans predict`` reads them,
and the target file the references.
"""

from __future__ import annotations

from argparse import ArgumentParser, Namespace
from typing import Any

from simuleval.agents import TextToTextAgent
from simuleval.agents.actions import ReadAction, WriteAction

from seqtrans.errors import SeqtransError
from seqtrans.inference.loading import load
from seqtrans.streaming.session import StreamSession, Update, check_streaming


class Agent(TextToTextAgent):
    """seqtrans's streaming decoding as a SimulEval text-to-text agent."""

    def __init__(self, args: Namespace) -> None:
        super().__init__(args)
        try:
            self.loaded = load(args.seqtrans_run, overrides=args.seqtrans_set or (),
                               device=args.seqtrans_device)
            check_streaming(self.loaded)
        except SeqtransError as exc:
            raise SystemExit(f"seqtrans.streaming.simuleval.Agent: {exc}. A run that can stream has a "
                             "learned read policy (model.cross_attention=monotonic, milk, mocha, mma_hard, "
                             "mma_il or mma_chunk) trained with model.causal_encoder=true, or scaled_dot "
                             "attention with any encoder, under wait-k with --seqtrans-set "
                             "decode.wait_k=K (an encoder that reads the whole source encodes the source "
                             "read so far again at each read)") from None
        self.session: StreamSession | None = None

    @staticmethod
    def add_args(parser: ArgumentParser) -> None:
        parser.add_argument("--seqtrans-run", required=True, metavar="RUN_DIR",
                            help="The seqtrans run (or checkpoint) to decode with; it must be able to "
                                 "stream.")
        parser.add_argument("--seqtrans-set", nargs="*", default=[], metavar="KEY=VALUE",
                            help="Decoding settings, as 'seqtrans predict --set' takes them "
                                 "(decode.wait_k=3).")
        parser.add_argument("--seqtrans-device", default="cpu", choices=["auto", "cpu", "cuda"],
                            help="Where the model decodes (default: cpu).")

    def reset(self) -> None:
        super().reset()
        self.session = None

    def policy(self, states: Any = None) -> ReadAction | WriteAction:
        states = self.states if states is None else states
        if self.session is None:
            self.session = StreamSession(self.loaded, origin="simuleval")
        session = self.session
        words: list[str] = []
        if not session.finished:
            words += _texts(session.push(states.source[len(session.words):]))
            if states.source_finished:
                words += _texts(session.finish())
        if words or session.done:
            return WriteAction(" ".join(words), finished=session.done)
        return ReadAction()


def _texts(update: Update) -> list[str]:
    return [word.text for word in update.words]
