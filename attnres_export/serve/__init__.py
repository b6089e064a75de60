"""Serving exported artifacts with Triton Inference Server (docs/serving.md).

``signature``: an artifact's inputs and outputs as Triton sees them (names, dtypes, dims, batch axis);
``server``: ``attnres serve``, a PyTriton server whose model instances run our runners;
``repository``: ``attnres triton-repo``, a model repository for a stock Triton server, checked against Triton's
own config schema. PyTriton and tritonclient are the optional ``serve`` extra, imported only when used
(``dependencies``).
"""
