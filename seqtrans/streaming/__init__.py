"""Simultaneous (streaming) decoding, in one place: the decoder step that writes while
the source arrives (:mod:`.decoder`), the push session of one sentence (:mod:`.session`),
``predict --stream`` (:mod:`.predict`), test sets scored as streams with SimulEval's
latency metrics (:mod:`.evaluation`, :mod:`.latency`), how a learned read policy's
training matches its decisions (:mod:`.policy`), the SimulEval agent (:mod:`.simuleval`)
and the server's WebSocket adapter over the session (:mod:`.websocket`)."""
