"""``seqtrans serve``: trained models behind an HTTP and WebSocket server (the ``serve``
extra). Importing this package imports none of the server's dependencies; see
:mod:`seqtrans.serving.server`."""
