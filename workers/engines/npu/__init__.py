"""Chat models on Qualcomm's NPU: a GGUF converted to an ONNX decoder graph, run by onnxruntime-qnn.

`convert.py` turns a llama-architecture GGUF into the graph (cached in the data dir), `decoder.py`
runs it (chunked prefill, single-token decode, a host-owned KV cache), `engine.py` serves chat on it
behind the Engine interface.
"""
