"""The PyTriton peer: Triton with dynamic batching (max 32, 2 ms delay) around onnxruntime.

Usage: python pytriton_server.py MODEL.onnx HTTP_PORT WORKSPACE (a folder that does not exist yet)
"""

import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

path, port, workspace = sys.argv[1], int(sys.argv[2]), sys.argv[3]
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])


@batch
def infer(x):
    return {"y": session.run(["y"], {"x": x})[0]}


config = TritonConfig(
    http_address="127.0.0.1", http_port=port, grpc_address="127.0.0.1", grpc_port=port + 1, metrics_port=port + 2
)
with Triton(config=config, workspace=workspace) as triton:
    triton.bind(
        model_name="mlp",
        infer_func=infer,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(512,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(512,))],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
    )
    triton.serve()
