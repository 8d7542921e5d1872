"""The naive peer: aiohttp + onnxruntime in a thread pool, no batching (../shared/PEERS.md).

Usage: python naive_server.py MODEL.onnx PORT
"""

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from aiohttp import web

path, port = sys.argv[1], int(sys.argv[2])
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
pool = ThreadPoolExecutor(4)


async def infer(request: web.Request) -> web.Response:
    body = await request.json()
    tensor = body["inputs"][0]
    x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    y = await asyncio.get_running_loop().run_in_executor(pool, lambda: session.run(["y"], {"x": x})[0])
    output = {"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}
    return web.json_response({"model_name": "mlp", "outputs": [output]})


app = web.Application()
app.add_routes([web.post("/v2/models/mlp/infer", infer)])
web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
