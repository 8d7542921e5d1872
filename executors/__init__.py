"""Where the model runs: ONNX Runtime executors and the protocol the gateway speaks to them."""
