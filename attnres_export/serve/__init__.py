"""Serving exported artifacts with Triton Inference Server (docs/serving.md).

``signature``: an artifact's inputs and outputs as Triton sees them (names, dtypes, dims, batch axis);
``server``: ``attnres serve``, the supervisor of a PyTriton server whose model instances run our runners;
``front``: its public ports, which check every request (``limits``: what a request may hold, from the export;
``wire``: the KServe HTTP and gRPC request formats) and answer readiness; ``backend``: the Triton server on
loopback ports and the watch on its processes (``proxy_patches``: a longer PyTriton instance
handshake, zero-size tensors through its tensor store; ``triton_log``: Triton's output without its
known-harmless lines, a start's output after the line that says where the model is served);
``workspace``: the server's files and the guard that removes them however it ends;
``repository``: ``attnres triton-repo``, a model repository for a stock Triton server, checked against Triton's
own config schema. PyTriton, tritonclient and aiohttp are the optional ``serve`` extra, imported only when used
(``dependencies``).
"""
