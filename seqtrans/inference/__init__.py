"""Inference: everything that uses a trained model, apart from training it.

- :mod:`~seqtrans.inference.loaded`: a run loaded for decoding
  (:class:`~seqtrans.inference.loaded.Loaded`);
- :mod:`~seqtrans.inference.loading`: loading a run (or several, as an ensemble), and
  ``evaluate``;
- :mod:`~seqtrans.inference.phrases`: target phrases given as text, encoded
  (``decode.banned``); :mod:`~seqtrans.inference.lexical`: a constraints file's phrases;
- :mod:`~seqtrans.inference.evaluation`: decoding many sources, reading and scoring a split;
- :mod:`~seqtrans.inference.online`: ``predict``, input lines decoded in batches as they arrive;
- :mod:`~seqtrans.streaming.session`: one streamed sentence; :mod:`~seqtrans.streaming.predict`:
  ``predict --stream``, words decoded as they arrive;
- :mod:`~seqtrans.inference.scoring`: the log-probability of given pairs (``seqtrans score``);
- :mod:`~seqtrans.inference.export`: a model in another engine's format (CTranslate2);
- :mod:`~seqtrans.inference.heatmaps`: attention weights drawn as heatmaps;
- :mod:`~seqtrans.streaming.policy`: how far a learned read policy's hard decisions differ
  from the expected alignment it was trained with.

Nothing here imports the training orchestrator (:mod:`seqtrans.pipeline`), which uses
this package for its test decoding and validation. Importing the package imports none
of its modules: each is imported where it is used.
"""
